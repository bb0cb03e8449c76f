#!/usr/bin/env bash
# test_sources.sh - a job blended from two sources (docs/planner.md,
# "Sources"): two daemons with different datasets whose shards have the
# same names, weights 1:3, two ranks: every epoch holds each source's quota
# exactly, the small source repeated whole and the large one subsampled
# without repeats, --ids says the source of every sample, --stratify puts
# each source's share in every batch, the same seed gives the same ids, and
# bad sources are refused before any sample is delivered.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

check "source a builds (300 samples)" make_dataset "$T/a" 300 3 3000 200K
check "source b builds (60 samples)" make_dataset "$T/b" 60 2 3000 200K
start_daemon da "$T/a/shards" && EPA=$EP
start_daemon db "$T/b/shards" && EPB=$EP
# Both sources' shards have the same names: they are distinct all the same.
same=$(comm -12 <(ls "$T/a/shards" | grep -v idx) <(ls "$T/b/shards" | grep -v idx) | wc -l)
check "the two datasets share shard names ($same)" test "$same" -ge 1

run_ranks() { # run_ranks TAG EXTRA...: 2 ranks x 2 epochs
    local tag=$1
    shift
    local pids=()
    for r in 0 1; do
        "$EMLIO" fetch --source "a=$EPA" --source "b=$EPB@3" --batch 8 \
            --world 2 --rank $r --epochs 2 --seed 7 --verify --quiet \
            --ids "$T/$tag.ids.$r" "$@" >"$T/$tag.out.$r" 2>"$T/$tag.err.$r" &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}
check "2 ranks x 2 epochs over two sources verify" run_ranks w --in-order
# Epoch of 360 (300 + 60): a gets 90, b 270.
for e in 0 1; do
    cat "$T"/w.ids.* | awk -v e=$e '$1 == e && $5 != "pad"' >"$T/w.e$e"
    na=$(awk '$2 == "a"' "$T/w.e$e" | wc -l)
    nb=$(awk '$2 == "b"' "$T/w.e$e" | wc -l)
    check "epoch $e: source a has its quota of 90 ($na)" test "$na" -eq 90
    check "epoch $e: source b has its quota of 270 ($nb)" test "$nb" -eq 270
    ra=$(awk '$2 == "a" {print $3, $4}' "$T/w.e$e" | sort | uniq -d | wc -l)
    check "epoch $e: a (subsampled) repeats no sample ($ra)" test "$ra" -eq 0
    # b: 270 of 60 is 4.5x: every sample 4 or 5 times.
    bad=$(awk '$2 == "b" {print $3, $4}' "$T/w.e$e" | sort | uniq -c |
        awk '$1 < 4 || $1 > 5' | wc -l)
    nbu=$(awk '$2 == "b" {print $3, $4}' "$T/w.e$e" | sort -u | wc -l)
    check "epoch $e: b (repeated) has all 60 samples ($nbu)" test "$nbu" -eq 60
    check "epoch $e: each 4 or 5 times ($bad otherwise)" test "$bad" -eq 0
