#!/usr/bin/env bash
# test_relay.sh - `emlio-relay` against a Python echo server on loopback:
# integrity both ways, delay, rate cap, 64 concurrent connections, bad
# arguments, clean exit on SIGTERM. Run from the repo root with B=<build dir>.
# Ends with "N passed, N failed" and exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh
PY=/usr/bin/python3

cat >"$T/helper.py" <<'EOF'
import hashlib, random, socket, socketserver, statistics, sys, threading, time

def echo_server():
    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            s = self.request
            while True:
                b = s.recv(262144)
                if not b:
                    break
                s.sendall(b)
            s.shutdown(socket.SHUT_WR)
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    socketserver.ThreadingTCPServer.request_queue_size = 256
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    print("port %d" % srv.server_address[1], flush=True)
    srv.serve_forever()

def transfer(port, nbytes, seed):
    """Sends nbytes, half-closes, reads the echo to EOF. Returns
    (sha of sent, sha of received, seconds)."""
    data = random.Random(seed).randbytes(nbytes)
    s = socket.create_connection(("127.0.0.1", port))
    got = hashlib.sha256()
    t0 = time.monotonic()
    def send():
        view = memoryview(data)
        for off in range(0, nbytes, 1 << 20):
            s.sendall(view[off:off + (1 << 20)])
        s.shutdown(socket.SHUT_WR)
    th = threading.Thread(target=send)
    th.start()
    n = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got.update(b)
        n += len(b)
    th.join()
    s.close()
    return hashlib.sha256(data).hexdigest(), got.hexdigest(), n, time.monotonic() - t0

