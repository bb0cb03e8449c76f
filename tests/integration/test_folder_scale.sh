#!/usr/bin/env bash
# test_folder_scale.sh - an ImageFolder of 20,000 files in 200 classes (the
# suite's copy of bench/folder_start.sh's 1.28M): a cached start stats
# directories, not files; adding a file lists its class again, alone, and
# serves it; 1,000 classes are served under ulimit -n 256; too few
# descriptors fail at start-up instead of failing every read. No timings.
. "$(dirname "$0")/lib.sh"

GEN=$B/bench/folder_tree
[ -x "$GEN" ] || { fail "$GEN is built (make)"; finish; exit 1; }
"$GEN" "$T/img" 20000 200 >/dev/null
# An hour old: a class changed within 2 s of its listing is listed again.
find "$T/img" -type d -exec touch -d '1 hour ago' {} +

stop() { kill -INT "$DPID"; wait "$DPID" 2>/dev/null; }

start_daemon first "$T/img" || { fail "first start"; finish; exit 1; }
stop
check "the first start writes the file list" test -f "$T/img/.emlio-files"
inode=$(stat -c %i "$T/img/.emlio-files")

# A cached start under strace: no image is stat'ed (the class directories
# are); without strace, the list not being rewritten says the same (any
# class listed again rewrites it).
if command -v strace >/dev/null; then
    : >"$T/st.out"
    strace -f -qq -e trace=newfstatat,statx,stat,lstat -o "$T/st" \
        "$EMLIOD" --data "$T/img" --bind 'tcp://127.0.0.1:*' \
        --log-level warn >"$T/st.out" 2>"$T/st.err" &
    spid=$!
    for _ in $(seq 1 400); do
        grep -q listening "$T/st.out" && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    kill -INT "$(pgrep -P "$spid" | head -1)" 2>/dev/null
    wait "$spid" 2>/dev/null
    check "strace: the cached start listened" grep -q listening "$T/st.out"
    n=$(grep -c 'img_' "$T/st")
    check "strace: a cached start stats no image ($n)" test "$n" -eq 0
    d=$(grep -c 'class_' "$T/st")
    check "strace: it stats the class directories ($d)" test "$d" -ge 200
else
    skip "strace is not installed: stat calls of a cached start not counted"
fi
start_daemon cached "$T/img" || fail "cached start"
stop
check "a cached start does not rewrite the list" \
    test "$(stat -c %i "$T/img/.emlio-files")" = "$inode"
check "and logs nothing about it" bash -c "! grep -q 'file list' '$T/cached.err'"

# One file added: its class alone is listed again, and it is served.
echo "new image" >"$T/img/class_0042/zz_new.jpg"
start_daemon added "$T/img" || fail "start after adding a file"
check "one class is listed again" \
    grep -q "out of date for 1 of 200 classes" "$T/added.err"
"$EMLIO" fetch --connect "$EP" --batch 64 --verify --quiet >"$T/f.json" \
    2>"$T/f.err"
check "fetch --verify after adding a file" test $? -eq 0
check "the added file is served (20001 samples)" \
    test "$(json_field "$T/f.json" samples)" = 20001
stop

# 1,000 classes under ulimit -n 256: nothing is held per class.
"$GEN" "$T/many" 2000 1000 >/dev/null
(
    ulimit -n 256
    start_daemon many "$T/many" || exit 1
    "$EMLIO" fetch --connect "$EP" --batch 16 --verify --quiet >"$T/m.json"
    rc=$?
    stop
    exit $rc
)
check "1,000 classes served under ulimit -n 256" test $? -eq 0
check "all 2,000 samples" test "$(json_field "$T/m.json" samples)" = 2000
# Too few descriptors: a clear error at start-up, never "listening".
out=$(ulimit -n 40 && timeout 20 "$EMLIOD" --data "$T/many" \
    --bind 'tcp://127.0.0.1:*' 2>&1)
check "ulimit -n 40: start-up fails naming the limit" \
    bash -c "echo \"\$1\" | grep -q 'too few file descriptors'" _ "$out"
check "ulimit -n 40: never listening" \
    bash -c "! echo \"\$1\" | grep -q 'listening'" _ "$out"
finish
