#!/usr/bin/env bash
# test_blend_formats.sh - a blend of five sources in three formats (issue
# 33's quota target): TFRecord, tar and ImageFolder datasets of different
# sizes served by five daemons, weights from 1 to 50, two ranks, three
# epochs. Every epoch gives every source its exact share within one sample
# (computed here from sizes and weights, not read back from the planner),
# a subsampled source repeats nothing within an epoch, a repeated one
# shows each sample floor or ceil of its quota / size times, and the ranks'
# JSON quotas agree. Then a blend of four of them, weights 1:1:1:1, and
# the faults that must stop a blend before any sample is delivered: a
# source whose daemon is down, a saved state resumed against another
# dataset, against a source list with one source more or one less, and
# the states of one rank given twice.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

# Sizes 240 / 90 / 60 / 30 / 20 samples; a TFRecord, b tar, c and e
# ImageFolder trees, d TFRecord.
check "a: 240 samples as TFRecord" make_dataset "$T/a" 240 3 2000 100K
check "b: 90 samples as tar" sh -c '"$1" synth "$2/img" --samples 90 \
    --classes 3 --bytes 2000 --quiet >/dev/null &&
    "$1" pack "$2/img" "$2/wds" --to tar --shard-bytes 60K --quiet >/dev/null' \
    sh "$EMLIO" "$T/b"
check "c: 60 samples as an ImageFolder tree" "$EMLIO" synth "$T/c" \
    --samples 60 --classes 4 --bytes 2000 --quiet
check "d: 30 samples as TFRecord" make_dataset "$T/d" 30 2 2000 20K
check "e: 20 samples as an ImageFolder tree" "$EMLIO" synth "$T/e" \
    --samples 20 --classes 2 --bytes 2000 --quiet
check "b is read as tar" sh -c '"$1" inspect "$2" | grep -q "^format: *tar$"' \
    sh "$EMLIO" "$T/b/wds"
check "c is read as an ImageFolder" \
    sh -c '"$1" inspect "$2" | grep -q "^format: *imagefolder$"' sh "$EMLIO" "$T/c"
start_daemon da "$T/a/shards" && EPA=$EP
start_daemon db "$T/b/wds" && EPB=$EP
start_daemon dc "$T/c" && EPC=$EP
start_daemon dd "$T/d/shards" && EPD=$EP
start_daemon de "$T/e" && EPE=$EP

# blend TAG RANKS EPOCHS SOURCE...: every rank of a blend, at once (with
# the fetch options in $EXTRA).
blend() {
    local tag=$1 ranks=$2 epochs=$3
    shift 3
    local srcs=() pids=() rc=0
    for s in "$@"; do srcs+=(--source "$s"); done
    for ((r = 0; r < ranks; r++)); do
        "$EMLIO" fetch "${srcs[@]}" --batch 8 --world "$ranks" --rank $r \
            --epochs "$epochs" --seed 11 --verify --quiet \
            --ids "$T/$tag.ids.$r" ${EXTRA-} >"$T/$tag.out.$r" \
            2>"$T/$tag.err.$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ $rc -eq 0 ] || tail -n 3 "$T"/"$tag".err.*
    return $rc
}

# quotas_hold TAG EPOCHS NAME=SIZE@WEIGHT...: for every epoch and source,
# checks the count against SIZE_TOTAL x WEIGHT / WEIGHT_SUM within one,
# no repeat where the quota is below the size, floor/ceil repeats above
# it, and the ranks' JSON quotas equal to the count. Prints one line per
# violation (nothing when all hold).
quotas_hold() {
    local tag=$1 epochs=$2
    shift 2
    cat "$T"/"$tag".ids.* >"$T/$tag.all"
    python3 - "$T/$tag.all" "$epochs" "$@" "$T"/"$tag".out.* <<'EOF'
import collections, json, math, sys
ids, epochs = sys.argv[1], int(sys.argv[2])
specs = [a for a in sys.argv[3:] if "=" in a]
outs = [a for a in sys.argv[3:] if "=" not in a]
src = {}
for s in specs:
    name, rest = s.split("=")
    size, weight = rest.split("@")
    src[name] = (int(size), float(weight))
total = sum(s for s, _ in src.values())
wsum = sum(w for _, w in src.values())
seen = collections.defaultdict(collections.Counter)
for line in open(ids):
    f = line.split()
    if f[-1] == "pad":
        continue
    seen[(int(f[0]), f[1])][(f[2], f[3])] += 1
json_q = collections.defaultdict(int)
json_n = collections.defaultdict(int)
for o in outs:
    for line in open(o):
        d = json.loads(line)
        if "sources" in d and "epoch" in d:
            for name, v in d["sources"].items():
                json_q[(d["epoch"], name)] = v["quota"]
                json_n[(d["epoch"], name)] += v["samples"]
bad = []
for e in range(epochs):
    for name, (size, weight) in src.items():
        c = seen[(e, name)]
        n = sum(c.values())
        share = total * weight / wsum
        if abs(n - share) >= 1:
            bad.append("epoch %d %s: %d samples, share %.2f" % (e, name, n, share))
        if json_q[(e, name)] != n or json_n[(e, name)] != n:
            bad.append("epoch %d %s: JSON quota %d, samples %d, ids %d"
                       % (e, name, json_q[(e, name)], json_n[(e, name)], n))
        if n <= size and max(c.values(), default=1) > 1:
            bad.append("epoch %d %s: a subsampled source repeats" % (e, name))
        if n > size:
            lo, hi = n // size, -(-n // size)
            if len(c) != size or any(k < lo or k > hi for k in c.values()):
                bad.append("epoch %d %s: repeats outside %d..%d" % (e, name, lo, hi))
print("\n".join(bad))
EOF
}

