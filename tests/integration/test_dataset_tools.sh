#!/usr/bin/env bash
# tests/integration/test_dataset_tools.sh - the dataset subcommands of `emlio`
# end to end: synth -> pack -> inspect -> index, corruption, bad input and
# determinism. Run from the repository root with B=<build dir>.
# SPDX-License-Identifier: MIT
set -u
B=${B:-build}
EMLIO=$B/bin/emlio
passed=0
failed=0

if [ ! -x "$EMLIO" ]; then
    echo "missing $EMLIO (build it first)"
    echo "0 passed, 1 failed"
    exit 1
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/emlio-dataset.XXXXXX")
trap 'rm -rf "$T"' EXIT

# check NAME CMD...: runs CMD, counts a pass when it succeeds.
check() {
    local name=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
    fi
}

# runs CMD, storing its exit status, stdout and stderr in RC, OUT, ERR.
capture() {
    "$@" >"$T/out" 2>"$T/err"
    RC=$?
    OUT=$(cat "$T/out")
    ERR=$(cat "$T/err")
}

# fails_with RC_WANTED PATTERN: the last capture exited RC_WANTED and its
# stderr matches PATTERN (extended regex).
fails_with() {
    [ "$RC" -eq "$1" ] && grep -Eq -- "$2" <<<"$ERR" || {
        echo "    rc=$RC stderr: $ERR"
        return 1
    }
}

# ---- synth ---------------------------------------------------------------
capture "$EMLIO" synth "$T/src" --samples 60 --classes 3 --bytes 20K --seed 7
check "synth exits 0" test "$RC" -eq 0
check "synth writes 3 class dirs" \
    test "$(find "$T/src" -mindepth 1 -maxdepth 1 -type d | wc -l)" -eq 3
check "synth writes 60 jpg files" \
    test "$(find "$T/src" -name '*.jpg' -type f | wc -l)" -eq 60
check "synth files split evenly over classes" \
    test "$(find "$T/src/class_001" -name '*.jpg' | wc -l)" -eq 20
mean=$(find "$T/src" -name '*.jpg' -printf '%s\n' |
    awk '{ s += $1; n++ } END { print int(s / n) }')
check "synth mean size within 20% of 20 KiB ($mean)" \
    test "$mean" -ge 16384 -a "$mean" -le 24576
reported=$(sed -nE 's/^size: mean ([0-9]+) bytes.*/\1/p' <<<"$OUT")
check "synth reports the mean size ($reported)" \
    test "${reported:-0}" -ge $((mean - 1)) -a "${reported:-0}" -le $((mean + 1))

s_decode_all() {
    local f
    if command -v djpeg >/dev/null; then
        for f in $(find "$T/src" -name '*.jpg'); do
            djpeg "$f" >/dev/null 2>"$T/djpeg.err" || return 1
            [ -s "$T/djpeg.err" ] && return 1 # a warning: corrupt data
        done
        return 0
    fi
    if /usr/bin/python3 -c 'import PIL' 2>/dev/null; then
        /usr/bin/python3 - "$T/src" <<'EOF'
import pathlib, sys
from PIL import Image
for p in pathlib.Path(sys.argv[1]).rglob("*.jpg"):
    Image.open(p).load()
EOF
        return
    fi
    echo "    (no djpeg or PIL: decoding not checked)"
}
check "synth images decode cleanly" s_decode_all

"$EMLIO" synth "$T/src2" --samples 60 --classes 3 --bytes 20K --seed 7 \
    --quiet >/dev/null 2>&1
check "synth is deterministic (same seed, same bytes)" diff -r "$T/src" "$T/src2"
"$EMLIO" synth "$T/src3" --samples 60 --classes 3 --bytes 20K --seed 8 \
    --quiet >/dev/null 2>&1
check "synth differs with another seed" \
    bash -c "! cmp -s '$T/src/class_000/img_00000000.jpg' \
        '$T/src3/class_000/img_00000000.jpg'"

