#!/bin/bash
# bench/parts_ab.sh: a batch asked for in parts (the default, about 2 MiB a
# GET) against one GET per daemon (--request-bytes 1T), in one invocation,
# alternating, over loopback or an end-to-end delay line (issue 18;
# docs/performance.md "A batch in parts").
#
# usage: bench/parts_ab.sh BUILD SHARDS RTT_MS "BATCHES" [ROUNDS]
#   BUILD: a build directory (bin/emliod, bin/emlio, bench/delayline), e.g.
#   build-bench after `make B=build-bench build-bench/bin/emlio
#   build-bench/bin/emliod build-bench/bench/delayline`.
#   SHARDS: a TFRecord dataset (bench/run's build-bench/bench-data/s6000-c100/shards).
#   RTT_MS: 0 = loopback; else the daemon listens in this namespace and
#   `emlio fetch` runs in netns emlio-parts behind build/bench/delayline
#   (as root; the namespace and devices are made and removed here).
#   BATCHES: batch sizes, e.g. "32 256 1024". ROUNDS: pairs per size (3).
# Prints one line per run: MB/s, first batch, ramp_s, client + daemon
# CPU-s/GB. PIN=1 pins the daemon to CPU 0 and the client to CPU 1 (one
# side's threads then share one core's cache). EPOCHS (default 4 at an RTT,
# 40 over loopback) sets the run length.
set -euo pipefail
B=$1 DATA=$2 RTT=$3 BATCHES=$4 ROUNDS=${5:-3}
. "$(dirname "$0")/fetch_cell.sh"
ab_path parts_ab "$B" emlio-parts emparts 10.77.30.1 10.77.30.2 "$RTT"
cell() { fetch_cell "$B" "$@"; } # LABEL BATCH [fetch args...]

echo "RTT $RTT ms, $ROUNDS rounds, $epochs epochs a run$([ "${PIN:-0}" = 1 ] && echo ', pinned')"
for batch in $BATCHES; do
    for _ in $(seq "$ROUNDS"); do
        cell parts "$batch"
        cell whole "$batch" --request-bytes 1T
    done
done
