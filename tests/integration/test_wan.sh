#!/usr/bin/env bash
# test_wan.sh - EMLIO over a real long path: emliod in this namespace, emlio
# fetch in another, joined by bench/delayline (TUN devices, kernel TCP end
# to end: windows, buffers and slow start act as on a WAN). Checks that the
# stream tuner opens streams on a window-limited 50 ms path and stays at two
# on a fast one, that --streams pins the number, that the window advice is
# printed, and that epochs overlapping (the next requested while the current
# arrives) still deliver every sample exactly once per epoch.
# Skipped, with the reason, where namespaces or TUN devices are not allowed.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

DELAYLINE=$B/bench/delayline
NS=emwan$$
if ! ip netns add "$NS" 2>/dev/null; then
    skip "network namespaces are not permitted here (ip netns add failed)"
    finish
    exit $?
fi
if [ ! -c /dev/net/tun ]; then
    ip netns del "$NS"
    skip "no /dev/net/tun: the delay line cannot run here"
    finish
    exit $?
fi
trap 'kill $DL 2>/dev/null; wait $DL 2>/dev/null; ip netns del $NS 2>/dev/null; cleanup' EXIT
# Private addresses and devices, so parallel runs and benchmarks coexist.
NEAR=10.79.$(($$ % 250)).1
FAR=10.79.$(($$ % 250)).2

# start_path ONE_WAY_MS: the delay line, up and addressed.
start_path() {
    [ -n "${DL:-}" ] && { kill "$DL" 2>/dev/null; wait "$DL" 2>/dev/null; }
    : >"$T/dl.out"
    "$DELAYLINE" --netns "$NS" --delay-ms "$1" --near-addr "$NEAR" \
        --far-addr "$FAR" --near-dev "wn$$" --far-dev "wf$$" \
        >"$T/dl.out" 2>"$T/dl.err" &
    DL=$!
    wait_for "$T/dl.out" ready 5 "$DL" && return 0
    cat "$T/dl.err"
    return 1
}

# fetch_far NAME ARGS...: emlio fetch inside the far namespace.
fetch_far() {
    local name=$1
    shift
    EMLIO_LOG_LEVEL=info ip netns exec "$NS" "$EMLIO" fetch --connect "$EP" \
        --batch 32 --quiet "$@" >"$T/$name.out" 2>"$T/$name.err"
}

check "dataset builds" make_dataset "$T" 1200 4 100000 32M
# The path first: the daemon binds the near address the delay line adds.
check "delay line starts (50 ms RTT)" start_path 25
: >"$T/d.out"
# --sndbuf kernel: autotuned 4 MiB send buffers, as on most hosts, even
# though the test runs as root (auto would force 32 MiB).
"$EMLIOD" --data "$T/shards" --bind "tcp://$NEAR:*" --sndbuf kernel \
    --log-level warn >"$T/d.out" 2>"$T/d.err" &
PIDS+=($!)
EP=$(listen_addr "$T/d.out" emliod "$!")
check "daemon listens on the near address" test -n "$EP"

# A window-limited path: 4 MiB / 50 ms = ~84 MB/s per stream.
fetch_far slow --epochs 4 --verify --ids "$T/slow.ids"
check "fetch over 50 ms succeeds" test $? -eq 0
check "every sample exactly once in each of 4 overlapping epochs" \
    grep -q '"verified": true' "$T/slow.out"
check "the ids list each epoch's 1200 samples once" test \
    "$(sort -u "$T/slow.ids" | wc -l),$(wc -l <"$T/slow.ids")" = 4800,4800
rtt=$(json_field "$T/slow.out" rtt_ms)
check "the RTT is measured (~50 ms: $rtt)" /usr/bin/python3 -c \
    "import sys; sys.exit(not 45 <= $rtt <= 80)"
streams=$(json_field "$T/slow.out" streams)
check "the tuner opened streams on a window-limited path ($streams > 2)" \
    test "$streams" -gt 2
check "per-stream rates are reported" /usr/bin/python3 -c "
import json; j = json.loads(open('$T/slow.out').read().splitlines()[-1])
assert len(j['stream_mb_per_s']) == j['streams'], j
assert j['limit'] in ('window', 'daemon', 'network', 'consumer', 'cpu'), j"
check "epoch lines carry the path" grep -q '"epoch": 3,.*"rtt_ms"' "$T/slow.out"

