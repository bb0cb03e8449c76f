#!/usr/bin/env bash
# bench/cold.sh - datasets larger than the daemon's memory, read cold
# (issue 30), every cell of it in one invocation.
#
#   bench/cold.sh make DIR [GB]   (any user) DIR/img: a synthetic ImageFolder
#                                 tree of about GB gigabytes (2.7), and the
#                                 same images as TFRecord (DIR/tfr) and tar
#                                 (DIR/tar) shards of 8 MB
#   bench/cold.sh run DIR [MEM]   (root, after make all) the cells below, with
#                                 the daemon (and the DataLoader) in a memory
#                                 cgroup of MEM (512M); one line per cell on
#                                 stdout, the same as CSV in $OUT
#                                 (docs/cold.csv), and the figure
#                                 docs/cold.png
#
# Every cell drops the page cache first and counts device bytes from
# /proc/diskstats (the whole disk), never from the loader. Cells:
#   fio     the device on the same files: sequential 1 MiB QD 32, random
#           reads of the mean sample size at QD 1, 4, 16 and 64, direct, and
#           buffered at QD 16 inside the cgroup
#   warm    emlio from a warm page cache (no limit), uniform, --window-shards
#           4 and --shuffle none: the other ceiling of each, measured after
#           an epoch that maps the pages (that epoch's rate too)
#   loop    emlio on loopback: TFRecord mapped (the old default) and read
#           (uniform, --window-shards 4, --shuffle none, and the default
#           --io auto), tar and ImageFolder read, TFRecord decoded on the
#           storage node (--decode-at server)
#   dl      the PyTorch DataLoader over the same images as files, raw bytes,
#           random order, 4, 8 and 16 workers, in the same cgroup
#   sweep   emlio (defaults) and the DataLoader (8 workers) at dataset /
#           memory = 0.5, 1, 2 and 5 (the cgroup limit varied); 2 epochs
#   wan     30 ms RTT through build/bench/delayline (client in its own
#           network namespace, kernel TCP end to end): emlio, and the
#           DataLoader's per-sample HTTP GETs from nginx (in the cgroup)
#   au      MLPerf Storage's ResNet-50 accounting: emulated H100s (batch
#           400, 0.224 s of compute per batch, one rank each) fed at once;
#           the most that all stay at accelerator utilisation >= 90%, for
#           emlio and for the DataLoader
# APPEND=1 adds to $OUT rather than starting it.
# SECTIONS="fio warm loop dl sweep wan au fio" picks (the default: all,
# fio again at the end, since this VM's disk varies); CELL_S caps
# a cell's seconds (60); EPOCHS is the epochs of the warm and loop cells
# (2: one epoch of ~1 s is mostly start-up; cold every epoch, the data
# being larger than the memory). At the end bench/cold_targets.py sets
# the run's figures against issue 30's targets.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n 2,40p "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
CMD=$1 DIR=$2