capture "$EMLIO" synth "$T/src" --samples 5 --classes 1
check "synth refuses a non-empty DIR" fails_with 1 "not empty"
capture "$EMLIO" synth "$T/x" --classes 3
check "synth without --samples is a usage error" fails_with 2 "required"
capture "$EMLIO" synth "$T/x" --samples 3 --classes zero
check "synth rejects a bad number" fails_with 2 "'zero'"
capture "$EMLIO" synth "$T/fixed" --samples 4 --classes 2 --width 64 \
    --height 48 --bytes 3K
s_fixed_size() {
    [ "$RC" -eq 0 ] || return 1
    command -v djpeg >/dev/null || return 0
    [ "$(djpeg "$T/fixed/class_000/img_00000000.jpg" | sed -n 2p)" = "64 48" ]
}
check "synth --width/--height keeps the size" s_fixed_size

# ---- pack ----------------------------------------------------------------
capture "$EMLIO" pack "$T/src" "$T/dst" --shard-bytes 300K
check "pack exits 0" test "$RC" -eq 0
nshards=$(find "$T/dst" -name '*.tfrecord' | wc -l)
check "pack writes several shards ($nshards)" test "$nshards" -ge 3
check "pack names shards -of-N" test "$(find "$T/dst" \
    -name "train-*-of-$(printf %05d "$nshards").tfrecord" | wc -l)" \
    -eq "$nshards"
check "pack writes an index per shard" \
    test "$(find "$T/dst" -name '*.tfrecord.idx' | wc -l)" -eq "$nshards"
check "pack leaves no temporary files" \
    test "$(find "$T/dst" -name '*.tmp*' | wc -l)" -eq 0
check "pack writes classes.txt" \
    diff <(printf 'class_000\nclass_001\nclass_002\n') "$T/dst/classes.txt"
check "pack summary counts records" grep -q "packed 60 records" <<<"$OUT"
big=$(find "$T/dst" -name '*.tfrecord' -size +320k | wc -l)
check "pack keeps shards near --shard-bytes" test "$big" -eq 0

