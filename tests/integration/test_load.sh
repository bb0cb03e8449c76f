#!/usr/bin/env bash
# test_load.sh - 64 concurrent client processes against one daemon each
# complete verified epochs with exact sample sets; a client that sends
# requests and never reads does not make the daemon's memory grow without
# bound. Prints the throughput and the daemon's RSS.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh
CLIENTS=${EMLIO_LOAD_CLIENTS:-64}

check "dataset builds" make_dataset "$T" 200 2 3000 120K
for f in "$T"/shards/*.tfrecord; do
    k=$(wc -l <"$f.idx")
    for ((i = 0; i < k; i++)); do echo "$(basename "$f") $i"; done
done | sort >"$T/all"
start_daemon load "$T/shards" --workers 2 || fail "daemon starts"
rss() { awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$DPID/status"; }
rss0=$(rss)

start=$(date +%s.%N)
pids=()
for c in $(seq 1 "$CLIENTS"); do
    "$EMLIO" fetch --connect "$EP" --batch 8 --epochs 2 --seed "$c" --streams 1 \
        --verify --quiet --ids "$T/c$c.ids" --timeout-ms 120000 \
        >"$T/c$c.out" 2>"$T/c$c.err" &
    pids+=($!)
done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
end=$(date +%s.%N)
check "$CLIENTS concurrent clients all succeed ($bad failed)" test $bad -eq 0
exact=0
for c in $(seq 1 "$CLIENTS"); do
    for e in 0 1; do
        awk -v e=$e '$1 == e {print $2, $3}' "$T/c$c.ids" | sort |
            cmp -s - "$T/all" || exact=$((exact + 1))
    done
done
check "every client got every sample exactly once per epoch" test $exact -eq 0
rss1=$(rss)
/usr/bin/python3 -c "import sys; n, t = int(sys.argv[1]) * 2 * int(sys.argv[2]), float(sys.argv[4]) - float(sys.argv[3]); print(f'load: {sys.argv[1]} clients x 2 epochs, {n} samples in {t:.2f} s = {n / t:.0f} samples/s; daemon RSS {sys.argv[5]} MB before, {sys.argv[6]} MB after')" \
    "$CLIENTS" "$(wc -l <"$T/all")" "$start" "$end" "$rss0" "$rss1"

# A client that only sends: the daemon answers at most its credits and
# drops the rest, so its memory stays bounded.
/usr/bin/python3 - "$EP" <<'PY' >"$T/flood.out" 2>&1 &
import sys, time, zmq, msgpack
ctx = zmq.Context()
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
d.setsockopt(zmq.RCVHWM, 1)          # and never read what comes back
d.setsockopt(zmq.SNDHWM, 0)
d.connect(sys.argv[1])
get = msgpack.packb({"t": 3, "id": 7, "items": [0, 0] * 64})
deadline = time.time() + 4
n = 0
while time.time() < deadline:
    d.send(get)
    n += 1
print("flood sent", n)
PY
fpid=$!
peak=$rss1
while kill -0 $fpid 2>/dev/null; do
    r=$(rss)
    [ "$r" -gt "$peak" ] && peak=$r
    sleep 0.2
done
echo "flood: $(cat "$T/flood.out"); daemon RSS peak ${peak} MB (before ${rss1} MB)"
check "the daemon survives a client that floods without reading" \
    kill -0 "$DPID"
if [ -n "${EMLIO_SANITIZED:-}" ]; then
    # ASan's allocator caches freed memory and its slowdown lets the flood
    # outrun the frontend, so RSS says little here; make test checks it.
    skip "RSS bound under sanitizers (measured by make test)"
else
    check "a client that never reads keeps daemon RSS bounded (+$((peak - rss1)) MB)" \
        test $((peak - rss1)) -lt 128
fi
"$EMLIO" fetch --connect "$EP" --batch 8 --verify --quiet >/dev/null 2>&1
check "daemon still serves others afterwards" test $? -eq 0
finish