if [ "$CMD" = make ]; then
    GB=${3:-2.7}
    E=${B:-build}/bin/emlio
    mkdir -p "$DIR"
    [ -d "$DIR/one" ] || "$E" synth "$DIR/one" --samples 2000 --classes 10 --quiet
    [ -d "$DIR/one-tfr" ] || "$E" pack "$DIR/one" "$DIR/one-tfr" --shard-bytes 8M --quiet
    [ -d "$DIR/one-tar" ] || "$E" pack "$DIR/one" "$DIR/one-tar" --to tar --shard-bytes 8M --quiet
    one=$(du -sb "$DIR/one" | cut -f1)
    copies=$(/usr/bin/python3 -c "import math; print(max(1, math.ceil($GB * 1e9 / $one)))")
    mkdir -p "$DIR/img" "$DIR/tfr" "$DIR/tar"
    for k in $(seq -w 1 "$copies"); do
        for f in "$DIR"/one-tfr/train-*; do cp -n "$f" "$DIR/tfr/c$k-$(basename "$f")"; done
        for f in "$DIR"/one-tar/train-*; do cp -n "$f" "$DIR/tar/c$k-$(basename "$f")"; done
        for c in "$DIR"/one/*/; do
            cn=$(basename "$c")
            mkdir -p "$DIR/img/$cn"
            for f in "$c"*; do cp -n "$f" "$DIR/img/$cn/c$k-$(basename "$f")"; done
        done
    done
    cp "$DIR/one-tfr/classes.txt" "$DIR/tfr/"
    du -sh "$DIR/img" "$DIR/tfr" "$DIR/tar"
    exit 0
fi
[ "$CMD" = run ] || usage
[ "$(id -u)" = 0 ] || { echo "bench/cold.sh run: needs root (cgroup, drop_caches, netns)" >&2; exit 1; }
MEM=${3:-512M}
B=${B:-build}
EMLIOD=$B/bin/emliod EMLIO=$B/bin/emlio
CELL_S=${CELL_S:-60}
EPOCHS=${EPOCHS:-2}
SECTIONS=${SECTIONS:-fio warm loop dl sweep wan au fio}
OUT=${OUT:-docs/cold.csv}
CG=/sys/fs/cgroup/memory/emlio_cold
[ -d /sys/fs/cgroup/memory ] || { echo "bench/cold.sh: needs the v1 memory controller at /sys/fs/cgroup/memory" >&2; exit 1; }
mkdir -p "$CG"
bytes_of() { numfmt --from=iec "$1"; }
set_mem() { echo "$1" >"$CG/memory.limit_in_bytes"; }
set_mem "$(bytes_of "$MEM")"
SRC=$(df --output=source "$DIR" | tail -1)
DEV=$(lsblk -no PKNAME "$SRC" 2>/dev/null || true)
[ -n "$DEV" ] || DEV=$(basename "$SRC")
DATA_B=$(du -sb "$DIR/tfr" | cut -f1)
NIMG=$(find "$DIR/img" -name '*.jpg' | wc -l)
MEAN=$(( $(du -sb "$DIR/img" | cut -f1) / NIMG ))
BS=$(( (MEAN + 4095) / 4096 * 4096 )) # direct reads want whole blocks
T=$(mktemp -d)
DL_PID= DL_NS=
. bench/delayline_ns.sh
cleanup() {
    jobs -p | xargs -r kill 2>/dev/null || true
    dl_cleanup
    rm -rf "$T"
}
trap cleanup EXIT

# Kills what is left in the cgroup: the workers of a DataLoader whose main
# process the OOM killer took live on, holding the cgroup's memory.
cg_clear() {
    local p
    for p in $(cat "$CG/cgroup.procs"); do kill -9 "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do [ -s "$CG/cgroup.procs" ] || return 0; sleep 0.1; done
}
OOM0=0
cg_oom_note() {
    local n; n=$(awk '/oom_kill /{print $2}' "$CG/memory.oom_control" 2>/dev/null || echo 0)
    [ "$n" != "$OOM0" ] && echo " (OOM-killed in the $MEM cgroup)"
    OOM0=$n
}
sectors() { awk -v d="$DEV" '$3 == d { print $6 }' /proc/diskstats; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
in_cg() { echo "$BASHPID" >"$CG/cgroup.procs"; exec "$@"; }
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
HZ=$(getconf CLK_TCK)
[ -n "${APPEND:-}" ] ||
    echo "section,cell,loader,mb_per_s,delivered_mb,device_mb,amplification,cpu_s_per_gb,limit,extra" >"$OUT"

# row SECTION CELL LOADER MBPS DELIVERED_B DEVICE_B CPU_TICKS LIMIT EXTRA
# (CPU ticks of the whole machine over the cell, as /proc/stat counts them)
row() {
    HZ=$HZ /usr/bin/python3 - "$@" >>"$OUT" <<'EOF'
import os, sys
sec, cell, loader, mbps, deliv, dev, cpu, limit, extra = sys.argv[1:10]
deliv, dev, cpu = float(deliv), float(dev), float(cpu) / float(os.environ["HZ"])
print("%s,%s,%s,%.1f,%.0f,%.0f,%.3f,%.2f,%s,%s" % (sec, cell, loader, float(mbps), deliv / 1e6, dev / 1e6,
      dev / deliv if deliv else 0, cpu / (deliv / 1e9) if deliv else 0, limit, extra))
EOF
    tail -1 "$OUT" | awk -F, '{ printf "%-6s %-28s %-8s %8.1f MB/s  delivered %6.0f MB  device %6.0f MB  %5.2fx  %6.2f CPU-s/GB  limit %-8s %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }'
}

# emliod_start NAME DIR EXTRA...: emliod in the cgroup on a fresh port
emliod_start() {
    local name=$1 data=$2; shift 2
    EP_PORT=$(port)
    ( in_cg "$EMLIOD" --data "$data" --bind "tcp://0.0.0.0:$EP_PORT" --log-level info "$@" ) \
        >"$T/$name.dlog" 2>&1 &
    DPID=$!
    for _ in $(seq 200); do grep -q "serving on" "$T/$name.dlog" && return 0; sleep 0.1; done
    cat "$T/$name.dlog" >&2; return 1
}

# emlio_cell SECTION CELL DATA "EMLIOD OPTS" [--netns NS --host H] -- FETCH OPTS...
emlio_cell() {
    local sec=$1 cell=$2 data=$3 dopts=$4; shift 4
    local wrap=() host=127.0.0.1
    if [ "${1:-}" = --netns ]; then wrap=(ip netns exec "$2"); host=$4; shift 4; fi
    [ "${1:-}" = -- ] && shift
    drop
    # shellcheck disable=SC2086
    emliod_start "$cell" "$data" $dopts || return 0
    drop
    local s0 c0; s0=$(sectors); c0=$(cpu_ticks)
    timeout -s INT "$CELL_S" "${wrap[@]}" "$EMLIO" fetch --connect "tcp://$host:$EP_PORT" \
        --epochs "$EPOCHS" --verify --quiet "$@" >"$T/f.out" 2>"$T/f.err" || true
    local s1 c1; s1=$(sectors); c1=$(cpu_ticks)
    kill "$DPID"; wait "$DPID" 2>/dev/null || true
    if ! tail -1 "$T/f.out" | grep -q mb_per_s; then
        echo "$sec $cell: fetch failed: $(tail -2 "$T/f.err")" >&2; return 0
    fi
    local j; j=$(tail -1 "$T/f.out")
    row "$sec" "$cell" emlio "$(jget "$j" mb_per_s)" "$(jget "$j" bytes)" \
        $(( (s1 - s0) * 512 )) "$(( c1 - c0 ))" "$(jget "$j" limit)" \
        "verified=$(jget "$j" verified) io=$(grep -oE 'io: (map|read)' "$T/$cell.dlog" | head -1 | cut -d' ' -f2)"
}
jget() { /usr/bin/python3 -c '
import json, sys
try:
    v = json.loads(sys.argv[1]).get(sys.argv[2])
except ValueError:
    v = None
print(v if v is not None else 0)' "$1" "$2"; }

# dl_cell SECTION CELL WORKERS [http PORT [NS HOST]]: the DataLoader
dl_cell() {
    local sec=$1 cell=$2 w=$3 mode=${4:-local} hport=${5:-0} ns=${6:-} host=${7:-127.0.0.1}
    local cmd=(/usr/bin/python3 bench/pytorch_loader.py --mode "$mode" --root "$DIR/img"
        --host "$host" --port "$hport" --workers "$w" --batch 64 --collate bytes
        --max-samples "$NIMG" --max-seconds "$CELL_S")
    drop
    local s0 c0; s0=$(sectors); c0=$(cpu_ticks)
    if [ "$mode" = local ]; then
        ( in_cg "${cmd[@]}" ) >"$T/dl.out" 2>"$T/dl.err" || true
    else
        ip netns exec "$ns" "${cmd[@]}" >"$T/dl.out" 2>"$T/dl.err" || true
    fi
    local s1 c1; s1=$(sectors); c1=$(cpu_ticks)
    [ "$mode" = local ] && cg_clear # (nginx lives there for http)
    if ! tail -1 "$T/dl.out" | grep -q mb_per_s; then
        echo "$sec $cell: DataLoader failed$(cg_oom_note): $(tail -2 "$T/dl.err")" >&2; return 0
    fi
    local j; j=$(tail -1 "$T/dl.out")
    row "$sec" "$cell" pytorch "$(jget "$j" mb_per_s)" "$(jget "$j" bytes)" \
        $(( (s1 - s0) * 512 )) "$(( c1 - c0 ))" - "workers=$w"
}

fio_cell() { # CELL FIO-ARGS...: fio over the TFRecord shards
    local cell=$1; shift
    drop
    local s0; s0=$(sectors)
    if [ ! -d "$DIR/.fio" ]; then # the shards alone (hard links), not their indexes
        mkdir "$DIR/.fio"
        ln "$DIR"/tfr/*.tfrecord "$DIR/.fio/"
    fi
    fio --name=cold --opendir="$DIR/.fio" --file_service_type=random --ioengine=io_uring \
        --runtime=6 --time_based --group_reporting --output-format=json "$@" >"$T/fio.json" 2>/dev/null || {
        echo "fio $cell: failed" >&2; return 0; }
    local s1; s1=$(sectors)
    local bw; bw=$(/usr/bin/python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):]); r=j["jobs"][0]["read"]; print(r["bw_bytes"]/1e6, r["io_bytes"])' "$T/fio.json")
    row fio "$cell" fio ${bw% *} "${bw#* }" $(( (s1 - s0) * 512 )) 0 - ""
}

echo "# $(date -u +%FT%TZ) $(du -sh "$DIR/tfr" | cut -f1) per format ($NIMG images, mean $MEAN B), memory limit $MEM, device $DEV, $(nproc) CPUs"
for sec in $SECTIONS; do
case $sec in
fio)
    command -v fio >/dev/null || { echo "fio: not installed (apt-get install fio)" >&2; continue; }
    fio_cell "seq 1M QD32 direct" --rw=read --bs=1M --iodepth=32 --direct=1
    for qd in 1 4 16 64; do
        fio_cell "rand $((BS / 1024))K QD$qd direct" --rw=randread --bs="$BS" --iodepth=$qd --direct=1
    done
    ( echo "$BASHPID" >"$CG/cgroup.procs"; fio_cell "rand $((BS / 1024))K QD16 buffered" --rw=randread --bs="$BS" --iodepth=16 --direct=0 )
    ;;
warm)
    # The other ceiling of each shuffle: the same fetch from a warm page
    # cache (mapped, no limit), the baseline issue 30's targets take when
    # it is lower than the device's (a CPU-bound VM).
    set_mem $(( 4 * DATA_B ))
    cat "$DIR"/tfr/* >/dev/null
    # Each daemon serves one epoch first: a fresh daemon's first epoch maps
    # every page it sends, which on this VM costs more than reading it
    # (`first epoch` cells), and a daemon that serves a warm cache for long
    # has them mapped: the measured fetch is that steady rate.
    for w in "uniform:" "window 4:--window-shards 4" "no shuffle:--shuffle none"; do
        emliod_start warm "$DIR/tfr" --io map
        # shellcheck disable=SC2086
        "$EMLIO" fetch --connect "tcp://127.0.0.1:$EP_PORT" --epochs 1 --batch 64 --quiet \
            ${w#*:} >"$T/f0.out" 2>/dev/null || true
        # shellcheck disable=SC2086
        timeout -s INT "$CELL_S" "$EMLIO" fetch --connect "tcp://127.0.0.1:$EP_PORT" --epochs "$EPOCHS" \
            --batch 64 --verify --quiet ${w#*:} >"$T/f.out" 2>/dev/null || true
        kill "$DPID"; wait "$DPID" 2>/dev/null || true
        j=$(tail -1 "$T/f0.out")
        row warm "tfr map warm ${w%%:*} first epoch" emlio "$(jget "$j" mb_per_s)" "$(jget "$j" bytes)" 0 0 "$(jget "$j" limit)" ""
        j=$(tail -1 "$T/f.out")
        row warm "tfr map warm ${w%%:*}" emlio "$(jget "$j" mb_per_s)" "$(jget "$j" bytes)" 0 0 "$(jget "$j" limit)" ""
    done
    set_mem "$(bytes_of "$MEM")"
    ;;
loop)
    emlio_cell loop "tfr map uniform" "$DIR/tfr" "--io map" -- --batch 64
    emlio_cell loop "tfr auto uniform (default)" "$DIR/tfr" "" -- --batch 64
    emlio_cell loop "tfr read uniform" "$DIR/tfr" "--io read" -- --batch 64
    emlio_cell loop "tfr read window 4" "$DIR/tfr" "--io read" -- --batch 64 --window-shards 4
    emlio_cell loop "tfr read no shuffle" "$DIR/tfr" "--io read" -- --batch 64 --shuffle none
    emlio_cell loop "tar read uniform" "$DIR/tar" "--io read" -- --batch 64
    emlio_cell loop "img read uniform" "$DIR/img" "--io read" -- --batch 64
    emlio_cell loop "tfr read decode at server" "$DIR/tfr" "--io read" -- --batch 64 \
        --transform "random_resized_crop(224),horizontal_flip" --decode-at server
    ;;
dl)
    for w in 4 8 16; do dl_cell dl "img DataLoader $w workers" "$w"; done
    ;;
sweep)
    for ratio in 0.5 1 2 5; do
        set_mem "$(/usr/bin/python3 -c "print(int($DATA_B / $ratio))")"
        emlio_cell sweep "x$ratio emlio default" "$DIR/tfr" "" -- --batch 64 --epochs 2
        dl_cell sweep "x$ratio DataLoader" 8
    done
    set_mem "$(bytes_of "$MEM")"
    ;;
wan)
    dl_start bench/cold.sh "$B" emlio_cold cold 10.77.0.1 10.77.0.2 30
    emlio_cell wan "30ms tfr emlio default" "$DIR/tfr" "" --netns emlio_cold --host 10.77.0.1 -- --batch 64
    [ "${WAN_DL:-1}" = 1 ] || { dl_cleanup; DL_PID= DL_NS=; continue; }
    hp=$(port)
    cat >"$T/nginx.conf" <<EOF
worker_processes 2; daemon off; pid $T/nginx.pid; error_log $T/nginx.err;
events { worker_connections 1024; }
http { access_log off; sendfile on; keepalive_requests 100000;
  server { listen $hp; root $DIR/img; } }
EOF
    ( in_cg nginx -c "$T/nginx.conf" ) &
    NPID=$!
    sleep 1
    for w in 32 64; do dl_cell wan "30ms DataLoader HTTP $w workers" "$w" http "$hp" emlio_cold 10.77.0.1; done
    kill "$NPID" 2>/dev/null || true
    wait "$NPID" 2>/dev/null || true
    cg_clear
    dl_cleanup; DL_PID= DL_NS=
    ;;
au)
    # One emulated H100 per rank: batch 400, 0.224 s per batch (MLPerf
    # Storage ResNet-50; its samples are 114,660 B, ours $MEAN B).
    au_round() { # LOADER N: min AU of N ranks fed at once
        local loader=$1 n=$2 r pids=()
        drop
        if [ "$loader" = emlio ]; then
            emliod_start au "$DIR/tfr" || return 1
            for r in $(seq 0 $((n - 1))); do
                timeout -s INT "$CELL_S" "$EMLIO" fetch --connect "tcp://127.0.0.1:$EP_PORT" \
                    --batch 400 --compute-s 0.224 --rank "$r" --world "$n" --epochs 3 --quiet \
                    >"$T/au.$r" 2>/dev/null & pids+=($!)
            done
        else
            for r in $(seq 0 $((n - 1))); do
                ( in_cg /usr/bin/python3 bench/pytorch_loader.py --mode local --root "$DIR/img" \
                    --workers $(( 2 / n > 1 ? 2 / n : 1 )) --batch 400 --collate bytes --compute-s 0.224 \
                    --rank "$r" --world "$n" --max-samples $(( 3 * NIMG / n )) --max-seconds "$CELL_S" ) \
                    >"$T/au.$r" 2>/dev/null & pids+=($!)
            done
        fi
        wait "${pids[@]}" 2>/dev/null || true
        if [ "$loader" = emlio ]; then kill "$DPID"; wait "$DPID" 2>/dev/null || true; else cg_clear; fi
        /usr/bin/python3 -c '
import json, sys
aus = []
for p in sys.argv[1:]:
    try: aus.append(json.loads(open(p).read().strip().splitlines()[-1])["au"])
    except Exception: aus.append(0.0)
print(min(aus))' $(for r in $(seq 0 $((n - 1))); do echo "$T/au.$r"; done)
    }
    for loader in emlio pytorch; do
        best=0
        for n in 1 2 3 4 5 6 7 8; do
            au=$(au_round "$loader" "$n")
            echo "au     $loader $n emulated H100s: min AU $au"
            /usr/bin/python3 -c "import sys; sys.exit(0 if $au >= 0.9 else 1)" || break
            best=$n
        done
        row au "H100s at AU >= 0.9" "$loader" 0 0 0 0 - "h100s=$best"
    done
    ;;
esac
done
[ -s "$OUT" ] && /usr/bin/python3 bench/cold_plot.py "$OUT" docs/cold.png "$DATA_B" || true
[ -s "$OUT" ] && /usr/bin/python3 bench/cold_targets.py "$OUT" || true
