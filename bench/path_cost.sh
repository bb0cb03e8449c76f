#!/bin/bash
# bench/path_cost.sh: where the CPU goes per GB on an emulated path, for
# emlio fetch and iperf3 in one invocation (issue 18; docs/performance.md
# "Packing large frames over a network"). One line per run: wire MB/s,
# packets and ACKs per GB, CPU-s per GB of the client, the server, the
# delay line and the whole VM (busy, softirq), context switches per GB and
# the VM's idle share. The delay line carries both ends' TCP work (writing
# a packet into a TUN device runs the receiving stack), so its CPU moves
# with the ACKs and wake-ups the two ends cause.
#
# usage: bench/path_cost.sh BUILD SHARDS RTT_MS ROUNDS "CASE" ["CASE" ...]
#   BUILD: a build directory (bin/emliod, bin/emlio, bench/delayline).
#   SHARDS: a TFRecord dataset, e.g. build-bench/bench-data/s6000-c100/shards.
#   RTT_MS: > 0: the daemon or iperf3 -s listens in this namespace and the
#   client runs in netns emlio-cost behind the delay line (made and removed
#   here; root); 0: both over loopback (no packet counts, no delay line).
#   CASE: "emlio [fetch args]" or "iperf3 [client args]", e.g.
#   "emlio --batch 32" "emlio --streams 10" "iperf3 -P 32"; EMLIOD_ARGS
#   adds emliod arguments ("--pack small"). Each round runs every case.
# EPOCHS (13) sets the fetch's length, SECS (7) iperf3's; DL_RT (10) the
# delay line's SCHED_FIFO priority (0: normal scheduling); CLIENT_ENV
# ("VAR=value ...", split on blanks) the environment of each emlio fetch.
set -euo pipefail
B=$1 DATA=$2 RTT=$3 ROUNDS=$4
shift 4
PY=/usr/bin/python3
NS=emlio-cost NEAR=10.77.40.1 FAR=10.77.40.2 DEV=emcost-near
prefix=()
. "$(dirname "$0")/delayline_ns.sh"
if [ "$RTT" != 0 ]; then
    # Real-time, as bench/run runs it (--delayline-rt 10): on two busy
    # vCPUs a delay line that waits for the scheduler adds its own latency.
    DL_RT=${DL_RT:-10}
    dl_start path_cost "$B" "$NS" emcost "$NEAR" "$FAR" "$RTT"
    prefix=(ip netns exec "$NS")
else
    NEAR=127.0.0.1 DEV=none
fi

cpu_of() { if [ -n "${1:-}" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
dev_counts() { awk -v d="$DEV:" '$1 == d {print $2, $3, $10, $11; f = 1} END {if (!f) print 0, 0, 0, 0}' /proc/net/dev; }

run_case() { # KIND ARGS...
    local kind=$1 tmp port sp
    shift
    tmp=$(mktemp -d) port=$((20000 + RANDOM % 20000))
    if [ "$kind" = emlio ]; then
        # shellcheck disable=SC2086
        "$B/bin/emliod" --data "$DATA" --bind "tcp://$NEAR:$port" ${EMLIOD_ARGS:-} >"$tmp/d" 2>&1 &
        sp=$!
        for _ in $(seq 100); do grep -q listening "$tmp/d" && break; sleep 0.1; done
    else
        iperf3 -s -B $NEAR -p "$port" >"$tmp/d" 2>&1 &
        sp=$!
        sleep 0.5
    fi
    local net0 net1 stat0 stat1 dl0 dl1 sv0 sv1 cs0 cs1 t0 t1
    net0=$(dev_counts) stat0=$(head -1 /proc/stat) dl0=$(cpu_of "$DL_PID") sv0=$(cpu_of $sp)
    cs0=$(awk '/^ctxt/ {print $2}' /proc/stat) t0=$(date +%s.%N)
    if [ "$kind" = emlio ]; then
        # shellcheck disable=SC2086
        "${prefix[@]}" env ${CLIENT_ENV:-} /usr/bin/time -f "%U %S" -o "$tmp/t" "$B/bin/emlio" fetch \
            --connect "tcp://$NEAR:$port" --epochs "${EPOCHS:-13}" --quiet "$@" \
            >"$tmp/j" 2>/dev/null || echo "path_cost: fetch failed ($*)" >&2
    else
        "${prefix[@]}" /usr/bin/time -f "%U %S" -o "$tmp/t" iperf3 -c $NEAR \
            -p "$port" -R -J -t "${SECS:-7}" "$@" >"$tmp/j" 2>/dev/null ||
            echo "path_cost: iperf3 failed ($*)" >&2
    fi
    t1=$(date +%s.%N) net1=$(dev_counts) stat1=$(head -1 /proc/stat)
    dl1=$(cpu_of "$DL_PID") sv1=$(cpu_of $sp) cs1=$(awk '/^ctxt/ {print $2}' /proc/stat)
    kill $sp
    wait $sp 2>/dev/null || true
    $PY - "$tmp" "$kind $*" "$net0" "$net1" "$stat0" "$stat1" "$dl0" "$dl1" \
        "$sv0" "$sv1" "$cs0" "$cs1" "$t0" "$t1" <<'PYEOF'
import json, sys
(tmp, label, net0, net1, st0, st1, dl0, dl1, sv0, sv1, cs0, cs1, t0, t1) = sys.argv[1:]
rb0, rp0, tb0, tp0 = map(int, net0.split())
rb1, rp1, tb1, tp1 = map(int, net1.split())
s0 = [int(x) for x in st0.split()[1:]]
s1 = [int(x) for x in st1.split()[1:]]
d = [b - a for a, b in zip(s0, s1)]
text = open(tmp + "/j").read()
if label.startswith("emlio"):
    got = json.loads(text.strip().splitlines()[-1])["bytes"]
else:
    got = json.loads(text)["end"]["sum_received"]["bytes"]
gb = got / 1e9  # delivered to the client, over the whole run
secs = float(t1) - float(t0)
client = sum(map(float, open(tmp + "/t").read().split()[-2:]))
server = (float(sv1) - float(sv0)) / 100
line = (float(dl1) - float(dl0)) / 100
busy = (sum(d) - d[3] - d[4]) / 100
# The near device: the server's packets go out of it (data), the client's
# come in (ACKs); none over loopback.
print("%-36s %6.0f MB/s  pkts %4.1fk/GB acks %4.1fk/GB | CPU-s/GB client %.2f server %.2f "
      "delay line %.2f VM busy %.2f (softirq %.2f) | ctxsw %4.1fk/GB idle %4.1f%%"
      % (label[:36], gb * 1e3 / secs, (tp1 - tp0) / gb / 1e3, (rp1 - rp0) / gb / 1e3,
         client / gb, server / gb, line / gb, busy / gb, d[6] / 100 / gb,
         (int(cs1) - int(cs0)) / gb / 1e3, 100.0 * d[3] / max(sum(d), 1)))
PYEOF
    rm -rf "$tmp"
}

echo "RTT $RTT ms, $ROUNDS rounds"
for _ in $(seq "$ROUNDS"); do
    for c in "$@"; do
        # shellcheck disable=SC2086
        run_case $c
    done
done
