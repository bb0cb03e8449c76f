#!/usr/bin/env bash
# test_untrusted_disk.sh - what is on disk is as untrusted as what comes off
# the network (issue 19), end to end through the programs: a symlink to a
# secret is neither served nor packed, a FIFO does not hang the start-up,
# operator mistakes stop emliod at start naming what is wrong, config files
# that are not text are refused at once, SIGTERM stops
# a load in progress (no READY), SIGHUP is logged, and a shard count above
# the soft descriptor limit still starts.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

# --- One rule for paths: the symlink to a secret ---------------------------
"$EMLIO" synth "$T/img" --samples 12 --classes 2 --bytes 3000 --quiet >/dev/null
echo "TOP-SECRET-BYTES" >"$T/secret"
ln -s "$T/secret" "$T/img/class_000/zz_shadow.jpg"
start_daemon links "$T/img" || fail "daemon over a tree with a symlink starts"
"$EMLIO" fetch --connect "$EP" --batch 4 --quiet --ids "$T/ids.txt" \
    >"$T/links.json" 2>&1
check "fetch over the tree works" test $? -eq 0
check "the symlink out of the root is not listed" \
    test "$(json_field "$T/links.json" samples)" = 12
check "the left-out link is logged" grep -q "left out 1 symbolic link" "$T/links.err"
kill "$DPID"; wait "$DPID" 2>/dev/null
"$EMLIO" pack "$T/img" "$T/packed" --to tar --quiet >"$T/pack.out" 2>&1
check "pack over the tree works" test $? -eq 0
check "pack warns of the link it left out" \
    grep -q "emlio pack: warning: left out 1 symbolic link" "$T/pack.out"
check "pack copies no byte of the secret" \
    bash -c "! grep -rq TOP-SECRET-BYTES '$T/packed'"
"$EMLIO" pack "$T/img" "$T/packed2" --to tar --follow-symlinks --quiet \
    >/dev/null 2>&1
check "pack --follow-symlinks still copies nothing from outside" \
    bash -c "! grep -rq TOP-SECRET-BYTES '$T/packed2'"

# --- A FIFO as the file list does not hang the start-up --------------------
rm -f "$T/img/.emlio-files"
mkfifo "$T/img/.emlio-files"
start_daemon fifo "$T/img" || fail "daemon with a FIFO as .emlio-files starts"
check "the FIFO file list is reported" grep -q "not a regular file" "$T/fifo.err"
kill "$DPID"; wait "$DPID" 2>/dev/null
rm -f "$T/img/.emlio-files"

# --- Operator mistakes fail at start-up ------------------------------------
"$EMLIO" pack "$T/img" "$T/tars" --to tar --quiet >/dev/null 2>&1
out=$(timeout 20 "$EMLIOD" --data "$T/tars" --bind 'tcp://127.0.0.1:*' \
    --field png 2>&1)
check "--field no sample has: start-up error" \
    bash -c "echo \"\$1\" | grep -q \"has a 'png' member\"" _ "$out"
out=$(timeout 20 "$EMLIOD" --data "$T/tars" --bind 'tcp://127.0.0.1:*' \
    --label-field lbl 2>&1)
check "--label-field no sample has: start-up error" \
    bash -c "echo \"\$1\" | grep -q \"label member 'lbl'\"" _ "$out"
out=$(timeout 20 "$EMLIOD" --data "$T/tars" --bind 'tcp://127.0.0.1:*' \
    --label-field jpg 2>&1)
check "a label that does not parse: start-up error" \
    bash -c "echo \"\$1\" | grep -q 'is not an integer'" _ "$out"

# --- Config files: a NUL byte, /dev/zero, a directory ----------------------
printf 'readers 2\n\0bind tcp://127.0.0.1:1\n' >"$T/nul.conf"
out=$(timeout 20 "$EMLIOD" --config "$T/nul.conf" 2>&1)
check "a config with a NUL byte is refused, naming the line" \
    bash -c "echo \"\$1\" | grep -q 'nul.conf:2: NUL byte'" _ "$out"
out=$(timeout 20 "$EMLIOD" --config /dev/zero 2>&1)
check "/dev/zero as config is refused at once" \
    bash -c "echo \"\$1\" | grep -q 'not a regular file'" _ "$out"
