#!/usr/bin/python3
# tests/python/test_hardening.py - issue 11: shards that change under a
# running daemon, connection accounting that cannot be abused, and failures
# that are reported. Each test starts its own emliod (tests/python/_support).
# Needs python3-zmq and python3-msgpack.
# SPDX-License-Identifier: MIT
import io
import os
import resource
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import unittest

import msgpack
import zmq

import _support
from _support import EMLIO, Daemon, make_dataset

T_HELLO, T_WELCOME, T_GET, T_BATCH, T_ERROR = 1, 2, 3, 4, 5
ECORRUPT = -1003


def pack(h):
    return msgpack.packb(h, use_bin_type=True)


def unpack(b):
    return msgpack.unpackb(b, raw=False)


def wait_for(pred, timeout, step=0.05):
    """Polls pred until it is true or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


class Stream:
    """One DEALER connection speaking protocol v1 directly."""

    def __init__(self, ctx, endpoint, rcvhwm=0):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.connect(endpoint)

    def hello(self):
        self.sock.send(pack({"t": T_HELLO, "v": 4, "name": "hardening"}))

    def get(self, rid, items):
        flat = []
        for shard, record in items:
            flat += [shard, record]
        self.sock.send(pack({"t": T_GET, "id": rid, "items": flat}))

    def recv(self, timeout=10.0):
        if not self.sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None, []
        frames = self.sock.recv_multipart()
        return unpack(frames[0]), frames[1:]

    def close(self):
        self.sock.close(0)


def fetch(endpoint, *extra, timeout=60):
    return subprocess.run(
        [EMLIO, "fetch", "--connect", endpoint, "--batch", "16",
         "--timeout-ms", "10000"] + list(extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
        text=True)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="emlio-hard.")
        self.ctx = zmq.Context()
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        self.ctx.destroy(0)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dataset(self, samples=120, shard_bytes="128K"):
        shards, _ = make_dataset(self.tmp, samples=samples, classes=2,
                                 nbytes="8K", shard_bytes=shard_bytes)
        return shards

    def daemon(self, data, *extra):
        d = Daemon(data, *extra)
        self.daemons.append(d)
        return d

    def welcome(self, endpoint):
        s = Stream(self.ctx, endpoint)
        s.hello()
        h, _ = s.recv()
        self.assertIsNotNone(h, "no WELCOME")
        self.assertEqual(h.get("t"), T_WELCOME, h)
        return s, h

    def shard_index(self, welcome, name):
        names = [s[0] if isinstance(s, (list, tuple)) else s.get("name")
                 for s in welcome["shards"]]
        return names.index(name)


class ChangedShards(Base):
    """Row 1: a served shard shrinks, is rewritten or replaced."""

    def changed_once(self, d, name):
        return d.stderr().count("shard '%s' changed on disk" % name) == 1

    def check_changed(self, d, shards, name, index):
        # The daemon lives, logs the change once, refuses that shard's
        # samples by name and serves the others.
        self.assertTrue(wait_for(lambda: self.changed_once(d, name), 10),
                        d.stderr())
        s, w = self.welcome(d.endpoint)
        s.get(7, [(index, 0)])
        h, _ = s.recv()
        self.assertEqual(h["t"], T_ERROR, h)
        self.assertEqual(h["code"], ECORRUPT, h)
        self.assertIn(name, h["msg"])
        self.assertIn("changed on disk", h["msg"])
        other = (index + 1) % len(w["shards"])
        s.get(8, [(other, 0)])
        h, frames = s.recv()
        self.assertEqual(h["t"], T_BATCH, h)
        self.assertEqual(len(frames), 1)
        s.close()
        r = fetch(d.endpoint, "--verify")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(name, r.stderr)
        self.assertIsNone(d.proc.poll(), "emliod died: " + d.stderr())
        self.assertTrue(self.changed_once(d, name), d.stderr())

    def test_truncated_leased_shard(self):
        shards = self.dataset()
        d = self.daemon(shards)
        r = fetch(d.endpoint, "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        _, w = self.welcome(d.endpoint)
        name = sorted(f for f in os.listdir(shards)
                      if f.endswith(".tfrecord"))[0]
        path = os.path.join(shards, name)
        # truncate(2) waits until emliod gives its lease back.
        t0 = time.monotonic()
        os.truncate(path, os.path.getsize(path) - 5000)
        self.assertLess(time.monotonic() - t0, 10)
        self.check_changed(d, shards, name, self.shard_index(w, name))

    def test_truncated_shard_read_by_copy(self):
        shards = self.dataset()
        name = sorted(f for f in os.listdir(shards)
                      if f.endswith(".tfrecord"))[0]
        path = os.path.join(shards, name)
        # Open for writing elsewhere: no lease, so emliod reads by copying.
        fd = os.open(path, os.O_RDWR)
        try:
            d = self.daemon(shards)
            _, w = self.welcome(d.endpoint)
            os.ftruncate(fd, os.path.getsize(path) - 5000)
            self.check_changed(d, shards, name, self.shard_index(w, name))
        finally:
            os.close(fd)

    def test_truncated_shard_skipped(self):
        shards = self.dataset()
        d = self.daemon(shards, "--on-corrupt", "skip")
        name = sorted(f for f in os.listdir(shards)
                      if f.endswith(".tfrecord"))[0]
        path = os.path.join(shards, name)
        os.truncate(path, os.path.getsize(path) - 5000)
        self.assertTrue(wait_for(lambda: self.changed_once(d, name), 10),
                        d.stderr())
        r = fetch(d.endpoint, "--verify")
        self.assertIn('"skipped": ', r.stdout)
        self.assertIsNone(d.proc.poll(), d.stderr())

    def tar_dataset(self, shards=2, samples=40):
        # WebDataset shards written by Python's tarfile: an 8 KiB "jpg" and
        # a "cls" per sample.
        d = os.path.join(self.tmp, "tar")
        os.makedirs(d)
        for i in range(shards):
            with tarfile.open(os.path.join(d, "s%d.tar" % i), "w",
                              format=tarfile.USTAR_FORMAT) as tf:
                for k in range(samples):
                    for ext, data in (("jpg", bytes([k % 251]) * 8192),
                                      ("cls", b"%d" % (k % 2))):
                        info = tarfile.TarInfo("%06d.%s" % (k, ext))
                        info.size = len(data)
                        tf.addfile(info, io.BytesIO(data))
        return d

    def test_truncated_leased_tar_shard(self):
        # Tar members are zero-copy frames from the mapping too: a tar cut
        # in half under the daemon must not SIGBUS it.
        shards = self.tar_dataset()
        d = self.daemon(shards)
        r = fetch(d.endpoint, "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        _, w = self.welcome(d.endpoint)
        name = "s0.tar"
        path = os.path.join(shards, name)
        t0 = time.monotonic()
        os.truncate(path, os.path.getsize(path) // 2)
        self.assertLess(time.monotonic() - t0, 10)
        self.check_changed(d, shards, name, self.shard_index(w, name))

    def test_truncated_tar_shard_read_by_copy(self):
        shards = self.tar_dataset()
        name = "s0.tar"
        path = os.path.join(shards, name)
        fd = os.open(path, os.O_RDWR)
        try:
            d = self.daemon(shards)
            s, w = self.welcome(d.endpoint)
            index = self.shard_index(w, name)
            # Read before the cut (by copying: no lease), then ask for the
            # last sample right after it: a short pread, not a SIGBUS.
            s.get(5, [(index, 39)])
            h, frames = s.recv()
            self.assertEqual(h["t"], T_BATCH, h)
            self.assertEqual(frames[0], bytes([39]) * 8192)
            self.assertEqual(h["samples"][2], 1, h)  # flat: the label
            os.ftruncate(fd, os.path.getsize(path) // 2)
            s.get(6, [(index, 39)])
            h, _ = s.recv()
            self.assertEqual(h["t"], T_ERROR, h)
            self.assertEqual(h["code"], ECORRUPT, h)
            s.close()
            self.check_changed(d, shards, name, index)
        finally:
            os.close(fd)

    def test_replaced_shard_is_logged_and_still_served(self):
        shards = self.dataset()
        d = self.daemon(shards)
        name = sorted(f for f in os.listdir(shards)
                      if f.endswith(".tfrecord"))[0]
        path = os.path.join(shards, name)
        with open(path + ".new", "wb") as f:
            f.write(b"\0" * 100)
        os.rename(path + ".new", path)
        self.assertTrue(wait_for(
            lambda: "shard '%s' was replaced" % name in d.stderr(), 10),
            d.stderr())
        r = fetch(d.endpoint, "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)


class Connections(Base):
    """Rows 2-4: slots, floods, idle peers, file descriptors."""

    def test_short_fetches_do_not_lock_out(self):
        d = self.daemon(self.dataset(), "--max-clients", "4")
        for i in range(3):
            r = fetch(d.endpoint, "--verify")
            self.assertEqual(r.returncode, 0, "run %d: %s" % (i, r.stderr))

    def test_connect_close_cycles_free_slots_at_once(self):
        d = self.daemon(self.dataset(), "--max-clients", "4")
        refused = 0
        for _ in range(40):  # ten times --max-clients
            s = Stream(self.ctx, d.endpoint)
            s.hello()
            h, _ = s.recv()
            s.close()
            refused += h is None or h["t"] != T_WELCOME
        # A close races the next HELLO by microseconds here; a refusal
        # then is fair (13 of 40 seen on a loaded VM), a lockout is not:
        # slots freed only by a timeout would refuse 36 of the 40.
        self.assertLess(refused, 20, d.stderr())
        t0 = time.monotonic()
        admitted = False
        while not admitted and time.monotonic() - t0 < 1.0:
            s = Stream(self.ctx, d.endpoint)
            s.hello()
            h, _ = s.recv(timeout=1.0)
            s.close()
            admitted = h is not None and h["t"] == T_WELCOME
            if not admitted:
                time.sleep(0.05)
        self.assertTrue(admitted, d.stderr())

    def test_flooder_is_disconnected(self):
        d = self.daemon(self.dataset(), "--max-credit", "16")
        s = Stream(self.ctx, d.endpoint, rcvhwm=1)
        mon = s.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        s.hello()
        items = [(0, r % 8) for r in range(32)]
        for rid in range(1, 2001):
            s.get(rid, items)
        self.assertTrue(wait_for(
            lambda: "without reading" in d.stderr(), 20), d.stderr())
        # It learns of the close once it reads what was sent before it.
        deadline = time.monotonic() + 15
        closed = False
        while not closed and time.monotonic() < deadline:
            while s.sock.poll(0, zmq.POLLIN):
                s.sock.recv_multipart()
            closed = bool(mon.poll(10))
        self.assertTrue(closed, "flooder not disconnected")
        s.sock.disable_monitor()
        s.close()
        r = fetch(d.endpoint, "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_idle_peers_are_disconnected(self):
        d = self.daemon(self.dataset(), "--idle-timeout", "1")
        socks = []
        mons = []
        for _ in range(20):
            s = Stream(self.ctx, d.endpoint)
            mons.append(s.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            socks.append(s)
        for m in mons:
            self.assertTrue(m.poll(8000), "silent peer still connected")
        for s in socks:
            s.sock.disable_monitor()
            s.close()

    def test_fd_exhaustion_is_logged_and_survived(self):
        shards = self.dataset()

        def low_limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))

        proc = subprocess.Popen(
            [_support.EMLIOD, "--data", shards, "--bind",
             "tcp://127.0.0.1:*", "--idle-timeout", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=low_limit, text=True)
        err = []

        def drain():
            for text in proc.stderr:
                err.append(text)
        threading.Thread(target=drain, daemon=True).start()
        try:
            line = proc.stdout.readline()
            self.assertIn("listening on", line)
            ep = line.split("listening on ")[1].split()[0]
            host, port = ep[len("tcp://"):].rsplit(":", 1)
            raw = []
            for _ in range(120):
                try:
                    raw.append(socket.create_connection((host, int(port)), 2))
                except OSError:
                    break
            # Wait (bounded) until the daemon has run out and said so, then
            # give the descriptors back: it must serve again. Fetching while
            # it is still out depends on how fast idle peers are evicted,
            # which made this test flaky.
            deadline = time.monotonic() + 30
            # (Or, before running out, closes connections beyond what the
            # limit leaves beside the shards' budget.)
            def said():
                text = "".join(err)
                return ("out of file descriptors" in text or
                        "closing connections beyond" in text)
            while time.monotonic() < deadline and not said():
                time.sleep(0.05)
            for c in raw:
                c.close()
            # ...and until it has seen them go (its descriptors back below
            # the limit with room for a client's streams), so the fetch
            # tests recovery, not how fast a loaded machine runs the
            # daemon's event loop.
            deadline = time.monotonic() + 30
            while (time.monotonic() < deadline and
                   len(os.listdir("/proc/%d/fd" % proc.pid)) > 96 - 24):
                time.sleep(0.05)
            self.assertIsNone(proc.poll())
            r = fetch(ep, "--verify", timeout=60)
            self.assertEqual(r.returncode, 0,
                             r.stderr + "\ndaemon:\n" + "".join(err[-60:]))
            self.assertIsNone(proc.poll())
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = "".join(err)
        self.assertTrue("out of file descriptors" in log or
                        "closing connections beyond" in log, log[-2000:])
        # One line per interval, not one per connection closed.
        self.assertLess(log.count("closing connections beyond"), 5, log[-2000:])


class FailLoudly(Base):
    """Rows 5-10: every failure says why."""

    def test_empty_dataset_is_an_error(self):
        os.makedirs(os.path.join(self.tmp, "d"))
        open(os.path.join(self.tmp, "d", "x.tfrecord"), "wb").close()
        p = subprocess.run([_support.EMLIOD, "--data",
                            os.path.join(self.tmp, "d"), "--bind",
                            "tcp://127.0.0.1:*"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("empty", p.stderr)

    def test_skip_starts_without_index(self):
        shards = self.dataset()
        name = sorted(f for f in os.listdir(shards)
                      if f.endswith(".tfrecord"))[0]
        path = os.path.join(shards, name)
        os.unlink(path + ".idx")
        with open(path, "r+b") as f:  # one data byte of the first record
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        d = self.daemon(shards, "--on-corrupt", "skip")
        r = fetch(d.endpoint, "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"skipped": 1', r.stdout)

    def test_full_disk_is_reported(self):
        d = self.daemon(self.dataset())
        for extra in ([], ["--state", os.path.join(self.tmp, "s")]):
            r = fetch(d.endpoint, "--ids", "/dev/full", *extra)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("cannot write '/dev/full': No space left on device",
                          r.stderr, extra)

    def test_resume_refuses_lost_or_cut_ids(self):
        d = self.daemon(self.dataset())
        state = os.path.join(self.tmp, "state")
        ids = os.path.join(self.tmp, "ids")
        r = fetch(d.endpoint, "--state", state, "--ids", ids, "--epochs", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        size = os.path.getsize(ids)
        os.truncate(ids, size // 2)
        r = fetch(d.endpoint, "--state", state, "--ids", ids, "--epochs", "2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("was cut to %d of the %d bytes" % (size // 2, size),
                      r.stderr)
        os.unlink(ids)
        r = fetch(d.endpoint, "--state", state, "--ids", ids, "--epochs", "2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is gone", r.stderr)
        with open(ids, "w") as f:  # same length, other contents
            f.write("x" * size)
        r = fetch(d.endpoint, "--state", state, "--ids", ids, "--epochs", "2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("contents changed", r.stderr)
        # Without --ids the resume goes on.
        r = fetch(d.endpoint, "--state", state, "--epochs", "2", "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"samples": 120,', r.stdout)

    def test_wrong_server_key_fails_fast(self):
        shards = self.dataset()
        keys = os.path.join(self.tmp, "keys")
        os.makedirs(keys)
        for name in ("server", "client", "other"):
            _support.run(EMLIO, "keygen", os.path.join(keys, name))
        d = self.daemon(shards, "--curve-secret",
                        os.path.join(keys, "server.key_secret"))
        t0 = time.monotonic()
        r = subprocess.run(
            [EMLIO, "fetch", "--connect", d.endpoint, "--batch", "16",
             "--server-key", os.path.join(keys, "other.key"),
             "--client-key", os.path.join(keys, "client.key_secret"),
             "--connect-timeout-ms", "30000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            timeout=60)
        took = time.monotonic() - t0
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("wrong server key", r.stderr)
        self.assertLess(took, 5.0, r.stderr)


class PythonLoader(Base):
    """Row 11: a kept batch and a dropped, unclosed Loader."""

    def test_dropped_loader_frees_without_cycle_collector(self):
        import gc
        import emlio
        d = self.daemon(self.dataset())

        def counts():
            return (len(os.listdir("/proc/self/fd")),
                    len(os.listdir("/proc/self/task")))

        kept = []
        gc.collect()
        gc.disable()
        try:
            before = counts()
            for _ in range(30):
                loader = emlio.Loader(d.endpoint, 16, epochs=1)
                it = iter(loader)
                kept.append(next(it).keep())
                del it, loader
            after = counts()
        finally:
            gc.enable()
        self.assertLess(after[0] - before[0], 20, (before, after))
        self.assertLess(after[1] - before[1], 10, (before, after))
        # The loader's close released the kept batches with it.
        self.assertTrue(all(b.released for b in kept))


if __name__ == "__main__":
    _support.main()
