#!/usr/bin/env bash
# bench/tuning.sh - the measurements behind docs/tuning.md: one TCP path
# through the delay line (build/bench/delayline) at each RTT, iperf3 with
# this host's default socket-buffer sysctls and with raised ones, on the
# sending side, the receiving side, or both.
#
#   bench/tuning.sh [RTTS_MS] [SECONDS]     (root; default "30 100" 8)
#   NO_FORCE=1: iperf3 cases only; ONLY_FORCE=1: the setsockopt cases only
#
# Both ends run in private network namespaces (NS_S: the sender, where
# emliod would run; NS_C: the receiver, where emlio fetch would run) and the
# delay line joins them, so the per-namespace sysctls (net.ipv4.tcp_wmem,
# tcp_rmem) are changed there and never on the host; the namespaces and
# their settings vanish at the end. The congestion control is chosen per
# socket (iperf3 -C, i.e. TCP_CONGESTION): writing
# net.ipv4.tcp_congestion_control inside a namespace is refused here.
# net.core.wmem_max/rmem_max are not writable inside a namespace on this
# kernel, so they stay at the host's values (4 MiB here).
# Prints one markdown row per measurement: the settings, the iperf3
# command and the received MB/s.
set -u
RTTS=${1:-30 100}
SECS=${2:-8}
B=${B:-build}
DL=$B/bench/delayline
NS_S=tunes$$
NS_C=tunec$$
S_ADDR=10.79.251.1
C_ADDR=10.79.251.2
PORT=5211
[ -x "$DL" ] || { echo "build $DL first (make all)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 is missing" >&2; exit 1; }
ip netns add "$NS_S" && ip netns add "$NS_C" || exit 1
DLPID=""
SPID=""
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null
    [ -n "$DLPID" ] && kill "$DLPID" 2>/dev/null
    wait 2>/dev/null
    rm -f /tmp/tuning.$$.*
    ip netns del "$NS_S" 2>/dev/null
    ip netns del "$NS_C" 2>/dev/null
}
trap cleanup EXIT
s() { ip netns exec "$NS_S" "$@"; }
c() { ip netns exec "$NS_C" "$@"; }

# defaults: whatever a fresh namespace gets (copied from the host's)
DEF_WMEM=$(s sysctl -n net.ipv4.tcp_wmem | tr '\t' ' ')
DEF_RMEM=$(s sysctl -n net.ipv4.tcp_rmem | tr '\t' ' ')
DEF_CC=$(s sysctl -n net.ipv4.tcp_congestion_control)
BIG="4096 131072 67108864" # 64 MiB max

setup() { # setup SENDER_WMEM RECEIVER_RMEM
    s sysctl -qw net.ipv4.tcp_wmem="$1"
    c sysctl -qw net.ipv4.tcp_rmem="$2"
}
start_dl() { # start_dl ONE_WAY_MS: the delay line runs in NS_S (its "near" side)
    : >/tmp/tuning.$$.dl
    ip netns exec "$NS_S" chrt -f 10 "$DL" --netns "$NS_C" --delay-ms "$1" --near-dev tunen0 --far-dev tunef0 \
        --near-addr $S_ADDR --far-addr $C_ADDR >/tmp/tuning.$$.dl 2>/tmp/tuning.$$.dlerr &
    DLPID=$!
    for _ in $(seq 100); do grep -q ready /tmp/tuning.$$.dl && break; sleep 0.1; done
    ip netns exec "$NS_S" iperf3 -s -B $S_ADDR -p $PORT >/dev/null 2>&1 &
    SPID=$!
    sleep 0.5
}
stop_dl() {
    kill "$SPID" 2>/dev/null
    kill -TERM "$DLPID" 2>/dev/null
    wait 2>/dev/null
    SPID=""
    DLPID=""
    sed 's/^/    /' /tmp/tuning.$$.dlerr >&2
    sleep 0.5
}
run() { # run LABEL RTT SENDER_WMEM RECEIVER_RMEM CC IPERF_ARGS...
    local label=$1 rtt=$2 w=$3 r=$4 cc=$5
    shift 5
    setup "$w" "$r"
    set -- -C "$cc" "$@"
    local omit=2
    local out
    out=$(c iperf3 -c $S_ADDR -p $PORT -R -t "$SECS" -O $omit -J "$@" 2>&1)
    local mbs
    mbs=$(echo "$out" | /usr/bin/python3 -c '
import json, sys
try:
    j = json.load(sys.stdin); s = j["end"]["sum_received"]
    print("%.0f | %s" % (s["bytes"] / s["seconds"] / 1e6, j["end"]["sum_sent"].get("retransmits")))
except Exception as e:
    print("error | %s" % e)')
    echo "| $rtt ms | $label | \`${w##* }\` | \`${r##* }\` | $cc | \`iperf3 -c -R -t $SECS -O $omit $*\` | $mbs |"
}

# A bulk TCP sender with an explicit send buffer (SO_SNDBUF, or
# SO_SNDBUFFORCE which needs CAP_NET_ADMIN and ignores net.core.wmem_max),
# as emliod sets its ZeroMQ sockets' buffers; the receiver autotunes.
cat >/tmp/tuning.$$.py <<'EOF2'
import socket, sys, time
mode, host, port, secs, omit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1)
    c, _ = s.accept()
    buf = bytearray(1 << 22); t0 = time.monotonic(); n = 0; tm = None
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        now = time.monotonic()
        if tm is None and now - t0 >= omit:
            tm, n = now, 0
        n += k
    print("%.0f" % (n / (time.monotonic() - tm) / 1e6))
