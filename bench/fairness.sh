#!/usr/bin/env bash
# bench/fairness.sh - two jobs against one emliod: fair shares (issue 32).
#
#   bench/fairness.sh [DATA] [SECONDS]   (after make all)
#
# DATA: TFRecord shards (default /var/tmp/fair/shards, made on first use:
# 8,000 synthetic JPEGs of ~110 KB). Two `emlio fetch` jobs run at once
# against one daemon on loopback, one with --streams 32, one with
# --streams 2, each reading epochs back to back (backlogged). What each
# job received is read from the daemon's per-job counters
# (emlio_job_bytes_total, emlio_job_samples_total at /metrics) once a
# second, after a 3 s start; per window of 5 s the script prints the ratio
# of the two jobs' rates and, over the run, Jain's index of the rates
# divided by the weights.
#
# Cells, each under --schedule fifo (the old order: by arrival) and fair:
#   raw     raw bytes, warm page cache: here the two clients and the daemon
#           share 2 CPUs, so the clients' own CPU bounds them and the daemon
#           can only give a job what its client reads
#   server  tensors decoded on the daemon (--decode-at server): the daemon's
#           CPU is the resource to share
#   w21     as server, the 32-stream job weighted 2, the other 1
#   stall   as server, equal weights, the 2-stream job stopped (SIGSTOP)
#           for 5 s mid-run: the other job's rate before, during, after
# One line per cell on stdout; never run with another benchmark.
set -u
cd "$(dirname "$0")/.."
B=build/bin
DATA=${1:-/var/tmp/fair/shards}
SECS=${2:-20}
T=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

if [ ! -d "$DATA" ]; then
    top=$(dirname "$DATA")
    mkdir -p "$top"
    $B/emlio synth "$top/img" --samples 8000 --classes 10 --bytes 110000 --quiet &&
        $B/emlio pack "$top/img" "$DATA" --shard-bytes 64M --quiet || exit 1
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# cell NAME SCHEDULE WEIGHT_BIG STALL FETCH_ARGS...
cell() {
    local name=$1 sched=$2 wbig=$3 stall=$4
    shift 4
    local port mport
    port=$(free_port)
    mport=$(free_port)
    $B/emliod --data "$DATA" --bind "tcp://127.0.0.1:$port" \
        --metrics "127.0.0.1:$mport" --schedule "$sched" \
        --job-weight "big=$wbig" --log-level warn 2>"$T/d.err" >/dev/null &
    local d=$!
    PIDS+=("$d")
    for _ in $(seq 50); do
        curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null && break
        sleep 0.1
    done
    $B/emlio fetch -c "tcp://127.0.0.1:$port" --batch 64 --streams 32 \
        --job big --epochs 100000 --quiet "$@" >/dev/null 2>"$T/big.err" &
    local a=$!
    $B/emlio fetch -c "tcp://127.0.0.1:$port" --batch 64 --streams 2 \
        --job small --epochs 100000 --quiet "$@" >/dev/null 2>"$T/small.err" &
    local c=$!
    PIDS+=("$a" "$c")
    sleep 3
    : >"$T/samples"
    for i in $(seq 0 "$SECS"); do
        if [ "$stall" = 1 ] && [ "$i" = $((SECS / 2 - 2)) ]; then kill -STOP "$c"; fi
        if [ "$stall" = 1 ] && [ "$i" = $((SECS / 2 + 3)) ]; then kill -CONT "$c"; fi
        curl -s "http://127.0.0.1:$mport/metrics" |
            awk -v t="$i" '/^emlio_job_bytes_total\{job="(big|small)"\}/ {
                    split($1, a, "\""); b[a[2]] = $2 }
                END { print t, b["big"] + 0, b["small"] + 0 }' >>"$T/samples"
        sleep 1
    done
    kill -CONT "$c" 2>/dev/null
    kill "$a" "$c" 2>/dev/null
    wait "$a" "$c" 2>/dev/null
    kill "$d"
    wait "$d" 2>/dev/null
    python3 - "$name" "$sched" "$wbig" "$stall" "$SECS" "$T/samples" <<'EOF'
import sys
name, sched, wbig, stall, secs, path = sys.argv[1:]
wbig, secs = float(wbig), int(secs)
rows = [list(map(float, l.split())) for l in open(path) if l.strip()]
def rate(a, b, k):
    return (rows[b][k] - rows[a][k]) / max(rows[b][0] - rows[a][0], 1e-9) / 1e6
big, small = rate(0, -1, 1), rate(0, -1, 2)
ratios = []
for a in range(0, len(rows) - 5, 5):
    s = rate(a, a + 5, 2)
    ratios.append(rate(a, a + 5, 1) / s if s > 0 else float("inf"))
x = [big / wbig, small]
jain = sum(x) ** 2 / (2 * sum(v * v for v in x)) if any(x) else 0
line = (f"{name:6} {sched:4} big {big:7.1f} MB/s  small {small:7.1f} MB/s  "
        f"big/small {big / small if small else float('inf'):5.2f} (weights "
        f"{wbig:g}:1; per 5 s: {' '.join(f'{r:.2f}' for r in ratios)})  "
        f"jain {jain:.3f}")
if stall == "1":
    h = secs // 2
    before, during, after = rate(0, h - 2, 1), rate(h - 1, h + 3, 1), rate(h + 4, -1, 1)
    line += f"  big while small stopped: {before:.1f} -> {during:.1f} -> {after:.1f} MB/s"
print(line, flush=True)
EOF
}

XF=(--transform 'random_resized_crop(64)' --decode-at server)
for sched in fifo fair; do
    cell raw "$sched" 1 0
    cell server "$sched" 1 0 "${XF[@]}"
    cell w21 "$sched" 2 0 "${XF[@]}"
    cell stall "$sched" 1 1 "${XF[@]}"
done
