#!/usr/bin/env bash
# test_recovery.sh - crash recovery, exactly once: kill -9 of the daemon
# mid-epoch and a restart on the same port (clients reconnect with backoff
# and ask again for what was in flight); kill -9 of a client and a restart
# from its checkpoint; a restart with fewer credits, which the client
# learns. --verify and --ids prove every sample exactly once.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

check "dataset builds" make_dataset "$T" 240 3 4000 150K
all_records() {
    for f in "$T"/shards/*.tfrecord; do
        k=$(wc -l <"$f.idx")
        for ((i = 0; i < k; i++)); do echo "$(basename "$f") $i"; done
    done | sort
}
all_records >"$T/all"
free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# start_relay UPSTREAM_PORT: a 10 ms relay in front of the daemon slows the
# fetch enough to kill things mid-epoch. Sets RELAY.
start_relay() {
    : >"$T/relay.out"
    "$EMLIO_RELAY" --listen 127.0.0.1:0 --connect "127.0.0.1:$1" \
        --delay-ms 5 >"$T/relay.out" 2>"$T/relay.err" &
    PIDS+=($!)
    RELAY=$(listen_addr "$T/relay.out" emlio-relay)
}
# start_daemon NAME [emliod options]: emliod on $port, its output in
# $T/NAME.out and .err. Sets DPID.
start_daemon() {
    local name=$1
    shift
    "$EMLIOD" --data "$T/shards" --bind "tcp://127.0.0.1:$port" \
        --log-level warn "$@" >"$T/$name.out" 2>"$T/$name.err" &
    DPID=$!
    PIDS+=("$DPID")
}
# --- daemon killed with SIGKILL mid-epoch, restarted on the same port ---
port=$(free_port)
start_daemon d
check "relay starts" start_relay "$port"
"$EMLIO" fetch --connect "tcp://$RELAY" --batch 2 --inflight 2 --streams 1 \
    --verify --ids "$T/k1.ids" --timeout-ms 30000 --quiet \
    >"$T/k1.out" 2>"$T/k1.err" &
fpid=$!
check "fetch is under way" wait_lines "$T/k1.ids" 40
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
before=$(wc -l <"$T/k1.ids")
sleep 0.5 # the daemon stays down a while: the client must keep retrying
start_daemon d2
wait $fpid
check "fetch survives a daemon kill -9 and restart" test $? -eq 0
check "it was killed mid-epoch ($before of 240 delivered)" test "$before" -lt 240
sort "$T/k1.ids" | awk '{print $2, $3}' >"$T/k1.sorted"
check "every sample exactly once across the restart" cmp -s "$T/k1.sorted" "$T/all"
check "fetch --verify agreed" test "$(json_field "$T/k1.out" verified)" = True

# --- client killed with SIGKILL mid-epoch, restarted from its state ---
"$EMLIO" fetch --connect "tcp://$RELAY" --batch 2 --inflight 2 --streams 1 \
    --state "$T/state" --ids "$T/k2.ids" --quiet >"$T/k2.out" 2>"$T/k2.err" &
fpid=$!
check "second fetch is under way" wait_lines "$T/k2.ids" 60
kill -9 $fpid
wait $fpid 2>/dev/null
check "state survived the kill" test -s "$T/state"
"$EMLIO" fetch --connect "tcp://$RELAY" --batch 2 --state "$T/state" \
    --ids "$T/k2.ids" --verify --quiet >"$T/k2b.out" 2>"$T/k2b.err"
check "restarted client completes the epoch" test $? -eq 0
awk '{print $2, $3}' "$T/k2.ids" | sort >"$T/k2.sorted"
check "every sample exactly once across the client kill" \
    cmp -s "$T/k2.sorted" "$T/all"
check "no sample listed twice" test "$(sort -u "$T/k2.sorted" | wc -l)" = 240

# --- the daemon restarted with fewer credits: the client learns them ---
# (from the WELCOME of its reconnected stream 0, and sizes its parts and
# window again; it used to keep the first daemon's 256 per stream). One
# stream: a session's further streams get the short WELCOME, without limits.
port=$(free_port)
start_daemon d3
check "relay starts (credits)" start_relay "$port"
EMLIO_LOG_LEVEL=info "$EMLIO" fetch --connect "tcp://$RELAY" --batch 8 \
    --inflight 2 --streams 1 --request-bytes 1 --verify --ids "$T/k3.ids" \
    --timeout-ms 30000 --quiet >"$T/k3.out" 2>"$T/k3.err" &
fpid=$!
check "fetch in parts is under way" wait_lines "$T/k3.ids" 40
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
before=$(wc -l <"$T/k3.ids")
start_daemon d4 --max-credit 2
wait $fpid
check "fetch survives a restart with fewer credits" test $? -eq 0
check "it was killed mid-epoch ($before of 240 delivered)" test "$before" -lt 240
check "the client took the new credits" \
    grep -q "now grants 2 requests per stream (was 256)" "$T/k3.err"
sort "$T/k3.ids" | awk '{print $2, $3}' >"$T/k3.sorted"
check "every sample exactly once across that restart" \
    cmp -s "$T/k3.sorted" "$T/all"
finish
