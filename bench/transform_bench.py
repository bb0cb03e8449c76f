#!/usr/bin/env python3
# bench/transform_bench.py - the transform pipeline alone, one core: EMLIO's
# random_resized_crop(224),horizontal_flip (build/bench/transform_bench, C)
# against torchvision's RandomResizedCrop(224) + RandomHorizontalFlip +
# PILToTensor on the same JPEG bytes (held in memory by both), with a plain
# full libjpeg-turbo decode for reference. Images per CPU-second of the one
# thread doing the work, so other load on the machine does not count.
#
#   make build/bench/transform_bench
#   /usr/bin/python3 bench/transform_bench.py [--dir DIR] [--samples 200]
#       [--width W --height H] [--rounds 3] [--spec SPEC]
# Without --dir it writes the files with `emlio synth` (~110 KB JPEGs, the
# ImageNet mean size) into a temporary directory.
# SPDX-License-Identifier: MIT
import argparse
import glob
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), ".."))


def synth(build, d, samples, width, height):
    argv = [os.path.join(build, "bin", "emlio"), "synth", d, "--samples",
            str(samples), "--classes", "4", "--quiet"]
    if width:
        argv += ["--width", str(width), "--height", str(height)]
    subprocess.run(argv, check=True)


def emlio_rates(build, d, spec, rounds):
    out = subprocess.run(
        [os.path.join(build, "bench", "transform_bench"), d, spec,
         str(rounds)], check=True, stdout=subprocess.PIPE).stdout.decode()
    rates = {}
    for line in out.splitlines():
        name, images, cpu_s, rate = line.split()
        rates[name] = float(rate)
    return rates


def torchvision_rate(files, rounds):
    import torch
    import torchvision.transforms as T
    from PIL import Image
    torch.set_num_threads(1)
    blobs = [open(f, "rb").read() for f in files]
    pipe = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                      T.PILToTensor()])

    def one_pass():
        for b in blobs:
            pipe(Image.open(io.BytesIO(b)).convert("RGB"))

    one_pass()  # warm-up
    t0 = time.thread_time()
    for _ in range(rounds):
        one_pass()
    return len(blobs) * rounds / (time.thread_time() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--width", type=int, default=0)
    ap.add_argument("--height", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each side; the median is reported")
    ap.add_argument("--spec", default="random_resized_crop(224),"
                    "horizontal_flip")
    ap.add_argument("--build", default=os.environ.get("B", "build"))
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    tmp = None
    d = a.dir
    if not d:
        tmp = tempfile.mkdtemp(prefix="emlio-tfbench-")
        d = os.path.join(tmp, "img")
        synth(build, d, a.samples, a.width, a.height)
    try:
        files = sorted(glob.glob(os.path.join(d, "*", "*.jpg")))
        mean_kb = statistics.mean(os.path.getsize(f) for f in files) / 1000
        from PIL import Image
        sizes = [Image.open(f).size for f in files]
        mean_mp = statistics.mean(w * h for w, h in sizes) / 1e6
        runs = [emlio_rates(build, d, a.spec, a.rounds)
                for _ in range(a.repeat)]
        emlio = statistics.median(r["emlio"] for r in runs)
        full = statistics.median(r["libjpeg_full_decode"] for r in runs)
        pil = statistics.median(torchvision_rate(files, a.rounds)
                                for _ in range(a.repeat))
        print("%d JPEGs, mean %.0f KB, %.2f MP; one thread, images per "
              "CPU-second, median of %d runs x %d passes"
              % (len(files), mean_kb, mean_mp, a.repeat, a.rounds))
        print("| pipeline | images/s | vs torchvision |")
        print("|---|---|---|")
        print("| emlio %s | %.0f | %.2fx |" % (a.spec, emlio, emlio / pil))
        print("| torchvision RandomResizedCrop(224)+RandomHorizontalFlip+"
              "PILToTensor (PIL %s) | %.0f | 1.00x |"
              % (Image.__version__, pil))
        print("| libjpeg-turbo full decode only (reference) | %.0f | %.2fx |"
              % (full, full / pil))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