# inspect --json on every shard: counts add up, keys and kinds are right.
s_inspect_all() {
    local f
    for f in "$T"/dst/*.tfrecord; do
        "$EMLIO" inspect --json "$f" || return 1
    done >"$T/inspect.jsonl"
    /usr/bin/python3 - "$T/inspect.jsonl" <<'EOF'
import json, sys
objs = [json.loads(line) for line in open(sys.argv[1])]
assert sum(o["records"] for o in objs) == 60, objs
for o in objs:
    kinds = {f["key"]: f["kind"] for f in o["features"]}
    assert kinds == {"image/encoded": "bytes",
                     "image/class/label": "int64"}, kinds
    assert o["raw"] == 0 and o["records"] > 0
    rb = o["record_bytes"]
    assert rb["min"] <= rb["mean"] <= rb["max"]
EOF
}
check "inspect --json reports 60 records and the two keys" s_inspect_all
capture "$EMLIO" inspect "$T/dst/train-00000-of-$(printf %05d "$nshards").tfrecord"
check "inspect text lists the keys" grep -q "image/encoded" <<<"$OUT"

# An independent reader (Python, no TensorFlow): framing, CRC32C, Example
# fields, labels in torchvision order and bytes equal to the source files.
s_python_read() {
    PYTHONPATH=scripts /usr/bin/python3 - "$T/src" "$T/dst" <<'EOF'
import os, struct, sys
from tfrecord_raw import masked_crc32c as masked
src, dst = sys.argv[1], sys.argv[2]
def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1
        v |= (x & 0x7F) << s; s += 7
        if x < 0x80:
            return v, i
def fields(b):
    i = 0
    while i < len(b):
        tag, i = varint(b, i)
        assert tag & 7 == 2, tag
        n, i = varint(b, i)
        yield tag >> 3, b[i:i + n]; i += n
records = []
for name in sorted(os.listdir(dst)):
    if not name.endswith(".tfrecord"):
        continue
    data = open(os.path.join(dst, name), "rb").read()
    i = 0
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        (lcrc,) = struct.unpack_from("<I", data, i + 8)
        assert lcrc == masked(data[i:i + 8])
        rec = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, i + 12 + n)
        assert dcrc == masked(rec)
        i += 16 + n
        feats = {}
        for _, features in fields(rec):
            for _, entry in fields(features):
                kv = dict(fields(entry))
                feats[kv[1].decode()] = kv[2]
        kind, lst = next(fields(feats["image/class/label"]))
        assert kind == 3
        if lst[0] == 0x0A:  # packed: tag, length, varints
            _, j = varint(lst, 1)
            label, _ = varint(lst, j)
        else:  # unpacked: tag 0x08, varint
            label, _ = varint(lst, 1)
        kind, lst = next(fields(feats["image/encoded"]))
        assert kind == 1
        _, img = next(fields(lst))
        records.append((label, img))
classes = sorted(os.listdir(src))
want = []
for c, cls in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(src, cls))):
        want.append((c, open(os.path.join(src, cls, f), "rb").read()))
# pack shuffles by default (seed 0, recorded in pack.txt): every image
# once with its label, in another order than the classes'.
assert sorted(records) == sorted(want), "labels and image bytes"
assert [r[0] for r in records] != [w[0] for w in want], "not shuffled"
EOF
}
check "shards read back by an independent reader" s_python_read
check "pack.txt records the shuffle and its seed" \
    bash -c "grep -qx 'order shuffled' '$T/dst/pack.txt' && grep -qx 'seed 0' '$T/dst/pack.txt'"

capture "$EMLIO" pack "$T/src" "$T/dst" --shard-bytes 300K
check "pack refuses a DST that already holds shards" \
    fails_with 1 "already holds shards"
"$EMLIO" pack "$T/src" "$T/dst2" --shard-bytes 300K --quiet
check "pack is deterministic" diff -r "$T/dst" "$T/dst2"
# --force replaces the shards of the earlier run: none is left stale.
cp -r "$T/dst" "$T/forced"
capture "$EMLIO" pack "$T/src" "$T/forced" --shard-bytes 1M --force --quiet
check "pack --force succeeds" test "$RC" -eq 0
check "pack --force leaves only the new shards" \
    test "$(find "$T/forced" -name '*.tfrecord' | wc -l)" -eq \
    "$(find "$T/forced" -name '*-of-*' -name "*-of-$(printf %05d \
        "$(find "$T/forced" -name '*.tfrecord' | wc -l)").tfrecord" | wc -l)"
check "pack --force leaves fewer shards than before" \
    test "$(find "$T/forced" -name '*.tfrecord' | wc -l)" -lt "$nshards"
"$EMLIO" pack "$T/src" "$T/shuf1" --shard-bytes 300K --seed 3 --quiet
"$EMLIO" pack "$T/src" "$T/shuf2" --shard-bytes 300K --seed 3 --quiet
check "pack --seed is deterministic" diff -r "$T/shuf1" "$T/shuf2"
check "pack --seed changes the order" \
    bash -c "! diff -rq '$T/dst' '$T/shuf1' >/dev/null"
"$EMLIO" pack "$T/src" "$T/one" --quiet
check "pack default shard size gives one shard" \
    test "$(find "$T/one" -name '*.tfrecord' | wc -l)" -eq 1

# ---- index ---------------------------------------------------------------
mkdir -p "$T/orig-idx"
cp "$T"/dst/*.idx "$T/orig-idx/"
rm "$T"/dst/*.idx
capture "$EMLIO" index "$T/dst"
check "index exits 0" test "$RC" -eq 0
s_same_idx() {
    local f
    for f in "$T"/orig-idx/*.idx; do
        cmp "$f" "$T/dst/$(basename "$f")" || return 1
    done
}
check "index reproduces pack's index files" s_same_idx
f0="$T/dst/train-00000-of-$(printf %05d "$nshards").tfrecord"
capture "$EMLIO" index "$f0"
check "index takes a file argument" test "$RC" -eq 0

mkdir -p "$T/bad"
cp "$T"/dst/*.tfrecord "$T/bad/"
victim=$(ls "$T"/bad/*.tfrecord | sed -n 2p)
size=$(stat -c %s "$victim")
/usr/bin/python3 - "$victim" "$((size / 2))" <<'EOF'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    f.seek(off)
    f.write(bytes([b[0] ^ 0xFF]))
EOF
capture "$EMLIO" index "$T/bad"
check "index fails on a corrupt shard" fails_with 1 "$(basename "$victim")"
check "index error gives an offset" grep -q "offset" <<<"$ERR"
check "index reports the failure count" grep -q "1 failed" <<<"$OUT"
check "index still indexes the good shards" \
    test "$(find "$T/bad" -name '*.idx' | wc -l)" -eq $((nshards - 1))
capture "$EMLIO" index "$T/bad" --no-verify
check "index --no-verify skips data crcs" test "$RC" -eq 0
capture "$EMLIO" inspect "$victim" --verify
check "inspect --verify fails on the corrupt shard" \
    fails_with 1 "$(basename "$victim")"

mkdir -p "$T/empty"
capture "$EMLIO" index "$T/empty"
check "index on a dir without shards fails" fails_with 1 "no \*.tfrecord"
capture "$EMLIO" index "$T/nope"
check "index on a missing path fails" \
    fails_with 1 "'$T/nope': no such file"
capture "$EMLIO" index
check "index without arguments is a usage error" fails_with 2 "missing"

# ---- bad input to pack ----------------------------------------------------
capture "$EMLIO" pack "$T/nope" "$T/out1"
check "pack: missing SRC" fails_with 1 "cannot read '$T/nope': no such file"
capture "$EMLIO" pack "$T/empty" "$T/out2"
check "pack: empty SRC" fails_with 1 "class directories under '$T/empty'"
mkdir -p "$T/emptyclass/a" "$T/emptyclass/b"
cp "$T/src/class_000/img_00000000.jpg" "$T/emptyclass/a/"
capture "$EMLIO" pack "$T/emptyclass" "$T/out3"
check "pack: class without images" fails_with 1 "'$T/emptyclass/b' has no images"
mkdir -p "$T/notjpeg/a"
cp "$T/src/class_000/img_00000000.jpg" "$T/notjpeg/a/"
echo "hello" >"$T/notjpeg/a/fake.jpg"
capture "$EMLIO" pack "$T/notjpeg" "$T/out4"
check "pack: a .jpg that is not a JPEG" \
    fails_with 1 "'$T/notjpeg/a/fake.jpg': not a JPEG"
check "pack: no shard left after the failure" \
    test "$(find "$T/out4" -name '*.tfrecord*' | wc -l)" -eq 0
rm "$T/notjpeg/a/fake.jpg"
# pack reads SRC as emliod serves it: other images are skipped (and
# counted), files that are not images are not part of the dataset.
echo "notes" >"$T/notjpeg/a/README.txt"
printf '\x89PNG\r\n' >"$T/notjpeg/a/other.png"
capture "$EMLIO" pack "$T/notjpeg" "$T/out5"
check "pack: other images are skipped" \
    bash -c "[ $RC -eq 0 ] && grep -q '1 files skipped' <<<'$OUT'"
capture "$EMLIO" pack "$T/src"
check "pack: one argument is a usage error" fails_with 2 "expected SRC and DST"
capture "$EMLIO" pack "$T/src" "$T/out6" --shard-bytes lots
check "pack: bad --shard-bytes" fails_with 2 "'lots'"
capture "$EMLIO" pack --help
check "pack --help prints usage to stdout" \
    bash -c "[ $RC -eq 0 ] && grep -q '^usage: emlio pack' '$T/out'"
capture "$EMLIO" inspect "$T/nope.tfrecord"
check "inspect: missing file" fails_with 1 "cannot open '$T/nope.tfrecord'"
head -c 100 "$f0" >"$T/trunc.tfrecord"
capture "$EMLIO" inspect "$T/trunc.tfrecord"
check "inspect: truncated file" fails_with 1 "trunc.tfrecord"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
