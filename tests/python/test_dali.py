# tests/python/test_dali.py - the contract of emlio.dali.ExternalSource as
# fn.external_source(batch=True, num_outputs=2) uses it, checked without DALI
# (not installable here): types, dtypes, shapes, batch sizes, epoch ends,
# DALI's cycle="raise" / cycle=None / callable protocols, copies.
# SPDX-License-Identifier: MIT
import os
import subprocess
import sys

import numpy as np

import _support
from _support import DatasetCase


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _have_dali():
    import importlib.util
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ImportError:  # no "nvidia" package at all
        return False


class CycleRaise:
    """What DALI's external_source does with an iterable and cycle="raise"
    (nvidia/dali/external_source.py, _CycleIter): iter() once, and on
    StopIteration iter() again before re-raising it."""

    def __init__(self, source):
        self.source = source
        self.it = iter(source)

    def __call__(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.source)
            raise


class DaliAdapterTest(DatasetCase):
    SAMPLES = 100
    CLASSES = 4
    BATCH = 16

    def setUp(self):
        from emlio.dali import ExternalSource
        self.src = ExternalSource(self.endpoint, self.BATCH, seed=3)
        self.by_bytes = {_read(p): label for p, label in self.files}

    def tearDown(self):
        self.src.close()

    def check_batch(self, out, label_dtype=np.int32):
        self.assertIsInstance(out, tuple)
        self.assertEqual(len(out), 2)  # num_outputs=2
        jpegs, labels = out
        self.assertIsInstance(jpegs, list)
        self.assertGreaterEqual(len(jpegs), 1)
        self.assertLessEqual(len(jpegs), self.BATCH)
        for j in jpegs:
            self.assertIsInstance(j, np.ndarray)
            self.assertEqual(j.dtype, np.uint8)
            self.assertEqual(j.ndim, 1)
            self.assertTrue(j.flags["C_CONTIGUOUS"])
        self.assertIsInstance(labels, np.ndarray)
        self.assertEqual(labels.dtype, label_dtype)
        self.assertEqual(labels.shape, (len(jpegs), 1))
        return jpegs, labels

    def epoch_sizes(self, it):
        sizes = []
        for out in it:
            sizes.append(len(self.check_batch(out)[0]))
        return sizes

    def test_iterable_protocol_one_epoch_per_iter(self):
        # Batches arrive out of order: the short one may come at any point.
        full, rest = divmod(self.SAMPLES, self.BATCH)
        want = [self.BATCH] * full + ([rest] if rest else [])
        self.assertEqual(sorted(self.epoch_sizes(iter(self.src)),
                                reverse=True), want)
        self.assertEqual(self.src.epoch_stats()["epoch"], 0)
        self.assertEqual(sorted(self.epoch_sizes(iter(self.src)),
                                reverse=True), want)
        self.assertEqual(self.src.epoch_stats()["epoch"], 1)

    def test_end_of_epoch_raises_stopiteration_and_stays_ended(self):
        it = iter(self.src)
        n = sum(1 for _ in it)
        self.assertGreater(n, 0)
        with self.assertRaises(StopIteration):
            next(it)
        with self.assertRaises(StopIteration):
            next(it)

    def test_cycle_raise_runs_epoch_after_epoch(self):
        cb = CycleRaise(self.src)
        for epoch in range(3):
            samples = 0
            while True:
                try:
                    jpegs, _ = self.check_batch(cb())
                except StopIteration:
                    break
                samples += len(jpegs)
            self.assertEqual(samples, self.SAMPLES)
            self.assertEqual(self.src.epoch_stats()["epoch"], epoch)

    def test_callable_protocol(self):
        for epoch in range(2):
            samples = 0
            while True:
                try:
                    jpegs, _ = self.check_batch(self.src.next_batch())
                except StopIteration:
                    break
                samples += len(jpegs)
            self.assertEqual(samples, self.SAMPLES)
            self.assertEqual(self.src.epoch_stats()["epoch"], epoch)

    def test_arrays_are_copies_that_stay_valid(self):
        kept = list(iter(self.src))  # every batch released by now
        seen = set()
        for jpegs, labels in kept:
            for j, label in zip(jpegs, labels[:, 0].tolist()):
                data = j.tobytes()
                self.assertEqual(self.by_bytes[data], label)
                seen.add(data)
        self.assertEqual(len(seen), self.SAMPLES)

    def test_label_dtype_and_set_epoch(self):
        from emlio.dali import ExternalSource
        with ExternalSource(self.endpoint, self.BATCH, seed=3,
                            label_dtype=np.int64) as src:
            src.set_epoch(5)
            for out in src:
                self.check_batch(out, np.int64)
            self.assertEqual(src.epoch_stats()["epoch"], 5)

    def test_drop_last_gives_full_batches(self):
        from emlio.dali import ExternalSource
        with ExternalSource(self.endpoint, self.BATCH, drop_last=True) as s:
            sizes = [len(j) for j, _ in s]
        self.assertEqual(sizes, [self.BATCH] * (self.SAMPLES // self.BATCH))

    def test_two_ranks_with_padding(self):
        # 100 samples over 2 ranks with batch 16: equal batch counts per
        # rank; skip_pad leaves out the repeats.
        from emlio.dali import ExternalSource
        got = []
        for rank in range(2):
            with ExternalSource(self.endpoint, self.BATCH, rank=rank,
                                world_size=2, skip_pad=True) as s:
                for jpegs, labels in s:
                    self.check_batch((jpegs, labels))
                    got += [j.tobytes() for j in jpegs]
        self.assertEqual(len(got), self.SAMPLES)
        self.assertEqual(set(got), set(self.by_bytes))

    def test_example_without_dali(self):
        script = os.path.join(_support.ROOT, "examples", "dali_pipeline.py")
        p = subprocess.run([sys.executable, script, "--connect",
                            self.endpoint, "--batch", "16", "--no-dali"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = p.stdout.decode()
        self.assertIn("epoch 1: 7 batches, 100 samples", out)
        self.assertIn("ndarray, uint8", out)
        if not _have_dali():
            p = subprocess.run([sys.executable, script, "--connect",
                                self.endpoint], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=60)
            self.assertEqual(p.returncode, 2)
            self.assertIn("nvidia.dali is not installed", p.stderr.decode())

    def test_dali_is_imported_only_on_use(self):
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "import emlio.dali; "
                "print('nvidia.dali' in sys.modules)")
        p = subprocess.run([sys.executable, "-c", code, os.path.join(
            _support.ROOT, "bindings", "python")], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(p.stdout.decode().strip(), "False",
                         p.stderr.decode())


if __name__ == "__main__":
    _support.main()