def main():
    mode = sys.argv[1]
    if mode == "server":
        echo_server()
    port = int(sys.argv[2])
    if mode == "checksum":
        want, got, n, secs = transfer(port, int(sys.argv[3]), 1)
        print("sent %s received %s bytes %d secs %.3f %s" %
              (want[:16], got[:16], n, secs, "MATCH" if want == got else "DIFFER"))
    elif mode == "pingpong":
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for i in range(11):
            msg = bytes([i]) * 64
            t0 = time.monotonic()
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                b = s.recv(64 - len(got))
                if not b:
                    raise SystemExit("eof")
                got += b
            rtts.append((time.monotonic() - t0) * 1e3)
            if got != msg:
                raise SystemExit("corrupt")
        s.close()
        print("median_ms %.3f min %.3f max %.3f" %
              (statistics.median(rtts[1:]), min(rtts[1:]), max(rtts[1:])))
    elif mode == "multi":
        nconn, nbytes = int(sys.argv[3]), int(sys.argv[4])
        results = [None] * nconn
        barrier = threading.Barrier(nconn)
        def one(i):
            try:
                barrier.wait()
                want, got, n, _ = transfer(port, nbytes, 100 + i)
                results[i] = want == got and n == nbytes
            except Exception as e:
                print("conn %d: %s" % (i, e), flush=True)
                results[i] = False
        ths = [threading.Thread(target=one, args=(i,)) for i in range(nconn)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        print("multi ok %d of %d" % (sum(1 for r in results if r), nconn))

main()
EOF

if [ ! -x "$EMLIO" ]; then
    echo "FAIL $EMLIO is not built"
    echo "0 passed, 1 failed"
    exit 1
fi

# Echo server on a port the kernel picks.
$PY "$T/helper.py" server >"$T/server.out" 2>&1 &
PIDS+=($!)
if ! wait_for "$T/server.out" '^port [0-9]+' 10; then
    fail "echo server did not start"
    echo "$PASSED passed, $FAILED failed"
    exit 1
fi
sport=$(sed -nE 's/^port ([0-9]+)/\1/p' "$T/server.out")

# start_relay NAME ARGS...: starts a relay, sets rport and rpid.
start_relay() {
    local name=$1
    shift
    "$EMLIO_RELAY" --listen 127.0.0.1:0 --connect "127.0.0.1:$sport" "$@" \
        >"$T/$name.out" 2>"$T/$name.err" &
    rpid=$!
    PIDS+=($rpid)
    rport=
    if wait_for "$T/$name.out" '^emlio-relay: listening on ' 10; then
        rport=$(sed -nE 's/^emlio-relay: listening on .*:([0-9]+)$/\1/p' \
            "$T/$name.out")
    fi
    [ -n "$rport" ]
}

# stop_relay: SIGTERM, then waits up to 5 s for a clean exit; returns its
# exit status (124 if it did not stop).
stop_relay() {
    kill -TERM "$rpid" 2>/dev/null
    local deadline=$((SECONDS + 5))
    while kill -0 "$rpid" 2>/dev/null && [ $SECONDS -le $deadline ]; do
        sleep 0.02
    done
    if kill -0 "$rpid" 2>/dev/null; then
        kill -KILL "$rpid"
        wait "$rpid" 2>/dev/null
        return 124
    fi
    wait "$rpid"
}

# (1) 50 MB echoed through a relay with a small delay: intact both ways,
# and the half-close travels both ways (the client reads to EOF).
if start_relay integrity --delay-ms 2; then
    out=$(timeout 60 $PY "$T/helper.py" checksum "$rport" 50000000 2>&1)
    if echo "$out" | grep -q 'bytes 50000000 .* MATCH'; then
        ok "50 MB intact both ways with EOF propagation ($out)"
    else
        fail "integrity: $out"
    fi
    stop_relay
    rc=$?
    if [ $rc -eq 0 ] && grep -q 'late p50' "$T/integrity.err"; then
        ok "SIGTERM exits 0 and prints stats: $(tail -n 1 "$T/integrity.err")"
    else
        fail "SIGTERM exit status $rc; stderr: $(cat "$T/integrity.err")"
    fi
else
    fail "relay did not report its port: $(cat "$T/integrity.err")"
fi

# (2) --delay-ms 20: ping-pong round trip at least 40 ms (no upper bound:
# how much longer depends on the machine's load, issue 20).
if start_relay delay --delay-ms 20; then
    out=$(timeout 30 $PY "$T/helper.py" pingpong "$rport" 2>&1)
    med=$(echo "$out" | sed -nE 's/^median_ms ([0-9.]+).*/\1/p')
    if [ -n "$med" ] && awk -v m="$med" 'BEGIN { exit !(m >= 40) }'; then
        ok "delay 20 ms: round trip $out"
    else
        fail "delay 20 ms: round trip $out"
    fi
    stop_relay
else
    fail "relay (delay) did not start: $(cat "$T/delay.err")"
fi

# (3) --rate-mbit 100: 25 MB each way takes at least ~1.8 s (2.0 nominal).
if start_relay rate --delay-ms 0 --rate-mbit 100; then
    out=$(timeout 60 $PY "$T/helper.py" checksum "$rport" 25000000 2>&1)
    secs=$(echo "$out" | sed -nE 's/.* secs ([0-9.]+) .*/\1/p')
    if echo "$out" | grep -q MATCH && [ -n "$secs" ] &&
        awk -v s="$secs" 'BEGIN { exit !(s >= 1.8) }'; then
        ok "rate 100 Mbit/s: 25 MB in $secs s"
    else
        fail "rate 100 Mbit/s: $out"
    fi
    stop_relay
else
    fail "relay (rate) did not start: $(cat "$T/rate.err")"
fi

# (4) 64 concurrent connections, 1 MB each, all intact.
if start_relay multi --delay-ms 5; then
    out=$(timeout 120 $PY "$T/helper.py" multi "$rport" 64 1000000 2>&1)
    if echo "$out" | grep -q '^multi ok 64 of 64'; then
        ok "64 concurrent connections intact"
    else
        fail "64 connections: $out"
    fi
    stop_relay
else
    fail "relay (multi) did not start: $(cat "$T/multi.err")"
fi

# (4b) the splice mode passes the same integrity and concurrency checks.
if start_relay splice --delay-ms 1 --mode splice; then
    out=$(timeout 60 $PY "$T/helper.py" checksum "$rport" 20000000 2>&1)
    out2=$(timeout 120 $PY "$T/helper.py" multi "$rport" 64 300000 2>&1)
    if echo "$out" | grep -q MATCH && echo "$out2" | grep -q '^multi ok 64 of 64'; then
        ok "splice mode: 20 MB and 64 connections intact"
    else
        fail "splice mode: $out / $out2"
    fi
    stop_relay
else
    fail "relay (splice) did not start: $(cat "$T/splice.err")"
fi

# (5) bad arguments: non-zero exit and a message naming the problem.
# expect_fail CODE PATTERN ARGS...
expect_fail() {
    local code=$1 pattern=$2
    shift 2
    local err rc
    err=$(timeout 10 "$EMLIO_RELAY" "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq "$code" ] && echo "$err" | grep -qE "$pattern"; then
        ok "relay $* -> exit $rc: $(echo "$err" | head -n 1)"
    else
        fail "relay $* -> exit $rc (want $code, /$pattern/): $err"
    fi
}
expect_fail 2 "cannot listen on '127.0.0.1:99999': invalid port" \
    --listen 127.0.0.1:99999 --connect 127.0.0.1:1 --delay-ms 1
expect_fail 2 "missing --connect" --listen 127.0.0.1:0 --delay-ms 1
expect_fail 2 "invalid --delay-ms 'abc'" \
    --listen 127.0.0.1:0 --connect 127.0.0.1:1 --delay-ms abc
expect_fail 2 "unknown option '--bogus'" --bogus
expect_fail 2 "cannot connect to 'nohost': expected HOST:PORT" \
    --listen 127.0.0.1:0 --connect nohost --delay-ms 1
expect_fail 1 "cannot listen on '127.0.0.1:$sport': Address already in use" \
    --listen "127.0.0.1:$sport" --connect 127.0.0.1:1 --delay-ms 1
if "$EMLIO_RELAY" --help | grep -q 'netem'; then
    ok "--help prints usage"
else
    fail "--help"
fi

finish
