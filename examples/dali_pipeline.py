#!/usr/bin/env python3
# examples/dali_pipeline.py - EMLIO batches into an NVIDIA DALI pipeline that
# decodes the JPEGs on the GPU (fn.decoders.image, device="mixed").
# SPDX-License-Identifier: MIT
"""Feed a DALI pipeline from a running emliod.

    PYTHONPATH=bindings/python EMLIO_LIBRARY=build/libemlio.so \\
        python3 examples/dali_pipeline.py --connect tcp://127.0.0.1:PORT \\
        --batch 64 --epochs 2

Needs NVIDIA DALI and a GPU. DALI is not a Debian package and PyPI is out of
reach here, so this example was not run in this tree; without DALI it says
so and exits with status 2. ``--no-dali`` runs the same source without DALI
(what fn.external_source would receive: counts, shapes, dtypes per epoch).

Epochs: the source is given with cycle="raise", so at the end of each epoch
pipe.run() raises StopIteration; pipe.reset() then lets DALI call
iter(source) again, which starts the next EMLIO epoch.
"""

import argparse
import os
import sys
import time

# After site-packages: an installed emlio wins, this tree's is the fallback.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                             "bindings", "python"))

from emlio.dali import ExternalSource, pipeline  # noqa: E402


def run_dali(args, src):
    pipe = pipeline(src, args.batch, num_threads=args.threads,
                    device_id=args.device, size=args.size, cycle="raise")
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        samples = 0
        batches = 0
        while True:
            try:
                images, labels = pipe.run()
            except StopIteration:
                pipe.reset()
                break
            batches += 1
            samples += len(labels)
            if batches == 1:
                print("epoch %d first batch: images %s, labels %s" % (
                    epoch, images.as_tensor().shape(),
                    labels.as_tensor().shape()))
        dt = time.monotonic() - t0
        print("epoch %d: %d batches, %d images, %.0f images/s" % (
            epoch, batches, samples, samples / dt if dt else 0))


def run_plain(args, src):
    for epoch in range(args.epochs):
        batches = 0
        samples = 0
        for jpegs, labels in src:
            batches += 1
            samples += len(jpegs)
            if batches == 1:
                print("epoch %d first batch: %d jpegs (%s, %s), labels %s %s"
                      % (epoch, len(jpegs), type(jpegs[0]).__name__,
                         jpegs[0].dtype, labels.shape, labels.dtype))
        print("epoch %d: %d batches, %d samples" % (epoch, batches, samples))


def main():
    ap = argparse.ArgumentParser(description="emliod -> DALI pipeline")
    ap.add_argument("--connect", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--no-dali", action="store_true",
                    help="iterate the source without DALI")
    args = ap.parse_args()

    if not args.no_dali:
        try:
            import nvidia.dali
            print("DALI %s" % nvidia.dali.__version__)
        except ImportError as exc:
            print("dali_pipeline: nvidia.dali is not installed (%s); "
                  "use --no-dali to check the source alone" % exc,
                  file=sys.stderr)
            return 2
    with ExternalSource(args.connect, args.batch, seed=args.seed) as src:
        if args.no_dali:
            run_plain(args, src)
        else:
            run_dali(args, src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