out=$(timeout 20 "$EMLIOD" --config "$T" 2>&1)
check "a directory as config is refused, saying so" \
    bash -c "echo \"\$1\" | grep -q 'it is a directory'" _ "$out"

# --- Signals --------------------------------------------------------------
# A tree that takes a while to list (20,000 classes, no file list), so the
# stop signal lands while loading.
/usr/bin/python3 - "$T/big" <<'EOF'
import os, sys
root = sys.argv[1]
for i in range(20000):
    d = os.path.join(root, "c%05d" % i)
    os.makedirs(d)
    with open(os.path.join(d, "a.jpg"), "wb") as f:
        f.write(b"x")
EOF
: >"$T/sig.out"
"$EMLIOD" --data "$T/big" --bind 'tcp://127.0.0.1:*' --no-write-index \
    >"$T/sig.out" 2>"$T/sig.err" &
SPID=$!
PIDS+=("$SPID")
sleep 0.2
kill -TERM "$SPID"
t0=$(date +%s%N)
wait "$SPID"
rc=$?
t1=$(date +%s%N)
check "SIGTERM during the load: exits 0" test "$rc" -eq 0
check "SIGTERM during the load: stops within a second" \
    test $(((t1 - t0) / 1000000)) -lt 1000
check "SIGTERM during the load: never listening" \
    bash -c "! grep -q 'listening on' '$T/sig.out'"
check "SIGTERM during the load: says so" grep -q "while loading" "$T/sig.err"
start_daemon hup "$T/img" || fail "daemon for SIGHUP starts"
kill -HUP "$DPID"
for _ in $(seq 1 100); do
    grep -q "SIGHUP ignored" "$T/hup.err" && break
    sleep 0.05
done
check "SIGHUP is logged, not fatal" grep -q "SIGHUP ignored" "$T/hup.err"
check "the daemon still runs after SIGHUP" kill -0 "$DPID"
kill "$DPID"; wait "$DPID" 2>/dev/null

