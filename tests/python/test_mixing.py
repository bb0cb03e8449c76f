# tests/python/test_mixing.py - the default order mixes classes like a
# uniform shuffle: per-batch class counts from a real daemon, on an
# ImageFolder (one class per directory, so one class per shard) and on
# TFRecords packed class-sorted, pass a chi-square test against the
# hypergeometric law; a 4-shard window fails it (so the test can fail).
# SPDX-License-Identifier: MIT
import math
import os
import shutil
import tempfile
import unittest

import _support
from _support import EMLIO, Daemon, run

import emlio

CLASSES = 10
PER = 60  # samples per class
BATCH = 20
EPOCHS = 12
BINS = 7  # counts 0 .. 5, and 6 or more
# 0.999 quantile of chi-square with BINS - 1 = 6 degrees of freedom.
CRITICAL = 22.46


def hypergeom(k, K, n, N):
    return math.comb(K, k) * math.comb(N - K, n - k) / math.comb(N, n)


def chi_square(endpoint, **kw):
    """Pearson's chi-square of the histogram of (full batch, class) counts
    over EPOCHS epochs against a uniform shuffle's."""
    seen = [0] * BINS
    obs = 0
    with emlio.Loader(endpoint, BATCH, epochs=EPOCHS, seed=5, **kw) as ld:
        for b in ld:
            if len(b) != BATCH:
                continue
            labels = b.labels.tolist()
            for c in range(CLASSES):
                seen[min(labels.count(c), BINS - 1)] += 1
                obs += 1
    n = CLASSES * PER
    probs = [hypergeom(k, PER, BATCH, n) for k in range(BINS - 1)]
    probs.append(1 - sum(probs))
    return sum((s - p * obs) ** 2 / (p * obs) for s, p in zip(seen, probs))


class MixingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-mix.")
        cls.img = os.path.join(cls.tmp, "img")
        cls.tfr = os.path.join(cls.tmp, "tfr")
        run(EMLIO, "synth", cls.img, "--samples", str(CLASSES * PER),
            "--classes", str(CLASSES), "--bytes", "2K", "--quiet")
        # No --seed: the records stay sorted by class, about 2 classes a
        # shard, as a user who packs without reading the docs gets.
        run(EMLIO, "pack", cls.img, cls.tfr, "--shard-bytes", "48K",
            "--quiet")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check(self, daemon):
        chi = chi_square(daemon.endpoint)
        chi4 = chi_square(daemon.endpoint, window_shards=4)
        print("# chi-square default %.1f, window 4 %.1f (critical %.2f)"
              % (chi, chi4, CRITICAL))
        self.assertLess(chi, CRITICAL)
        self.assertGreater(chi4, 10 * CRITICAL)

    def test_imagefolder_batches_mix_like_uniform(self):
        with Daemon(self.img, "--format", "imagefolder") as d:
            self.check(d)

    def test_class_sorted_tfrecords_mix_like_uniform(self):
        shards = [f for f in os.listdir(self.tfr) if f.endswith(".tfrecord")]
        self.assertGreaterEqual(len(shards), 8)
        with Daemon(self.tfr) as d:
            self.check(d)


if __name__ == "__main__":
    _support.main()
