#!/bin/bash
# bench/cold_ab.sh: two builds read one dataset cold, in turn, in one
# invocation (root): before every run the page cache is dropped, emliod
# --io read serves DATA over loopback and one `emlio fetch --verify` reads
# an epoch. The order within a pair alternates every round: on this VM the
# first run after a pair's drop read up to 10% faster whichever build it was.
# Prints MB/s, daemon and client CPU-s/GB and device bytes (/proc/diskstats)
# over delivered bytes.
#   bench/cold_ab.sh OLD_BUILD NEW_BUILD DATA [ROUNDS] [DEVICE]   (4, vda)
# OLD_ENV / NEW_ENV: VAR=VALUE words for that side's daemon, so one build
# A/Bs a setting (OLD_ENV=EMLIO_IO_FIXED=0 bench/cold_ab.sh build build
# ...); MEM: the daemons run in a v1 memory cgroup of that size (none);
# EPOCHS (1) and FETCH_OPTS (e.g. "--shuffle none") go to the fetch.
set -euo pipefail
OLD=$1 NEW=$2 DATA=$3 ROUNDS=${4:-4} DEV=${5:-vda}
CG=
if [ -n "${MEM:-}" ]; then
    CG=/sys/fs/cgroup/memory/emlio_ab
    mkdir -p "$CG"
    echo "$MEM" >"$CG/memory.limit_in_bytes"
fi

run() { # LABEL BUILD ENV
    local label=$1 b=$2 envs=$3 t sp port r0 r1 c0 c1
    sync
    echo 3 >/proc/sys/vm/drop_caches
    port=$((30000 + RANDOM % 20000)) t=$(mktemp -d)
    # One process from fork to emliod (sh execs it), so $! is the daemon
    # whose CPU is counted; it joins the cgroup before the exec.
    # shellcheck disable=SC2016,SC2086
    sh -c '[ -z "$1" ] || echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$CG" \
        env $envs "$b/bin/emliod" --data "$DATA" --bind "tcp://127.0.0.1:$port" --io read \
        >"$t/d" 2>&1 &
    sp=$!
    for _ in $(seq 100); do grep -q listening "$t/d" && break; sleep 0.1; done
    r0=$(awk -v d="$DEV" '$3 == d {print $6}' /proc/diskstats)
    c0=$(awk '{print $14 + $15}' /proc/$sp/stat)
    /usr/bin/time -f "%U %S" -o "$t/t" "$b/bin/emlio" fetch --connect "tcp://127.0.0.1:$port" \
        --batch 64 --epochs "${EPOCHS:-1}" --verify --quiet ${FETCH_OPTS:-} >"$t/j" 2>/dev/null ||
        echo "cold_ab: fetch failed ($label)" >&2
    c1=$(awk '{print $14 + $15}' /proc/$sp/stat)
    r1=$(awk -v d="$DEV" '$3 == d {print $6}' /proc/diskstats)
    kill $sp
    wait $sp 2>/dev/null || true
    /usr/bin/python3 - "$t" "$label" "$c0" "$c1" "$r0" "$r1" <<'PY'
import json, sys
t, label, c0, c1, r0, r1 = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
j = json.loads(open(t + "/j").read().strip().splitlines()[-1])
gb = j["bytes"] / 1e9
client = sum(map(float, open(t + "/t").read().split()[-2:]))
print("%-4s %6.0f MB/s  daemon CPU-s/GB %.2f  client %.2f  device/delivered %.2f  verified %s"
      % (label, j["mb_per_s"], (c1 - c0) / 100 / gb, client / gb,
         (r1 - r0) * 512 / j["bytes"], j["verified"]))
PY
    rm -rf "$t"
}

for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
        run old "$OLD" "${OLD_ENV:-}"
        run new "$NEW" "${NEW_ENV:-}"
    else
        run new "$NEW" "${NEW_ENV:-}"
        run old "$OLD" "${OLD_ENV:-}"
    fi
done
