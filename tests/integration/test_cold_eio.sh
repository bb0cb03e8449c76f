#!/usr/bin/env bash
# test_cold_eio.sh - EIO from the device under emliod --io read (issue 30):
# a record on a failing region of a shard is an error naming the shard and
# the record (the daemon keeps serving), or with --on-corrupt skip a
# counted skip, never a short or wrong sample. The failing region comes
# from faultfs.py (FUSE, python3-fusepy): this kernel has no device-mapper.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

if ! /usr/bin/python3 -c 'import fusepy' 2>/dev/null || [ ! -e /dev/fuse ] ||
    [ "$(id -u)" != 0 ]; then
    skip "EIO under --io read: needs root, /dev/fuse and python3-fusepy"
    finish
    exit
fi
check "dataset builds" make_dataset "$T" 240 3 20000 1M
victim=$(cd "$T/shards" && ls *.tfrecord | head -1)
mkdir -p "$T/mnt"
/usr/bin/python3 tests/integration/faultfs.py "$T/shards" "$T/mnt" "$T/fail" \
    "$victim" 2>"$T/fuse.err" &
FPID=$!
unmount() { umount "$T/mnt" 2>/dev/null || umount -l "$T/mnt" 2>/dev/null; wait "$FPID" 2>/dev/null; }
for _ in $(seq 50); do mountpoint -q "$T/mnt" && break; sleep 0.1; done
check "the fault file system is mounted" mountpoint -q "$T/mnt"

for mode in fail skip; do
    rm -f "$T/fail"
    start_daemon "eio_$mode" "$T/mnt" --io read --on-corrupt "$mode" || fail "$mode: daemon starts"
    # The region fails from now on; what the load read is dropped from
    # the page cache, so every read goes to the file system.
    touch "$T/fail"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 1 --verify --quiet \
        >"$T/$mode.out" 2>"$T/$mode.ferr"
    rc=$?
    if [ $mode = fail ]; then
        check "fail: the fetch fails" test $rc -ne 0
        check "fail: the error names the shard" grep -q "$victim" "$T/$mode.ferr"
        check "fail: ... and the record and the reason" \
            grep -qE "record [0-9]+.*(I/O error|Input/output error)|unreadable.*record [0-9]+" "$T/$mode.ferr"
    else
        check "skip: the fetch completes" test $rc -eq 0
        skipped=$(json_field "$T/$mode.out" skipped)
        check "skip: the failing records are counted as skipped ($skipped)" \
            test "${skipped:-0}" -gt 0
        check "skip: and the rest verifies" test "$(json_field "$T/$mode.out" verified)" = True
        samples=$(json_field "$T/$mode.out" samples)
        check "skip: every other sample arrives ($samples + $skipped of 240)" \
            test $((samples + skipped)) -ge 240
    fi
    check "$mode: the daemon is still running" kill -0 "$DPID"
    kill "$DPID"
    wait "$DPID" 2>/dev/null
done
unmount
finish
