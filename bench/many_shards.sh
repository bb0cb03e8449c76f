#!/usr/bin/env bash
# many_shards.sh - serves N small TFRecord shards under a small descriptor
# limit and fetches a verified epoch: the issue-22 scale check of shards
# opened on demand (--max-open-shards, src/store/shard_cache.c) and of lease
# breaks watched by signal instead of polling.
#
#   bench/many_shards.sh [SHARDS [NOFILE [RECORDS]]]   (100000 1024 4)
#   FETCH_ARGS="--window-shards 256" bench/many_shards.sh   (plan locality)
#
# Prints the daemon's descriptors after start, during and after the epoch,
# its idle CPU (utime+stime from /proc/PID/stat over IDLE_S seconds, at
# start and after the epoch) and one JSON line with every figure. The
# shards are kept in $DATA (default /tmp/emlio-many-SHARDS) for reruns;
# they are written once (every shard the same RECORDS records of 96 B,
# framed by scripts/tfrecord_raw.py; shards differ by name, which the
# dataset fingerprint covers). Build first: make -j2.
#
# Measured 2026-12-01 on the 2-core CI VM (cores shared with other jobs):
# 100,000 shards under ulimit -n 1024 (budget 704): 728 descriptors at
# start, peak 731 during a verified epoch of 400,000 samples (55-61k
# samples/s: a uniform shuffle over 100k shards reopens a shard for almost
# every sample; 132k/s with FETCH_ARGS="--window-shards 256"), idle CPU 0.1-0.2% of a core; start 2.9-6.7 s with indexes
# written, 38-77 s the first time (100k .idx files written). At 10,000
# shards (all open) idle CPU is 0.1-0.2% against 6.3-6.7% before this
# change (the request thread polled F_GETLEASE on every shard).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
SHARDS=${1:-100000}
NOFILE=${2:-1024}
RECORDS=${3:-4}
IDLE_S=${IDLE_S:-10}
DATA=${DATA:-/tmp/emlio-many-$SHARDS}
OUT=$(mktemp -d /tmp/emlio-many-out.XXXXXX)
DPID=""
trap '[ -n "$DPID" ] && kill "$DPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$OUT"' EXIT

if [ ! -f "$DATA/.complete" ]; then
    rm -rf "$DATA"
    PYTHONPATH=scripts /usr/bin/python3 - "$DATA" "$SHARDS" "$RECORDS" <<'EOF' || exit 1
import os, sys
from tfrecord_raw import frame
out, shards, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
shard = b"".join(frame(bytes((r * 7 + i) & 0xFF for i in range(96)))
                 for r in range(records))
per_dir = 1000  # a flat directory of 100k entries is slow to list
for s in range(shards):
    d = os.path.join(out, "d%03d" % (s // per_dir))
    if s % per_dir == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "s%06d.tfrecord" % s), "wb") as f:
        f.write(shard)
open(os.path.join(out, ".complete"), "w").close()
EOF
fi

fds() { ls "/proc/$DPID/fd" 2>/dev/null | wc -l; }
ticks() { awk '{print $14 + $15}' "/proc/$DPID/stat"; }
idle_cpu() { # percent of one core over IDLE_S seconds of idleness
    local t0 t1 hz
    hz=$(getconf CLK_TCK)
    t0=$(ticks)
    sleep "$IDLE_S"
    t1=$(ticks)
    awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$IDLE_S" \
        'BEGIN {printf "%.2f", 100 * (b - a) / hz / s}'
}

t0=$(date +%s.%N)
(
    ulimit -n "$NOFILE" || exit 1
    exec "$B/bin/emliod" --data "$DATA" --bind 'tcp://127.0.0.1:*' \
        --log-level info >"$OUT/d.out" 2>"$OUT/d.err"
) &
DPID=$!
EP=""
for _ in $(seq 1 6000); do
    EP=$(sed -n 's/^emliod: listening on //p' "$OUT/d.out")
    [ -n "$EP" ] && break
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$EP" ]; then
    echo "emliod did not start:" >&2
    cat "$OUT/d.err" >&2
    exit 1
fi
start_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
grep -E "mapped shards|loaded" "$OUT/d.err"
fds_start=$(fds)
idle_start=$(idle_cpu)
echo "start ${start_s} s, ${fds_start} descriptors, idle CPU ${idle_start}% of a core"

peak=0
(
    # shellcheck disable=SC2086 # FETCH_ARGS: words on purpose
    "$B/bin/emlio" fetch --connect "$EP" --batch 256 --epochs 1 --verify \
        --quiet --timeout-ms 300000 ${FETCH_ARGS:-} >"$OUT/f.out" 2>"$OUT/f.err"
    echo $? >"$OUT/f.rc"
) &
FPID=$!
while kill -0 "$FPID" 2>/dev/null; do
    n=$(fds)
    [ "$n" -gt "$peak" ] && peak=$n
    sleep 0.2
done
wait "$FPID"
rc=$(cat "$OUT/f.rc")
verified=$(tail -n 1 "$OUT/f.out" | /usr/bin/python3 -c \
    'import json,sys; d=json.loads(sys.stdin.read()); print(d["verified"], d["samples"], round(d["samples_per_s"]))' 2>/dev/null)
fds_after=$(fds)
idle_after=$(idle_cpu)
echo "epoch: fetch rc $rc, verified/samples/rate: $verified; descriptors peak $peak, after $fds_after; idle CPU after ${idle_after}%"
grep -c "changed on disk\|cannot open" "$OUT/d.err" | sed 's/^/daemon errors logged: /'
printf '{"shards": %d, "nofile": %d, "start_s": %s, "fds_start": %d, "fds_peak": %d, "fds_after": %d, "idle_cpu_pct_start": %s, "idle_cpu_pct_after": %s, "fetch_rc": %d, "verified": "%s"}\n' \
    "$SHARDS" "$NOFILE" "$start_s" "$fds_start" "$peak" "$fds_after" \
    "$idle_start" "$idle_after" "$rc" "$verified"
[ "$rc" -eq 0 ]
