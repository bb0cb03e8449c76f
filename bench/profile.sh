#!/bin/bash
# bench/profile.sh: where emliod and `emlio fetch` spend CPU (perf, cpu-clock).
#
# usage: bench/profile.sh [RTT_MS [EPOCHS [SHARDS_DIR]]]
#   RTT_MS 0 = loopback (default); otherwise an `emlio-relay --mode copy`
#   with --delay-ms RTT/2 sits in between (outside the profile).
# Writes build-bench/profile-rttR/{emliod,fetch}.{data,txt}: flat profiles
# (self time by DSO and by symbol). Needs linux-perf (apt-get install
# linux-perf); uses the software cpu-clock event (VMs have no PMU).
set -euo pipefail
cd "$(dirname "$0")/.."
RTT=${1:-0}
EPOCHS=${2:-20}
SHARDS=${3:-build-bench/bench-data/s1500-c10/shards}
BIN=build-bench/bin
OUT=build-bench/profile-rtt$RTT
command -v perf >/dev/null || { echo "profile.sh: installing linux-perf (apt-get)"; apt-get install -y linux-perf >/dev/null; }
[ -x $BIN/emliod ] || { echo "profile.sh: build first: make B=build-bench build-bench/bin/emlio build-bench/bin/emliod" >&2; exit 1; }
[ -d "$SHARDS" ] || { echo "profile.sh: no shards in $SHARDS (run bench/run --quick first)" >&2; exit 1; }
mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

perf record -q -e cpu-clock -F 2000 -o "$OUT/emliod.data" -- \
    $BIN/emliod --data "$SHARDS" --bind 'tcp://127.0.0.1:*' >"$OUT/emliod.out" 2>"$OUT/emliod.err" &
PIDS+=($!)
for _ in $(seq 100); do grep -q 'listening on' "$OUT/emliod.out" 2>/dev/null && break; sleep 0.1; done
EP=$(grep -o 'tcp://[0-9.]*:[0-9]*' "$OUT/emliod.out") || { echo "profile.sh: emliod did not start" >&2; exit 1; }
if [ "$RTT" != 0 ]; then
    D=$(python3 -c "print($RTT/2)")
    $BIN/emlio-relay --listen 127.0.0.1:0 --connect "${EP#tcp://}" --delay-ms "$D" --mode copy \
        >"$OUT/relay.out" 2>"$OUT/relay.err" &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q 'listening on' "$OUT/relay.out" 2>/dev/null && break; sleep 0.1; done
    EP=tcp://$(grep -o '127.0.0.1:[0-9]*' "$OUT/relay.out")
fi
perf record -q -e cpu-clock -F 2000 -o "$OUT/fetch.data" -- \
    $BIN/emlio fetch --connect "$EP" --batch 32 --epochs "$EPOCHS" --quiet | tail -1 | tee "$OUT/fetch.json"
cleanup
PIDS=()
for w in emliod fetch; do
    {
        echo "== $w: self time by DSO"
        perf report -i "$OUT/$w.data" --stdio --no-children --sort dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12 || true
        echo "== $w: self time by symbol"
        perf report -i "$OUT/$w.data" --stdio --no-children --sort dso,sym 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 || true
        echo "== $w: self time by thread"
        perf report -i "$OUT/$w.data" --stdio --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -10 || true
    } >"$OUT/$w.txt"
    cat "$OUT/$w.txt"
done
