#!/bin/bash
# bench/sample_cost.sh: CPU per sample and per byte over loopback, a base
# build against this one, with one iperf3 stream as the yardstick (issue 18;
# docs/performance.md "Per sample and per byte").
#
# usage: bench/sample_cost.sh BASE_BUILD NEW_BUILD DATA_DIR [ROUNDS]
#   BASE_BUILD, NEW_BUILD: build directories (bin/emliod, bin/emlio), e.g. a
#   `git archive BASE | tar -x` tree built with make, and build/.
#   DATA_DIR: made once if missing: synthetic images of about 512 B, 4 KB
#   and 110 KB packed into TFRecord shards (d512, d4096, d110000).
# Each round runs iperf3 (one stream, 5 s), then for each size the base and
# the new build in turn: emliod on tcp://127.0.0.1:*, `emlio fetch --batch
# 256 --verify`, daemon CPU from /proc, client CPU from time(1). Prints one
# line per cell: samples/s, MB/s, client and daemon CPU-us per sample and
# CPU-s per GB. Leaves no daemon behind. CELLS="SIZE:EPOCHS ..." picks the
# cells (default "512:10 4096:40 110000:20"), e.g. CELLS=110000:60 for the
# per-byte cost alone. BATCH (default 256) sets the batch size, EMLIOD_ARGS
# extra daemon options for both builds (e.g. "--coalesce always"), and
# NEW_ARGS extra daemon options for the new build alone (an A/B of one
# option: BASE_BUILD and NEW_BUILD the same tree).
set -euo pipefail
BASE=$1
NEW=$2
DATA=$3
ROUNDS=${4:-3}
PY=/usr/bin/python3

make_data() { # SIZE SAMPLES
    [ -d "$DATA/d$1" ] && return 0
    mkdir -p "$DATA"
    "$NEW/bin/emlio" synth "$DATA/img$1" --samples "$2" --classes 10 --bytes "$1" --quiet
    "$NEW/bin/emlio" pack "$DATA/img$1" "$DATA/d$1" --shard-bytes 32M --quiet
    rm -rf "$DATA/img$1"
}

iperf_cell() {
    local port=$((30000 + RANDOM % 20000)) tmp
    tmp=$(mktemp -d)
    /usr/bin/time -f "%U %S" -o "$tmp/s" iperf3 -s -1 -p $port >/dev/null 2>&1 &
    local sp=$!
    sleep 0.5
    /usr/bin/time -f "%U %S" -o "$tmp/c" iperf3 -c 127.0.0.1 -p $port -t 5 -J >"$tmp/j" 2>/dev/null || true
    wait $sp || true
    $PY - "$tmp" <<'EOF'
import json, sys
d = sys.argv[1]
j = json.load(open(d + "/j"))["end"]["sum_received"]
cpu = sum(sum(map(float, open(d + f).read().split()[-2:])) for f in ("/c", "/s"))
print("iperf3 1 stream   %9.1f MB/s  cpu-s/GB %.3f" % (j["bytes"] / j["seconds"] / 1e6,
                                                      cpu / (j["bytes"] / 1e9)))
EOF
    rm -rf "$tmp"
}

emlio_cell() { # BUILD DATA EPOCHS ROLE (base or new)
    local tmp dp ep t0 t1
    tmp=$(mktemp -d)
    local extra=${EMLIOD_ARGS:-}
    [ "$4" = new ] && extra="$extra ${NEW_ARGS:-}"
    # shellcheck disable=SC2086 # word splitting of the option lists is meant
    "$1/bin/emliod" --data "$2" --bind 'tcp://127.0.0.1:*' $extra >"$tmp/d" 2>&1 &
    dp=$!
    for _ in $(seq 100); do grep -q listening "$tmp/d" && break; sleep 0.1; done
    ep=$(sed -n 's/.*listening on \(tcp:[^ ]*\).*/\1/p' "$tmp/d" | head -1)
    t0=$(awk '{print $14 + $15}' /proc/$dp/stat)
    /usr/bin/time -f "%U %S" -o "$tmp/t" "$1/bin/emlio" fetch --connect "$ep" --batch "${BATCH:-256}" \
        --epochs "$3" --verify --quiet >"$tmp/j"
    t1=$(awk '{print $14 + $15}' /proc/$dp/stat)
    kill $dp
    wait $dp || true
    $PY - "$tmp" "$t0" "$t1" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
d, t0, t1, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
j = json.loads(open(d + "/j").read().strip().splitlines()[-1])
cl = sum(map(float, open(d + "/t").read().split()[-2:]))
dm = (t1 - t0) / hz
n = j["samples"]
print("%9.0f samples/s %7.1f MB/s  client %.2f us/sample  daemon %.2f us/sample  cpu-s/GB %.3f"
      % (j["samples_per_s"], j["mb_per_s"], cl / n * 1e6, dm / n * 1e6,
         (cl + dm) / (j["bytes"] / 1e9)))
EOF
    rm -rf "$tmp"
}

for cell in ${CELLS:-512:10 4096:40 110000:20}; do
    case ${cell%%:*} in
    512) make_data 512 200000 ;;
    4096) make_data 4096 14648 ;;
    110000) make_data 110000 1000 ;;
    esac
done
for r in $(seq "$ROUNDS"); do
    echo "round $r"
    iperf_cell
    for cell in ${CELLS:-512:10 4096:40 110000:20}; do
        size=${cell%%:*}
        epochs=${cell##*:}
        printf "%-6s %-24s " "$size" "$BASE"
        emlio_cell "$BASE" "$DATA/d$size" "$epochs" base
        printf "%-6s %-24s " "$size" "$NEW${NEW_ARGS:+ $NEW_ARGS}"
        emlio_cell "$NEW" "$DATA/d$size" "$epochs" new
    done
done
