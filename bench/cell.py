#!/usr/bin/python3
"""One measured cell of bench/run: start a server, run a client, stop the server.

bench/run runs this under `emlio energy`, so one energy meter spans the
server and the client of the loader (and nothing else: the RTT relay runs
outside it). Usage:  cell.py SPEC.json

SPEC: {"server": null | {"argv": [...], "ready_re": REGEX | null,
                         "ready_port": PORT | null, "ready_host": ADDR (127.0.0.1),
                         "stop_signal": "TERM", "stdout": PATH, "stderr": PATH},
       "client": {"argv": [...], "stdout": PATH, "stderr": PATH,
                  "stop_after_s": S | null (SIGINT the client after S seconds),
                  "ok_rcs": [0] (exit statuses that count as success)},
       "timeout_s": S, "result": PATH}

Writes RESULT (JSON): client exit status, CPU seconds and peak RSS (from
wait4, so reaped worker processes are included), the server's CPU seconds
during the client's run (utime+stime from /proc of the server and all its
descendants) and over its whole life (wait4), and this runner's own CPU.
"""
import ctypes
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

CLK = os.sysconf("SC_CLK_TCK")
_libc = ctypes.CDLL(None, use_errno=True)


def _pdeathsig():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the runner


def tree_cpu(pid):
    """utime+stime (s) of pid and every live descendant, from /proc."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open("/proc/%d/stat" % p) as f:
                st = f.read()
            fields = st[st.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return total / CLK


def wait4_timeout(proc, timeout_s, what):
    """wait4() a Popen child; SIGKILL it after timeout_s. Returns (status, rusage, timed_out)."""
    fired = []

    def kill():
        fired.append(1)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    t = threading.Timer(timeout_s, kill)
    t.start()
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        t.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if fired:
        sys.stderr.write("cell: %s timed out after %.0f s, killed\n" % (what, timeout_s))
    return proc.returncode, ru, bool(fired)


def main():
    _pdeathsig()  # die with `emlio energy` (and so with bench/run)
    spec = json.load(open(sys.argv[1]))
    res = {"ok": False}
    srv = None
    try:
        s = spec.get("server")
        if s:
            srv = subprocess.Popen(s["argv"], stdout=subprocess.PIPE,
                                   stderr=open(s["stderr"], "wb"),
                                   preexec_fn=lambda: (os.setpgrp(), _pdeathsig()))
            out_f = open(s["stdout"], "w")
            ready = threading.Event()
            rx = re.compile(s["ready_re"]) if s.get("ready_re") else None

            def pump():
                for line in iter(srv.stdout.readline, b""):
                    line = line.decode("utf-8", "replace")
                    out_f.write(line)
                    out_f.flush()
                    if rx and rx.search(line):
                        ready.set()
            threading.Thread(target=pump, daemon=True).start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if srv.poll() is not None:
                    raise RuntimeError("server %s exited with %s before it was ready (see %s)"
                                       % (s["argv"][0], srv.returncode, s["stderr"]))
                if rx and ready.wait(0.02):
                    break
                if s.get("ready_port"):
                    try:
                        socket.create_connection((s.get("ready_host", "127.0.0.1"),
                                                  s["ready_port"]), 0.2).close()
                        break
                    except OSError:
                        time.sleep(0.02)
            else:
                raise RuntimeError("server %s not ready within 30 s" % s["argv"][0])
        c = spec["client"]
        cpu0 = tree_cpu(srv.pid) if srv else 0.0
        t0 = time.monotonic()
        # The client may meter the server itself over its own steady window
        # (bench/train_meter.py): /proc is shared across network namespaces.
        env = dict(os.environ, EMLIO_BENCH_SERVER_PID=str(srv.pid)) if srv else None
        cli = subprocess.Popen(c["argv"], stdout=open(c["stdout"], "wb"),
                               stderr=open(c["stderr"], "wb"), env=env,
                               preexec_fn=lambda: (os.setpgrp(), _pdeathsig()))
        stopper = None
        if c.get("stop_after_s"):
            def interrupt():
                try:
                    os.killpg(cli.pid, signal.SIGINT)
                except OSError:
                    pass
            stopper = threading.Timer(c["stop_after_s"], interrupt)
            stopper.start()
        try:
            rc, ru, to = wait4_timeout(cli, spec["timeout_s"], "client " + c["argv"][0])
        finally:
            if stopper:
                stopper.cancel()
        wall = time.monotonic() - t0
        cpu1 = tree_cpu(srv.pid) if srv else 0.0
        res.update(client_rc=rc, client_timed_out=to, client_wall_s=wall,
                   client_cpu_s=ru.ru_utime + ru.ru_stime,
                   client_user_s=ru.ru_utime, client_sys_s=ru.ru_stime,
                   client_maxrss_kb=ru.ru_maxrss, client_minflt=ru.ru_minflt,
                   server_cpu_s=cpu1 - cpu0)
        if srv:
            if srv.poll() is None:
                os.kill(srv.pid, getattr(signal, "SIG" + s.get("stop_signal", "TERM")))
            src, sru, _ = wait4_timeout(srv, 15, "server " + s["argv"][0]) \
                if srv.returncode is None else (srv.returncode, None, False)
            res.update(server_rc=src)
            if sru is not None:
                res.update(server_life_cpu_s=sru.ru_utime + sru.ru_stime,
                           server_maxrss_kb=sru.ru_maxrss, server_minflt=sru.ru_minflt)
        res["ok"] = (rc in c.get("ok_rcs", [0]) and not to)
    except Exception as e:  # reported to bench/run, which prints it
        res["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        if srv and srv.poll() is None:
            try:
                os.killpg(srv.pid, signal.SIGKILL)
            except OSError:
                pass
            srv.wait()
        me = resource.getrusage(resource.RUSAGE_SELF)
        res["runner_cpu_s"] = me.ru_utime + me.ru_stime
        with open(spec["result"], "w") as f:
            json.dump(res, f)
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