done
# fetch's epoch JSON: each rank's samples of each source, and the quota.
ja=$(cat "$T"/w.out.* | python3 -c 'import json,sys
t = 0
for line in sys.stdin:
    d = json.loads(line)
    if d.get("epoch") == 0 and "sources" in d:
        assert d["sources"]["a"]["quota"] == 90 and d["sources"]["b"]["quota"] == 270
        t += d["sources"]["a"]["samples"]
print(t)')
check "epoch JSON: the ranks' samples of a add up to its quota ($ja)" test "$ja" = 90
# a's two epochs take different samples (the selection rotates).
a01=$(cat "$T/w.e0" "$T/w.e1" | awk '$2 == "a" {print $3, $4}' | sort | uniq -d | wc -l)
check "a's two epochs take 180 different samples ($a01 twice)" test "$a01" -eq 0

check "the same seed again" run_ranks w2 --in-order
check "gives the same ids, rank 0" cmp -s "$T/w.ids.0" "$T/w2.ids.0"
check "gives the same ids, rank 1" cmp -s "$T/w.ids.1" "$T/w2.ids.1"

# Stratified, one rank, batch 12: a's share of a batch is 12 x 90 / 360 = 3.
check "stratified fetch" "$EMLIO" fetch --source "a=$EPA" --source "b=$EPB@3" \
    --batch 12 --epochs 1 --stratify --verify --quiet --ids "$T/s.ids"
bad=$(awk '{n[int((NR - 1) / 12)] += ($2 == "a")} END {for (b in n) if (n[b] != 3) print b}' "$T/s.ids" | wc -l)
lines=$(wc -l <"$T/s.ids")
check "stratified: 360 samples ($lines)" test "$lines" -eq 360
check "stratified: every batch holds 3 of a and 9 of b ($bad batches not)" test "$bad" -eq 0

# --sources FILE: the same blend from a JSON list gives the same ids.
printf '[{"name": "a", "endpoints": ["%s"]},\n {"name": "b", "endpoints": "%s", "weight": 3}]\n' \
    "$EPA" "$EPB" >"$T/src.json"
check "--sources FILE fetch" "$EMLIO" fetch --sources "$T/src.json" --batch 8 \
    --world 2 --rank 0 --epochs 2 --seed 7 --verify --quiet --in-order \
    --ids "$T/f.ids"
check "gives the ids --source gave" cmp -s "$T/f.ids" "$T/w.ids.0"
# b's 60 samples exactly 100 times in an epoch of 160: samples, not weight.
printf '[{"name": "a", "endpoints": "%s", "weight": 2}, {"name": "b", "endpoints": "%s", "samples": 100}]' \
    "$EPA" "$EPB" >"$T/n.json"
check "--sources with an exact count" "$EMLIO" fetch --sources "$T/n.json" \
    --batch 8 --epochs 1 --epoch-samples 160 --verify --quiet --ids "$T/n.ids"
nb=$(awk '$2 == "b"' "$T/n.ids" | wc -l)
check "the source with samples 100 got 100 ($nb)" test "$nb" -eq 100

# A resume state records the weights: after a saved epoch 0, another
# weight resumes at epoch 1 with its quotas (1:2 of 360: a 120, b 240);
# the same blend resumes too (test_weight_change.sh: in mid-epoch).
check "a blend saves its state" "$EMLIO" fetch --source "a=$EPA" \
    --source "b=$EPB@3" --batch 8 --epochs 1 --quiet --state "$T/st" \
    --ids "$T/st.ids"
cp "$T/st" "$T/st2"
check "another weight resumes" "$EMLIO" fetch --source "a=$EPA" \
    --source "b=$EPB@2" --batch 8 --epochs 2 --quiet --state "$T/st2" \
    --verify >"$T/st2.out"
n1a=$(python3 -c 'import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("epoch") == 1:
        print(d["sources"]["a"]["samples"])' "$T/st2.out")
check "  with epoch 1 at the new quota of a, 120 ($n1a)" test "$n1a" = 120
check "the same blend resumes" "$EMLIO" fetch --source "a=$EPA" \
    --source "b=$EPB@3" --batch 8 --epochs 2 --quiet --state "$T/st" \
    --ids "$T/st.ids" --verify
n1=$(awk '$1 == 1' "$T/st.ids" | wc -l)
check "  and delivers epoch 1 whole ($n1)" test "$n1" -eq 360

refused() { # refused TEXT ARGS...: fetch fails, saying TEXT, delivering nothing
    local want=$1
    shift
    "$EMLIO" fetch --batch 4 --epochs 1 --quiet --ids "$T/bad.ids" "$@" \
        >"$T/bad.out" 2>"$T/bad.err" && return 1
    grep -q -- "$want" "$T/bad.err" || { cat "$T/bad.err"; return 1; }
    [ ! -s "$T/bad.ids" ]
}
check "a weight of 0 is refused" refused "positive, finite" --source "a=$EPA@0"
check "a weight of nan is refused" refused "positive, finite" --source "a=$EPA@nan"
check "two sources of one name are refused" refused "two sources are named 'a'" \
    --source "a=$EPA" --source "a=$EPB"
check "one daemon in two sources is refused" refused "both name daemon" \
    --source "a=$EPA" --source "b=$EPA"
check "--source with --connect is refused" refused "not both" \
    --source "a=$EPA" --connect "$EPB"
check "--stratify without sources is refused" refused "need sources" \
    --connect "$EPA" --stratify
check "a name that is not printable ASCII is refused" refused "printable ASCII" \
    --source "$(printf 'caf\303\251')=$EPA"
check "a source without daemons is refused" refused "NAME=EP" --source "a="
for bad in '[{"name": "a", "endpoints": "EP", "weight": -1}]|not positive' \
    '[{"name": "a", "endpoints": "EP", "colour": 1}]|unknown key' \
    '[{"name": "a", "name": "b", "endpoints": "EP"}]|given twice' \
    '[{"name": "a"}]|needs a name and endpoints' \
    '[{"name": "a", "endpoints": "EP"}] x|bytes after' \
    '[{"name": "a", "endpoints": "EP", "samples": 2.5}]|whole number' \
    '[{"name": "a", "endpoints": "EP", "weight": 1, "samples": 5}]|not both' \
    '[{"name": "a", "endpoints": "EP", "weight": 0x10}]|JSON number' \
    '[{"name": "a", "endpoints": "EP", "weight": +1}]|JSON number' \
    '[]|no source' '{"name": "a"}|expected' '[{"name": "a\u00e9", "endpoints": "EP"}]|ASCII'; do
    text=${bad%%|*}
    text=${text//EP/$EPA}
    want=${bad##*|}
    printf '%s' "$text" >"$T/bad.json"
    check "--sources refuses: $want" refused "$want" --sources "$T/bad.json"
done
check "--sources names the file and line" refused "bad.json:1:" --sources "$T/bad.json"
check "--sources and --source together are refused" refused "not both" \
    --sources "$T/src.json" --source "a=$EPA"
check "a missing --sources file is refused" refused "cannot open" \
    --sources "$T/none.json"
finish
