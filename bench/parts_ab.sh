#!/bin/bash
# bench/parts_ab.sh: a batch asked for in parts (the default, about 2 MiB a
# GET) against one GET per daemon (--request-bytes 1T), in one invocation,
# alternating, over loopback or an end-to-end delay line (issue 18;
# docs/performance.md "A batch in parts").
#
# usage: bench/parts_ab.sh BUILD SHARDS RTT_MS "BATCHES" [ROUNDS]
#   BUILD: a build directory (bin/emliod, bin/emlio, bench/delayline), e.g.
#   build-bench after `make B=build-bench build-bench/bin/emlio
#   build-bench/bin/emliod build-bench/bench/delayline`.
#   SHARDS: a TFRecord dataset (bench/run's build-bench/bench-data/s6000-c100/shards).
#   RTT_MS: 0 = loopback; else the daemon listens in this namespace and
#   `emlio fetch` runs in netns emlio-parts behind build/bench/delayline
#   (as root; the namespace and devices are made and removed here).
#   BATCHES: batch sizes, e.g. "32 256 1024". ROUNDS: pairs per size (3).
# Prints one line per run: MB/s, first batch, ramp_s, client + daemon
# CPU-s/GB. PIN=1 pins the daemon to CPU 0 and the client to CPU 1 (one
# side's threads then share one core's cache). EPOCHS (default 4 at an RTT,
# 40 over loopback) sets the run length.
set -euo pipefail
B=$1 DATA=$2 RTT=$3 BATCHES=$4 ROUNDS=${5:-3}
PY=/usr/bin/python3
NS=emlio-parts NEAR=10.77.30.1 FAR=10.77.30.2
host=127.0.0.1 prefix=()
dpin=() cpin=()
if [ "${PIN:-0}" = 1 ]; then dpin=(taskset -c 0); cpin=(taskset -c 1); fi

. "$(dirname "$0")/delayline_ns.sh"
if [ "$RTT" != 0 ]; then
    dl_start parts_ab "$B" "$NS" emparts "$NEAR" "$FAR" "$RTT"
    host=$NEAR prefix=(ip netns exec "$NS")
fi
epochs=${EPOCHS:-$([ "$RTT" = 0 ] && echo 40 || echo 4)}

cell() { # LABEL BATCH [fetch args...]
    local label=$1 batch=$2 tmp port sp t0 t1
    shift 2
    tmp=$(mktemp -d) port=$((20000 + RANDOM % 20000))
    "${dpin[@]}" "$B/bin/emliod" --data "$DATA" --bind "tcp://$host:$port" >"$tmp/d" 2>&1 &
    sp=$!
    for _ in $(seq 100); do grep -q listening "$tmp/d" && break; sleep 0.1; done
    t0=$(awk '{print $14 + $15}' /proc/$sp/stat)
    "${prefix[@]}" "${cpin[@]}" /usr/bin/time -f "%U %S" -o "$tmp/t" "$B/bin/emlio" fetch \
        --connect "tcp://$host:$port" --batch "$batch" --epochs "$epochs" --verify \
        --quiet "$@" >"$tmp/j" 2>/dev/null || echo "parts_ab: fetch failed ($label)" >&2
    t1=$(awk '{print $14 + $15}' /proc/$sp/stat)
    kill $sp; wait $sp 2>/dev/null || true
    $PY - "$tmp" "$t0" "$t1" "$label" "$batch" <<'EOF'
import json, sys
d, t0, t1, label, batch = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
j = json.loads(open(d + "/j").read().strip().splitlines()[-1])
cpu = sum(map(float, open(d + "/t").read().split()[-2:])) + (t1 - t0) / 100
print("batch %-5s %-6s %7.0f MB/s  first batch %.3f s  ramp_s %-5s  CPU-s/GB %.3f  streams %s  inflight %s"
      % (batch, label, j["mb_per_s"], j["first_batch_s"], j.get("ramp_s"),
         cpu / (j["bytes"] / 1e9), j.get("streams"), j.get("inflight")))
EOF
    rm -rf "$tmp"
}

echo "RTT $RTT ms, $ROUNDS rounds, $epochs epochs a run$([ "${PIN:-0}" = 1 ] && echo ', pinned')"
for batch in $BATCHES; do
    for _ in $(seq "$ROUNDS"); do
        cell parts "$batch"
        cell whole "$batch" --request-bytes 1T
    done
done
