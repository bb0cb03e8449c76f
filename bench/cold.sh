#!/usr/bin/env bash
# bench/cold.sh - a dataset larger than the daemon's memory, read cold.
# Usage (root): bench/cold.sh DATA_DIR [MEM_LIMIT (512M)] [BATCH (64)]
# emliod runs in a v1 memory cgroup (memory.limit_in_bytes = MEM_LIMIT; its
# page cache is charged to it), the page cache is dropped before every cell,
# and each cell fetches one epoch on loopback. Device bytes come from
# /proc/diskstats (the whole disk), not from the loader. One line per cell:
#   io shuffle  MB/s  delivered_MB  device_MB  amplification  limit
set -euo pipefail
DATA=${1:?data dir}
MEM=${2:-512M}
BATCH=${3:-64}
B=${B:-build}
EMLIOD=$B/bin/emliod
EMLIO=$B/bin/emlio
CG=/sys/fs/cgroup/memory/emlio_cold
mkdir -p "$CG"
echo "$MEM" >"$CG/memory.limit_in_bytes"
DEV=$(lsblk -no PKNAME "$(df --output=source "$DATA" | tail -1)" 2>/dev/null || true)
[ -n "$DEV" ] || DEV=$(basename "$(df --output=source "$DATA" | tail -1)")
sectors() { awk -v d="$DEV" '$3 == d { print $6 }' /proc/diskstats; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cell() { # io, fetch options...
    local io=$1; shift
    local p; p=$(port)
    sync; echo 3 >/proc/sys/vm/drop_caches
    ( echo $BASHPID >"$CG/cgroup.procs"; exec "$EMLIOD" --data "$DATA" \
        --bind "tcp://127.0.0.1:$p" --io "$io" ) >"$T/d.log" 2>&1 &
    local d=$!
    for _ in $(seq 100); do grep -q "serving on" "$T/d.log" && break; sleep 0.1; done
    sync; echo 3 >/proc/sys/vm/drop_caches
    local s0; s0=$(sectors)
    timeout -s INT "${CELL_S:-90}" "$EMLIO" fetch --connect "tcp://127.0.0.1:$p" --batch "$BATCH" --epochs 1 \
        --verify "$@" >"$T/f.out" 2>"$T/f.err" || { cat "$T/f.err" >&2; }
    local s1; s1=$(sectors)
    kill "$d"; wait "$d" 2>/dev/null || true
    local oom; oom=$(awk '/oom_kill /{print $2}' "$CG/memory.oom_control" 2>/dev/null || echo 0)
    tail -1 "$T/f.out" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read()); dev = (int(sys.argv[3]) - int(sys.argv[2])) * 512
print("%-5s %-14s %8.1f MB/s  delivered %7.0f MB  device %7.0f MB  %5.2fx  limit %-8s verified %s oom %s" % (
    sys.argv[1], sys.argv[4] or "uniform", j["mb_per_s"], j["bytes"] / 1e6, dev / 1e6,
    dev / max(j["bytes"], 1), j["limit"], j["verified"], sys.argv[5]))' \
        "$io" "$s0" "$s1" "$*" "$oom"
}

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "# $(date -u +%FT%TZ) data $(du -sh "$DATA" | cut -f1) memory limit $MEM batch $BATCH device $DEV"
for io in ${IO_MODES:-map read}; do
    cell "$io"
    cell "$io" --window-shards 4
done
