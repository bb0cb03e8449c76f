#!/usr/bin/env bash
# test_share.sh - shared reads (issue 32, docs/fairness.md "Shared reads"):
# two jobs of different seeds that share read the dataset about once between
# them where two that do not read it twice; each still gets every sample
# exactly once, in an order that does not depend on who else runs; what
# came from another job's read is reported in fetch's JSON, the daemon's
# log and its per-job metrics; --share-all shares jobs that did not ask; a
# decoded job's tensors are the same bytes shared or alone. The targets on a
# cold dataset larger than memory are measured by bench/jobs.sh.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib.sh

# 1,200 records of ~40 KB in ~1 MB shards: ~48 MB, ~48 shards.
check "dataset builds" make_dataset "$T/ds" 1200 4 40000 1M
DATA="$T/ds/shards"
BYTES=$(du -sb "$DATA" | cut -f1)

# A cache that cannot fit beside the engine in the memory the daemon may
# use is refused at start, naming the option.
"$EMLIOD" --data "$DATA" --bind 'tcp://127.0.0.1:*' --io read \
    --share-bytes 100000G >"$T/big.out" 2>"$T/big.err"
check "--share-bytes beyond the memory is refused" test $? -ne 0
check "... naming the option and the limit" \
    grep -q -- "--share-bytes .* do not fit in 3/4 of the" "$T/big.err"

# --io read: the records come from the device, not from the mappings; a
# 32 MiB cache (the least) makes windows of 8 MiB: the dataset is ~6 of them.
start_daemon d "$DATA" --io read --share-bytes 32M --log-level info \
    --metrics 127.0.0.1:0 || exit 1
MURL=$(sed -n 's/^emliod: metrics on //p' "$T/d.out")
check "the daemon says it keeps a shared cache" \
    grep -q "share: up to 32 MiB of chunks" "$T/d.err"

fetch() { # fetch OUT ARGS...: one epoch, JSON in $T/OUT
    local out=$1
    shift
    "$EMLIO" fetch -c "$EP" --batch 32 --verify "$@" >"$T/$out" 2>"$T/$out.err"
}
BG=() # the fetches running in the background (the daemons are too)
field() { json_field "$T/$1" "$2"; }
# ratio A B: A / B to two places.
ratio() { /usr/bin/python3 -c "print(f'{$1 / $2:.2f}')"; }

# Two jobs that do not share: each reads the dataset from the device.
fetch a0.json --job lone-a --seed 1 &
BG+=($!)
fetch b0.json --job lone-b --seed 2
wait "${BG[@]}"
BG=()
for j in a0 b0; do
    check "unshared $j: verified" test "$(field $j.json verified)" = True
done
READ0=$(($(field a0.json disk_read_bytes) + $(field b0.json disk_read_bytes)))
check "two unshared jobs read the dataset twice ($(ratio $READ0 $BYTES)x)" \
    test "$READ0" -ge $((BYTES * 18 / 10))
check "... and say nothing came from another's read" \
    test "$(field a0.json shared_bytes)" -eq 0

# The same two, sharing: about once between them, each exactly once.
# (--share-join 0: both from the start, so that their orders can be
# compared with a run alone; a late job is tested below.)
fetch a.json --job share-a --seed 1 --share --share-join 0 --in-order \
    --ids "$T/a.ids" &
BG+=($!)
fetch b.json --job share-b --seed 2 --share --share-join 0 --in-order \
    --ids "$T/b.ids"
wait "${BG[@]}"
BG=()
for j in a b; do
    check "shared $j: verified, every sample once" \
        test "$(field $j.json verified)" = True
    check "shared $j: 1200 samples" test "$(field $j.json samples)" -eq 1200
done
READ=$(($(field a.json disk_read_bytes) + $(field b.json disk_read_bytes)))
SHARED=$(($(field a.json shared_bytes) + $(field b.json shared_bytes)))
check "two sharing jobs read the dataset about once ($(ratio $READ $BYTES)x)" \
    test "$READ" -le $((BYTES * 115 / 100))
check "... and about half of what they got came from the other's reads" \
    test "$SHARED" -ge $((BYTES * 6 / 10))
check "the two seeds' orders differ" bash -c "! cmp -s '$T/a.ids' '$T/b.ids'"
check "... over the same samples" bash -c \
    "cmp -s <(sort '$T/a.ids') <(sort '$T/b.ids')"

# A sharing job's order is its own: alone it is the same.
fetch solo.json --job share-a --seed 1 --share --share-join 0 --in-order \
    --ids "$T/solo.ids"
