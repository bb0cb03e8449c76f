#!/usr/bin/env bash
# test_formats_tools.sh - emlio inspect, index and pack over WebDataset tar
# and ImageFolder (docs/formats.md): ImageFolder -> tar and TFRecord -> tar
# conversions served by emliod with exactly-once epochs, a GNU tar archive
# indexed in DALI's wds2idx format, and inspect's summary of each format.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh

check "dataset builds" make_dataset "$T" 120 4 3000 64K
# ImageFolder -> tar, shards of about 48 KB.
"$EMLIO" pack "$T/img" "$T/wds" --to tar --shard-bytes 48K --quiet
check "pack --to tar succeeds" test $? -eq 0
nt=$(ls "$T"/wds/*.tar | wc -l)
check "several tar shards ($nt)" test "$nt" -ge 3
check "every tar shard has its index" test "$(ls "$T"/wds/*.tar.idx | wc -l)" = "$nt"
check "indexes are wds2idx v1.2" grep -q '^v1.2 ' "$T/wds/train-00000.tar.idx"
check "GNU tar reads the shards" tar tf "$T/wds/train-00000.tar" >/dev/null
"$EMLIO" inspect "$T/wds" --json >"$T/insp.json"
check "inspect tar: format" test "$(json_field "$T/insp.json" format)" = tar
check "inspect tar: 120 records" test "$(json_field "$T/insp.json" records)" = 120
check "inspect tar: labels 0..3" test "$(json_field "$T/insp.json" label_max)" = 3
"$EMLIO" inspect "$T/img" --json >"$T/insp2.json"
check "inspect imagefolder: format" \
    test "$(json_field "$T/insp2.json" format)" = imagefolder
check "inspect imagefolder: 4 shards (classes)" \
    test "$(json_field "$T/insp2.json" shards)" = 4
# The same bytes whatever the format: tar and ImageFolder served, verified,
# every sample once per epoch.
for src in wds img; do
    start_daemon "d-$src" "$T/$src" || { fail "daemon on $src starts"; continue; }
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --verify \
        --ids "$T/ids-$src" --quiet >"$T/f-$src.out" 2>"$T/f-$src.err"
    check "$src: fetch --verify succeeds" test $? -eq 0
    check "$src: 240 samples" test "$(json_field "$T/f-$src.out" samples)" = 240
    for e in 0 1; do
        awk -v e=$e '$1 == e {print $2, $3}' "$T/ids-$src" | sort >"$T/$src-e$e"
        check "$src epoch $e: 120 distinct samples" \
            test "$(sort -u "$T/$src-e$e" | wc -l)" = 120
    done
    check "$src: same bytes as the tar shards" \
        test "$(json_field "$T/f-$src.out" bytes)" = \
        "$(json_field "$T/f-wds.out" bytes)"
    kill "$DPID"
done
# TFRecord -> tar keeps the image bytes and labels.
"$EMLIO" pack "$T/shards" "$T/wds2" --to tar --quiet
check "pack tfrecord --to tar" test "$(ls "$T"/wds2/*.tar | wc -l)" -ge 1
"$EMLIO" inspect "$T/wds2" --json >"$T/insp3.json"
check "tfrecord -> tar: 120 records" test "$(json_field "$T/insp3.json" records)" = 120
# A GNU tar archive with a long name and a directory, indexed by `index`.
mkdir -p "$T/gnu/src/$(printf 'd%.0s' $(seq 1 110))"
long="$(printf 'd%.0s' $(seq 1 110))/k1"
printf abc >"$T/gnu/src/$long.jpg"
printf 7 >"$T/gnu/src/$long.cls"
mkdir -p "$T/gnu/shards"
tar -C "$T/gnu/src" --format=gnu -cf "$T/gnu/shards/g.tar" .
"$EMLIO" index "$T/gnu/shards" >"$T/index.out" 2>&1
check "index a GNU tar" test $? -eq 0
check "index names the shard" grep -q "g.tar: 1 samples" "$T/index.out"
check "wds2idx names the long member" grep -q "$long.jpg" "$T/gnu/shards/g.tar.idx"
head -c 700 "$T/gnu/shards/g.tar" >"$T/gnu/shards/g.tar.new" &&
    mv "$T/gnu/shards/g.tar.new" "$T/gnu/shards/g.tar"
"$EMLIO" index "$T/gnu/shards/g.tar" >/dev/null 2>"$T/index.err"
check "index of a truncated tar fails" test $? -ne 0
check "index names file and offset" grep -q "g.tar' at offset [0-9]" "$T/index.err"

# Tools never mix datasets (issue 19): pack into a DST that holds shards is
# refused; --force replaces the <prefix>-* shards, leaving none stale.
cp -r "$T/wds" "$T/again"
"$EMLIO" pack "$T/img" "$T/again" --to tar --shard-bytes 200K --quiet 2>"$T/again.err"
check "pack --to tar refuses a DST that holds shards" test $? -eq 1
check "pack names what is there" grep -q "already holds shards or other files" "$T/again.err"
check "the refused pack changed nothing" diff -r "$T/wds" "$T/again"
"$EMLIO" pack "$T/img" "$T/again" --to tar --shard-bytes 200K --quiet --force
check "pack --force succeeds" test $? -eq 0
n_again=$(ls "$T"/again/*.tar | wc -l)
check "pack --force leaves no stale shard ($n_again < $nt)" test "$n_again" -lt "$nt"
check "pack --force leaves no stale index" \
    test "$(ls "$T"/again/*.tar.idx | wc -l)" -eq "$n_again"
"$EMLIO" inspect "$T/again" --json >"$T/again.json"
check "pack --force: still 120 samples" test "$(json_field "$T/again.json" records)" = 120

# An index that cannot be written (as on a read-only or full file system;
# here a directory stands where the index goes, which stops root too) is a
# failure that is reported, counted and turned into a non-zero exit; the
# other shards are still indexed.
mkdir -p "$T/ro"
cp "$T/wds/train-00000.tar" "$T/wds/train-00001.tar" "$T/ro/"
mkdir -p "$T/ro/train-00000.tar.idx/keep"
"$EMLIO" index "$T/ro" >"$T/ro.out" 2>"$T/ro.err"
check "index: an unwritable index fails the run" test $? -eq 1
check "index: the failure names the index" \
    grep -q "cannot write index '$T/ro/train-00000.tar.idx'" "$T/ro.err"
check "index: the failure is counted" grep -q "; 1 failed" "$T/ro.out"
check "index: the other shard is still indexed" test -f "$T/ro/train-00001.tar.idx"
# A --format that leaves out what is there says what is there.
"$EMLIOD" --data "$T/img" --bind 'tcp://127.0.0.1:*' --format tfrecord \
    >/dev/null 2>"$T/wrongfmt.err"
check "--format tfrecord on an ImageFolder fails" test $? -ne 0
check "... naming its subdirectories" grep -q "it holds .* subdirectories" "$T/wrongfmt.err"
"$EMLIOD" --data "$T/wds" --bind 'tcp://127.0.0.1:*' --format tfrecord \
    >/dev/null 2>"$T/wrongfmt2.err"
check "--format tfrecord on tar shards names them" \
    grep -q "it holds [0-9]* \*.tar shards" "$T/wrongfmt2.err"
# .jpg and .JPEG files are one field, "jpg", not two (issue 34).
mkdir -p "$T/mixedext/a"
first=$(find "$T/img" -name '*.jpg' | head -2)
cp "$(echo "$first" | sed -n 1p)" "$T/mixedext/a/x.jpg"
cp "$(echo "$first" | sed -n 2p)" "$T/mixedext/a/y.JPEG"
"$EMLIO" inspect "$T/mixedext" >"$T/mixedext.out" 2>&1
check "inspect: .jpg and .JPEG are one field jpg of 2 records" \
    grep -qE "^  jpg +2 records" "$T/mixedext.out"
check "inspect: no separate jpeg field" bash -c "! grep -q '^  jpeg ' '$T/mixedext.out'"
# A 0-byte .jpg is no image: left out with a warning that names it,
# never served as an empty sample (issue 34).
: >"$T/mixedext/a/empty.jpg"
"$EMLIO" inspect "$T/mixedext" >"$T/empty.out" 2>&1
check "inspect: an empty .jpg is left out, named" \
    grep -q "left out 1 empty image file (e.g. 'a/empty.jpg')" "$T/empty.out"
check "inspect: ... and the class has its 2 real images" grep -qE "^records: +2$" "$T/empty.out"
start_daemon empty "$T/mixedext" || fail "daemon over a tree with an empty file starts"
check "emliod: the empty file is left out at start, named" \
    grep -q "left out 1 empty image file (e.g. 'a/empty.jpg')" "$T/empty.err"
"$EMLIO" fetch --connect "$EP" --batch 2 --epochs 1 --verify --quiet >"$T/empty.json" 2>/dev/null
check "fetch: 2 samples, none of them empty" test "$(json_field "$T/empty.json" samples)" = 2
kill "$DPID"
wait "$DPID" 2>/dev/null
finish
