#!/usr/bin/env bash
# test_io_auto.sh - emliod --io auto while serving (src/server/server_io.c):
# emliod runs in a memory cgroup of its own; the test writes the cgroup's
# limit under the running daemon and checks that auto moves the dataset
# from the mappings to exact-size reads and back (logged, counted in the
# metrics, seen in what fetch reports the reads took), and that shards
# whose pages are resident anyway (read by `cat` outside the cgroup) are
# served from their mappings while the rest is read, and read again once
# their pages are dropped. Needs root and a memory cgroup controller
# (v1 memory.limit_in_bytes or v2 memory.max); skipped, and said, without.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

if ! memory_cgroup io_auto $((1 << 30)); then
    skip "--io auto while serving: no writable memory cgroup controller here (needs root)"
    finish
    exit
fi
LIMIT=$CG_LIMIT

# 6 shards of ~8 MB: 48 MB of records.
check "dataset builds" make_dataset "$T" 480 4 100000 8M
cat >"$T/in_cg.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$CG/cgroup.procs" && exec "$EMLIOD" "\$@"
EOF
chmod +x "$T/in_cg.sh"

drop_pages() {
    /usr/bin/python3 -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "$T"/shards/*.tfrecord
}
drop_pages # what the daemon maps from now on is charged to its cgroup
EMLIOD="$T/in_cg.sh" start_daemon auto "$T/shards" --log-level info --read-ahead-bytes 1M \
    --metrics 127.0.0.1:0 || fail "daemon starts in the cgroup"
check "emliod runs inside the cgroup" grep -qx "$DPID" "$CG/cgroup.procs"
murl=$(sed -n 's/^emliod: metrics on //p' "$T/auto.out")
check "1 GiB: auto maps, and says it looks again" \
    grep -q "io: map (auto; dataset 4[0-9] MiB, memory cgroup limit 1024 MiB).*looked at again" "$T/auto.err"

n=0
# fetch_epoch: one verified epoch; sets DISK to what its reads took.
fetch_epoch() {
    n=$((n + 1))
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 1 --seed $n --verify \
        --quiet >"$T/fetch$n.out" 2>"$T/fetch$n.err"
    VERIFIED=$(json_field "$T/fetch$n.out" verified 2>/dev/null)
    DISK=$(json_field "$T/fetch$n.out" disk_read_bytes 2>/dev/null)
}
# metric NAME: its value now.
metric() { curl -s "$murl" | awk -v m="$1" '$1 == m { print $2 }'; }
# wait_for WHAT 'COMMAND': up to 15 s (auto looks every 2 s); COMMAND is
# evaluated afresh at every try.
wait_for() {
    local what=$1
    for _ in $(seq 150); do
        eval "$2" && { ok "$what"; return 0; }
        sleep 0.1
    done
    fail "$what (emlio_server_io_mapped_shards $(metric emlio_server_io_mapped_shards))"
    command -v fincore >/dev/null && fincore "$T"/shards/*.tfrecord | sed 's/^/    /'
    grep "io: " "$T"/*.err | tail -5 | sed 's/^/    /'
}

fetch_epoch
check "mapped: the epoch verifies" test "$VERIFIED" = True
check "mapped: no engine reads" test "$DISK" = 0

# The limit falls below the dataset: the shards are read from now on
# (but for those the cgroup's reclaim left resident).
echo $((40 << 20)) >"$CG/$LIMIT" || fail "the cgroup takes a 40 MiB limit"
wait_for "40 MiB: auto switches to read, and logs why" \
    'grep -q "io: now read (auto, was map; dataset 4[0-9] MiB, memory cgroup limit 40 MiB)" "$T/auto.err"'
check "the switch is counted (emlio_server_io_switches_total 1)" test "$(metric emlio_server_io_switches_total)" = 1
check "the read mode is exported (emlio_server_io_read_mode 1)" test "$(metric emlio_server_io_read_mode)" = 1
fetch_epoch
check "read: the epoch verifies" test "$VERIFIED" = True
check "read: records came through the engine ($DISK bytes)" test "${DISK:-0}" -gt 0

# The limit raised again: back to the mappings for all.
echo $((1 << 30)) >"$CG/$LIMIT"
wait_for "1 GiB again: auto switches back to map" \
    'grep -q "io: now map (auto, was read; dataset 4[0-9] MiB, memory cgroup limit 1024 MiB)" "$T/auto.err"'
check "switches counted (2)" test "$(metric emlio_server_io_switches_total)" = 2
fetch_epoch
check "mapped again: the epoch verifies" test "$VERIFIED" = True
check "mapped again: no engine reads" test "$DISK" = 0
check "the daemon is alive" kill -0 "$DPID"
kill "$DPID"; wait "$DPID" 2>/dev/null

# Residency: a daemon that starts reading (its mappings never touched).
# Pages cached by someone else (charged to this shell's cgroup, not the
# daemon's) send their shards back to the mappings while reading.
drop_pages
echo $((40 << 20)) >"$CG/$LIMIT"
EMLIOD="$T/in_cg.sh" start_daemon res "$T/shards" --log-level info --read-ahead-bytes 1M \
    --metrics 127.0.0.1:0 || fail "reading daemon starts in the cgroup"
murl=$(sed -n 's/^emliod: metrics on //p' "$T/res.out")
check "40 MiB: auto reads from the start" \
    grep -q "io: read (auto; dataset 4[0-9] MiB, memory cgroup limit 40 MiB)" "$T/res.err"
fetch_epoch
check "read: the epoch verifies" test "$VERIFIED" = True
check "read: every record came through the engine ($DISK bytes)" test "${DISK:-0}" -ge 48000000
# Read again at each try: on a loaded host (the sanitizer run) the cache
# may let a few pages go before the daemon's next look.
wait_for "resident shards are served from their mappings (emlio_server_io_mapped_shards 6)" \
    'cat "$T"/shards/*.tfrecord >/dev/null; [ "$(metric emlio_server_io_mapped_shards)" = 6 ]'
check "the log says how many shards are resident" \
    grep -q "io: [1-6] of 6 shards resident in the page cache: served from their mappings" "$T/res.err"
drop_pages
wait_for "their pages dropped, they are read again (emlio_server_io_mapped_shards 0)" \
    '[ "$(metric emlio_server_io_mapped_shards)" = 0 ]'
check "the log says none is resident now" grep -q "io: 0 of 6 shards resident" "$T/res.err"
wait_for "cached again, mapped again" \
    'cat "$T"/shards/*.tfrecord >/dev/null; [ "$(metric emlio_server_io_mapped_shards)" = 6 ]'
fetch_epoch
check "resident: the epoch verifies" test "$VERIFIED" = True
check "resident: nothing went through the engine" test "$DISK" = 0
check "residency is no switch (switches 0)" test "$(metric emlio_server_io_switches_total)" = 0
kill "$DPID"; wait "$DPID" 2>/dev/null

# An asked mode is never changed.
EMLIOD="$T/in_cg.sh" start_daemon asked "$T/shards" --io map --log-level info || fail "asked daemon starts"
echo $((40 << 20)) >"$CG/$LIMIT"
sleep 4.5
check "--io map asked: no look while serving" bash -c "! grep -q 'io: now' '$T/asked.err'"
kill "$DPID"; wait "$DPID" 2>/dev/null
finish