check "a sharing job's order does not depend on who else reads" \
    cmp -s "$T/a.ids" "$T/solo.ids"
check "alone, nothing of it came from another job" \
    test "$(field solo.json shared_bytes)" -eq 0

check "the daemon logs what a job got from others' reads" bash -c \
    "sleep 2.5; grep -q 'job share-a left after .* MB from others. shared reads' '$T/d.err'"
# Per-job metrics while two sharing jobs run.
fetch ma.json --job met-a --seed 7 --share --epochs 30 &
BG+=($!)
fetch mb.json --job met-b --seed 8 --share --epochs 30 &
BG+=($!)
sleep 1.5
curl -s "$MURL" >"$T/m.txt"
kill "${BG[@]}" 2>/dev/null
wait "${BG[@]}"
BG=()
check "metric emlio_job_shared_bytes_total per job" \
    grep -q '^emlio_job_shared_bytes_total{job="met-[ab]"} ' "$T/m.txt"

# A job that shares but reads in random order over the whole dataset (one
# window of every shard) would make the daemon read a chunk per record:
# it is caught and served with exact reads, and still gets every sample.
fetch rnd.json --job random --seed 9 --share --window-shards 100000
check "a sharing job in random order is served whole" \
    test "$(field rnd.json verified)" = True
check "... and the daemon stopped caching for it, saying why" \
    grep -q "job random: its shared reads loaded .* it is served with exact reads" "$T/d.err"
check "... having read less than 8x the dataset for it ($(ratio $(field rnd.json disk_read_bytes) $BYTES)x)" \
    test "$(field rnd.json disk_read_bytes)" -le $((BYTES * 8))

# Decoded on the daemon: the read is shared, the augmentation each job's
# own, byte for byte what the job gets alone.
XF='random_resized_crop(32),horizontal_flip'
fetch xa.json --job xf-a --seed 3 --share --share-join 0 --transform "$XF" --decode-at server \
    --in-order --digests --ids "$T/xa.ids" &
BG+=($!)
fetch xb.json --job xf-b --seed 4 --share --share-join 0 --transform "$XF" --decode-at server \
    --in-order --digests --ids "$T/xb.ids"
wait "${BG[@]}"
BG=()
fetch xs.json --job xf-a --seed 3 --share --share-join 0 --transform "$XF" --decode-at client \
    --in-order --digests --ids "$T/xs.ids"
check "decoded, shared: verified" test "$(field xa.json verified)" = True
check "decoded on the daemon while sharing = decoded alone on the client" \
    cmp -s "$T/xa.ids" "$T/xs.ids"
check "... and another seed's tensors differ" \
    bash -c "! cmp -s '$T/xa.ids' '$T/xb.ids'"
check "the decoded pair shared reads too" \
    test $(($(field xa.json shared_bytes) + $(field xb.json shared_bytes))) -gt 0

# A job that starts while another reads joins it where it is (docs/planner.md,
# "Joining"): its epoch 0 begins at the daemon's cursor, it reads what the
# other reads from its first batch, and still gets every sample once.
# --compute-s holds each batch as a trainer would, so that the early job is
# mid-epoch when the late one comes. The decoded jobs above left less than
# 2 s before: their cursor must not stand in for the early job's.
# The late job starts once the daemon has sent the early one half an epoch
# (its per-job metric of bytes sent, not of samples asked for, which runs
# ahead by the client's window: past the first of the epoch's 3 segments,
# its cursor is past 0), not after a fixed sleep: a loaded machine (CI, the
# sanitizers) can take longer than any sleep to get the early job going.
fetch early.json --job early --seed 11 --share --epochs 5 --compute-s 0.02 &
BG+=($!)
early_bytes() {
    curl -s "$MURL" | sed -n 's/^emlio_job_bytes_total{job="early"} //p'
}
for _ in $(seq 300); do
    test "$(early_bytes)" -ge $((BYTES / 2)) 2>/dev/null && break
    sleep 0.1
done
fetch late.json --job late --seed 12 --share --epochs 2 --compute-s 0.02 \
    --state "$T/late.state"
wait "${BG[@]}"
BG=()
JOIN=$(field late.json share_join)
check "a late job joins past the start (cursor $JOIN)" test "$JOIN" -gt 0
check "... the daemon logs where it joined" \
    grep -q "job late joins the shared schedule at cursor $JOIN " "$T/d.err"
check "... both verified, every sample once per epoch" \
    test "$(field early.json verified)$(field late.json verified)" = TrueTrue
