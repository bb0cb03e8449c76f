#!/bin/bash
# test_split_nodes.sh - one dataset on several daemons: replicas are proven
# by content, not by name, and the classes are one list.
#   - an ImageFolder split by files (every node has every class directory,
#     alternate files on each) is refused by default, naming the shard and
#     both daemons, and with --disjoint-shards delivers every file once;
#   - same-named class directories whose files differ but whose counts and
#     sizes match (only the WELCOME digest tells them apart) are refused;
#   - an ImageFolder split by classes delivers every sample with its label
#     in the union of the class names (as torchvision numbers them);
#   - true replicas (copies of one tree) still merge;
#   - TFRecord daemons whose classes.txt name a label differently are
#     refused (labels are stored in the records: no remap possible).
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib.sh

"$EMLIO" synth "$T/all" --samples 512 --classes 4 --bytes 3000 --quiet \
    >/dev/null || {
    fail "synth"
    finish
    exit 1
}
# sha256 -> class index (sorted class names), for every image.
(cd "$T/all" && find . -name '*.jpg' | sort | while read -r f; do
    c=$(basename "$(dirname "$f")")
    echo "$(sha256sum <"$f" | cut -d' ' -f1) $c"
done) >"$T/truth.txt"
ls "$T/all" | sort | nl -v0 | awk '{ print $2, $1 }' >"$T/classidx.txt"

# Split by files: even files on A, odd on B, every class on both.
for c in $(ls "$T/all"); do
    mkdir -p "$T/A/$c" "$T/B/$c"
    i=0
    for f in $(ls "$T/all/$c" | sort); do
        if [ $((i % 2)) -eq 0 ]; then cp "$T/all/$c/$f" "$T/A/$c/"; else
            cp "$T/all/$c/$f" "$T/B/$c/"; fi
        i=$((i + 1))
    done
done
# Split by classes: class_000, class_001 on C; the others on D.
mkdir -p "$T/C" "$T/D"
classes=($(ls "$T/all" | sort))
cp -r "$T/all/${classes[0]}" "$T/all/${classes[1]}" "$T/C/"
cp -r "$T/all/${classes[2]}" "$T/all/${classes[3]}" "$T/D/"

start_daemon dA "$T/A" || exit 1
EPA=$EP
start_daemon dB "$T/B" || exit 1
EPB=$EP

# ---- split by files: refused by default -------------------------------
"$EMLIO" fetch --connect "$EPA,$EPB" --batch 32 --verify --quiet \
    >"$T/f1.out" 2>"$T/f1.err"
rc=$?
check "split by files: fetch refuses (exit $rc)" test "$rc" -ne 0
check "the refusal names the shard and both daemons" \
    grep -q "shard '${classes[0]}' differs between daemon '$EPA'.*daemon '$EPB'" \
    "$T/f1.err"
check "the refusal says what to do" grep -q -- "--disjoint-shards" "$T/f1.err"
"$EMLIO" inspect "$EPA,$EPB" >"$T/i1.out" 2>"$T/i1.err"
rc=$?
check "split by files: inspect refuses too (exit $rc)" test "$rc" -ne 0

# ---- with --disjoint-shards: every file once, labels right ------------
"$EMLIO" fetch --connect "$EPA,$EPB" --batch 32 --verify --quiet \
    --disjoint-shards --ids "$T/ids1.txt" --labels --digests \
    >"$T/f2.out" 2>"$T/f2.err"
rc=$?
check "split by files, --disjoint-shards: fetch --verify passes (exit $rc)" \
    test "$rc" -eq 0
check "512 samples delivered" test "$(json_field "$T/f2.out" samples)" = 512
# ids lines: EPOCH SHARD RECORD LABEL SHA256
awk '{ print $5 }' "$T/ids1.txt" | sort >"$T/got1.txt"
cut -d' ' -f1 "$T/truth.txt" | sort >"$T/want.txt"
check "every image exactly once (by SHA-256)" cmp -s "$T/got1.txt" "$T/want.txt"
label_ok() { # label_ok IDS: each sample's label is its image's class index
    awk 'NR == FNR { idx[$1] = $2; next }
         FILENAME == ARGV[2] { cls[$1] = idx[$2]; next }
         { if (!($5 in cls) || cls[$5] != $4) bad++ }
         END { exit bad > 0 }' "$T/classidx.txt" "$T/truth.txt" "$1"
}
check "every label is its image's class" label_ok "$T/ids1.txt"
check "the parts of a split class are named apart" \
    grep -q "^0 ${classes[0]}@[0-9a-f]\{8\} " "$T/ids1.txt"
