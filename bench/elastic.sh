#!/bin/bash
# elastic.sh - elastic resume at 10^6 samples (issue 33's target): an
# epoch of SHARDS x RECORDS raw 16-byte records (TFRecord, hard links of
# one shard) begun on 4 ranks and stopped by SIGINT, resumed on 2 and
# stopped, finished on 3 (global batch 192, --in-order). Prints each
# rank's time to its first batch (fetch's resume_s, reading and merging
# every state, plus first_batch_s), the state files' sizes, and
# checks that the union of every run's --ids is the uninterrupted epoch's
# plan exactly once (10^6 distinct ids, none repeated), that every rank of
# every run delivered a subsequence of an uninterrupted 4-rank run's global
# order (--in-order), and that every resumed rank reached its first batch
# in under 1 s (resume_s + first_batch_s); exits 1 when any fails.
#   bench/elastic.sh [SHARDS [RECORDS]]      (default 100 x 10000)
# WEIGHTS=1: the same with two sources of that size (two daemons), an
# epoch of 1.2 x one source, the weights changed from 1:1 (4 ranks) to
# 1:3 (2 ranks, then 3): the union has no sample twice and the new
# quotas exactly (docs/planner.md, "Weights changed mid-epoch").
set -u
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
EMLIO=$B/bin/emlio
SHARDS=${1:-100}
RECORDS=${2:-10000}
T=$(mktemp -d /tmp/emlio-elastic.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"' EXIT

# The framing is the shared pure-Python one, as in the tests.
PYTHONPATH=scripts /usr/bin/python3 - "$T/d" "$SHARDS" "$RECORDS" <<'PY' || exit 1
import os, struct, sys
from tfrecord_raw import frame
out, shards, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
parts = []
for r in range(records):
    parts.append(frame(struct.pack("<QQ", r, r * 2654435761 & 0xFFFFFFFFFFFFFFFF)))
os.makedirs(out)
first = os.path.join(out, "s00000.tfrecord")
with open(first, "wb") as f:
    f.write(b"".join(parts))
for s in range(1, shards):
    os.link(first, os.path.join(out, "s%05d.tfrecord" % s))
PY
N=$((SHARDS * RECORDS))

start() { # start DIR: an emliod over DIR, its endpoint in EP
    $B/bin/emliod --data "$1" --bind 'tcp://127.0.0.1:*' --log-level warn \
        >"$1.out" 2>"$1.err" &
    PIDS+=($!)
    EP=""
    for _ in $(seq 1 600); do
        EP=$(sed -n 's/^emliod: listening on //p' "$1.out")
        [ -n "$EP" ] && break
        sleep 0.05
    done
    [ -n "$EP" ] || { echo "emliod did not start"; cat "$1.err"; exit 1; }
}
start "$T/d"
# Sources: a second daemon over links to the same shards (another source
# all the same); WB is b's weight of the run.
WEIGHTS=${WEIGHTS:-0}
if [ "$WEIGHTS" = 1 ]; then
    EPA=$EP
    mkdir "$T/e"
    for f in "$T"/d/*.tfrecord; do ln "$f" "$T/e/"; done
    start "$T/e"
    EPB=$EP
fi
WB=1
connect() {
    if [ "$WEIGHTS" = 1 ]; then
        echo --source "a=$EPA" --source "b=$EPB@$WB" --epoch-samples $((N * 6 / 5))
    else
        echo --connect "$EP"
    fi
}

run() { # run NAME WORLD STOP_AFTER_S [ARGS...]: one run, all its ranks
    local name=$1 world=$2 stop=$3 r
    shift 3
    mkdir -p "$T/$name"
    local rp=()
    for r in $(seq 0 $((world - 1))); do
        # shellcheck disable=SC2046
        "$EMLIO" fetch $(connect) --world "$world" --rank "$r" \
            --batch $((192 / world)) --seed 9 --in-order --epochs 1 --quiet \
            --state "$T/$name/rank$r.state" --ids "$T/$name.$r.ids" "$@" \
            >"$T/$name.$r.out" 2>"$T/$name.$r.err" &
        rp+=($!)
    done
    if [ "$stop" != 0 ]; then
        sleep "$stop"
        kill -INT "${rp[@]}" 2>/dev/null
    fi
    for p in "${rp[@]}"; do wait "$p"; done
    local lines first
    lines=$(cat "$T/$name".*.ids | wc -l)
    printf '%-5s %d ranks: %8d samples' "$name" "$world" "$lines"
    for r in $(seq 0 $((world - 1))); do
        first=$(tail -n 1 "$T/$name.$r.out" | /usr/bin/python3 -c \
            'import json,sys; d=json.loads(sys.stdin.read()); print(round(d["resume_s"] + d["first_batch_s"], 3))' 2>/dev/null)
        printf ', rank %d resume+first batch %s s' "$r" "$first"
        echo "$name $r ${first:-none}" >>"$T/firsts"
    done
    printf ', states %s bytes\n' "$(cat "$T/$name"/*.state | wc -c)"
}

# slow_starts RUN...: the ranks of the resumed RUNs whose resume and first
# batch took 1 s or more (or that printed none), one line each.
slow_starts() {
    local run
    for run in "$@"; do
        awk -v r="$run" '$1 == r && ($3 == "none" || $3 + 0 >= 1)' "$T/firsts"
    done
}

# out_of_order KEYS RUN...: the ids files of RUN whose samples (KEYS: the
# awk fields naming a sample) are not a subsequence of the uninterrupted
# run's global order, one name each.
out_of_order() {
    local keys=$1 f
    shift
    for f in $(for run in "$@"; do ls "$T/$run".*.ids; done); do
        grep -v ' pad$' "$f" | awk "{print $keys}" | /usr/bin/python3 -c '
import sys
pos = {l: i for i, l in enumerate(open(sys.argv[1]).read().splitlines())}
seq = [pos.get(l, -1) for l in sys.stdin.read().splitlines()]
sys.exit(0 if -1 not in seq and seq == sorted(seq) else 1)' "$T/order" || echo "$f"
    done
}

# global_order KEYS: the uninterrupted run's global sequence in $T/order:
# its 4 ranks' batches taken in turn (rank r holds every global batch's
# r-th quarter), each rank's ids in its order.
global_order() {
    /usr/bin/python3 - "$1" "$T"/whole.[0-3].ids >"$T/order" <<'PY'
import sys
keys = [int(k.strip("$")) - 1 for k in sys.argv[1].split(",")]
ranks = []
for path in sys.argv[2:]:
    rows = [l.split() for l in open(path) if not l.rstrip().endswith(" pad")]
    ranks.append([" ".join(r[k] for k in keys) for r in rows])
# Contiguous slices: rank r holds global positions [r * n / 4, ...).
for seq in ranks:
    print("\n".join(seq))
PY
}

if [ "$WEIGHTS" = 1 ]; then
    E=$((N * 6 / 5))
    echo "epoch of $E samples from sources a and b of $N each; global batch 192"
    run a 4 1.0
    WB=3
    run b 2 1.0 --resume-from "$T/a"
    run c 3 0 --resume-from "$T/b" --verify
    cat "$T"/[abc].*.ids | grep -v ' pad$' | awk '{print $2, $3, $4}' | sort >"$T/union"
    dups=$(uniq -d "$T/union" | wc -l)
    na=$(grep -c '^a ' "$T/union")
    nb=$(grep -c '^b ' "$T/union")
    slow=$(slow_starts b c)
    echo "union: $(wc -l <"$T/union") samples, $dups repeated; a $na (quota $((E / 4))), b $nb (quota $((E * 3 / 4)))"
    echo "resumed ranks at 1 s or more to their first batch: ${slow:-none}"
    [ "$dups" = 0 ] && [ "$na" = $((E / 4)) ] && [ "$nb" = $((E * 3 / 4)) ] &&
        [ -z "$slow" ]
    exit
fi
echo "epoch of $N samples, $SHARDS shards; global batch 192"
run whole 4 0
global_order '$2,$3'
run a 4 1.0
run b 2 1.0 --resume-from "$T/a"
run c 3 0 --resume-from "$T/b" --verify
cat "$T"/[abc].*.ids | grep -v ' pad$' | awk '{print $2, $3}' | sort >"$T/union"
dups=$(uniq -d "$T/union" | wc -l)
distinct=$(uniq "$T/union" | wc -l)
same=$(cmp -s "$T/union" <(sort "$T/order") && echo yes || echo no)
disorder=$(out_of_order '$2, $3' a b c)
slow=$(slow_starts b c)
echo "union: $(wc -l <"$T/union") samples, $distinct distinct, $dups repeated (epoch: $N); the uninterrupted run's samples: $same"
echo "ranks out of the uninterrupted global order: ${disorder:-none}"
echo "resumed ranks at 1 s or more to their first batch: ${slow:-none}"
[ "$distinct" = "$N" ] && [ "$dups" = 0 ] && [ "$same" = yes ] &&
    [ -z "$disorder" ] && [ -z "$slow" ]