check "... the early job started at 0" test "$(field early.json share_join)" -eq 0
LB=$(field late.json bytes)
LS=$(field late.json shared_bytes)
check "... the late job got $(ratio $LS $LB)x of its bytes from shared reads" \
    test "$LS" -ge $((LB * 3 / 10))
# fetch's last line is the run's: its shared and device bytes are the sums
# of the epochs' lines (they were the last epoch's, half of a 2-epoch run).
epoch_sums() { /usr/bin/python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ep = [l for l in lines if "epoch" in l]
print(len(ep), sum(l["shared_bytes"] for l in ep), sum(l["disk_read_bytes"] for l in ep))' "$1"; }
check "... its last line sums its 2 epochs' shared and device bytes" \
    test "$(epoch_sums "$T/late.json")" = "2 $LS $(field late.json disk_read_bytes)"
# Group pacing (docs/fairness.md, "Shared reads"): a sharing job two
# segments of the schedule ahead of another that is reading would evict
# the chunks that one still copies; its GETs past that wait (up to 250 ms
# each, one kept in flight), and the daemon logs the time. A slow job and
# a fast one: the fast one is paced, both still get every sample once; a
# job alone never is. The slow one keeps 2 batches in flight, so that its
# readers' cursor stays where it consumes (a deep window would have the
# daemon read its whole epoch ahead). They start 2.5 s
# after the jobs above, whose cursor a new job would otherwise join (the
# daemon keeps it 2 s), far from where the slow one reads.
sleep 2.5
fetch pslow.json --job pace-slow --seed 21 --share --epochs 3 --compute-s 0.03 \
    --inflight 2 &
BG+=($!)
for _ in $(seq 300); do
    curl -s "$MURL" | grep -q '^emlio_job_bytes_total{job="pace-slow"} [1-9]' && break
    sleep 0.1
done
fetch pfast.json --job pace-fast --seed 22 --share --epochs 3
wait "${BG[@]}"
BG=()
check "paced jobs: both verified, every sample once per epoch" \
    test "$(field pslow.json verified)$(field pfast.json verified)" = TrueTrue
paced() { # paced JOB: the seconds the daemon logged it paced
    sed -n "s/.*job $1 left after .*, \([0-9.]*\) s paced to its sharing group.*/\1/p" \
        "$T/d.err" | tail -1
}
fetch plone.json --job pace-lone --seed 23 --share
sleep 2.5 # a job is logged a second after it leaves
check "a job ahead of a slower sharing job is paced ($(paced pace-fast) s)" \
    /usr/bin/python3 -c "import sys; sys.exit(0 if float('$(paced pace-fast)' or 0) > 0 else 1)"
check "... a job alone never is ($(paced pace-lone) s)" test "$(paced pace-lone)" = 0.00

# Its resume state keeps the cursor: alone (nothing to join) it goes on
# from the saved one. (An epoch it finished leaves a state of the next.)
fetch resumed.json --job late --seed 12 --share --epochs 3 \
    --state "$T/late.state"
check "a resumed sharing job keeps its cursor, alone" \
    test "$(field resumed.json share_join)" -eq "$JOIN"
check "... verified" test "$(field resumed.json verified)" = True
# A cursor given is the order asked for, whoever else reads.
fetch at.json --job at --seed 12 --share --share-join 7 --epochs 1
check "--share-join 7: that cursor" test "$(field at.json share_join)" -eq 7
check "... verified" test "$(field at.json verified)" = True
"$EMLIO" fetch -c "$EP" --batch 32 --share --share-join -3 >/dev/null \
    2>"$T/badjoin.err"
check "a bad --share-join is refused" test $? -eq 2
check "... naming it" grep -q "invalid value '-3' for --share-join" \
    "$T/badjoin.err"

# --share-all: jobs that did not ask are planned and served as sharing.
start_daemon all "$DATA" --io read --share-bytes 32M --share-all || exit 1
fetch c.json --job all-a --seed 5 &
BG+=($!)
fetch d.json --job all-b --seed 6
wait "${BG[@]}"
BG=()
READ2=$(($(field c.json disk_read_bytes) + $(field d.json disk_read_bytes)))
check "--share-all: two jobs that did not ask read it about once ($(ratio $READ2 $BYTES)x)" \
    test "$READ2" -le $((BYTES * 115 / 100))
check "--share-all: both verified" \
    test "$(field c.json verified)$(field d.json verified)" = TrueTrue

# Mapped (the dataset fits): nothing to share but the page cache; --share
# is accepted and the job is served whole.
start_daemon map "$DATA" --io map || exit 1
fetch m.json --share --seed 1
check "--share against a mapped daemon: verified" \
    test "$(field m.json verified)" = True

finish