else:
    opt, size = sys.argv[6], int(sys.argv[7])
    c = socket.socket()
    if opt != "none":
        c.setsockopt(socket.SOL_SOCKET, {"SO_SNDBUF": socket.SO_SNDBUF, "SO_SNDBUFFORCE": 32}[opt], size)
    c.connect((host, port))
    got = c.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    buf = b"x" * (1 << 20); t0 = time.monotonic()
    while time.monotonic() - t0 < secs + omit:
        c.sendall(buf)
    c.close()
    sys.stderr.write("sndbuf %d\n" % got)
EOF2
force() { # force LABEL RTT OPT BYTES: python sender here (NS_S), receiver in NS_C
    local label=$1 rtt=$2 opt=$3 size=$4 p=$((PORT + 1))
    ip netns exec "$NS_C" /usr/bin/python3 /tmp/tuning.$$.py recv $C_ADDR $p "$SECS" 2 \
        >/tmp/tuning.$$.rate &
    local rpid=$!
    sleep 0.5
    local got
    got=$(s /usr/bin/python3 /tmp/tuning.$$.py send $C_ADDR $p "$SECS" 2 "$opt" "$size" 2>&1)
    wait $rpid
    echo "| $rtt ms | $label ($got) | \`${DEF_WMEM##* }\` | \`${DEF_RMEM##* }\` | $DEF_CC | \`setsockopt($opt, $size)\` (python sender) | $(cat /tmp/tuning.$$.rate) | - |"
}

echo "| RTT | case | sender tcp_wmem max | receiver tcp_rmem max | cc | command | MB/s | retransmits |"
echo "|---|---|---|---|---|---|---|---|"
for rtt in $RTTS; do
    start_dl "$(awk -v r="$rtt" 'BEGIN { print r / 2 }')"
    [ -n "${ONLY_FORCE:-}" ] || {
        run "defaults, 1 stream" "$rtt" "$DEF_WMEM" "$DEF_RMEM" "$DEF_CC" -P 1
        run "defaults, -w 4M (SO_SNDBUF/SO_RCVBUF, capped by *mem_max)" "$rtt" "$DEF_WMEM" "$DEF_RMEM" "$DEF_CC" -P 1 -w 4M
        run "defaults, 8 streams" "$rtt" "$DEF_WMEM" "$DEF_RMEM" "$DEF_CC" -P 8
        run "defaults, 16 streams" "$rtt" "$DEF_WMEM" "$DEF_RMEM" "$DEF_CC" -P 16
        run "defaults, 32 streams" "$rtt" "$DEF_WMEM" "$DEF_RMEM" "$DEF_CC" -P 32
        run "receiver rmem raised only" "$rtt" "$DEF_WMEM" "$BIG" "$DEF_CC" -P 1
        run "sender wmem raised only" "$rtt" "$BIG" "$DEF_RMEM" "$DEF_CC" -P 1
        run "both raised" "$rtt" "$BIG" "$BIG" "$DEF_CC" -P 1
        run "both raised, cubic" "$rtt" "$BIG" "$BIG" cubic -P 1
        run "defaults, cubic" "$rtt" "$DEF_WMEM" "$DEF_RMEM" cubic -P 1
    }
    [ -n "${NO_FORCE:-}" ] || {
        force "defaults, no setsockopt" "$rtt" none 0
        force "SO_SNDBUF 64 MiB, capped by wmem_max" "$rtt" SO_SNDBUF $((64 << 20))
        force "SO_SNDBUFFORCE 64 MiB (CAP_NET_ADMIN)" "$rtt" SO_SNDBUFFORCE $((64 << 20))
    }
    stop_dl
done
# restore (the namespaces are deleted on exit anyway)
setup "$DEF_WMEM" "$DEF_RMEM"
