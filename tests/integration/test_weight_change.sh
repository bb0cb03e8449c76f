#!/bin/bash
# test_weight_change.sh - the sources' weights changed in the middle of an
# epoch (docs/planner.md, "Weights changed mid-epoch"): an epoch of 400
# from sources a (600 samples) and b (300) begun at 1:1 on 2 ranks,
# interrupted (SIGINT: each rank saves --state), resumed at 1:3 on 1 rank,
# interrupted, and finished at 1:3 on 2 ranks. The union of the runs holds
# no sample twice and the new quotas exactly (a 100, b 300: all of b);
# a resume with other weights from one rank's state of several is refused.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

make_dataset "$T/a" 600 3 1K 64K || { fail "dataset a"; finish; exit 1; }
make_dataset "$T/b" 300 2 1K 64K || { fail "dataset b"; finish; exit 1; }
start_daemon da "$T/a/shards" && EPA=$EP
start_daemon db "$T/b/shards" && EPB=$EP

# fetch_rank RUN WORLD RANK WB [ARGS...]: one rank of one run (b's weight
# WB), in background; global batch 8.
fetch_rank() {
    local run=$1 world=$2 rank=$3 wb=$4
    shift 4
    "$EMLIO" fetch --source "a=$EPA" --source "b=$EPB@$wb" \
        --epoch-samples 400 --world "$world" --rank "$rank" \
        --batch $((8 / world)) --seed 5 --epochs 1 --quiet \
        --ids "$T/$run.$rank.ids" "$@" >"$T/$run.$rank.out" 2>"$T/$run.$rank.err" &
    RPIDS+=($!)
}

# interrupted RUN WORLD WB FROM: WORLD ranks at b's weight WB (resuming
# from FROM unless empty), each stopped by SIGINT after a few batches.
interrupted() {
    local run=$1 world=$2 wb=$3 from=$4 r
    mkdir -p "$T/$run"
    RPIDS=()
    for r in $(seq 0 $((world - 1))); do
        fetch_rank "$run" "$world" "$r" "$wb" --state "$T/$run/rank$r.state" \
            --compute-s 0.02 ${from:+--resume-from "$T/$from"}
    done
    interrupt_ranks "$run" $((8 / world)) 3 130
}

check "2 ranks begin the epoch at 1:1 and are interrupted" interrupted w1 2 1 ""
check "1 rank resumes it at 1:3 and is interrupted" interrupted w2 1 3 w1
RPIDS=()
for r in 0 1; do fetch_rank w3 2 "$r" 3 --resume-from "$T/w2" --verify; done
bad=0
for p in "${RPIDS[@]}"; do wait "$p" || bad=1; done
check "2 ranks finish it at 1:3 (--verify)" test $bad = 0

n1=$(cat "$T"/w1.*.ids | grep -vc ' pad$')
n2=$(cat "$T"/w2.*.ids | grep -vc ' pad$')
check "the first two runs delivered some each ($n1, $n2)" test "$n1" -gt 0 -a "$n2" -gt 0
a1=$(cat "$T"/w1.*.ids | awk '$2 == "a" && $5 != "pad"' | wc -l)
check "the 1:1 run delivered fewer of a than 1:3 gives it ($a1 < 100)" test "$a1" -lt 100
cat "$T"/w[123].*.ids | grep -v ' pad$' | awk '{print $2, $3, $4}' | sort >"$T/union"
total=$(wc -l <"$T/union")
dups=$(uniq -d "$T/union" | wc -l)
na=$(awk '$1 == "a"' "$T/union" | wc -l)
nb=$(awk '$1 == "b"' "$T/union" | wc -l)
check "the epoch holds 400 samples ($total)" test "$total" = 400
check "  none twice ($dups)" test "$dups" = 0
check "  a's new quota, 100 ($na)" test "$na" = 100
check "  b's new quota, 300: all of b ($nb)" test "$nb" = 300
q=$(cat "$T"/w3.0.out | python3 -c 'import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if "sources" in d:
        print(d["sources"]["a"]["quota"], d["sources"]["b"]["quota"])')
check "the epoch JSON gives the quotas after the change ($q)" test "$q" = "100 300"

# --- refusals ---
"$EMLIO" fetch --source "a=$EPA" --source "b=$EPB@2" --epoch-samples 400 \
    --world 2 --rank 0 --batch 4 --seed 5 --epochs 1 --quiet \
    --state "$T/w1/rank0.state" >/dev/null 2>"$T/one.err"
check "other weights from one rank's state of two are refused" test $? -ne 0
check "  naming --resume-from" grep -q "resume-from" "$T/one.err"
"$EMLIO" fetch --source "a=$EPA" --source "b=$EPB@2" --epoch-samples 50 \
    --batch 8 --seed 5 --epochs 1 --quiet --resume-from "$T/w2" \
    >/dev/null 2>"$T/small.err"
check "an epoch smaller than what was delivered is refused" test $? -ne 0
check "  saying so" grep -q "is less than the" "$T/small.err"
"$EMLIO" fetch --source "b=$EPB" --source "a=$EPA" --epoch-samples 400 \
    --batch 8 --seed 5 --epochs 1 --quiet --resume-from "$T/w2" \
    >/dev/null 2>"$T/order.err"
check "sources in another order are refused" grep -q "names, order" "$T/order.err"
finish
