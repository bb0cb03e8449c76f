#!/usr/bin/env bash
# test_multi.sh - several daemons and ranks: three daemons with disjoint
# shards of uneven sizes, four ranks, two epochs: every sample exactly once
# per epoch across ranks, equal batch counts, deterministic assignment,
# epochs in different orders; a replica is read once; a fetch interrupted
# by SIGINT and resumed from its state file completes the epoch exactly once.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

check "dataset builds" make_dataset "$T" 400 4 6000 200K
mapfile -t shards < <(ls "$T"/shards/*.tfrecord)
n=${#shards[@]}
check "enough shards ($n)" test "$n" -ge 8
mkdir -p "$T/d1" "$T/d2" "$T/d3" "$T/d4"
# Uneven split: 1 shard, 2 shards, the rest.
for i in "${!shards[@]}"; do
    if [ "$i" -eq 0 ]; then d=d1; elif [ "$i" -le 2 ]; then d=d2; else d=d3; fi
    cp "${shards[$i]}" "${shards[$i]}.idx" "$T/$d/"
done
start_daemon d1 "$T/d1" && EP1=$EP
start_daemon d2 "$T/d2" && EP2=$EP
start_daemon d3 "$T/d3" && EP3=$EP
EPS="$EP1,$EP2,$EP3"
all_records() { # the dataset as "SHARD RECORD" lines, sorted
    for f in "${shards[@]}"; do
        k=$(wc -l <"$f.idx")
        for ((i = 0; i < k; i++)); do echo "$(basename "$f") $i"; done
    done | sort
}
all_records >"$T/all"
total=$(wc -l <"$T/all")

run_ranks() { # run_ranks TAG EXTRA...: 4 ranks x 2 epochs in parallel
    local tag=$1
    shift
    local pids=()
    for r in 0 1 2 3; do
        "$EMLIO" fetch --connect "$EPS" --batch 9 --world 4 --rank $r \
            --epochs 2 --seed 42 --verify --quiet --ids "$T/$tag.ids.$r" "$@" \
            >"$T/$tag.out.$r" 2>"$T/$tag.err.$r" &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}
check "4 ranks x 2 epochs over 3 daemons verify" run_ranks a
for e in 0 1; do
    cat "$T"/a.ids.* | awk -v e=$e '$1 == e && $4 != "pad" {print $2, $3}' |
        sort >"$T/a.e$e"
    check "epoch $e: union of ranks is the dataset ($total)" cmp -s "$T/a.e$e" "$T/all"
done
b0=$(json_field "$T/a.out.0" batches)
same=1
for r in 1 2 3; do
    [ "$(json_field "$T/a.out.$r" batches)" = "$b0" ] || same=0
done
check "equal batch counts across ranks ($b0)" test $same -eq 1
# Same seed: identical assignment (compare sets per rank and epoch).
check "second run with the same seed" run_ranks b
det=1
for r in 0 1 2 3; do
    cmp -s <(sort "$T/a.ids.$r") <(sort "$T/b.ids.$r") || det=0
done
check "same seed gives identical assignments" test $det -eq 1
differ=0
for r in 0 1 2 3; do
    cmp -s <(awk '$1 == 0 {print $2, $3}' "$T/a.ids.$r" | sort) \
        <(awk '$1 == 1 {print $2, $3}' "$T/a.ids.$r" | sort) || differ=1
done
check "the two epochs differ" test $differ -eq 1

# emlio plan agrees with what the ranks received.
"$EMLIO" plan --connect "$EPS" --world 4 --batch 9 --seed 42 >"$T/plan.json"
check "emlio plan prints the plan" test $? -eq 0
/usr/bin/python3 - "$T/plan.json" "$T/a.ids.2" <<'PY' >"$T/plan.check"
import json, sys
plan = json.load(open(sys.argv[1]))
mine = sorted(f"{s[0]} {s[1]}" for b in plan["ranks"][2]["batches"] for s in b if not s[3])
got = sorted(" ".join(l.split()[1:3]) for l in open(sys.argv[2]) if l.split()[0] == "0" and not l.rstrip().endswith("pad"))
print("same" if mine == got else f"differ {len(mine)} {len(got)}")
PY
check "emlio plan matches rank 2's epoch 0" grep -q same "$T/plan.check"

# A replica: d4 holds a copy of d3's first shard; read once per epoch.
cp "$T"/d3/$(ls "$T/d3" | grep 'tfrecord$' | head -n 1)* "$T/d4/"
start_daemon d4 "$T/d4" && EP4=$EP
"$EMLIO" fetch --connect "$EPS,$EP4" --batch 16 --epochs 2 --verify --quiet \
    --ids "$T/rep.ids" >"$T/rep.out" 2>&1
check "replica: fetch verifies" test $? -eq 0
awk '$1 == 0 {print $2, $3}' "$T/rep.ids" | sort >"$T/rep.e0"
check "replica: each sample once" cmp -s "$T/rep.e0" "$T/all"

# Resume: interrupt a slowed-down fetch with SIGINT, resume from its state.
"$EMLIO_RELAY" --listen 127.0.0.1:0 --connect "${EP3#tcp://}" --delay-ms 15 \
    >"$T/relay.out" 2>"$T/relay.err" &
PIDS+=($!)
RELAY=$(listen_addr "$T/relay.out" emlio-relay)
check "relay starts" test -n "$RELAY"
d3total=$(cat "$T"/d3/*.idx | wc -l)
"$EMLIO" fetch --connect "tcp://$RELAY" --batch 4 --inflight 1 --streams 1 \
    --state "$T/state" --ids "$T/res.ids" --quiet >"$T/res1.out" 2>&1 &
fpid=$!
for _ in $(seq 1 200); do
    [ -f "$T/res.ids" ] && [ "$(wc -l <"$T/res.ids")" -ge 20 ] && break
    sleep 0.05
done
kill -INT $fpid
wait $fpid
rc=$?
check "interrupted fetch exits 130" test $rc -eq 130
first=$(wc -l <"$T/res.ids")
check "interrupted mid-epoch ($first of $d3total)" test "$first" -lt "$d3total"
check "state file written" test -s "$T/state"
# Resumed with another --ids: refused, naming the one it was saved with
# (issue 34: the message named the new file as the old one).
"$EMLIO" fetch --connect "$EP3" --batch 4 --state "$T/state" \
    --ids "$T/other.ids" --quiet >/dev/null 2>"$T/other.err"
check "resume with another --ids is refused" test $? -ne 0
check "  naming the ids file it was saved with" \
    grep -q "saved with --ids '$(realpath "$T/res.ids")', not '$T/other.ids'" \
    "$T/other.err" || cat "$T/other.err"
check "  and writing no new ids file" test ! -e "$T/other.ids"
"$EMLIO" fetch --connect "$EP3" --batch 4 --state "$T/state" \
    --ids "$T/res.ids" --verify --quiet >"$T/res2.out" 2>"$T/res2.err"
check "resumed fetch completes" test $? -eq 0 || cat "$T/res2.err"
check "  without saying there was nothing left" \
    test -z "$(grep "nothing left" "$T/res2.err")"
# A finished state run again: says so, delivers nothing, changes nothing.
cp "$T/res.ids" "$T/res.before"
"$EMLIO" fetch --connect "$EP3" --batch 4 --state "$T/state" \
    --ids "$T/res.ids" --quiet >"$T/res4.out" 2>"$T/res4.err"
check "a finished state run again exits 0" test $? -eq 0
check "  saying there is nothing left to fetch" \
    grep -q "nothing left to fetch: the resume state '$T/state'" "$T/res4.err"
check "  and leaving its ids file as it was" cmp -s "$T/res.ids" "$T/res.before"
awk '{print $2, $3}' "$T/res.ids" | sort >"$T/res.all"
cat "$T"/d3/*.idx >/dev/null
for f in "$T"/d3/*.tfrecord; do
    k=$(wc -l <"$f.idx")
    for ((i = 0; i < k; i++)); do echo "$(basename "$f") $i"; done
done | sort >"$T/d3.all"
check "resumed epoch: every sample exactly once" cmp -s "$T/res.all" "$T/d3.all"
"$EMLIO" fetch --connect "$EP3" --batch 5 --state "$T/state" --quiet \
    >/dev/null 2>"$T/res3.err"
check "state from another batch size is refused" grep -q "another" "$T/res3.err"
finish
