#!/usr/bin/env bash
# bench/jobs.sh - many jobs over one cold dataset larger than the daemon's
# memory (issue 32, docs/fairness.md "Shared reads"), every cell in one
# invocation.
#
#   bench/jobs.sh DIR [MEM]   (root, after make all and bench/cold.sh make
#                             DIR) the TFRecord shards in DIR/tfr, emliod
#                             in a memory cgroup of MEM (512M), defaults
#                             otherwise (--io auto chooses read); one line
#                             per cell on stdout, the same as CSV in $OUT
#                             (docs/jobs.csv)
#
# Every cell drops the page cache and counts the device's bytes from
# /proc/diskstats (the whole disk), never from the loader. Each job runs
# one epoch with --verify and its own seed. Cells:
#   one        one job alone: the baseline of samples/s
#   three      three jobs started together, each reading on its own
#   three-sh   the same three with --share
#   late-sh    --share, the third job started half an epoch late (the first
#              two run two epochs so that it has company throughout)
# EMLIOD_OPTS adds options to every emliod (e.g. --share-bytes 256M);
# CELLS picks cells (default: one three three-sh late-sh); KEEP=DIR keeps
# each cell's daemon log and the jobs' JSON there.
# Columns: aggregate samples/s of the cell's jobs while all ran, the device's
# bytes over the dataset's per epoch of all jobs, each job's share of
# bytes from another job's read, whether every job verified.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { sed -n 2,22p "$0" >&2; exit 2; }
DIR=$1 MEM=${2:-512M}
[ "$(id -u)" = 0 ] || { echo "bench/jobs.sh: needs root (cgroup, drop_caches)" >&2; exit 1; }
[ -d "$DIR/tfr" ] || { echo "bench/jobs.sh: no $DIR/tfr (bench/cold.sh make $DIR)" >&2; exit 1; }
B=${B:-build}
EMLIOD=$B/bin/emliod EMLIO=$B/bin/emlio
OUT=${OUT:-docs/jobs.csv}
BATCH=${BATCH:-64}
CG=/sys/fs/cgroup/memory/emlio_jobs
[ -d /sys/fs/cgroup/memory ] || { echo "bench/jobs.sh: needs the v1 memory controller" >&2; exit 1; }
mkdir -p "$CG"
numfmt --from=iec "$MEM" >"$CG/memory.limit_in_bytes"
SRC=$(df --output=source "$DIR" | tail -1)
DEV=$(lsblk -no PKNAME "$SRC" 2>/dev/null || true)
[ -n "$DEV" ] || DEV=$(basename "$SRC")
DATA_B=$(du -sb "$DIR/tfr" | cut -f1)
T=$(mktemp -d)
cleanup() { jobs -p | xargs -r kill 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT

sectors() { awk -v d="$DEV" '$3 == d { print $6 }' /proc/diskstats; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
in_cg() { echo "$BASHPID" >"$CG/cgroup.procs"; exec "$@"; }
echo "cell,jobs,samples_per_s,one_job_ratio,device_mb,device_per_epoch,shared_pct,verified,extra" >"$OUT"

daemon_start() {
    PORT=$(port)
    # shellcheck disable=SC2086
    ( in_cg "$EMLIOD" --data "$DIR/tfr" --bind "tcp://127.0.0.1:$PORT" --log-level info \
        ${EMLIOD_OPTS:-} ) \
        >"$T/d.log" 2>&1 &
    DPID=$!
    for _ in $(seq 300); do grep -q "serving on" "$T/d.log" && return 0; sleep 0.1; done
    cat "$T/d.log" >&2; return 1
}
job() { # job NAME EPOCHS ARGS...: one fetch, JSON in $T/NAME.json
    local name=$1 epochs=$2; shift 2
    "$EMLIO" fetch --connect "tcp://127.0.0.1:$PORT" --batch "$BATCH" --epochs "$epochs" \
        --verify --quiet --job "$name" "$@" >"$T/$name.json" 2>"$T/$name.err" || true
}
jget() { tail -1 "$T/$1.json" | /usr/bin/python3 -c '
import json, sys
try:
    v = json.loads(sys.stdin.read()).get(sys.argv[1])
except ValueError:
    v = None
print(v if v is not None else 0)' "$2"; }

ONE_SPS=0
# cell NAME EPOCHS_OF_ALL: runs the jobs started by the cell's body
# ($T/jobs: NAME per line), then the row.
row() {
    local cell=$1 s0=$2 s1=$3 t0=$4 t1=$5 epochs=$6
    local names; names=$(cat "$T/jobs")
    local samples=0 bytes=0 shared=0 ok=1 n=0 per=""
    for j in $names; do
        n=$((n + 1))
        samples=$((samples + $(jget "$j" samples)))
        bytes=$((bytes + $(jget "$j" bytes)))
        shared=$((shared + $(jget "$j" shared_bytes)))
        [ "$(jget "$j" verified)" = True ] || ok=0
        per="$per $j:$(/usr/bin/python3 -c "b=$(jget "$j" bytes); print(f'{100*$(jget "$j" shared_bytes)/b:.0f}%' if b else '-')")"
    done
    /usr/bin/python3 - "$cell" "$n" "$samples" "$t0" "$t1" "$s0" "$s1" "$epochs" \
        "$shared" "$bytes" "$ok" "$ONE_SPS" "$DATA_B" "${per# }" >>"$OUT" <<'EOF'
import sys
cell, n, samples, t0, t1, s0, s1, epochs, shared, nbytes, ok, one, data, per = sys.argv[1:15]
sps = int(samples) / ((int(t1) - int(t0)) / 1e9)
dev = (int(s1) - int(s0)) * 512
ratio = sps / float(one) if float(one) else 1.0
print("%s,%s,%.0f,%.2f,%.0f,%.2f,%.0f,%s,%s" % (cell, n, sps, ratio, dev / 1e6,
      dev / (int(data) * float(epochs)), 100 * int(shared) / int(nbytes) if int(nbytes) else 0,
      "yes" if ok == "1" else "NO", per))
EOF
    tail -1 "$OUT" | awk -F, '{ printf "%-9s %s jobs %7.0f samples/s (%4.2fx one)  device %6.0f MB = %4.2fx the dataset per epoch  shared %3.0f%%  verified %s  %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
    [ "$cell" = one ] && ONE_SPS=$(tail -1 "$OUT" | cut -d, -f3)
    return 0
}

run_cell() { # run_cell NAME SHARE LATE
    local cell=$1 share=$2 late=$3 n=$4
    drop
    daemon_start
    drop
    local s0 t0; s0=$(sectors); t0=$(date +%s%N)
    local pids=() names=()
    local epochs_first=1
    [ "$late" = 1 ] && epochs_first=2
    for k in $(seq 1 "$n"); do
        local e=$epochs_first
        if [ "$late" = 1 ] && [ "$k" = "$n" ]; then
            sleep "$HALF"
            e=1
        fi
        job "$cell-$k" "$e" --seed "$k" $share &
        pids+=($!)
        names+=("$cell-$k")
    done
    printf '%s\n' "${names[@]}" >"$T/jobs"
    wait "${pids[@]}"
    local s1 t1; s1=$(sectors); t1=$(date +%s%N)
    # The daemon logs each job a second after it leaves (what it got,
    # read, shared, and its time paced to its group): kept with KEEP.
    [ -n "${KEEP:-}" ] && sleep 1.5
    kill "$DPID"; wait "$DPID" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then # KEEP=DIR: the cell's daemon log and JSON
        mkdir -p "$KEEP"
        cp "$T/d.log" "$KEEP/$cell.log"
        for j in "${names[@]}"; do cp "$T/$j.json" "$T/$j.err" "$KEEP/"; done
    fi
    local ep=$n
    [ "$late" = 1 ] && ep=$((2 * n - 1))
    row "$cell" "$s0" "$s1" "$t0" "$t1" "$ep"
    [ "$cell" = three-sh ] && HALF=$(/usr/bin/python3 -c "print(($t1 - $t0) / 2e9)")
    return 0
}

echo "# dataset $((DATA_B / 1000000)) MB in $DIR/tfr, emliod in a $MEM cgroup, batch $BATCH"
HALF=1
for c in ${CELLS:-one three three-sh late-sh}; do
    case $c in
    one) run_cell one "" 0 1 ;;
    three) run_cell three "" 0 3 ;;
    three-sh) run_cell three-sh --share 0 3 ;;
    late-sh) run_cell late-sh --share 1 3 ;;
    *) echo "bench/jobs.sh: unknown cell $c" >&2; exit 2 ;;
    esac
done
