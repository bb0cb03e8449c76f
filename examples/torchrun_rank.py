#!/usr/bin/env python3
# examples/torchrun_rank.py - one rank of a torchrun job: streams this
# rank's share of every epoch through a PyTorch DataLoader.
# SPDX-License-Identifier: MIT
"""One rank under torchrun (see examples/torchrun_loader.sh).

RANK and WORLD_SIZE come from torchrun (emlio reads them); LOCAL_RANK
would pick the GPU. With --out DIR each rank writes DIR/ids.RANK (one
"epoch shard record" line per sample) and DIR/result.RANK.json, which is
how the tests check that the ranks together saw every sample exactly once.

Elastic restart (docs/planner.md, "Elastic resume"): with --state-dir DIR
each rank saves its loader's state_dict() to DIR/state.RANK when it stops
(--stop-after N batches stands for a preemption); a later torchrun on
another number of processes with --resume-from DIR gives every rank the
list of all those states, and the samples the job had not consumed yet
are split among the new ranks. Keep the global batch: --batch B x
processes must stay the same. (A job with a process group can gather the
states with torch.distributed.all_gather_object instead of files.)
"""

import argparse
import glob
import json
import os
import pickle
import sys

# After site-packages: an installed emlio wins, this tree's is the fallback.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                             "bindings", "python"))

import torch  # noqa: E402

import emlio  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connect", required=True, help="daemon endpoints")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="directory for ids.RANK and result.RANK")
    ap.add_argument("--state-dir", help="save this rank's state here on exit")
    ap.add_argument("--resume-from",
                    help="directory of every rank's state of the last run")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after N batches (a stand-in preemption)")
    args = ap.parse_args()

    # RANK/WORLD_SIZE from torchrun; emlio.Loader reads them the same way.
    rank, world = emlio.rank_and_world()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = (torch.device("cuda", local_rank) if torch.cuda.is_available()
              else torch.device("cpu"))
    ids = open(os.path.join(args.out, "ids.%d" % rank), "w") if args.out \
        else None
    states = None
    if args.resume_from:
        states = []
        for path in sorted(glob.glob(os.path.join(args.resume_from,
                                                  "state.*"))):
            with open(path, "rb") as f:
                states.append(pickle.load(f))
    samples = 0
    batches = 0
    with emlio.Loader(args.connect, batch_size=args.batch, seed=args.seed,
                      epochs=args.epochs, state=states) as loader:
        # Resumed: the loader goes on in the epoch its states were of.
        for batch in loader:
            # A training step would decode batch.samples here.
            labels = torch.from_numpy(batch.labels).to(device)
            samples += int(labels.numel())
            if ids:
                for shard, record, pad in batch.ids:
                    ids.write("%d %s %d%s\n" % (batch.epoch, shard, record,
                                                " pad" if pad else ""))
            batches += 1
            if batches == args.stop_after:
                break
        if args.state_dir:
            os.makedirs(args.state_dir, exist_ok=True)
            path = os.path.join(args.state_dir, "state.%d" % rank)
            with open(path + ".tmp", "wb") as f:
                pickle.dump(loader.state_dict(), f)
            os.replace(path + ".tmp", path)
    if ids:
        ids.close()
    result = {"rank": rank, "world": world, "local_rank": local_rank,
              "samples": samples, "epochs": args.epochs}
    if args.out:
        with open(os.path.join(args.out, "result.%d.json" % rank), "w") as f:
            json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
