#!/usr/bin/env bash
# test_cold_io.sh - emliod --io read (src/store/ioengine.c): exact-size
# reads through io_uring and, with EMLIO_IO_URING=0, through the pread
# fallback, past the page cache (O_DIRECT where the file system has it)
# and, with EMLIO_IO_DIRECT=0, through it; each delivers what the mapping
# delivers, verified, for TFRecord, tar and ImageFolder, and reads ahead for queued
# requests; a bad mode, a memory limit below the engine's minimum and a
# shard cut short under the daemon are errors; records of very different
# sizes fit a small copy budget; a daemon without CAP_IPC_LOCK sizes its
# registered read buffers to the memlock limit.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

check "dataset builds" make_dataset "$T" 240 3 20000 1M
"$EMLIO" pack "$T/img" "$T/tar" --to tar --shard-bytes 1M --quiet >/dev/null
check "tar dataset builds" test "$(ls "$T"/tar/*.tar | wc -l)" -ge 3

# fetch_ids NAME: two verified epochs of the daemon at $EP, ids to $T/NAME.
# --inflight 8: GETs wait behind the one being read, for the read-ahead.
fetch_ids() {
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --seed 3 --verify --inflight 8 \
        --ids "$T/$1.ids" --quiet >"$T/$1.out" 2>"$T/$1.err"
}

for fmt in shards tar img; do
    start_daemon "map_$fmt" "$T/$fmt" --io map || fail "$fmt: map daemon starts"
    fetch_ids "map_$fmt"
    check "$fmt: --io map fetch verifies" test "$(json_field "$T/map_$fmt.out" verified)" = True
    check "$fmt: --io map: no engine reads reported" \
        test "$(json_field "$T/map_$fmt.out" disk_read_bytes)" = 0
    for engine in io_uring pread buffered; do
        name="${engine}_$fmt"
        no_uring="" no_direct=""
        [ $engine = pread ] && no_uring=0
        [ $engine = buffered ] && no_direct=0
        EMLIO_IO_URING=$no_uring EMLIO_IO_DIRECT=$no_direct \
            start_daemon "$name" "$T/$fmt" --io read --log-level info \
            --read-ahead-bytes 1M --metrics 127.0.0.1:0 --readers 1
        check "$name: daemon starts" test -n "$EP"
        if [ $engine = pread ]; then
            check "$name: the log says reads go through pread, and why" \
                grep -q "io: io_uring disabled by EMLIO_IO_URING=0: reads go through pread" "$T/$name.err"
        elif grep -q " through io_uring, " "$T/$name.err"; then
            ok "$name: the log names io_uring"
        else
            skip "$name: io_uring not available here ($(grep -o 'io: io_uring.*' "$T/$name.err"))"
        fi
        check "$name: the log names read mode" grep -q "io: read (asked" "$T/$name.err"
        want=tfrecord; [ $fmt = tar ] && want=tar; [ $fmt = img ] && want=imagefolder
        check "$name: the start log names the format it found ($want)" \
            grep -q "loaded [0-9]* shards ($want)" "$T/$name.err"
        if [ $engine = buffered ]; then
            check "$name: the log says reads use the page cache, and why" \
                grep -q "through the page cache (disabled by EMLIO_IO_DIRECT=0)" "$T/$name.err"
        elif grep -q "past the page cache" "$T/$name.err"; then
            ok "$name: the log names O_DIRECT"
        else
            skip "$name: no direct I/O on $T's file system ($(grep -o 'io: read.*' "$T/$name.err"))"
        fi
        murl=$(sed -n 's/^emliod: metrics on //p' "$T/$name.out")
        fetch_ids "$name"
        check "$name: fetch verifies" test "$(json_field "$T/$name.out" verified)" = True
        disk=$(json_field "$T/$name.out" disk_pct)
        check "$name: fetch reports the daemon's disk share ($disk%)" \
            bash -c "[[ '$disk' =~ ^[0-9]+$ ]] && [ '$disk' -le 100 ]"
        # What the reads took for the epoch's batches ("rd"), over what
        # was delivered: at least every byte once, never the 16-64x a
        # mapping read under memory pressure.
        amp=$(json_field "$T/$name.out" read_amp)
        check "$name: fetch reports the read amplification ($amp)" \
            /usr/bin/python3 -c "import sys; a = float(sys.argv[1]); sys.exit(not 1.0 <= a <= 2.0)" "$amp"
        sort "$T/map_$fmt.ids" >"$T/map_$fmt.sorted"
        sort "$T/$name.ids" >"$T/$name.sorted"
        check "$name: the same samples per epoch as --io map" \
            cmp -s "$T/map_$fmt.sorted" "$T/$name.sorted"
        curl -s "$murl" >"$T/$name.prom"
        dev=$(awk '/^emlio_server_disk_read_bytes_total /{print $2}' "$T/$name.prom")
        if [ "${dev:-0}" -gt 0 ]; then
            check "$name: the energy meter's disk term counts the device bytes (labelled model)" \
                grep -q '^emlio_energy_domain_joules_total{domain="model-disk",source="model"' "$T/$name.prom"
        else
            skip "$name: the block layer read nothing for the daemon (all in the page cache): no disk term to check"
        fi
        ahead=$(awk '/^emlio_server_io_ahead_bytes_total /{print $2}' "$T/$name.prom")
        check "$name: requests queued behind were read ahead ($ahead bytes)" \
            test "${ahead:-0}" -gt 0
        # Unshuffled, neighbouring records go to the device as one read
        # each run (never for ImageFolder's files): fewer reads than
        # samples, and still every sample verified.
        reads0=$(awk '/^emlio_server_io_reads_total /{print $2}' "$T/$name.prom")
        "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 1 --shuffle none \
            --verify --quiet >"$T/$name.none" 2>&1
        check "$name: --shuffle none verifies" test "$(json_field "$T/$name.none" verified)" = True
        reads1=$(curl -s "$murl" | awk '/^emlio_server_io_reads_total /{print $2}')
        if [ $fmt != img ]; then
            check "$name: --shuffle none merged neighbours ($((reads1 - reads0)) reads for 240 samples)" \
                test $((reads1 - reads0)) -lt 120
        fi
        kill "$DPID"
        wait "$DPID" 2>/dev/null
    done
