# bench/delayline_ns.sh: sourced by the bench scripts that run a client
# behind build/bench/delayline in a network namespace of their own
# (parts_ab.sh, path_cost.sh); bench/run has its own in Python.
#
# dl_start WHO BUILD NS DEV NEAR FAR RTT_MS makes namespace NS, starts the
# delay line between devices DEV-near (here, NEAR) and DEV-far (in NS, FAR)
# with RTT_MS / 2 each way, waits for it and sets an EXIT trap that stops
# it and removes NS. DL_RT: its SCHED_FIFO priority (0: normal
# scheduling; bench/run uses 10). WHO names the script in its errors.
DL_PID= DL_NS=

dl_cleanup() {
    if [ -n "$DL_PID" ]; then kill "$DL_PID" 2>/dev/null || true; wait "$DL_PID" 2>/dev/null || true; fi
    if [ -n "$DL_NS" ]; then ip netns del "$DL_NS" 2>/dev/null || true; fi
}

dl_start() { # WHO BUILD NS DEV NEAR FAR RTT_MS
    local who=$1 b=$2 ns=$3 dev=$4 near=$5 far=$6 rtt=$7 out rt=()
    ip netns add "$ns" || { echo "$who: netns $ns exists (another run?)" >&2; exit 1; }
    DL_NS=$ns
    trap dl_cleanup EXIT
    if [ "${DL_RT:-0}" != 0 ] && command -v chrt >/dev/null; then rt=(chrt -f "$DL_RT"); fi
    out=$(mktemp)
    "${rt[@]}" "$b/bench/delayline" --netns "$ns" \
        --delay-ms "$(/usr/bin/python3 -c "print($rtt / 2)")" \
        --near-dev "$dev-near" --far-dev "$dev-far" --near-addr "$near" \
        --far-addr "$far" >"$out" 2>/dev/null &
    DL_PID=$!
    for _ in $(seq 50); do grep -q ready "$out" && break; sleep 0.1; done
    if ! grep -q ready "$out"; then
        rm -f "$out"
        echo "$who: the delay line did not start" >&2
        exit 1
    fi
    rm -f "$out"
}
