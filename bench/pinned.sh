#!/usr/bin/env bash
# bench/pinned.sh - a cold dataset while another process holds the memory
# (issue 30's first row): GIB of memory held by a process that touched it
# (default 21 of 24), page cache dropped, then one `emlio fetch --batch 64`
# epoch against emliod --io auto (the default) and --io map, with the
# device bytes from /proc/diskstats over the delivered bytes.
#
#   bench/pinned.sh [DIR] [GIB]   (root, after make all and
#                                  bench/cold.sh make /var/tmp/cold)
set -u
cd "$(dirname "$0")/.."
B=build/bin
D=${1:-/var/tmp/cold/tfr}
GIB=${2:-21}
T=$(mktemp -d)
/usr/bin/python3 -c "
import numpy as np, time
a = np.ones($GIB << 30, dtype=np.uint8)
print('held', flush=True)
time.sleep(3600)" >"$T/hold.out" &
P=$!
trap 'kill $P 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 300); do grep -q held "$T/hold.out" && break; sleep 1; done
free -m | head -2
src=$(df --output=source "$D" | tail -1)
dev=$(lsblk -no pkname "$src" 2>/dev/null | head -1)
[ -n "$dev" ] || dev=$(basename "$src")
rd() { awk -v d="$dev" '$3 == d {print $6 * 512}' /proc/diskstats; }
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for mode in auto map; do
    sync
    echo 3 >/proc/sys/vm/drop_caches
    $B/emliod --data "$D" --bind "tcp://127.0.0.1:$port" --io "$mode" \
        --log-level info 2>"$T/$mode.err" >/dev/null &
    E=$!
    sleep 2
    grep "io: " "$T/$mode.err" | head -1
    r0=$(rd)
    timeout -s INT 300 $B/emlio fetch -c "tcp://127.0.0.1:$port" --batch 64 \
        --quiet 2>/dev/null | tail -1 >"$T/$mode.json"
    r1=$(rd)
    /usr/bin/python3 -c "
import json
d = json.loads(open('$T/$mode.json').read())
print('--io $mode: %.0f MB/s, %d samples, device / delivered %.2fx, limit %s'
      % (d['mb_per_s'], d['samples'], ($r1 - $r0) / max(d['bytes'], 1),
         d.get('limit')))"
    kill $E
    wait $E 2>/dev/null
done
