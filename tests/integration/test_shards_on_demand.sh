#!/usr/bin/env bash
# test_shards_on_demand.sh - 3,000 TFRecord shards served under ulimit -n
# 256 (a budget of 128 open shards): a verified epoch with every sample
# exactly once, descriptors within the limit; a limit too small for any
# budget, or a --max-open-shards that does not fit under it, fails at start
# with a message saying what to raise, never "listening" then failing every
# read. The 100,000-shard run is bench/many_shards.sh.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

out=$(IDLE_S=2 DATA="$T/many" B="$B" bench/many_shards.sh 3000 256 2>&1)
echo "$out" | sed 's/^/  /'
json=$(echo "$out" | tail -n 1)
field() { echo "$json" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
check "3000 shards under ulimit -n 256: a verified epoch" \
    test "$(field fetch_rc)" = 0 -a "$(field verified | cut -d' ' -f1-2)" = "True 12000"
check "descriptors stay under the limit (peak $(field fds_peak))" \
    test "$(field fds_peak)" -lt 256 -a "$(field fds_after)" -lt 256
check "start-up names the shards and the open budget" \
    grep -q "3000 mapped shards, at most 128 open at once" <<<"$out"

# too_small NAME ULIMIT ARGS...: emliod must fail at start, not listen.
too_small() {
    local name=$1 limit=$2
    shift 2
    (
        ulimit -n "$limit" || exit 99
        exec "$EMLIOD" --data "$T/many" --bind 'tcp://127.0.0.1:*' "$@"
    ) >"$T/$name.out" 2>"$T/$name.err"
    local rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 99 ] && ! grep -q listening "$T/$name.out"
}
check "ulimit -n 80: emliod refuses to start" too_small low 80
check "... saying what to raise" grep -q "open-file limit of 80 leaves room.*at least 95" "$T/low.err"
check "--max-open-shards above the limit: refused at start" \
    too_small big 256 --max-open-shards 200
check "... naming the option" grep -q "max-open-shards 200 does not fit" "$T/big.err"

# Idle connections must not take the descriptors the shards' budget
# needs: 250 silent TCP connections under ulimit -n 256, then a verified
# epoch. The daemon closes the idlest beyond what the limit leaves beside
# the budget (before, every shard open failed: "Too many open files").
(
    ulimit -n 256 || exit 99
    exec "$EMLIOD" --data "$T/many" --bind 'tcp://127.0.0.1:*'
) >"$T/idle.out" 2>"$T/idle.err" &
DPID=$!
for _ in $(seq 100); do grep -q listening "$T/idle.out" && break; sleep 0.1; done
EP=$(sed -n 's/^emliod: listening on //p' "$T/idle.out")
/usr/bin/python3 - "${EP##*:}" <<'PY' &
import socket, sys, time
socks = []
for _ in range(250):
    try:
        socks.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2))
    except OSError:
        break
time.sleep(30)
PY
HOLDER=$!
sleep 2
"$EMLIO" fetch --connect "$EP" --batch 64 --verify --quiet --timeout-ms 20000 \
    >"$T/idle.json" 2>"$T/idlefetch.err"
FRC=$?
check "250 idle connections: a verified epoch still" test $FRC -eq 0
if [ $FRC -ne 0 ]; then # what the client and the daemon said, for the log
    tail -5 "$T/idlefetch.err" | sed 's/^/  fetch: /'
    tail -8 "$T/idle.err" | sed 's/^/  emliod: /'
fi
check "... the daemon said why it closed connections" \
    grep -q "the most the descriptor limit leaves beside the shards' budget" "$T/idle.err"
kill "$HOLDER" "$DPID" 2>/dev/null
wait 2>/dev/null

# Shards the daemon has not opened yet are costed as copies when a GET is
# admitted (only opening one tells whether it gets a read lease): a GET of
# 8 x 100 KB samples of one closed shard under --max-copy-bytes 600K was
# refused as "would copy 644808 bytes", though its shard, once open, is
# leased and nothing is copied. A closed shard is now charged as the shard
# cache's last lease went (granted here, as root).
if [ "$(id -u)" != 0 ]; then
    skip "not root: no read leases (CAP_LEASE), so closed shards copy"
else
    make_dataset "$T/closed" 200 2 100000 1M
    # The first start writes the dataset index; the second loads the
    # shards from it and opens them only when read (shards written in the
    # index's own second would be opened at load to be checked again).
    touch -d '-10 seconds' "$T"/closed/shards/*.tfrecord
    start_daemon closed0 "$T/closed/shards"
    kill "$DPID" 2>/dev/null
    wait 2>/dev/null
    start_daemon closed "$T/closed/shards" --max-copy-bytes 600K --max-open-shards 16
    "$EMLIO" fetch --connect "$EP" --batch 8 --shuffle none --epochs 2 --verify \
        --quiet >"$T/closed.json" 2>"$T/closed.fetch.err"
    rc=$?
    samples=$([ $rc -eq 0 ] && json_field "$T/closed.json" samples)
    check "GETs of closed, leasable shards under a tight copy budget are served" \
        test $rc -eq 0 -a "$samples" = 400
    grep -q "would copy" "$T/closed.fetch.err" && tail -2 "$T/closed.fetch.err" | sed 's/^/  fetch: /'
    kill "$DPID" 2>/dev/null
    wait 2>/dev/null
fi
finish
