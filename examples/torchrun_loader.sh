#!/usr/bin/env bash
# examples/torchrun_loader.sh - starts one PyTorch process per GPU (or CPU
# slot) with torchrun; each streams its rank's share of every epoch from
# several emliod daemons through emlio.Loader (examples/torchrun_rank.py).
#
#   EMLIO_DAEMONS=tcp://storage1:5555,tcp://storage2:5555 \
#       examples/torchrun_loader.sh --epochs 2
#
# A restart on fewer processes (docs/planner.md, "Elastic resume"): keep
# the global batch (here 4 x 48 = 2 x 96 = 192). The first run stops after
# 100 batches a rank, as a preempted job would, each rank saving its state
# in ckpt/; the second, on 2 processes, gives every rank all 4 states and
# delivers exactly the samples the first had not:
#
#   NPROC_PER_NODE=4 examples/torchrun_loader.sh --batch 48 \
#       --state-dir ckpt --stop-after 100
#   NPROC_PER_NODE=2 examples/torchrun_loader.sh --batch 96 \
#       --resume-from ckpt --state-dir ckpt2
#
# Several training nodes: run it on each with NNODES, NODE_RANK and
# MASTER_ADDR (the rendezvous host) set; one node alone uses --standalone.
# torchrun gives each process RANK, WORLD_SIZE and LOCAL_RANK, which the
# loader reads, so every sample goes to exactly one rank per epoch.
# Arguments go to examples/torchrun_rank.py (--batch, --epochs, --out).
set -euo pipefail

: "${EMLIO_DAEMONS:?set EMLIO_DAEMONS to the daemon endpoints, comma-separated}"
here=$(cd "$(dirname "$0")" && pwd)
nproc=${NPROC_PER_NODE:-2}
if [ "${NNODES:-1}" -gt 1 ]; then
    rdzv=(--nnodes "$NNODES" --node_rank "${NODE_RANK:?set NODE_RANK}"
        --rdzv_backend c10d
        --rdzv_endpoint "${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29400}")
else
    rdzv=(--standalone --nnodes 1)
fi
# TORCHRUN may name another launcher command ("python3 -m torch.distributed.run").
read -ra launcher <<<"${TORCHRUN:-torchrun}"
exec "${launcher[@]}" "${rdzv[@]}" --nproc_per_node "$nproc" \
    "$here/torchrun_rank.py" --connect "$EMLIO_DAEMONS" "$@"
