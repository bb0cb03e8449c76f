#!/usr/bin/env python3
# bench/python_overhead.py - what the Python binding costs over the C client.
# Runs `emlio fetch` (C) and emlio.Loader (Python) against the same emliod on
# loopback, alternately, several times, and compares median samples/s.
# SPDX-License-Identifier: MIT
"""Python binding overhead versus the C client (`emlio fetch`).

Both clients run the same configuration (batch size, epochs, seed, window
shuffle, CRC check on, auto in-flight window) against one emliod on
127.0.0.1, alternately, --runs times each; the figure is the median
samples/s, and the ratio Python / C.

What each loop does per batch:

* C (`emlio fetch --quiet`): emlio_client_next, emlio_batch_samples, sums
  len and pad of every sample, emlio_batch_release.
* Python "none": ``for batch in loader`` (next, samples, epoch, index: four
  ctypes calls, one Batch object) and ``batch.nbytes`` (one np.frombuffer
  over the emlio_sample_t array); the previous batch is released by the
  iterator. The sample bytes are not touched, like in `emlio fetch`.
* Python "touch": as "none", plus a zero-copy NumPy view per sample
  (``batch.samples``) and reading each sample's first byte through it.

Timing: from the first begin_epoch to the end of the last epoch for both
(fetch's own "seconds"; Python measures after the Loader has connected).
The client's CPU time per sample (fetch's "cpu_s"; Python's process_time
over the loop) is printed too: when the daemon, not the client, is the
bottleneck (few cores), it shows the binding's cost that the throughput
ratio hides. So does "outside next()": per batch, the run's time minus the
time the client spent blocked in emlio_client_next (the stats' wait_s),
i.e. what the loop itself costs: C's loop body, or the whole Python layer.

Usage (from the repository root, B = build directory):
    B=build /usr/bin/python3 bench/python_overhead.py [--samples 20000
        --bytes 20K --batch 64 --epochs 3 --runs 5 --mode both]
    ... --connect tcp://host:port   to use a running daemon instead
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("B", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))


def c_run(args, endpoint):
    out = subprocess.run(
        [os.path.join(BUILD, "bin", "emlio"), "fetch", "--connect", endpoint,
         "--batch", str(args.batch), "--epochs", str(args.epochs), "--seed",
         str(args.seed), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600,
        check=True)
    figures = json.loads(out.stdout.decode().strip().splitlines()[-1])
    outside = (figures["seconds"] - figures["wait_s"]) / figures["batches"]
    return (figures["samples"] / figures["seconds"], figures["samples"],
            figures["cpu_s"] / figures["samples"], outside)


def py_run(args, endpoint, touch):
    import emlio
    with emlio.Loader(endpoint, args.batch, epochs=args.epochs,
                      seed=args.seed) as loader:
        samples = 0
        nbytes = 0
        acc = 0
        wait = 0.0
        batches = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for epoch in range(args.epochs):
            if touch:
                for batch in loader.epoch(epoch):
                    samples += len(batch)
                    nbytes += batch.nbytes
                    for view in batch.samples:
                        acc += view[0]
            else:
                for batch in loader.epoch(epoch):
                    samples += len(batch)
                    nbytes += batch.nbytes
            st = loader.epoch_stats()
            wait += st["wait_s"]
            batches += st["batches"]
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    return (samples / seconds, samples, cpu / samples,
            (seconds - wait) / batches)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connect", help="use this running daemon")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--bytes", default="20K", help="mean JPEG size")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mode", choices=("none", "touch", "both"),
                    default="both")
    args = ap.parse_args()

    import _support
    tmp = None
    daemon = None
    try:
        endpoint = args.connect
        if not endpoint:
            tmp = tempfile.mkdtemp(prefix="emlio-bench.")
            print("making %d synthetic samples of ~%s ..." % (
                args.samples, args.bytes), file=sys.stderr)
            shards, _ = _support.make_dataset(
                tmp, args.samples, args.classes, args.bytes, "16M")
            daemon = _support.Daemon(shards)
            endpoint = daemon.endpoint
        modes = ["none", "touch"] if args.mode == "both" else [args.mode]
        rates = {"c": []}
        cpu = {"c": []}
        outside = {"c": []}
        for m in modes:
            rates["py-" + m] = []
            cpu["py-" + m] = []
            outside["py-" + m] = []
        # One warm-up of each (page cache, daemon mappings, allocator).
        c_run(args, endpoint)
        py_run(args, endpoint, False)
        for i in range(args.runs):
            r, n_c, c, o = c_run(args, endpoint)
            rates["c"].append(r)
            cpu["c"].append(c)
            outside["c"].append(o)
            for m in modes:
                r, n_py, c, o = py_run(args, endpoint, m == "touch")
                rates["py-" + m].append(r)
                cpu["py-" + m].append(c)
                outside["py-" + m].append(o)
                if n_py != n_c:
                    raise SystemExit("sample counts differ: C %d, Python %d"
                                     % (n_c, n_py))
            print("run %d: %s" % (i + 1, "  ".join(
                "%s %.0f" % (k, v[-1]) for k, v in rates.items())),
                file=sys.stderr)
        c_med = statistics.median(rates["c"])
        c_cpu = statistics.median(cpu["c"]) * 1e6
        c_out = statistics.median(outside["c"]) * 1e6
        result = {"samples_per_run": n_c, "batch": args.batch,
                  "epochs": args.epochs, "runs": args.runs,
                  "c_samples_per_s": round(c_med, 1),
                  "c_cpu_us_per_sample": round(c_cpu, 3),
                  "c_outside_next_us_per_batch": round(c_out, 2)}
        for m in modes:
            med = statistics.median(rates["py-" + m])
            m_cpu = statistics.median(cpu["py-" + m]) * 1e6
            m_out = statistics.median(outside["py-" + m]) * 1e6
            result["py_%s_samples_per_s" % m] = round(med, 1)
            result["py_%s_cpu_us_per_sample" % m] = round(m_cpu, 3)
            result["py_%s_outside_next_us_per_batch" % m] = round(m_out, 2)
            result["ratio_%s" % m] = round(med / c_med, 3)
            print("python (%s) / C: %.0f / %.0f samples/s = %.1f%%; client "
                  "CPU %.2f vs %.2f us/sample; outside next() %.1f vs %.1f "
                  "us/batch" % (m, med, c_med, 100 * med / c_med, m_cpu,
                                c_cpu, m_out, c_out))
        print(json.dumps(result))
    finally:
        if daemon:
            daemon.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
