#!/usr/bin/env bash
# test_jobs.sh - training jobs at the daemon (issue 32, docs/fairness.md):
# names and weights from HELLO, the policy's cap, bad names and too many
# jobs refused clearly, per-job metrics, every rank of one job counted as
# one, and exactly-once delivery for jobs served side by side under both
# schedules. Shares themselves are measured by bench/fairness.sh.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib.sh

check "dataset builds" make_dataset "$T/ds" 600 4 20000 1M
DATA="$T/ds/shards"

# The policy is checked at start.
for bad in 'x=0' 'x=1001' 'x' '=3' 'x=1,,y=2' "$(printf 'a\tb=2')"; do
    "$EMLIOD" --data "$DATA" --bind 'tcp://127.0.0.1:*' --job-weight "$bad" \
        >"$T/bad.out" 2>"$T/bad.err"
    rc=$?
    check "--job-weight '$bad' refused (exit $rc)" test "$rc" -ne 0
    check "--job-weight '$bad': the error names the option" \
        grep -q -- "--job-weight" "$T/bad.err"
done
"$EMLIOD" --data "$DATA" --bind 'tcp://127.0.0.1:*' --schedule lottery \
    >"$T/bad.out" 2>"$T/bad.err"
check "--schedule lottery refused" test $? -ne 0

start_daemon d "$DATA" --job-weight 'capped=3,*=2' --log-level info || exit 1

fetch() { # fetch OUT ARGS...: one epoch, JSON in $T/OUT
    local out=$1
    shift
    "$EMLIO" fetch -c "$EP" --batch 32 "$@" >"$T/$out" 2>"$T/$out.err"
}

# Bad names: refused at HELLO with the reason, nothing served.
long=$(printf 'j%.0s' $(seq 65))
fetch long.json --job "$long"
check "a 65-byte job name fails the fetch" test $? -ne 0
check "... saying why" grep -q "bad job name: want 1..64 printable bytes, got 65" \
    "$T/long.json.err"
fetch ctl.json --job "$(printf 'a\tb')"
check "a job name with a control byte fails the fetch" test $? -ne 0
check "... saying why" grep -q "with a control or non-ASCII byte" "$T/ctl.json.err"
fetch ok64.json --job "$(printf 'k%.0s' $(seq 64))"
check "a 64-byte job name is served" test "$(json_field "$T/ok64.json" samples)" = 600

# Weights: asked, capped by the policy, or the policy's default.
fetch capped.json --job capped --job-weight 9
check "a job asking 9 under a cap of 3 is served" test $? -eq 0
check "... and weighs 3" grep -q "job capped arrived (weight 3)" "$T/d.err"
fetch low.json --job low --job-weight 1
check "a job asking 1 weighs 1" grep -q "job low arrived (weight 1)" "$T/d.err"
EMLIO_JOB=fromenv fetch env.json
check "the job named by \$EMLIO_JOB weighs the default 2" \
    grep -q "job fromenv arrived (weight 2)" "$T/d.err"
check "a departed job is logged with what it received" \
    bash -c "sleep 2.5; grep -q 'job low left after .* MB sent' '$T/d.err'"

# Two ranks of one job are one job; its metrics count both. Each holds its
# 10 batches 0.2 s (--compute-s), so the two overlap for 2 s: a job whose
# last stream leaves is forgotten, and under load rank 0 once finished
# before rank 1's HELLO, which then logged a second arrival.
fetch r0.json --job sweep --rank 0 --world 2 --verify --compute-s 0.2 &
p0=$!
fetch r1.json --job sweep --rank 1 --world 2 --verify --compute-s 0.2 &
p1=$!
wait "$p0"
r0=$?
wait "$p1"
r1=$?
check "two ranks of job sweep both finish" test "$r0$r1" = 00
check "... once arrived in the log" test "$(grep -c 'job sweep arrived' "$T/d.err")" = 1
check "... each rank verified" test "$(json_field "$T/r0.json" verified)$(json_field "$T/r1.json" verified)" = TrueTrue
s0=$(json_field "$T/r0.json" samples)
s1=$(json_field "$T/r1.json" samples)
check "... together every sample once ($s0 + $s1)" test $((s0 + s1)) = 600

kill "$DPID"
wait "$DPID" 2>/dev/null

# --max-jobs 2: a long job and a second one fill it; a third is refused,
# a second rank of a known job is not.
start_daemon lim "$DATA" --max-jobs 2 --metrics 127.0.0.1:0 || exit 1
MURL=$(sed -n 's/^emliod: metrics on //p' "$T/lim.out")
"$EMLIO" fetch -c "$EP" --batch 32 --job long1 --epochs 100000 --quiet \
    >/dev/null 2>"$T/long1.err" &