"$EMLIO" inspect "$EPA,$EPB" --disjoint-shards --json >"$T/i2.out" \
    2>"$T/i2.err"
check "inspect --disjoint-shards counts 512 samples" \
    test "$(json_field "$T/i2.out" samples)" = 512

# ---- same counts and sizes, different files: the digest decides -------
mkdir -p "$T/E/cls" "$T/F/cls"
for i in 0 1 2 3; do
    head -c 4096 /dev/urandom >"$T/E/cls/e$i.jpg"
    head -c 4096 /dev/urandom >"$T/F/cls/f$i.jpg"
done
start_daemon dE "$T/E" || exit 1
EPE=$EP
start_daemon dF "$T/F" || exit 1
EPF=$EP
"$EMLIO" fetch --connect "$EPE,$EPF" --batch 4 --verify --quiet \
    >"$T/f3.out" 2>"$T/f3.err"
rc=$?
check "equal counts and sizes, other files: refused (exit $rc)" \
    test "$rc" -ne 0
check "... as different content (digests differ)" \
    grep -q "shard 'cls' differs between daemon" "$T/f3.err"

# ---- split by classes: the union of the names, labels remapped --------
start_daemon dC "$T/C" || exit 1
EPC=$EP
start_daemon dD "$T/D" || exit 1
EPD=$EP
"$EMLIO" fetch --connect "$EPC,$EPD" --batch 32 --verify --quiet \
    --ids "$T/ids2.txt" --labels --digests >"$T/f4.out" 2>"$T/f4.err"
rc=$?
check "split by classes: fetch --verify passes (exit $rc)" test "$rc" -eq 0
awk '{ print $5 }' "$T/ids2.txt" | sort >"$T/got2.txt"
check "split by classes: every image exactly once" \
    cmp -s "$T/got2.txt" "$T/want.txt"
check "split by classes: every label is its class in the union" \
    label_ok "$T/ids2.txt"
"$EMLIO" inspect "$EPD,$EPC" --json >"$T/i3.out" 2>"$T/i3.err"
check "inspect lists the four classes, sorted" \
    test "$(tail -n 1 "$T/i3.out" | /usr/bin/python3 -c \
        'import json,sys; print(",".join(json.load(sys.stdin)["classes"]))')" \
    = "$(IFS=,; echo "${classes[*]}")"

# ---- true replicas still merge ------------------------------------------
cp -r "$T/all" "$T/all2"
start_daemon dR1 "$T/all" || exit 1
EPR1=$EP
start_daemon dR2 "$T/all2" || exit 1
EPR2=$EP
"$EMLIO" fetch --connect "$EPR1,$EPR2" --batch 32 --verify --quiet \
    --ids "$T/ids3.txt" --digests >"$T/f5.out" 2>"$T/f5.err"
rc=$?
check "copies of one tree are replicas (exit $rc)" test "$rc" -eq 0
check "replicas: 512 samples, not 1024" \
    test "$(json_field "$T/f5.out" samples)" = 512

# ---- stored labels: classes.txt that disagree are refused --------------
"$EMLIO" pack "$T/all" "$T/P1" --shard-bytes 400K --quiet >/dev/null
cp -r "$T/P1" "$T/P2"
# The same names, two labels swapped on P2.
awk 'NR == 1 { a = $0; next } NR == 2 { print; print a; next } { print }' \
    "$T/P1/classes.txt" >"$T/P2/classes.txt"
start_daemon dP1 "$T/P1" || exit 1
EPP1=$EP
start_daemon dP2 "$T/P2" || exit 1
EPP2=$EP
"$EMLIO" fetch --connect "$EPP1,$EPP2" --batch 32 --quiet \
    >"$T/f6.out" 2>"$T/f6.err"
rc=$?
check "TFRecord daemons naming label 0 differently: refused (exit $rc)" \
    test "$rc" -ne 0
check "... naming both daemons and the label" \
    grep -q "daemons '$EPP1' and '$EPP2' name label 0 differently" "$T/f6.err"

finish
