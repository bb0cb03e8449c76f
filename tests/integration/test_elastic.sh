#!/bin/bash
# test_elastic.sh - elastic resume with `emlio fetch --resume-from`: an
# epoch begun on 4 ranks, interrupted (SIGINT: each rank saves --state),
# resumed on 2 ranks, interrupted, finished on 3 (global batch 24 each
# time). The union of every run's --ids is the epoch's plan exactly once,
# and each rank's --in-order ids follow the uninterrupted run's global
# order. Bad sets of states are refused naming the file.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

make_dataset "$T/d" 2400 4 1K 64K || { fail "dataset"; finish; exit 1; }
start_daemon d "$T/d/shards" || { fail "daemon starts"; finish; exit 1; }

# fetch_rank RUN WORLD RANK [ARGS...]: one rank of one run, in background.
fetch_rank() {
    local run=$1 world=$2 rank=$3
    shift 3
    "$EMLIO" fetch --connect "$EP" --world "$world" --rank "$rank" \
        --batch $((24 / world)) --seed 9 --in-order --epochs 1 --quiet \
        --ids "$T/$run.$rank.ids" "$@" >"$T/$run.$rank.out" 2>"$T/$run.$rank.err" &
    RPIDS+=($!)
}

# interrupted RUN WORLD FROM: a run of WORLD ranks (resuming from FROM
# unless empty), each stopped with SIGINT once it delivered some batches.
interrupted() {
    local run=$1 world=$2 from=$3 r
    mkdir -p "$T/$run"
    RPIDS=()
    for r in $(seq 0 $((world - 1))); do
        fetch_rank "$run" "$world" "$r" --state "$T/$run/rank$r.state" \
            --compute-s 0.01 ${from:+--resume-from "$T/$from"}
    done
    # 130: stopped by the signal, its state saved (0: it finished first).
    interrupt_ranks "$run" $((24 / world)) 2 "130 0"
}

# The uninterrupted run: its ranks' ids, concatenated, are the global order.
RPIDS=()
for r in 0 1 2 3; do fetch_rank whole 4 "$r"; done
for p in "${RPIDS[@]}"; do wait "$p"; done
for r in 0 1 2 3; do grep -v ' pad$' "$T/whole.$r.ids"; done |
    awk '{print $2, $3}' >"$T/order"
check "the uninterrupted epoch holds every sample once" \
    test "$(sort -u "$T/order" | wc -l)" = 2400 -a "$(wc -l <"$T/order")" = 2400

check "4 ranks start and are interrupted" interrupted a 4 ""
check "every rank of the 4 saved a state" test "$(ls "$T/a" | wc -l)" = 4
check "2 ranks resume from the 4 and are interrupted" interrupted b 2 a
RPIDS=()
for r in 0 1 2; do fetch_rank c 3 "$r" --resume-from "$T/b" --verify; done
bad=0
for p in "${RPIDS[@]}"; do wait "$p" || bad=1; done
check "3 ranks resume from the 2 and finish the epoch (--verify)" test $bad = 0

cat "$T"/[abc].*.ids | grep -v ' pad$' | awk '{print $2, $3}' | sort >"$T/union"
check "the three runs delivered something each" \
    test -s "$T/a.0.ids" -a -s "$T/b.0.ids" -a -s "$T/c.0.ids"
check "the union of the three runs is the epoch exactly once" \
    cmp -s "$T/union" <(sort "$T/order")
# In order: each rank's samples are a subsequence of the global order.
in_global_order() {
    grep -v ' pad$' "$1" | awk '{print $2, $3}' | /usr/bin/python3 -c '
import sys
pos = {l: i for i, l in enumerate(open(sys.argv[1]).read().splitlines())}
seq = [pos[l] for l in sys.stdin.read().splitlines()]
sys.exit(0 if seq == sorted(seq) else 1)' "$T/order"
}
bad=0
for f in "$T"/[abc].*.ids; do in_global_order "$f" || { echo "$f"; bad=1; }; done
check "every rank of every run follows the global order (--in-order)" test $bad = 0

# --- refusals, naming the files ---
"$EMLIO" fetch --connect "$EP" --world 2 --rank 0 --batch 12 --seed 9 \
    --resume-from "$T/a/rank[012].state" --quiet >/dev/null 2>"$T/miss.err"
check "a rank missing is refused" test $? -ne 0
check "  saying which" grep -q "no resume state of rank 3 of the 4" "$T/miss.err"
check "  and listing the files" grep -q "rank2.state" "$T/miss.err"
"$EMLIO" fetch --connect "$EP" --world 2 --rank 0 --batch 10 --seed 9 \
    --resume-from "$T/a" --quiet >/dev/null 2>"$T/gb.err"
check "another global batch is refused" grep -q "global batch 4 x 6 = 24" "$T/gb.err"
"$EMLIO" fetch --connect "$EP" --world 2 --rank 0 --batch 12 --seed 10 \
    --resume-from "$T/a" --quiet >/dev/null 2>"$T/seed.err"
check "another seed is refused" grep -q "made with another seed" "$T/seed.err"
"$EMLIO" fetch --connect "$EP" --world 2 --rank 0 --batch 12 --seed 9 \
    --resume-from "$T/a" --state "$T/a/rank0.state" --quiet >/dev/null 2>"$T/own.err"
check "--state inside --resume-from is refused" grep -q "save this run's states elsewhere" "$T/own.err"
"$EMLIO" fetch --connect "$EP" --world 2 --rank 0 --batch 12 --seed 9 \
    --resume-from "$T/nothing-here" --quiet >/dev/null 2>"$T/none.err"
check "no state file is refused" grep -q "no state file there" "$T/none.err"
finish