# --- An unreadable lost+found under a non-root daemon ----------------------
# start_nobody NAME DIR: emliod as nobody (as the shipped unit runs it);
# 0 once it listens.
start_nobody() {
    setpriv --reuid=65534 --regid=65534 --clear-groups "$EMLIOD" --data "$2" \
        --bind 'tcp://127.0.0.1:*' --no-write-index >"$T/$1.out" \
        2>"$T/$1.err" &
    NPID=$!
    PIDS+=("$NPID")
    for _ in $(seq 1 200); do
        grep -q "listening on" "$T/$1.out" && return 0
        kill -0 "$NPID" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    mkdir -p "$T/lf"
    cp -r "$T/img" "$T/lf/img"
    rm -f "$T/lf/img/class_000/zz_shadow.jpg" "$T/lf/img/.emlio-files"
    cp -r "$T/tars" "$T/lf/tars"
    chmod 755 "$T"
    chmod -R a+rX "$T/lf"
    for d in img img/class_000 tars; do
        mkdir "$T/lf/$d/lost+found"
        chmod 700 "$T/lf/$d/lost+found"
    done
    for d in img tars; do
        start_nobody "lf_$d" "$T/lf/$d"
        check "non-root over $d with an unreadable lost+found: starts" test $? -eq 0
        check "non-root over $d: the left-out directory is logged" \
            grep -q "unreadable director" "$T/lf_$d.err"
        # Files root owns are read without O_NOATIME (EPERM for nobody).
        EPN=$(sed -n 's/^emliod: listening on //p' "$T/lf_$d.out")
        "$EMLIO" fetch --connect "$EPN" --batch 4 --quiet >"$T/lf_$d.json" 2>&1
        check "non-root over $d: an epoch is served" test $? -eq 0
        kill "$NPID" 2>/dev/null; wait "$NPID" 2>/dev/null
    done
    chmod 700 "$T"
else
    skip "not root: cannot run emliod as another user"
fi

# --- The dataset index truncated or rewritten under a running daemon -------
# Its record tables used to be read from a shared mapping of the file: the
# next request after `truncate` (or `cp` over it, `rsync --inplace`) died
# of SIGBUS. Now the index is the daemon's own copy, read at start.
# Tables past the first page: a truncated mapping faults there only.
"$EMLIO" synth "$T/ix_img" --samples 1200 --classes 3 --bytes 1000 --quiet >/dev/null
"$EMLIO" pack "$T/ix_img" "$T/ix_tfr" --shard-bytes 300K --quiet >/dev/null
"$EMLIO" pack "$T/ix_img" "$T/ix_tar" --to tar --shard-bytes 300K --quiet >/dev/null
for fmt in tfr tar; do
    start_daemon "ix0_$fmt" "$T/ix_$fmt" || fail "daemon over ix_$fmt starts"
    check "$fmt: the dataset index was written" test -s "$T/ix_$fmt/.emlio-index"
    kill "$DPID"; wait "$DPID" 2>/dev/null
    # The second start takes its record tables from the index.
    start_daemon "ix_$fmt" "$T/ix_$fmt" || fail "daemon over ix_$fmt restarts"
    sleep 1 # past the start's last look at the index
    truncate -s 64 "$T/ix_$fmt/.emlio-index"
    "$EMLIO" fetch --connect "$EP" --batch 8 --verify --quiet \
        >"$T/ix_$fmt.json" 2>"$T/ix_$fmt.ferr"
    check "$fmt: index truncated under the daemon: fetch --verify passes" \
        test "$(json_field "$T/ix_$fmt.json" verified)" = True
    check "$fmt: ... and the daemon lives" kill -0 "$DPID"
    head -c 200000 /dev/urandom >"$T/junk"
    cp "$T/junk" "$T/ix_$fmt/.emlio-index" # cp writes in place
    "$EMLIO" fetch --connect "$EP" --batch 8 --verify --quiet \
        >"$T/ix_$fmt.2.json" 2>>"$T/ix_$fmt.ferr"
    check "$fmt: index overwritten in place: fetch --verify passes" \
        test "$(json_field "$T/ix_$fmt.2.json" verified)" = True
    check "$fmt: ... and the daemon lives" kill -0 "$DPID"
    kill "$DPID"; wait "$DPID" 2>/dev/null
    start_daemon "ix2_$fmt" "$T/ix_$fmt" || fail "restart over ix_$fmt"
    check "$fmt: the next start reports the damaged index and rescans" \
        grep -qi "index" "$T/ix2_$fmt.err"
    "$EMLIO" fetch --connect "$EP" --batch 8 --verify --quiet \
        >"$T/ix_$fmt.3.json" 2>>"$T/ix_$fmt.ferr"
    check "$fmt: after the rescan: 1200 samples, verified" \
        test "$(json_field "$T/ix_$fmt.3.json" samples)" = 1200
    kill "$DPID"; wait "$DPID" 2>/dev/null
done

# --- More shards than the soft descriptor limit -----------------------------
mkdir -p "$T/many"
for i in $(seq -w 1 150); do cp "$T/tars/"*.tar "$T/many/s$i.tar" 2>/dev/null ||
    cp "$(ls "$T/tars/"*.tar | head -n 1)" "$T/many/s$i.tar"; done
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -ge 1024 ]; then
    (ulimit -Sn 64 && exec "$EMLIOD" --data "$T/many" \
        --bind 'tcp://127.0.0.1:*' --log-level warn) >"$T/fd.out" \
        2>"$T/fd.err" &
    FPID=$!
    PIDS+=("$FPID")
    for _ in $(seq 1 200); do
        grep -q "listening on" "$T/fd.out" && break
        kill -0 "$FPID" 2>/dev/null || break
        sleep 0.05
    done
    check "150 shards under a soft limit of 64 descriptors: starts" \
        grep -q "listening on" "$T/fd.out"
    kill "$FPID" 2>/dev/null; wait "$FPID" 2>/dev/null
else
    skip "hard descriptor limit $hard too low to test raising the soft one"
fi
out=$( (ulimit -n 64 && exec timeout 20 "$EMLIOD" --data "$T/many" \
    --bind 'tcp://127.0.0.1:*') 2>&1)
check "above the hard limit: the error says what to raise" \
    bash -c "echo \"\$1\" | grep -q 'open-file limit of 64 leaves room.*LimitNOFILE'" _ "$out"

finish
