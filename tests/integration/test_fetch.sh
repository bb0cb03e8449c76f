#!/usr/bin/env bash
# test_fetch.sh - the foundation end to end: synth, pack, emliod, fetch
# --verify on loopback, plus the programs' answers to bad input.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

check "dataset builds" make_dataset "$T" 300 3 20000 1M
nshards=$(ls "$T"/shards/*.tfrecord | wc -l)
check "several shards ($nshards)" test "$nshards" -ge 3
start_daemon d1 "$T/shards" || { fail "daemon starts"; finish; exit 1; }
ok "daemon starts and prints its endpoint ($EP)"

# Two verified epochs; every sample once per epoch, epochs in other orders.
"$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --seed 7 --verify \
    --ids "$T/ids" --quiet >"$T/fetch.out" 2>"$T/fetch.err"
check "fetch --verify succeeds" test $? -eq 0
check "json reports 600 samples" test "$(json_field "$T/fetch.out" samples)" = 600
check "json reports 2 epochs" test "$(json_field "$T/fetch.out" epochs)" = 2
check "json is verified" test "$(json_field "$T/fetch.out" verified)" = True
# ramp_s: seconds to 80% of the steady rate, within the run (not timed).
check "json has a plausible ramp_s" /usr/bin/python3 -c "
import json, sys
d = json.loads(open('$T/fetch.out').read().splitlines()[-1])
sys.exit(not 0 <= d['ramp_s'] <= d['seconds'] + 0.01)"
for e in 0 1; do
    awk -v e=$e '$1 == e {print $2, $3}' "$T/ids" | sort >"$T/e$e"
    check "epoch $e: 300 lines" test "$(wc -l <"$T/e$e")" = 300
    check "epoch $e: 300 distinct samples" test "$(sort -u "$T/e$e" | wc -l)" = 300
done
check "both epochs cover the same set" cmp -s "$T/e0" "$T/e1"
awk '$1 == 0 {print $2, $3}' "$T/ids" >"$T/o0"
awk '$1 == 1 {print $2, $3}' "$T/ids" >"$T/o1"
check "epochs differ in order" bash -c "! cmp -s '$T/o0' '$T/o1'"

# Same seed, same plan: the delivered set per batch is deterministic; in
# order with --shuffle none gives file order exactly.
"$EMLIO" fetch --connect "$EP" --batch 10 --shuffle none --in-order \
    --ids "$T/ids_none" --quiet >/dev/null 2>&1
awk '{print $2, $3}' "$T/ids_none" >"$T/none"
for f in "$T"/shards/*.tfrecord; do
    n=$(wc -l <"$f.idx")
    for ((i = 0; i < n; i++)); do echo "$(basename "$f") $i"; done
done >"$T/file_order"
check "--shuffle none --in-order is file order" cmp -s "$T/none" "$T/file_order"

# --progress: plain progress lines on stderr (a log, not a terminal), one
# at least per epoch's end, with percentage and ETA; stdout stays JSON.
"$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --progress 1 \
    >"$T/prog.out" 2>"$T/prog.err"
check "fetch --progress succeeds" test $? -eq 0
check "--progress: a line at the end of epoch 1 (50%)" \
    grep -qE '^emlio fetch: epoch 1/2  batch 19/19  50\.0%  .* ETA ' "$T/prog.err"
check "--progress: a line at the end of the run (100%)" \
    grep -qE '^emlio fetch: epoch 2/2  batch 19/19  100\.0%' "$T/prog.err"
check "--progress: stdout is JSON lines only" /usr/bin/python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 3, lines
for line in lines:
    json.loads(line)' "$T/prog.out"
"$EMLIO" fetch --connect "$EP" --batch 16 --progress 0 >/dev/null 2>"$T/prog0.err"
check "--progress 0 is refused" test $? -eq 2
# Fractions of a second too (issue 34: whole seconds only, before).
"$EMLIO" fetch --connect "$EP" --batch 16 --progress 0.2 >/dev/null 2>"$T/prog02.err"
check "--progress 0.2 is accepted" test $? -eq 0
check "--progress 0.2: a plain line at the end" grep -qE '^emlio fetch: epoch 1/1 .*100\.0%' "$T/prog02.err"

# emlio inspect tcp://: what the daemon serves, as a client learns it.
"$EMLIO" inspect "$EP" --json >"$T/inspect.json" 2>"$T/inspect.err"
check "inspect tcp://HOST:PORT succeeds" test $? -eq 0
check "inspect tcp:// reports the shards and the 300 samples" /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["shards"] == int(sys.argv[2]) and j["samples"] == 300, j
assert j["daemons"] == [sys.argv[3]] and len(j["shard_list"]) == j["shards"]
' "$T/inspect.json" "$nshards" "$EP"
check "inspect tcp:// as text" bash -c \
    "'$EMLIO' inspect '$EP' | grep -qx 'samples: 300'"
# The class names pack wrote (classes.txt), as the daemon's WELCOME says.
check "inspect tcp:// names the 3 classes in label order" /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
want = open(sys.argv[2]).read().split()
assert j["classes"] == want and len(want) == 3, (j["classes"], want)
assert j["format"] == "tfrecord", j["format"]
assert j["bytes"] == sum(s["bytes"] for s in j["shard_list"]) > 0
' "$T/inspect.json" "$T/shards/classes.txt"

# Batch sizes that do not divide the dataset, several streams, fixed window.
"$EMLIO" fetch --connect "$EP" --batch 7 --streams 4 --inflight 3 --verify \
    --quiet >"$T/f7.out" 2>&1
check "batch 7, 4 streams, window 3 verifies" test $? -eq 0
check "batch 7: 43 batches" test "$(json_field "$T/f7.out" batches)" = 43
# Fixed streams spread over both ZeroMQ I/O threads at once; tuned ones
# start on one and take the second only when it runs full (iolanes.h).
check "4 fixed streams use 2 I/O threads" \
    test "$(json_field "$T/f7.out" io_threads)" = 2
check "tuned streams use 1 or 2 I/O threads" /usr/bin/python3 -c "
import json, sys
d = json.loads(open('$T/fetch.out').read().splitlines()[-1])
sys.exit(d['io_threads'] not in (1, 2))"

# Credits are per connection: a client with more requests in flight than
# one stream may hold spreads them so no stream exceeds the daemon's limit.
start_daemon tight "$T/shards" --max-credit 2 --workers 4
credit_fail=0
for i in 1 2 3 4 5; do
    "$EMLIO" fetch --connect "$EP" --batch 7 --streams 3 --inflight 60 \
        --epochs 2 --quiet >/dev/null 2>>"$T/credit.err" || credit_fail=1
done
check "window larger than one stream's credits never exceeds them" \
    test $credit_fail -eq 0
kill "$DPID"

# Small samples (issue 18): at 512 B the automatic window grows to the
# daemon's credits on every stream. A client within its credits must never
# be taken for one that does not read, refused, or left waiting.
check "512 B dataset builds" make_dataset "$T/small" 20000 4 512 2M
start_daemon dsmall "$T/small/shards" || fail "daemon on 512 B samples starts"
for streams in auto 4; do
    flags=()
    [ "$streams" = auto ] || flags=(--streams "$streams")
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 3 --verify "${flags[@]}" \
        --quiet >"$T/small.out" 2>"$T/small.err"
    check "512 B, batch 16, streams $streams: fetch --verify succeeds" \
        test $? -eq 0
    check "512 B, streams $streams: 60000 samples" \
        test "$(json_field "$T/small.out" samples)" = 60000
    check "512 B, streams $streams: no connection lost" \
        bash -c "! grep -q 'lost connection' '$T/small.err'"
done
check "512 B: the daemon closed no client's connection" \
    bash -c "! grep -q 'closing connection' '$T/dsmall.err'"
kill "$DPID"

# Bad input: clear messages, non-zero exits, bounded time.
"$EMLIOD" --data "$T/nope" --bind 'tcp://127.0.0.1:*' >/dev/null 2>"$T/e1"
check "missing data dir fails" test $? -ne 0
check "missing data dir is named" grep -q "$T/nope" "$T/e1"
mkdir -p "$T/empty"
"$EMLIOD" --data "$T/empty" --bind 'tcp://127.0.0.1:*' >/dev/null 2>"$T/e2"
check "no shards fails" test $? -ne 0
check "no shards says so" grep -q "no \*.tfrecord shards" "$T/e2"
# A daemon of its own holds the port: the ones above were killed, and one
# that has finished stopping frees its port (the test used to hang then).
start_daemon inuse "$T/shards" || fail "daemon for the port test starts"
timeout 20 "$EMLIOD" --data "$T/shards" --bind "$EP" >/dev/null 2>"$T/e3"
rc=$?
check "port in use fails" test $rc -ne 0 -a $rc -ne 124
check "port in use says so" grep -qi "address already in use" "$T/e3"
kill "$DPID"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start=$SECONDS
"$EMLIO" fetch --connect "tcp://127.0.0.1:$port" --batch 8 \
    --connect-timeout-ms 500 >/dev/null 2>"$T/e4"
rc=$?
check "nobody listening fails" test $rc -ne 0
check "nobody listening names the endpoint" grep -q "127.0.0.1:$port" "$T/e4"
check "nobody listening gives up quickly" test $((SECONDS - start)) -le 5
"$EMLIO" fetch --batch 8 >/dev/null 2>"$T/e5"
check "fetch without --connect is a usage error" test $? -eq 2
"$EMLIOD" --data "$T/shards" >/dev/null 2>&1
check "emliod without --bind is a usage error" test $? -eq 2
# Endpoint mistakes say the expected form, before anything else is said.
"$EMLIOD" --data "$T/shards" --bind 127.0.0.1:5555 >/dev/null 2>"$T/e6"
check "emliod --bind without tcp:// is a usage error" test $? -eq 2
check "... that shows tcp://HOST:PORT first" \
    grep -q "^emliod: --bind: invalid endpoint '127.0.0.1:5555': expected tcp://HOST:PORT" "$T/e6"
check "... and no CURVE warning" bash -c "! grep -qi curve '$T/e6'"
"$EMLIO" fetch --connect tcp://127.0.0.1 --batch 8 >/dev/null 2>"$T/e7"
check "fetch --connect without a port is a usage error" test $? -eq 2
check "... that shows tcp://HOST:PORT" grep -q "expected tcp://HOST:PORT" "$T/e7"
"$EMLIO" plan --connect "$EP,tcp://h:70000" --world 1 --batch 8 \
    >/dev/null 2>"$T/e8"
check "plan --connect with a bad port names it" \
    grep -q "invalid port '70000' in endpoint 'tcp://h:70000'" "$T/e8"

# A corrupt record is never delivered. Samples too large to pack (above
# 16 KiB, as here) are sent with a CRC derived from the record's stored CRC,
# their bytes unread by the daemon (tfrecord.c): the client's check
# finds the flip and names the sample; smaller ones the daemon checks, and
# names with their offset (below).
mkdir -p "$T/bad"
cp "$T"/shards/* "$T/bad/"
victim=$(ls "$T"/bad/*.tfrecord | head -n 1)
/usr/bin/python3 - "$victim" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[len(b) // 2] ^= 0x01
open(p, 'wb').write(b)
PY
start_daemon bad "$T/bad" || fail "daemon on corrupt copy starts"
"$EMLIO" fetch --connect "$EP" --batch 16 --quiet >/dev/null 2>"$T/e6"
check "corrupt record fails the fetch" test $? -ne 0
check "corrupt sample named with shard and cause" \
    grep -q "sample [0-9]* of shard '$(basename "$victim")' from daemon '.*' does not match its CRC-32C: corrupt in the shard on disk or on the way" "$T/e6"

kill "$DPID"
# With --on-corrupt skip the record is left out, reported, never delivered.
start_daemon skip "$T/bad" --on-corrupt skip || fail "skip daemon starts"
"$EMLIO" fetch --connect "$EP" --batch 16 --verify --ids "$T/skip.ids" \
    --quiet >"$T/skip.out" 2>"$T/skip.err"
check "skip mode: fetch --verify succeeds" test $? -eq 0
check "skip mode: one record reported skipped" test "$(json_field "$T/skip.out" skipped)" = 1
check "skip mode: the skipped record is named" \
    grep -q "skipped corrupt record .* of shard '$(basename "$victim")'" "$T/skip.err"
check "skip mode: 299 samples delivered" test "$(wc -l <"$T/skip.ids")" = 299
kill "$DPID"

# flip_record SHARD: flips one byte in the middle of the shard's largest
# record (its image) and prints the record's index and size.
flip_record() {
    /usr/bin/python3 - "$1" <<'PY'
import sys
p = sys.argv[1]
recs = [tuple(map(int, line.split())) for line in open(p + '.idx')]
i = max(range(len(recs)), key=lambda k: recs[k][1])
off, size = recs[i]
b = bytearray(open(p, 'rb').read())
b[off + size // 2] ^= 0x01
open(p, 'wb').write(b)
print(i, size)
PY
}

# A >= 64 KiB image flipped on disk: the default daemon (--on-corrupt fail)
# sends it with the CRC the disk says it must have; the fetch fails naming
# the sample and the cause, and the sample is in no --ids line.
check "64 KiB dataset builds" make_dataset "$T/crc64" 12 2 70000 4M
victim=$(ls "$T"/crc64/shards/*.tfrecord | head -n 1)
read -r rec size < <(flip_record "$victim")
check "the flipped record holds a >= 64 KiB image ($size bytes)" \
    test "$size" -ge $((64 * 1024 + 100))
start_daemon crcbig "$T/crc64/shards" || fail "daemon on 64 KiB samples starts"
"$EMLIO" fetch --connect "$EP" --batch 2 --ids "$T/big.ids" --quiet \
    >/dev/null 2>"$T/big.err"
check "64 KiB flip: the fetch fails" test $? -ne 0
check "64 KiB flip: the sample, its shard and the cause are named" \
    grep -q "sample $rec of shard '$(basename "$victim")' from daemon '.*' does not match its CRC-32C: corrupt in the shard on disk or on the way" "$T/big.err"
check "64 KiB flip: the sample is not delivered" \
    bash -c "! grep -q ' $(basename "$victim") $rec\$' '$T/big.ids'"
# A GET with a transform decodes on the daemon, which checks first.
"$EMLIO" fetch --connect "$EP" --batch 2 --transform 'random_resized_crop(64)' \
    --decode-at server --quiet >/dev/null 2>"$T/bigxf.err"
check "64 KiB flip, decoded by the daemon: the fetch fails" test $? -ne 0
check "64 KiB flip, decoded by the daemon: it names the record and offset" \
    grep -q "corrupt record $rec in shard '$(basename "$victim")' at offset" "$T/bigxf.err"
# A client that does not check CRCs says so (GET "unchecked"): the daemon
# then checks the stored checksum itself, so --no-crc never lets disk
# corruption through unseen.
"$EMLIO" fetch --connect "$EP" --batch 2 --no-crc --ids "$T/bignocrc.ids" \
    --quiet >/dev/null 2>"$T/bignocrc.err"
check "64 KiB flip, --no-crc: the fetch fails" test $? -ne 0
check "64 KiB flip, --no-crc: the daemon names the record and offset" \
    grep -q "corrupt record $rec in shard '$(basename "$victim")' at offset" "$T/bignocrc.err"
check "64 KiB flip, --no-crc: the sample is not delivered" \
    bash -c "! grep -q ' $(basename "$victim") $rec\$' '$T/bignocrc.ids'"
kill "$DPID"
start_daemon crcbigskip "$T/crc64/shards" --on-corrupt skip ||
    fail "skip daemon on 64 KiB samples starts"
"$EMLIO" fetch --connect "$EP" --batch 2 --verify --ids "$T/bigskip.ids" \
    --quiet >"$T/bigskip.out" 2>"$T/bigskip.err"
check "64 KiB flip, skip mode: fetch --verify succeeds" test $? -eq 0
check "64 KiB flip, skip mode: the daemon skipped it" \
    grep -q "skipped corrupt record $rec of shard '$(basename "$victim")'" "$T/bigskip.err"
check "64 KiB flip, skip mode: 11 samples delivered" \
    test "$(wc -l <"$T/bigskip.ids")" = 11
kill "$DPID"

# Samples small enough to pack are checked by the daemon, which names the
# record and its offset.
check "4 KB dataset builds" make_dataset "$T/crc4" 12 2 4000 4M
victim=$(ls "$T"/crc4/shards/*.tfrecord | head -n 1)
read -r rec size < <(flip_record "$victim")
start_daemon crcsmall "$T/crc4/shards" || fail "daemon on 4 KB samples starts"
"$EMLIO" fetch --connect "$EP" --batch 2 --quiet >/dev/null 2>"$T/crc4.err"
check "4 KB flip: the fetch fails" test $? -ne 0
check "4 KB flip: the daemon names the record and its offset" \
    grep -q "corrupt record $rec in shard '$(basename "$victim")' at offset" "$T/crc4.err"

# emliod says at info when a client comes and goes, with what it sent.
MAIN_DPID=$DPID
check "a daemon logging at info starts" start_daemon info "$T/shards" \
    --log-level info
"$EMLIO" fetch --connect "$EP" --batch 16 --quiet >/dev/null 2>&1
kill -TERM "$DPID"
wait "$DPID"
DPID=$MAIN_DPID
check "... logs the client's connect" \
    grep -q "info  server: client connected from 127.0.0.1:" "$T/info.err"
check "... and its departure with bytes and rate" \
    grep -qE "client from 127.0.0.1:[0-9]+ left after .* MB sent, .* MB/s" \
    "$T/info.err"

# IPv6: an endpoint in brackets needs ZMQ_IPV6 on both ends (without it
# binding failed with "No such device").
if ip -6 addr show dev lo 2>/dev/null | grep -q 'inet6 ::1/128'; then
    MAIN_DPID=$DPID
    BIND='tcp://[::1]:*'
    check "a daemon binds tcp://[::1]:*" start_daemon v6 "$T/shards"
    unset BIND
    check "... and says so" grep -q '^tcp://\[::1\]:[0-9]*$' <<<"$EP"
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --verify --quiet \
        >/dev/null 2>"$T/v6.err"
    check "... and serves a verified fetch over IPv6" test $? -eq 0
    kill -TERM "$DPID"
    wait "$DPID"
    DPID=$MAIN_DPID
else
    skip "IPv6 fetch: no ::1 on the loopback device here"
fi

# A connection lost with the HELLO unanswered (a daemon out of descriptors
# closes fresh connections too): the client says HELLO again when it has
# reconnected, instead of waiting for the answer until its connect timeout
# (before: "no answer from daemon ... within 10000 ms").
MAIN_DPID=$DPID
start_daemon relayed "$T/shards" || fail "daemon behind the relay starts"
RELAYED=$DPID
DPID=$MAIN_DPID
/usr/bin/python3 tests/integration/zmtp_drop_first.py "${EP##*:}" >"$T/relay.port" &
RELAY=$!
for _ in $(seq 50); do [ -s "$T/relay.port" ] && break; sleep 0.1; done
"$EMLIO" fetch --connect "tcp://127.0.0.1:$(cat "$T/relay.port")" --batch 16 \
    --verify --quiet --connect-timeout-ms 10000 >/dev/null 2>"$T/relay.err"
rc=$?
check "HELLO lost with its connection: said again, a verified fetch" test $rc -eq 0
[ $rc -eq 0 ] || tail -3 "$T/relay.err" | sed "s/^/  fetch: /"
check "... after the client saw the connection lost" grep -q "lost connection 0" "$T/relay.err"
kill "$RELAY" "$RELAYED" 2>/dev/null
wait "$RELAY" "$RELAYED" 2>/dev/null

# A port nothing listens on is reported as refused, not after the
# (here long) connect timeout as "no answer".
closed=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$EMLIO" fetch --connect "tcp://127.0.0.1:$closed" --batch 4 \
    --connect-timeout-ms 60000 >/dev/null 2>"$T/refused.err"
check "a refused port fails" test $? -ne 0
check "... saying the connection was refused, naming the endpoint" \
    grep -q "connection refused by 'tcp://127.0.0.1:$closed'" "$T/refused.err"

# A host the resolver does not know fails at once, saying so (before: "no
# answer ... is emliod running there?" after the whole connect timeout).
# .invalid never resolves (RFC 6761).
start=$(date +%s)
"$EMLIO" fetch --connect "tcp://no-such-host.invalid:5555" --batch 4 \
    --connect-timeout-ms 60000 >/dev/null 2>"$T/unresolved.err"
check "an unresolvable host fails" test $? -ne 0
check "... at once, not after the connect timeout" test $(($(date +%s) - start)) -lt 30
check "... saying it cannot resolve the host, naming it" \
    grep -q "cannot resolve host 'no-such-host.invalid' of endpoint 'tcp://no-such-host.invalid:5555'" "$T/unresolved.err"

# SIGTERM stops the daemon cleanly.
kill -TERM "$DPID"
wait "$DPID"
check "emliod exits 0 on SIGTERM" test $? -eq 0
finish
