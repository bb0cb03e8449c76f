#!/usr/bin/env bash
# demo.sh - the main job on one machine: synthesize a small ImageNet-like
# dataset, pack it into TFRecord shards, serve it with emliod on loopback,
# fetch epochs with the client, print the throughput, stop the daemon.
# Run through `make demo`, which installs the packages and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
DATA=${EMLIO_DEMO_DIR:-demo-data}
SAMPLES=${EMLIO_DEMO_SAMPLES:-1000}
EPOCHS=${EMLIO_DEMO_EPOCHS:-3}

if [ ! -f "$DATA/shards/classes.txt" ]; then
    rm -rf "$DATA"
    echo "demo: synthesizing $SAMPLES JPEGs of ~110 KB in $DATA/img"
    "$B/bin/emlio" synth "$DATA/img" --samples "$SAMPLES" --classes 10 \
        --bytes 110000 --seed 1
    echo "demo: packing into TFRecord shards in $DATA/shards"
    "$B/bin/emlio" pack "$DATA/img" "$DATA/shards" --shard-bytes 32M
fi

log=$(mktemp)
"$B/bin/emliod" --data "$DATA/shards" --bind 'tcp://127.0.0.1:*' \
    >"$log" 2>"$log.err" &
daemon=$!
trap 'kill $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true; rm -f "$log" "$log.err"' EXIT
endpoint=""
for _ in $(seq 1 200); do
    endpoint=$(sed -n 's/^emliod: listening on //p' "$log")
    [ -n "$endpoint" ] && break
    kill -0 $daemon 2>/dev/null || { cat "$log.err"; exit 1; }
    sleep 0.05
done
[ -n "$endpoint" ] || { echo "demo: emliod did not start"; exit 1; }
echo "demo: emliod listening on $endpoint"
echo "demo: fetching $EPOCHS epochs, batch 64, verifying every sample"
"$B/bin/emlio" fetch --connect "$endpoint" --batch 64 --epochs "$EPOCHS" \
    --verify | tee "$log.json"
/usr/bin/python3 - "$log.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"demo: {r['samples']} samples, {r['bytes'] / 1e6:.0f} MB in "
      f"{r['seconds']:.2f} s = {r['samples_per_s']:.0f} samples/s, "
      f"{r['mb_per_s']:.0f} MB/s, first batch after "
      f"{r['first_batch_s'] * 1e3:.1f} ms, verified: {r['verified']}")
PY
echo "demo: two epochs of training-ready tensors (RandomResizedCrop 224 +"
echo "demo: flip, decoded where time and energy say: decode-at auto)"
"$B/bin/emlio" fetch --connect "$endpoint" --batch 64 --epochs 2 --quiet \
    --transform 'random_resized_crop(224),horizontal_flip' --decode-at auto \
    --verify >"$log.json"
/usr/bin/python3 - "$log.json" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().strip().splitlines()
r = json.loads(lines[-1])
t = json.loads(lines[-2])["transform"]
print(f"demo: {r['samples']} tensors of 224x224x3 in {r['seconds']:.2f} s = "
      f"{r['samples_per_s']:.0f} images/s, verified: {r['verified']}; "
      f"daemon share {t['server_share']:.2f} ({t['why']})")
PY
rm -f "$log.json"
kill -TERM $daemon
wait $daemon
echo "demo: emliod stopped"