l1=$!
PIDS+=("$l1")
"$EMLIO" fetch -c "$EP" --batch 32 --job long2 --epochs 100000 --quiet \
    >/dev/null 2>"$T/long2.err" &
l2=$!
PIDS+=("$l2")
for _ in $(seq 50); do
    curl -s "$MURL" >"$T/m.txt"
    grep -q 'emlio_job_streams{job="long2"}' "$T/m.txt" &&
        grep -q 'emlio_job_streams{job="long1"}' "$T/m.txt" && break
    sleep 0.1
done
fetch third.json --job third
check "a third job beyond --max-jobs 2 fails the fetch" test $? -ne 0
check "... saying why" grep -q "too many jobs (limit 2" "$T/third.json.err"
fetch again.json --job long1
check "another client of a known job is served" \
    test "$(json_field "$T/again.json" samples)" = 600

# Per-job metrics while both run: promtool-clean, with every family.
curl -s "$MURL" >"$T/m.txt"
for fam in bytes_total requests_total samples_total disk_read_bytes_total \
    wait_seconds_total weight streams queued; do
    check "metric emlio_job_$fam for long1" grep -q "^emlio_job_$fam{job=\"long1\"} " "$T/m.txt"
done
b1=$(awk '/^emlio_job_bytes_total\{job="long1"\}/ {print $2}' "$T/m.txt")
b2=$(awk '/^emlio_job_bytes_total\{job="long2"\}/ {print $2}' "$T/m.txt")
check "both long jobs received bytes ($b1, $b2)" \
    python3 -c "import sys; sys.exit(not (float('$b1') > 0 and float('$b2') > 0))"
if command -v promtool >/dev/null; then
    check "promtool check metrics passes with jobs" bash -c "promtool check metrics <'$T/m.txt'"
else
    skip "promtool not installed: the per-job metrics are not linted"
fi
kill "$l1" "$l2"
wait "$l1" "$l2" 2>/dev/null
kill "$DPID"
wait "$DPID" 2>/dev/null

# One connection floods GETs of 4,096 samples to decode (issue 34: the
# transform queue filled, both readers blocked in it, and a raw-byte fetch
# from another client failed after 60 s). Now the flood holds its share of
# the window; the other job's first GET goes at once and the rest within
# its share: the fetch finishes within its own 15 s timeout.
cat >"$T/flood.py" <<'EOF2'
import sys, time
import msgpack, zmq
ep, n_shards = sys.argv[1], int(sys.argv[2])
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect(ep)
s.send(msgpack.packb({"t": 1, "v": 4, "name": "flood", "job": "flood"}))
s.recv()
items = []
for i in range(4096):
    items += [i % n_shards, i % 25]
for rid in range(1, 251):
    s.send(msgpack.packb({"t": 3, "id": rid, "items": items,
                          "transform": "center_crop(1)", "seed": 1,
                          "epoch": 0}))
print("sent", flush=True)
time.sleep(120)
EOF2
start_daemon fl "$DATA" --transform-threads 2 || exit 1
n_shards=$(ls "$DATA"/*.tfrecord | wc -l)
/usr/bin/python3 "$T/flood.py" "$EP" "$n_shards" >"$T/flood.out" 2>"$T/flood.err" &
fpid=$!
PIDS+=("$fpid")
for _ in $(seq 100); do grep -q sent "$T/flood.out" && break; sleep 0.1; done
check "the flood of 250 x 4,096 decodes is sent" grep -q sent "$T/flood.out"
sleep 1
fetch raw.json --job raw --timeout-ms 15000 --verify
check "a raw-byte fetch beside the flood finishes (no 'no reply')" \
    test "$(json_field "$T/raw.json" samples)" = 600
check "... verified" test "$(json_field "$T/raw.json" verified)" = True
kill "$fpid"
wait "$fpid" 2>/dev/null
kill "$DPID"
wait "$DPID" 2>/dev/null

# Side by side under both schedules, each job gets every sample once.
for sched in fair fifo; do
    start_daemon "s$sched" "$DATA" --schedule "$sched" || exit 1
    fetch "a$sched.json" --job a --streams 8 --verify --epochs 2 &
    pa=$!
    fetch "b$sched.json" --job b --streams 1 --verify --epochs 2 &
    pb=$!
    wait "$pa"
    ra=$?
    wait "$pb"
    rb=$?
    check "$sched: two jobs at once both finish" test "$ra$rb" = 00
    check "$sched: both verified, 2 x 600 samples each" test \
        "$(json_field "$T/a$sched.json" verified)$(json_field "$T/a$sched.json" samples)$(json_field "$T/b$sched.json" verified)$(json_field "$T/b$sched.json" samples)" \
        = True1200True1200
    kill "$DPID"
    wait "$DPID" 2>/dev/null
done
finish
