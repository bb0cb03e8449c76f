#!/usr/bin/env bash
# bench/folder_start.sh - start-up of an ImageFolder at ImageNet's size:
# 1,281,167 tiny files in 1,000 classes (build/bench/folder_tree: hard
# links, ~50 MB on disk), served by emliod. Reports, for each emliod given:
# the first start (no file list), cached starts, the start after one file
# is added (one class listed again) and the start after that; then the
# stat calls of a first and a cached start (strace -c -f, a separate run:
# strace slows the start down, so it is not timed).
#
#   bench/folder_start.sh [FILES] [CLASSES] [ROUNDS]   (default 1281167 1000 3)
#   EMLIODS="build/bin/emliod /work/main/build/bin/emliod": compare builds
#   (each in turn rewrites .emlio-files in its own format; the first start
#   of each is its own). TREE=/tmp/dir: where the tree goes (removed at the
#   end unless KEEP=1).
#
# Time to start = from exec to the "listening on" line (polled every 10
# ms), i.e. the whole load: the shard walk, the class list, the file list.
# Two shared cores here: run ROUNDS >= 3 and read the spread.
set -u
FILES=${1:-1281167}
CLASSES=${2:-1000}
ROUNDS=${3:-3}
B=${B:-build}
EMLIODS=${EMLIODS:-$B/bin/emliod}
TREE=${TREE:-/tmp/emlio-folder-bench.$$}
GEN=$B/bench/folder_tree
[ -x "$GEN" ] || { echo "build $GEN first (make)" >&2; exit 2; }
cleanup() {
    rm -f "$TREE".out "$TREE".err "$TREE".rss "$TREE".sout "$TREE".strace
    [ -n "${KEEP:-}" ] || rm -rf "$TREE"
}
trap cleanup EXIT

# start EMLIOD: prints the seconds to "listening", then stops it; the
# daemon's warnings (file list out of date, ...) go to $TREE.err.
start() {
    local out=$TREE.out t0 t1 pid
    : >"$out"
    t0=$(date +%s.%N)
    "$1" --data "$TREE" --bind 'tcp://127.0.0.1:*' --log-level warn \
        >"$out" 2>"$TREE.err" &
    pid=$!
    while ! grep -q listening "$out"; do
        kill -0 "$pid" 2>/dev/null || { echo "failed"; cat "$TREE.err" >&2; return 1; }
        sleep 0.01
    done
    t1=$(date +%s.%N)
    # Peak resident memory of the load, for the table's last column.
    awk '/^VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status" >"$TREE.rss"
    kill -INT "$pid"
    wait "$pid" 2>/dev/null
    echo "$t0 $t1" | awk '{printf "%.2f", $2 - $1}'
}

# stats EMLIOD: stat-family calls of one start (strace -c -f).
stats() {
    command -v strace >/dev/null || { echo "n/a (no strace)"; return; }
    local out=$TREE.sout spid pid
    : >"$out"
    strace -f -c -o "$TREE.strace" -e trace=newfstatat,statx,fstat,openat2,getdents64 \
        "$1" --data "$TREE" --bind 'tcp://127.0.0.1:*' --log-level warn \
        >"$out" 2>/dev/null &
    spid=$!
    until grep -q listening "$out"; do
        kill -0 "$spid" 2>/dev/null || return
        sleep 0.05
    done
    pid=$(pgrep -P "$spid" | head -1)
    kill -INT "$pid"
    wait "$spid" 2>/dev/null
    awk '$NF ~ /^(newfstatat|statx|fstat|openat2|getdents64)$/ {printf "%s %s, ", $NF, $4}' \
        "$TREE.strace"
}

t0=$(date +%s.%N)
"$GEN" "$TREE" "$FILES" "$CLASSES" >/dev/null || exit 1
t1=$(date +%s.%N)
# Directories an hour old: a class changed within 2 s of its listing is
# listed again at the next start (docs/formats.md), which a tree made a
# moment ago would be.
find "$TREE" -type d -exec touch -d '1 hour ago' {} +
echo "tree: $FILES files in $CLASSES classes under $TREE, made in $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') s"
echo
echo "| emliod | first start (s) | cached starts (s) | one file added (s) | next start (s) | stats, first start | stats, cached start | peak RSS, cached (MB) |"
echo "|---|---|---|---|---|---|---|---|"
for d in $EMLIODS; do
    rm -f "$TREE/.emlio-files"
    first=$(start "$d")
    cached=""
    for _ in $(seq "$ROUNDS"); do cached="$cached $(start "$d")"; done
    rss=$(cat "$TREE.rss")
    n=$(printf 'bench_added_%s.jpg' "$RANDOM")
    echo new >"$TREE/class_0000/$n"
    added=$(start "$d")
    relisted=$(grep -o 'out of date for [0-9]* of [0-9]* classes' "$TREE.err" || echo "-")
    # Aged again, as a tree is when the next start comes minutes later.
    touch -d '1 hour ago' "$TREE/class_0000"
    next=$(start "$d")
    rm -f "$TREE/class_0000/$n"
    touch -d '1 hour ago' "$TREE/class_0000"
    start "$d" >/dev/null
    s_cached=$(stats "$d")
    rm -f "$TREE/.emlio-files"
    s_first=$(stats "$d")
    echo "| $d | $first | $cached | $added ($relisted) | $next | $s_first | $s_cached | $rss |"
done
