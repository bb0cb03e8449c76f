# bench/fetch_cell.sh - one A/B cell, sourced by bench/parts_ab.sh and
# bench/builds_ab.sh: an emliod of build BUILD over $DATA and one
# `emlio fetch` of the same build against it ($epochs epochs, --verify),
# printing MB/s, first batch, ramp and client + daemon CPU-s/GB.
# ab_path sets up the path (loopback, or a delay line into a namespace)
# and the globals fetch_cell reads; the caller sets DATA.

. "$(dirname "${BASH_SOURCE[0]}")/delayline_ns.sh"
PY=/usr/bin/python3

# ab_path WHO BUILD NS DEV NEAR FAR RTT_MS: loopback at RTT 0, else BUILD's
# delay line joins this namespace to NS (NEAR here, FAR there; removed on
# exit) and the client runs in NS. Sets host, prefix, dpin and cpin (PIN=1:
# daemon on CPU 0, client on CPU 1) and epochs (EPOCHS, default 4 at an
# RTT, 40 over loopback).
ab_path() {
    host=127.0.0.1 prefix=() dpin=() cpin=()
    if [ "${PIN:-0}" = 1 ]; then dpin=(taskset -c 0); cpin=(taskset -c 1); fi
    if [ "$7" != 0 ]; then
        dl_start "$1" "$2" "$3" "$4" "$5" "$6" "$7"
        host=$5 prefix=(ip netns exec "$3")
    fi
    epochs=${EPOCHS:-$([ "$7" = 0 ] && echo 40 || echo 4)}
}

fetch_cell() { # BUILD LABEL BATCH [fetch args...]
    local build=$1 label=$2 batch=$3 tmp port sp t0 t1
    shift 3
    tmp=$(mktemp -d) port=$((20000 + RANDOM % 20000))
    "${dpin[@]}" "$build/bin/emliod" --data "$DATA" --bind "tcp://$host:$port" >"$tmp/d" 2>&1 &
    sp=$!
    for _ in $(seq 100); do grep -q listening "$tmp/d" && break; sleep 0.1; done
    t0=$(awk '{print $14 + $15}' /proc/$sp/stat)
    "${prefix[@]}" "${cpin[@]}" /usr/bin/time -f "%U %S" -o "$tmp/t" "$build/bin/emlio" fetch \
        --connect "tcp://$host:$port" --batch "$batch" --epochs "$epochs" --verify \
        --quiet "$@" >"$tmp/j" 2>/dev/null || echo "fetch_cell: fetch failed ($label)" >&2
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