# Five sources, 1:50 between the lightest and the heaviest: the epoch is
# 440 samples; b's share 440 x 50 / 60.5 = 363.6 is four times its size,
# a's 7.3 a thirtieth of it.
FIVE="a=240@1 b=90@50 c=60@2 d=30@5 e=20@2.5"
check "five sources, three formats, 2 ranks x 3 epochs verify" blend five 2 3 \
    "a=$EPA@1" "b=$EPB@50" "c=$EPC@2" "d=$EPD@5" "e=$EPE@2.5"
out=$(quotas_hold five 3 $FIVE)
check "every epoch: each source within one of its share${out:+: $out}" \
    test -z "$out"
a012=$(awk '$2 == "a" && $5 != "pad" {print $3, $4}' "$T"/five.ids.* | sort | uniq -d | wc -l)
check "a's 3 x 7 picks rotate: no sample twice in 3 epochs ($a012)" test "$a012" -eq 0
# In order, twice: the files are identical, line for line.
for tag in ord1 ord2; do
    EXTRA=--in-order check "in order, 2 ranks x 3 epochs ($tag)" blend $tag 2 3 \
        "a=$EPA@1" "b=$EPB@50" "c=$EPC@2" "d=$EPD@5" "e=$EPE@2.5"
done
check "the same seed gives the same ids (rank 0)" cmp -s "$T/ord1.ids.0" "$T/ord2.ids.0"
check "the same seed gives the same ids (rank 1)" cmp -s "$T/ord1.ids.1" "$T/ord2.ids.1"
check "  which out of order were the same samples" \
    cmp -s <(sort "$T"/five.ids.*) <(sort "$T"/ord1.ids.*)
formats=$(awk '$5 != "pad" {print $2}' "$T"/five.ids.* | sort -u | tr -d '\n')
check "every source delivered ($formats)" test "$formats" = abcde

check "four sources 1:1:1:1, one rank x 2 epochs verify" blend four 1 2 \
    "b=$EPB" "c=$EPC" "d=$EPD" "e=$EPE"
out=$(quotas_hold four 2 b=90@1 c=60@1 d=30@1 e=20@1)
check "  each source gets 50 an epoch${out:+: $out}" test -z "$out"

refused() { # refused TEXT ARGS...: fetch fails, saying TEXT, delivering nothing
    local want=$1
    shift
    rm -f "$T/bad.ids"
    "$EMLIO" fetch --batch 4 --epochs 2 --quiet --ids "$T/bad.ids" "$@" \
        >"$T/bad.out" 2>"$T/bad.err" && return 1
    grep -q -- "$want" "$T/bad.err" || { cat "$T/bad.err"; return 1; }
    [ ! -s "$T/bad.ids" ]
}

# A source whose daemon is down: named, nothing delivered.
down=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
check "a source whose daemon is down is refused, naming it" refused \
    "connection refused by 'tcp://127.0.0.1:$down'" --source "a=$EPA" --source "z=tcp://127.0.0.1:$down"

# Saved states against what they were not made with. One state per rank of
# a 2-rank run stopped after epoch 0.
mkdir -p "$T/st"
pids=()
for r in 0 1; do
    "$EMLIO" fetch --source "a=$EPA" --source "d=$EPD@2" --batch 8 --world 2 \
        --rank $r --epochs 1 --seed 3 --quiet --state "$T/st/r$r" \
        --ids "$T/st.ids.$r" >/dev/null 2>"$T/st.err.$r" &
    pids+=($!)
done
wait "${pids[@]}"
check "a 2-rank blend saved its states" test -s "$T/st/r0" -a -s "$T/st/r1"
check "they resume on one rank" "$EMLIO" fetch --source "a=$EPA" \
    --source "d=$EPD@2" --batch 16 --epochs 2 --seed 3 --quiet --verify \
    --resume-from "$T/st" --ids "$T/st.res.ids"
check "against another dataset for a source: refused, naming it" refused \
    "other data in source 'a'" --source "a=$EPB" --source "d=$EPD@2" \
    --batch 16 --seed 3 --resume-from "$T/st"
check "with a source more: refused, counting them" refused \
    "made with 2 sources, this run has 3" \
    --source "a=$EPA" --source "d=$EPD@2" --source "e=$EPE" --batch 16 \
    --seed 3 --resume-from "$T/st"
check "with a source less: refused, counting them" refused \
    "made with 2 sources, this run has 1" \
    --source "a=$EPA" --batch 16 --seed 3 --resume-from "$T/st"
check "with the sources renamed: refused" refused "another dataset or sources" \
    --source "x=$EPA" --source "d=$EPD@2" --batch 16 --seed 3 \
    --resume-from "$T/st"
cp "$T/st/r0" "$T/dup0"
cp "$T/st/r0" "$T/dup1"
check "one rank's state given twice: refused" refused "rank 0" \
    --source "a=$EPA" --source "d=$EPD@2" --batch 16 --seed 3 \
    --resume-from "$T/dup*"
finish