done

# A memory limit below what the engine needs is a start-up error that
# says how much it needs.
"$EMLIOD" --data "$T/shards" --bind "tcp://127.0.0.1:*" --io read \
    --read-ahead-bytes 100T >/dev/null 2>"$T/small.err"
rc=$?
check "memory below the engine's minimum: emliod fails" test $rc -ne 0
check "memory below the engine's minimum: the error says what it needs" \
    grep -q "MiB the I/O engine needs (twice --read-ahead-bytes" "$T/small.err"

"$EMLIOD" --data "$T/shards" --bind "tcp://127.0.0.1:*" --io bogus \
    >/dev/null 2>"$T/bogus.err"
rc=$?
check "--io bogus fails" test $rc -ne 0
check "--io bogus is named" grep -q "unknown io mode 'bogus'" "$T/bogus.err"

# A shard cut short under a daemon reading it with exact reads: refused
# with the shard named, never served short; the daemon keeps serving.
cp -r "$T/shards" "$T/cut"
start_daemon cut "$T/cut" --io read || fail "cut: daemon starts"
victim=$(ls "$T"/cut/*.tfrecord | head -1)
# A blocking open for writing: it waits until the daemon gives its lease up.
/usr/bin/python3 -c "open('$victim', 'r+b').truncate(100)"
check "cut shard: truncated" test "$(stat -c %s "$victim")" = 100
"$EMLIO" fetch --connect "$EP" --batch 16 --epochs 1 --verify --quiet \
    >"$T/cut.out" 2>"$T/cut.ferr"
rc=$?
check "cut shard: fetch fails" test $rc -ne 0
check "cut shard: the error names the shard" grep -q "$(basename "$victim")" "$T/cut.ferr"
check "cut shard: the daemon is still running" kill -0 "$DPID"

# A mix of 20 KB images (TFRecord) and 600-byte records (tar) under a
# small copy budget: GETs are sized by the shard with the largest mean
# record, so none asks for more than the budget. Sized by the dataset's
# mean, every epoch failed with "request would copy ... more than the
# daemon's budget" (found by a race hunt, 2026-12-07).
"$EMLIO" synth "$T/tiny" --samples 600 --classes 2 --bytes 600 --quiet &&
    "$EMLIO" pack "$T/tiny" "$T/mix" --to tar --shard-bytes 64K --quiet >/dev/null &&
    cp "$T"/shards/*.tfrecord* "$T/mix/"
check "mixed dataset builds" test "$(ls "$T"/mix/*.tar | wc -l)" -ge 2
start_daemon mix "$T/mix" --mixed-formats --io read --max-copy-bytes 64K ||
    fail "mix: daemon starts"
fetch_mix() {
    "$EMLIO" fetch --connect "$EP" --batch 32 --seed "$1" --verify --quiet \
        >/dev/null 2>"$T/mix-$1.ferr"
}
for seed in 22 32 52; do
    check "mixed sizes, 64 KiB copy budget, seed $seed: a verified epoch" \
        fetch_mix "$seed"
done

# Registered read buffers as a user without CAP_IPC_LOCK: the arena is
# sized to the memlock limit (8 MiB, shared by the readers' rings and the
# start-up probe's) and used; under a limit too small for it, the daemon
# says why and reads as before. Both verified.
fetch_nob() {
    "$EMLIO" fetch --connect "$EP" --batch 16 --verify --quiet \
        --ids "$T/$1.ids" >/dev/null 2>"$T/$1.ferr"
}
nobody_daemon() { # NAME MEMLOCK_BYTES
    local name=$1
    prlimit --memlock="$2:$2" setpriv --reuid 65534 --regid 65534 \
        --clear-groups --inh-caps=-all "$T/nob/bin/emliod" --data "$T/shards" \
        --bind "tcp://127.0.0.1:*" --io read --log-level info \
        >"$T/$name.out" 2>"$T/$name.err" &
    DPID=$!
    PIDS+=("$DPID")
    EP=$(listen_addr "$T/$name.out" emliod "$DPID")
}
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
    mkdir -p "$T/nob" && cp -r "$B/bin" "$B/lib" "$T/nob/" &&
        chmod -R a+rX "$T/nob" "$T/shards" && chmod a+x "$T"
    for cell in "ml8 8388608" "ml1 1048576"; do
        # shellcheck disable=SC2086
        set -- $cell
        if ! nobody_daemon "$1" "$2"; then
            fail "$1: a daemon as nobody starts: $(tail -2 "$T/$1.err")"
            continue
        fi
        check "$1: memlock $(($2 >> 10)) KiB as nobody: a verified epoch" \
            fetch_nob "$1"
        kill "$DPID"
        wait "$DPID" 2>/dev/null
    done
    check "ml8: the arena fits the memlock limit and is used" \
        grep -Eq "io: [1-8] MiB of read buffers registered with io_uring" "$T/ml8.err"
    check "ml8: reads went into it" \
        grep -Eq "past the page cache, [1-9][0-9]* into registered buffers" "$T/ml8.err"
    check "ml1: too small a limit is said, not failed" \
        grep -q "no registered read buffers: the memlock limit (1024 KiB" "$T/ml1.err"
    check "ml1: no read used it" \
        grep -q "past the page cache, 0 into registered buffers" "$T/ml1.err"
    check "ml8 and ml1 delivered the same samples" \
        cmp -s <(sort "$T/ml8.ids") <(sort "$T/ml1.ids")
else
    skip "registered buffers as nobody: needs root, setpriv and prlimit"
fi
finish
