#!/bin/bash
# bench/small_soak.sh: issue 18's "0 failures" target. Runs `emlio fetch
# --verify` with default flags over loopback, N times per (dataset, batch),
# against one emliod per dataset, and counts the fetches that fail.
#
# usage: bench/small_soak.sh BUILD "DATASETS" "BATCHES" N [EPOCHS]
#   BUILD: a build directory with bin/emliod and bin/emlio.
#   DATASETS: TFRecord directories, e.g. of 512 B and 4 KB samples made by
#   `emlio gen` (bench/sample_cost.sh makes them).
#   BATCHES: e.g. "16 64 256 1024". N: fetches per pair. EPOCHS: 2.
# Prints one line per pair (runs, failures, samples/s range) and the first
# lines of every failure's stderr; exits 1 when any fetch failed.
set -uo pipefail
B=$1 DATASETS=$2 BATCHES=$3 N=$4 EPOCHS=${5:-2}
PY=/usr/bin/python3
fails=0 runs=0
for data in $DATASETS; do
    tmp=$(mktemp -d) port=$((20000 + RANDOM % 20000))
    "$B/bin/emliod" --data "$data" --bind "tcp://127.0.0.1:$port" >"$tmp/d" 2>&1 &
    sp=$!
    for _ in $(seq 100); do grep -q listening "$tmp/d" && break; sleep 0.1; done
    grep -q listening "$tmp/d" || { echo "small_soak: emliod did not start on $data" >&2; cat "$tmp/d" >&2; exit 1; }
    for batch in $BATCHES; do
        rates=() f=0
        for i in $(seq "$N"); do
            runs=$((runs + 1))
            if "$B/bin/emlio" fetch --connect "tcp://127.0.0.1:$port" --batch "$batch" \
                --epochs "$EPOCHS" --verify --quiet >"$tmp/j" 2>"$tmp/e"; then
                rates+=("$($PY -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["samples_per_s"])' "$tmp/j")")
            else
                f=$((f + 1)) fails=$((fails + 1))
                echo "small_soak: FAILED $data batch $batch run $i:" >&2
                head -5 "$tmp/e" >&2
            fi
        done
        $PY - "$data" "$batch" "$N" "$f" "${rates[@]}" <<'PYEOF'
import sys
data, batch, n, f = sys.argv[1:5]
r = [float(x) for x in sys.argv[5:]]
span = "%.0f-%.0f samples/s" % (min(r), max(r)) if r else "-"
print("%-30s batch %-5s runs %-3s failures %-3s %s" % (data, batch, n, f, span))
PYEOF
    done
    kill $sp; wait $sp 2>/dev/null
    rm -rf "$tmp"
done
echo "small_soak: $runs fetches, $fails failed"
[ "$fails" = 0 ]
