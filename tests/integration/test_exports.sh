#!/usr/bin/env bash
# test_exports.sh - emliod --metrics (Prometheus text, checked with promtool)
# and --influx, emlio fetch --influx, against a real InfluxDB 1.x started on
# free loopback ports. Parts whose tool is missing are skipped with a
# message. Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3

# free_port: a TCP port that was free a moment ago on 127.0.0.1.
free_port() {
    $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# metric FILE NAME: the value of the first sample of NAME (any labels).
metric() {
    awk -v n="$2" '$1 == n || index($1, n "{") == 1 { print $NF; exit }' "$1"
}

make_dataset "$T/ds" 200 5 3000 60000 || {
    echo "cannot make the dataset"
    exit 1
}

# --- Prometheus. ---
start_daemon prom "$T/ds/shards" --metrics 127.0.0.1:0 || exit 1
MURL=$(sed -n 's/^emliod: metrics on //p' "$T/prom.out")
check "metrics line follows the listening line" \
    test "$(sed -n 2p "$T/prom.out")" = "emliod: metrics on $MURL"
check "metrics URL names a real port" \
    bash -c "[[ '$MURL' =~ ^http://127\.0\.0\.1:[1-9][0-9]*/metrics$ ]]"

"$EMLIO" fetch --connect "$EP" --batch 16 --quiet >"$T/fetch1.json"
check "fetch ran" test -s "$T/fetch1.json"
FETCHED=$(json_field "$T/fetch1.json" samples)
curl -sS -D "$T/scrape.hdr" -o "$T/scrape.txt" --max-time 5 "$MURL"
check "scrape answered 200" grep -q '^HTTP/1.1 200' "$T/scrape.hdr"
check "scrape has the text-format content type" \
    grep -qi '^Content-Type: text/plain; version=0.0.4' "$T/scrape.hdr"
check "emlio_samples_total equals the fetched samples ($FETCHED)" \
    test "$(metric "$T/scrape.txt" emlio_samples_total)" = "$FETCHED"
check "emlio_sent_bytes_total equals the fetched bytes" \
    test "$(metric "$T/scrape.txt" emlio_sent_bytes_total)" = \
    "$(json_field "$T/fetch1.json" bytes)"
check "emlio_requests_total counts the batches" \
    test "$(metric "$T/scrape.txt" emlio_requests_total)" = \
    "$(json_field "$T/fetch1.json" batches)"
check "emlio_clients_total is positive" \
    test "$(metric "$T/scrape.txt" emlio_clients_total)" -ge 1
check "emlio_clients and emlio_streams are exported" \
    grep -qE '^emlio_streams [0-9]+' "$T/scrape.txt"
check "emlio_errors_total is 0" \
    test "$(metric "$T/scrape.txt" emlio_errors_total)" = 0
check "energy carries its source label" \
    grep -qE '^emlio_energy_joules_total\{source="(model|rapl|perf|nvml|none)[a-z+]*"\} [0-9.e+-]+$' \
    "$T/scrape.txt"
check "every family has HELP and TYPE" \
    test "$(grep -c '^# HELP ' "$T/scrape.txt")" = \
    "$(grep -c '^# TYPE ' "$T/scrape.txt")"
for m in emlio_process_cpu_seconds_total emlio_process_resident_memory_bytes \
    emlio_uptime_seconds emlio_corrupt_skipped_total emlio_packed_bytes_total; do
    check "$m is exported" test -n "$(metric "$T/scrape.txt" "$m")"
done
if command -v promtool >/dev/null; then
    check "promtool check metrics passes" \
        bash -c "promtool check metrics <'$T/scrape.txt'"
else
    skip "promtool not installed (Debian package prometheus)"
fi
E1=$(metric "$T/scrape.txt" emlio_energy_joules_total)
curl -sS -o "$T/scrape2.txt" --max-time 5 "$MURL"
check "energy is a growing counter" \
    $PY -c "import sys; sys.exit(not float('$(metric "$T/scrape2.txt" emlio_energy_joules_total)') >= float('$E1'))"
check "other paths answer 404" \
    test "$(curl -s -o /dev/null -w '%{http_code}' "${MURL%/metrics}/other")" = 404
check "POST answers 405" \
    test "$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$MURL")" = 405
