#!/bin/bash
# bench/builds_ab.sh: two builds of EMLIO against each other, in one
# invocation, alternating (old, new, old, new, ...) so that load from
# elsewhere falls on both alike; over loopback or an end-to-end delay
# line. What "no regression" claims are measured with (e.g. issue 33:
# one source, one rank, before and after sources were added).
#
# usage: bench/builds_ab.sh OLD_BUILD NEW_BUILD SHARDS RTT_MS "BATCHES" [ROUNDS]
#   OLD_BUILD, NEW_BUILD: build directories (bin/emliod, bin/emlio), e.g.
#   `git worktree add /tmp/old REV && make -C /tmp/old all` and build.
#   NEW_BUILD's bench/delayline carries the RTT. SHARDS, RTT_MS, BATCHES,
#   ROUNDS, PIN and EPOCHS as bench/parts_ab.sh.
set -euo pipefail
OLD=$1 NEW=$2 DATA=$3 RTT=$4 BATCHES=$5 ROUNDS=${6:-3}
. "$(dirname "$0")/fetch_cell.sh"
ab_path builds_ab "$NEW" emlio-builds embuilds 10.77.31.1 10.77.31.2 "$RTT"

echo "RTT $RTT ms, $ROUNDS rounds, $epochs epochs a run; old $OLD, new $NEW"
for batch in $BATCHES; do
    for _ in $(seq "$ROUNDS"); do
        fetch_cell "$OLD" old "$batch"
        fetch_cell "$NEW" new "$batch"
    done
done
