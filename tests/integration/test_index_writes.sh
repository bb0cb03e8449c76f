#!/usr/bin/env bash
# test_index_writes.sh - the daemon's cache files (the shards' .idx, the
# dataset index, an ImageFolder's file list) on a read-only or a full file
# system (issue 34, "wrong hints on read-only or full disks"): the daemon
# serves every sample anyway, logs the first failed .idx once with the
# remedy that fits the errno and counts the rest, and tells a full disk
# from a read-only one. Needs root (a read-only bind mount, a small tmpfs).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=1M tmpfs "$T" 2>/dev/null; then
    skip "index writes on read-only and full file systems: needs root and mount"
    finish
    exit
fi
umount "$T"

check "dataset builds" make_dataset "$T/src" 240 3 20000 1M
SHARDS=$(ls "$T/src/shards"/*.tfrecord | wc -l)
# No cache file survives from the build: the daemon must try to write each.
rm -f "$T/src/shards"/*.idx "$T/src/shards/.emlio-index" "$T/src/img/.emlio-files"
MOUNTS=()
unmount_all() {
    for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
}
trap 'unmount_all; cleanup' EXIT

fetch_all() { # fetch_all NAME: one verified epoch from $EP
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 1 --verify \
        >"$T/$1.json" 2>"$T/$1.ferr"
}

# Read-only: a bind mount of the data, remounted read-only.
mkdir -p "$T/ro"
mount --bind "$T/src" "$T/ro" && MOUNTS+=("$T/ro") &&
    mount -o remount,bind,ro "$T/ro"
check "the read-only mount refuses writes" bash -c "! touch '$T/ro/x' 2>/dev/null"
start_daemon ro "$T/ro/shards" || exit 1
fetch_all ro
check "read-only: every sample, verified" test "$(json_field "$T/ro.json" verified)" = True
check "read-only: the first .idx failure is logged with its remedy" \
    grep -q "cannot write index '.*\.idx': Read-only file system; pass --no-write-index not to try" "$T/ro.err"
check "... once, not once per shard ($(grep -c 'cannot write index' "$T/ro.err"))" \
    test "$(grep -c "cannot write index '" "$T/ro.err")" -eq 1
check "... the others counted ($((SHARDS - 1)) more)" \
    grep -q "$((SHARDS - 1)) more .idx files could not be written" "$T/ro.err"
check "read-only: the dataset index asks for a writable --index-dir" \
    grep -q "cannot write dataset index .*Read-only file system.*(give emliod a writable --index-dir)" "$T/ro.err"
kill "$DPID"
wait "$DPID" 2>/dev/null

mkdir -p "$T/ix"
start_daemon roix "$T/ro/shards" --index-dir "$T/ix" || exit 1
fetch_all roix
check "read-only with --index-dir: verified" test "$(json_field "$T/roix.json" verified)" = True
check "... the dataset index is written there" test -n "$(ls "$T/ix")"
check "... and is not complained of" bash -c "! grep -q 'cannot write dataset index' '$T/roix.err'"
kill "$DPID"
wait "$DPID" 2>/dev/null

start_daemon roquiet "$T/ro/shards" --no-write-index || exit 1
fetch_all roquiet
check "read-only with --no-write-index: verified, and not a word of writes" \
    bash -c "test \"\$(grep -c 'cannot write' '$T/roquiet.err')\" -eq 0 &&
        grep -q '\"verified\": true' '$T/roquiet.json'"
kill "$DPID"
wait "$DPID" 2>/dev/null

start_daemon roimg "$T/ro/img" || exit 1
fetch_all roimg
check "read-only ImageFolder: verified" test "$(json_field "$T/roimg.json" verified)" = True
check "... the file list's failure says what it costs and how not to try" \
    grep -q "cannot write file list '.*\.emlio-files': Read-only file system; the next start walks the class directories again; pass --no-write-index not to try" "$T/roimg.err"
kill "$DPID"
wait "$DPID" 2>/dev/null

# Full: a tmpfs the size of the shards plus a little, filled to the brim.
mkdir -p "$T/full"
KB=$(du -sk "$T/src/shards" | cut -f1)
mount -t tmpfs -o size=$((KB + 512))k tmpfs "$T/full" && MOUNTS+=("$T/full")
cp "$T/src/shards"/*.tfrecord "$T/full/"
dd if=/dev/zero of="$T/full/filler" bs=4k 2>/dev/null
check "the tmpfs is full" bash -c "! echo x 2>/dev/null >'$T/full/probe'"
start_daemon full "$T/full" || exit 1
fetch_all full
check "full: every sample, verified" test "$(json_field "$T/full.json" verified)" = True
check "full: the .idx failure says the file system is full" \
    grep -q "cannot write index '.*': No space left on device; the file system is full" "$T/full.err"
check "full: the dataset index's hint is free space, not a writable directory" \
    grep -q "cannot write dataset index .*No space left on device.*(the file system is full: free space there, or give --index-dir on another one)" "$T/full.err"
check "... and says nothing of writability" bash -c "! grep -q 'writable' '$T/full.err'"
kill "$DPID"
wait "$DPID" 2>/dev/null

finish