check "garbage answers 400" \
    bash -c "printf 'xx\x01\r\n\r\n' | curl -s --max-time 5 telnet://${MURL#http://} 2>/dev/null | head -c 12 | grep -q 'HTTP/1.1 400'"
check "an oversized request is refused" \
    test "$(curl -s -o /dev/null -w '%{http_code}' -H "X-Big: $(head -c 9000 /dev/zero | tr '\0' a)" "$MURL")" = 431
check "the endpoint still serves after bad requests" \
    test "$(curl -s -o /dev/null -w '%{http_code}' "$MURL")" = 200

# --- Bad flags. ---
"$EMLIOD" --data "$T/ds/shards" --bind 'tcp://127.0.0.1:*' --metrics nonsense \
    >/dev/null 2>"$T/bad.err"
check "a bad --metrics address fails the start" \
    grep -q "invalid metrics address 'nonsense'" "$T/bad.err"
"$EMLIOD" --data "$T/ds/shards" --bind 'tcp://127.0.0.1:*' \
    --influx https://x/write >/dev/null 2>"$T/bad2.err"
check "an https --influx URL is refused" grep -q "https is not supported" \
    "$T/bad2.err"
"$EMLIOD" --data "$T/ds/shards" --bind 'tcp://127.0.0.1:*' --influx-interval 0 \
    >/dev/null 2>"$T/bad3.err"
check "--influx-interval 0 is refused with status 2" test $? -eq 2

# --- A dead InfluxDB is logged, never fatal. ---
start_daemon dead "$T/ds/shards" --influx "http://127.0.0.1:1/write?db=x" \
    --influx-interval 0.1 || exit 1
for _ in $(seq 1 100); do
    grep -q "cannot push" "$T/dead.err" && break
    sleep 0.05
done
check "a failed push is logged" grep -q "cannot push to 'http://127.0.0.1:1/write?db=x'" "$T/dead.err"
check "the failure is logged once, not every interval" \
    test "$(grep -c 'cannot push' "$T/dead.err")" -eq 1
"$EMLIO" fetch --connect "$EP" --batch 16 --quiet \
    --influx "http://127.0.0.1:1/write?db=x" >"$T/fetch-dead.json" 2>"$T/fetch-dead.err"
check "fetch with a dead InfluxDB still succeeds" \
    test "$(json_field "$T/fetch-dead.json" samples)" = 200
check "fetch warns about the push" grep -q "warning: cannot push epoch 0" \
    "$T/fetch-dead.err"

# --- InfluxDB. ---
if ! command -v influxd >/dev/null; then
    skip "influxd not installed (Debian package influxdb): InfluxDB checks"
    finish
    exit
fi
IPORT=$(free_port)
RPORT=$(free_port)
mkdir -p "$T/influx"
cat >"$T/influx/influxdb.conf" <<EOF
reporting-disabled = true
bind-address = "127.0.0.1:$RPORT"
[meta]
  dir = "$T/influx/meta"
[data]
  dir = "$T/influx/data"
  wal-dir = "$T/influx/wal"
  query-log-enabled = false
[http]
  enabled = true
  bind-address = "127.0.0.1:$IPORT"
  log-enabled = false
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
[subscriber]
  enabled = false
EOF
influxd run -config "$T/influx/influxdb.conf" >"$T/influx/out.log" 2>&1 &
IPID=$!
PIDS+=("$IPID")
IURL="http://127.0.0.1:$IPORT"
up=0
for _ in $(seq 1 200); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$IURL/ping")" = 204 ]; then
        up=1
        break
    fi
    kill -0 "$IPID" 2>/dev/null || break
    sleep 0.05