# The training side's Prometheus endpoint, scraped mid-run (from inside
# the far namespace, where fetch runs). The run is long and ended by SIGINT
# once scraped: since the first epoch's streams open during the handshake,
# 3 epochs here can end within a second, before any fixed wait for the
# tuner's first ticks. Two streams pinned, window-bound at 50 ms whatever
# the load; scraped until the tuner has named the window as the limit (its
# first ticks may say otherwise) or 8 s passed.
EMLIO_LOG_LEVEL=info timeout -s INT 20 ip netns exec "$NS" "$EMLIO" fetch \
    --connect "$EP" --batch 32 --quiet --epochs 100000 --streams 2 \
    --metrics 127.0.0.1:0 >"$T/scraped.out" 2>"$T/scraped.err" &
FPID=$!
addr=""
for _ in $(seq 1 200); do
    addr=$(sed -n 's|^emlio fetch: metrics on http://\(.*\)/metrics$|\1|p' \
        "$T/scraped.err")
    [ -n "$addr" ] && break
    sleep 0.05
done
for _ in $(seq 1 32); do
    sleep 0.25
    ip netns exec "$NS" /usr/bin/python3 -c "
import urllib.request, sys
print(urllib.request.urlopen('http://$addr/metrics', timeout=5).read().decode())" \
        >"$T/scrape.txt" 2>&1
    grep -q '^emlio_client_limit{limit="window"}' "$T/scrape.txt" && break
done
kill -INT $FPID 2>/dev/null
wait $FPID
check "fetch --metrics serves while it runs" grep -q '^emlio_client_streams ' "$T/scrape.txt"
check "metrics give the I/O threads in use (1 or 2)" awk '$1 == "emlio_client_io_threads" { found = 1; ok = $2 == 1 || $2 == 2 } END { exit !(found && ok) }' "$T/scrape.txt"
# At least the configured 50 ms; how much more depends on the load.
check "metrics give the RTT (>= 0.04 s)" awk '$1 == "emlio_client_rtt_seconds" { found = 1; ok = $2 >= 0.04 } END { exit !(found && ok) }' "$T/scrape.txt"
check "metrics give a rate per stream" grep -q '^emlio_client_stream_rate_bytes_per_second{daemon="tcp://' "$T/scrape.txt"
check "metrics name what limits" grep -q '^emlio_client_limit{limit="window"}' "$T/scrape.txt"
if command -v promtool >/dev/null; then
    check "promtool accepts the exposition" promtool check metrics <"$T/scrape.txt"
else
    skip "promtool is not installed: exposition not linted"
fi

# 6 epochs (~4 s), not 2: the advice waits for a tick that classes the
# path as window-bound, and under load (make test beside other work) the
# first ticks of a 1.4 s run could all say "cpu" (issue 34: failed once).
fetch_far pinned --epochs 6 --streams 2
check "--streams 2 pins the number on the same path" test \
    "$(json_field "$T/pinned.out" streams)" -eq 2
# Two streams at 8-32 MiB windows are window-bound at 50 ms whatever the
# load (the auto run starts with enough streams that a busy host may call
# it CPU-bound instead).
check "the window-limited path is reported with the sysctl to raise" \
    grep -q "window-limited.*net.ipv4.tcp_wmem" "$T/pinned.err"

# 30 ms, the issue's path: three overlapping epochs, each exactly once.
check "delay line restarts (30 ms RTT)" start_path 15
fetch_far thirty --epochs 3 --verify --ids "$T/thirty.ids"
check "3 overlapping epochs over 30 ms: every sample exactly once" \
    grep -q '"verified": true' "$T/thirty.out"
check "the 30 ms ids list 3 x 1200 distinct samples" test \
    "$(sort -u "$T/thirty.ids" | wc -l),$(wc -l <"$T/thirty.ids")" = 3600,3600

# A fast path (0.05 ms): the windows never limit; two streams stay.
check "delay line restarts (0.05 ms RTT)" start_path 0.025
fetch_far fast --epochs 3 --verify
check "fetch over 0.05 ms succeeds" grep -q '"verified": true' "$T/fast.out"
# Two a lane: a client whose ZeroMQ I/O thread runs full takes another
# and opens as many streams again on it (client_tune.c, s_spread_lanes),
# which a sanitized build on a busy host does for CPU, not for the path
# (1 run in 3 under ASan). The tuner itself adds none for the window.
lanes=$(sed -n 's/.*spreading over \([0-9]*\) of.*/\1/p' "$T/fast.err" | tail -n 1)
streams=$(json_field "$T/fast.out" streams)
check "the tuner stays at 2 streams a lane on a fast path ($streams on ${lanes:-1})" \
    test "$streams" -eq $((2 * ${lanes:-1}))
check "no window advice on a fast path" sh -c "! grep -q window-limited '$T/fast.err'"
finish
