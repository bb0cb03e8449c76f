# lib.sh - helpers shared by the integration tests (sourced, not run).
# Every test gets a private temp dir, counts its checks and ends with the
# line "N passed, N failed, N skipped"; daemons are started on ports chosen at run
# time and killed on exit.
B=${B:-build}
EMLIO=$B/bin/emlio
EMLIOD=$B/bin/emliod
EMLIO_RELAY=$B/bin/emlio-relay # benchmark tool (bench/relay)
T=$(mktemp -d /tmp/emlio-it.XXXXXX)
PASSED=0
FAILED=0
SKIPPED=0
PIDS=()

CGROUPS=() # memory cgroups made by memory_cgroup, removed on exit

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    for cg in "${CGROUPS[@]}"; do
        for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
        sleep 0.2
        rmdir "$cg" 2>/dev/null
    done
    [ -n "${KEEP_T:-}" ] || rm -rf "$T"
}
trap cleanup EXIT

ok() { PASSED=$((PASSED + 1)); echo "ok - $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $1"; }
# skip WHAT: a check that cannot run here (reported, never counted passed).
skip() { SKIPPED=$((SKIPPED + 1)); echo "skip - $1"; }
check() { # check NAME CMD...: passes when CMD succeeds
    local name=$1
    shift
    if "$@"; then ok "$name"; else fail "$name"; fi
}
finish() {
    echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
    [ "$FAILED" -eq 0 ]
}

# memory_cgroup NAME BYTES: a memory cgroup of this test's own (v1
# memory.limit_in_bytes or v2 memory.max) limited to BYTES and removed on
# exit; sets CG and CG_LIMIT (the limit's file). Fails without root or a
# writable memory controller: the test then skips, saying so.
memory_cgroup() {
    if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
        CG=/sys/fs/cgroup/memory/emlio_$1_$$ CG_LIMIT=memory.limit_in_bytes
    elif [ -f /sys/fs/cgroup/cgroup.controllers ] &&
        grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null &&
        [ -w /sys/fs/cgroup ]; then
        CG=/sys/fs/cgroup/emlio_$1_$$ CG_LIMIT=memory.max
    else
        return 1
    fi
    mkdir "$CG" 2>/dev/null || return 1
    CGROUPS+=("$CG")
    echo "$2" >"$CG/$CG_LIMIT"
}

# in_cgroup CMD...: runs CMD inside $CG (memory_cgroup).
in_cgroup() {
    bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" "$@"
}

# make_dataset DIR SAMPLES CLASSES BYTES SHARD_BYTES: synth + pack into DIR.
make_dataset() {
    "$EMLIO" synth "$1/img" --samples "$2" --classes "$3" --bytes "$4" \
        --quiet >/dev/null &&
        "$EMLIO" pack "$1/img" "$1/shards" --shard-bytes "$5" --quiet >/dev/null
}

# gradient_ppm FILE W H: a W x H RGB gradient as a binary PPM (NumPy): an
# image that cjpeg turns into a small JPEG of many pixels.
gradient_ppm() {
    /usr/bin/python3 - "$@" <<'EOF'
import sys
import numpy as np
path, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = np.linspace(0, 255, w, dtype=np.float32)[None, :]
y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
img = np.empty((h, w, 3), np.uint8)
img[..., 0] = x
img[..., 1] = y
img[..., 2] = (x + y) / 2
with open(path, "wb") as f:
    f.write(b"P6\n%d %d\n255\n" % (w, h))
    f.write(img.tobytes())
EOF
}

# start_daemon NAME DATA_DIR [ARGS...]: starts emliod on a free loopback
# port (BIND, if set, instead of tcp://127.0.0.1:*) and waits (bounded) for
# its "listening on" line. Sets EP and DPID.
start_daemon() {
    local name=$1 data=$2
    shift 2
    : >"$T/$name.out" # exists before the background shell opens it
    "$EMLIOD" --data "$data" --bind "${BIND:-tcp://127.0.0.1:*}" --log-level warn "$@" \
        >"$T/$name.out" 2>"$T/$name.err" &
    DPID=$!
    PIDS+=("$DPID")
    EP=$(listen_addr "$T/$name.out" emliod "$DPID") && return 0
    echo "daemon $name did not start:"
    cat "$T/$name.err"
    return 1
}

# listen_addr FILE WHO [PID]: waits (10 s at most) for the line "WHO:
# listening on ADDR" in FILE and prints ADDR; fails at once when PID, if
# given, has exited, since no line will come.
listen_addr() {
    local addr
    for _ in $(seq 1 200); do
        addr=$(sed -n "s/^$2: listening on //p" "$1")
        [ -n "$addr" ] && echo "$addr" && return 0
        [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# wait_for FILE PATTERN SECONDS [PID]: polls until FILE has a line
# matching PATTERN (grep -E), or the deadline passes; fails at once when
# PID, if given, has exited, since no line will come.
wait_for() {
    local deadline=$((SECONDS + $3))
    while [ $SECONDS -le $deadline ]; do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        [ -z "${4:-}" ] || kill -0 "$4" 2>/dev/null || return 1
        sleep 0.02
    done
    return 1
}

# wait_lines FILE N: waits (20 s at most) until FILE has N lines.
wait_lines() {
    for _ in $(seq 1 800); do
        [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
        sleep 0.025
    done
    return 1
}

# interrupt_ranks RUN PER FIRST RCS: the fetches of pids RPIDS, rank r
# writing --ids "$T/RUN.r.ids": each gets SIGINT once it wrote
# PER x (r + FIRST) ids (so the ranks stop at different points), then all
# are waited for; fails unless each exit status is one of RCS (e.g.
# "130": stopped by the signal, its --state saved; "130 0": or finished).
interrupt_ranks() {
    local run=$1 per=$2 first=$3 rcs=" $4 " r bad=0 rc
    for r in "${!RPIDS[@]}"; do
        wait_lines "$T/$run.$r.ids" $((per * (r + first)))
        kill -INT "${RPIDS[$r]}"
    done
    for r in "${!RPIDS[@]}"; do
        wait "${RPIDS[$r]}"
        rc=$?
        case "$rcs" in *" $rc "*) ;; *) bad=1 ;; esac
    done
    return $bad
}

# json_field FILE KEY: the value of KEY in the last line of FILE (JSON).
json_field() {
    tail -n 1 "$1" | /usr/bin/python3 -c \
        "import json,sys; print(json.loads(sys.stdin.read())['$2'])"
}