done
check "influxd starts" test $up -eq 1
if [ $up -ne 1 ]; then
    tail -n 20 "$T/influx/out.log"
    finish
    exit
fi
curl -sS -XPOST "$IURL/query" --data-urlencode 'q=CREATE DATABASE emlio' \
    >"$T/influx/create.json"
check "database created" grep -q '"statement_id":0' "$T/influx/create.json"

WURL="$IURL/write?db=emlio"
start_daemon flux "$T/ds/shards" --influx "$WURL" --influx-interval 1 || exit 1
"$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --rank 0 --world 1 \
    --quiet --influx "$WURL" >"$T/fetch2.json" 2>"$T/fetch2.err"
check "fetch --influx ran without warnings" \
    bash -c "[ -s '$T/fetch2.json' ] && ! grep -q warning '$T/fetch2.err'"

# query Q: the JSON answer of InfluxDB to Q on db emlio.
query() {
    curl -sS -G "$IURL/query" --data-urlencode "db=emlio" \
        --data-urlencode "q=$1"
}
query 'SELECT * FROM emlio_epoch' >"$T/epochs.json"
check "the epoch points match the fetch JSON" $PY - "$T/fetch2.json" "$T/epochs.json" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"epoch"')]
series = json.load(open(sys.argv[2]))["results"][0]["series"][0]
rows = [dict(zip(series["columns"], v)) for v in series["values"]]
assert len(rows) == len(lines) == 2, (len(rows), len(lines))
for want, got in zip(lines, sorted(rows, key=lambda r: r["epoch"])):
    assert got["epoch"] == want["epoch"], (got, want)
    for k in ("samples", "bytes"):
        assert got[k] == want[k], (k, got[k], want[k])
    for k in ("seconds", "wait_s", "cpu_s", "energy_j", "j_per_sample"):
        assert abs(got[k] - want[k]) <= 1e-4 * max(1.0, abs(want[k])), (k, got[k], want[k])
    assert got["energy_source"] == want["energy_source"], got
    assert got["rank"] == "0" and got["world"] == "1", got
print("epoch points ok:", [(r["epoch"], r["samples"], r["energy_j"]) for r in rows])
EOF

# The daemon pushes every second: wait (bounded) for a point that has seen
# both epochs.
TOTAL=$(json_field "$T/fetch2.json" samples)
got=""
for _ in $(seq 1 60); do
    got=$(query 'SELECT last(samples) FROM emlio_server' |
        $PY -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print(r["series"][0]["values"][0][1] if "series" in r else "")')
    [ "$got" = "$TOTAL" ] && break
    sleep 0.1
done
check "emlio_server points reach samples=$TOTAL (last: '$got')" \
    test "$got" = "$TOTAL"
query 'SELECT * FROM emlio_server ORDER BY time DESC LIMIT 1' >"$T/server.json"
check "emlio_server carries host, endpoint and energy" $PY - "$T/server.json" "$EP" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["results"][0]["series"][0]
r = dict(zip(s["columns"], s["values"][0]))
assert r["endpoint"] == sys.argv[2], r
assert r["host"], r
for k in ("requests", "bytes", "cpu_s", "uptime_s", "energy_j"):
    assert r[k] is not None and r[k] >= 0, (k, r)
assert r["energy_source"] in ("model", "rapl", "perf", "nvml", "none") or "+" in r["energy_source"], r
EOF

# A clean stop pushes a last point.
N0=$(query 'SELECT count(samples) FROM emlio_server' |
    $PY -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["series"][0]["values"][0][1])')
kill -TERM "$DPID"
wait "$DPID" 2>/dev/null
N1=$(query 'SELECT count(samples) FROM emlio_server' |
    $PY -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["series"][0]["values"][0][1])')
check "a stop pushes a last point ($N0 -> $N1)" test "$N1" -gt "$N0"

finish
