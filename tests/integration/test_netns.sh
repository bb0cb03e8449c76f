#!/usr/bin/env bash
# test_netns.sh - several hosts on one machine: two storage nodes and two
# training nodes in their own network namespaces, joined by veth pairs to
# a bridge namespace on a private test subnet. The daemons bind their own
# addresses (non-loopback, so with CURVE); the ranks fetch across them.
# Skipped, with a message, where namespaces are not permitted.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

tag=em$$
ns() { echo "${tag}$1"; }
cleanup_ns() {
    # `ip netns exec` may fork: kill what runs inside each namespace, not
    # only the pids we started, or daemons outlive the test.
    for n in s1 s2 c1 c2 br; do
        ip netns pids "$(ns $n)" 2>/dev/null | xargs -r kill 2>/dev/null
        ip netns del "$(ns $n)" 2>/dev/null
    done
}
if ! ip netns add "$(ns probe)" 2>/dev/null; then
    echo "skip - network namespaces are not permitted here (ip netns add failed)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
ip netns del "$(ns probe)"
trap 'cleanup_ns; cleanup' EXIT

# Topology: a bridge in namespace "br"; each host namespace has one veth
# end (eth0) on 10.213.0.0/24, the other end enslaved to the bridge.
ip netns add "$(ns br)"
ip -n "$(ns br)" link add br0 type bridge
ip -n "$(ns br)" link set br0 up
i=1
for h in s1 s2 c1 c2; do
    ip netns add "$(ns $h)"
    ip link add "${tag}$h" type veth peer name eth0 netns "$(ns $h)"
    ip link set "${tag}$h" netns "$(ns br)"
    ip -n "$(ns br)" link set "${tag}$h" master br0 up
    ip -n "$(ns $h)" addr add "10.213.0.$i/24" dev eth0
    ip -n "$(ns $h)" link set eth0 up
    ip -n "$(ns $h)" link set lo up
    i=$((i + 1))
done

check "dataset builds" make_dataset "$T" 160 2 40000 1M
mkdir -p "$T/n1" "$T/n2" "$T/keys/auth"
mapfile -t shards < <(ls "$T"/shards/*.tfrecord)
for i in "${!shards[@]}"; do
    d=n$((i % 2 + 1))
    cp "${shards[$i]}" "${shards[$i]}.idx" "$T/$d/"
done
(cd "$T/keys" && "$OLDPWD/$EMLIO" keygen server >/dev/null &&
    "$OLDPWD/$EMLIO" keygen client >/dev/null && cp client.key auth/)

start_in() { # start_in HOST DATA ADDR: emliod inside a namespace
    : >"$T/$1.out"
    ip netns exec "$(ns $1)" "$EMLIOD" --data "$2" --bind "tcp://$3:*" \
        --curve-secret "$T/keys/server.key_secret" \
        --authorized-keys "$T/keys/auth" --log-level warn \
        >"$T/$1.out" 2>"$T/$1.err" &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        grep -q "listening on" "$T/$1.out" && break
        sleep 0.05
    done
    sed -n 's/^emliod: listening on //p' "$T/$1.out"
}
EP1=$(start_in s1 "$T/n1" 10.213.0.1)
EP2=$(start_in s2 "$T/n2" 10.213.0.2)
check "daemons listen on their hosts' addresses" test -n "$EP1" -a -n "$EP2"
pids=()
for r in 0 1; do
    ip netns exec "$(ns c$((r + 1)))" "$EMLIO" fetch --connect "$EP1,$EP2" \
        --batch 8 --world 2 --rank $r --epochs 2 --verify --quiet \
        --server-key "$T/keys/server.key" --client-key "$T/keys/client.key_secret" \
        --ids "$T/r$r.ids" >"$T/r$r.out" 2>"$T/r$r.err" &
    pids+=($!)
done
ok_all=1
for p in "${pids[@]}"; do wait "$p" || ok_all=0; done
check "two ranks on two hosts fetch from two storage hosts" test $ok_all -eq 1
for e in 0 1; do
    cat "$T"/r*.ids | awk -v e=$e '$1 == e && $4 != "pad" {print $2, $3}' | sort >"$T/e$e"
    check "epoch $e: every sample once across hosts ($(wc -l <"$T/e$e"))" \
        test "$(sort -u "$T/e$e" | wc -l)" = 160 -a "$(wc -l <"$T/e$e")" = 160
done
# Samples of ~40 KB crossed a network: the daemons packed them (--pack
# auto), where only those of 16 KiB or less used to be.
stop_packed() { # stop_packed HOST: stops its daemon; "BYTES PACKED" it sent
    local p
    p=$(ip netns pids "$(ns $1)")
    kill -TERM $p
    for _ in $(seq 1 100); do
        kill -0 $p 2>/dev/null || break
        sleep 0.05
    done
    sed -n 's/.* \([0-9]*\) bytes (\([0-9]*\) packed).*/\1 \2/p' "$T/$1.err"
}
read -r sent packed <<<"$(stop_packed s2)"
check "over the network most bytes went packed ($packed of $sent)" \
    test -n "$sent" -a "${packed:-0}" -ge $((sent / 2)) -a "$sent" -gt 0
# A client on the daemon's own host gets them as frames of their own.
read -r sent packed <<<"$(stop_packed s1)"
EP1=$(start_in s1 "$T/n1" 10.213.0.1)
ip netns exec "$(ns s1)" "$EMLIO" fetch --connect "$EP1" --batch 8 --verify --quiet \
    --server-key "$T/keys/server.key" --client-key "$T/keys/client.key_secret" \
    >/dev/null 2>"$T/local.err"
check "a client on the daemon's host fetches" test $? -eq 0
read -r sent packed <<<"$(stop_packed s1)"
check "on the daemon's own host large samples go unpacked ($packed of $sent)" \
    test -n "$sent" -a "$sent" -gt 0 -a "${packed:-0}" -lt $((sent / 2))
ip netns exec "$(ns c1)" "$EMLIO" fetch --connect "tcp://10.213.0.1:1" --batch 8 \
    --connect-timeout-ms 500 --quiet >/dev/null 2>"$T/closed.err"
check "a closed port on another host fails cleanly" test $? -ne 0
finish
