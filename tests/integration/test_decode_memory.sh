#!/usr/bin/env bash
# test_decode_memory.sh - decode memory inside a memory cgroup (issue 34:
# "decode memory is outside every budget"; emliod was OOM-killed in a
# 700 MB cgroup decoding large progressive JPEGs, the client reached
# 837 MB). Both ends size what one decode may hold from the memory they
# may use (a quarter of the cgroup's limit over the decode threads, 32 MiB
# at least): in a 256 MiB cgroup with two threads, 32 MiB each. 30 MP
# progressive 4:4:4 JPEGs need ~180 MB of coefficients each: refused by
# the cap, naming the file, on the client and on the daemon, neither
# killed; with --on-corrupt skip the small images still arrive. Needs
# root, a memory cgroup controller and cjpeg (libjpeg-turbo-progs).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

if ! command -v cjpeg >/dev/null; then
    skip "decode memory in a cgroup: cjpeg (libjpeg-turbo-progs) not installed"
    finish
    exit
fi
if ! memory_cgroup decode $((256 << 20)); then
    skip "decode memory in a cgroup: no writable memory cgroup controller here (needs root)"
    finish
    exit
fi

# An ImageFolder of one class: 4 large progressive images and 8 small ones.
mkdir -p "$T/img/a"
gradient_ppm "$T/big.ppm" 6000 5000
gradient_ppm "$T/small.ppm" 320 240
for i in 0 1 2 3; do
    cjpeg -quality 85 -sample 1x1 -progressive "$T/big.ppm" >"$T/img/a/big$i.jpg" || break
done
for i in 0 1 2 3 4 5 6 7; do
    cjpeg -quality 85 "$T/small.ppm" >"$T/img/a/small$i.jpg" || break
done
rm -f "$T/big.ppm" "$T/small.ppm"
check "4 large progressive and 8 small JPEGs are made" \
    test "$(ls "$T/img/a" | wc -l)" -eq 12

XF='center_crop(64)'
start_daemon plain "$T/img" --transform-threads 1 || exit 1

# The client, in the cgroup, decoding here on two threads.
in_cgroup "$EMLIO" fetch --connect "$EP" --batch 4 --transform "$XF" \
    --decode-at client --transform-threads 2 >"$T/c.json" 2>"$T/c.err"
rc=$?
check "client in 256 MiB: the epoch fails (rc $rc), not killed" \
    test $rc -ne 0 -a $rc -ne 137
check "... the large image is refused by the decode cap, named" \
    grep -q "cannot decode file 'a/big[0-3].jpg' (record [0-3]).*6000x5000 needs more memory to decode than one decode may hold" "$T/c.err"
in_cgroup "$EMLIO" fetch --connect "$EP" --batch 4 --transform "$XF" \
    --decode-at client --transform-threads 2 --on-corrupt skip \
    >"$T/cs.json" 2>"$T/cs.err"
rc=$?
check "client in 256 MiB with --on-corrupt skip: succeeds (rc $rc)" test $rc -eq 0
check "... the 8 small images delivered" test "$(json_field "$T/cs.json" samples)" -eq 8
check "... each decode here held at most 32 MiB (fetch's JSON says so)" \
    grep -q '"client_decode_max_bytes": 33554432' "$T/cs.json"
kill "$DPID"
wait "$DPID" 2>/dev/null

# The daemon, in the cgroup, decoding on two threads.
cat >"$T/emliod_in_cg.sh" <<EOF
#!/usr/bin/env bash
echo \$\$ >"$CG/cgroup.procs" && exec "$EMLIOD" "\$@"
EOF
chmod +x "$T/emliod_in_cg.sh"
EMLIOD="$T/emliod_in_cg.sh" start_daemon cg "$T/img" --transform-threads 2 \
    --log-level info || exit 1
check "the daemon says 32 MiB per decode thread" \
    grep -q "2 transform threads (32 MiB each at most)" "$T/cg.err"
"$EMLIO" fetch --connect "$EP" --batch 4 --transform "$XF" --decode-at server \
    >"$T/s.json" 2>"$T/s.err"
check "daemon in 256 MiB: the epoch fails" test $? -ne 0
check "... the large image is refused by the decode cap, named" \
    grep -q "a/big[0-3].jpg.*6000x5000 needs more memory to decode than one decode may hold" "$T/s.err"
check "... and the daemon is alive" kill -0 "$DPID"
kill "$DPID"
wait "$DPID" 2>/dev/null
EMLIOD="$T/emliod_in_cg.sh" start_daemon cgskip "$T/img" --transform-threads 2 \
    --on-corrupt skip || exit 1
"$EMLIO" fetch --connect "$EP" --batch 4 --transform "$XF" --decode-at server \
    >"$T/ss.json" 2>"$T/ss.err"
check "daemon in 256 MiB with --on-corrupt skip: the 8 small images" \
    test "$(json_field "$T/ss.json" samples 2>/dev/null)" = 8
kill "$DPID"
wait "$DPID" 2>/dev/null
finish
