# tests/python/test_sources.py - emlio.Loader(sources=...) against two real
# emliod daemons with different datasets: exact quotas per epoch, every
# sample's source in Batch.sources, stratified batches, bad sources refused.
# Run from the repository root: B=<build dir> /usr/bin/python3 <this file>.
# SPDX-License-Identifier: MIT
import collections
import os
import shutil
import tempfile
import unittest

import _support

import emlio


class SourcesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-py-src.")
        cls.daemons = []
        try:
            a, _ = _support.make_dataset(os.path.join(cls.tmp, "a"), 120, 2)
            b, _ = _support.make_dataset(os.path.join(cls.tmp, "b"), 40, 2)
            cls.daemons = [_support.Daemon(a), _support.Daemon(b)]
        except BaseException:
            for d in cls.daemons:
                d.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        cls.ea, cls.eb = (d.endpoint for d in cls.daemons)

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons:
            d.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_quotas_and_sources_per_sample(self):
        # 160 samples an epoch, weights 1:1: 80 of a (subsampled), 80 of b
        # (each of its 40 twice).
        srcs = [{"name": "a", "endpoints": self.ea, "weight": 1},
                ("b", [self.eb], 1.0)]
        with emlio.Loader(None, 16, sources=srcs, seed=3) as loader:
            self.assertEqual(loader.source_names, ["a", "b"])
            for epoch in range(2):
                per = collections.Counter()
                ids = collections.Counter()
                for batch in loader.epoch(epoch):
                    srcs_of = batch.sources.tolist()
                    for s, (shard, rec, pad) in zip(srcs_of, batch.ids):
                        self.assertFalse(pad)
                        per[s] += 1
                        ids[(s, shard, rec)] += 1
                self.assertEqual(per, {0: 80, 1: 80})
                self.assertEqual(max(n for (s, _, _), n in ids.items()
                                     if s == 0), 1)
                self.assertEqual({n for (s, _, _), n in ids.items()
                                  if s == 1}, {2})

    def test_stratified_batches(self):
        srcs = [("a", self.ea, 3), ("b", self.eb, 1)]
        with emlio.Loader(None, 8, sources=srcs, stratify=True,
                          epoch_samples=80) as loader:
            n = 0
            for batch in loader.epoch(0):
                self.assertEqual(sorted(batch.sources.tolist()),
                                 [0] * 6 + [1] * 2)
                n += 1
            self.assertEqual(n, 10)

    def test_torch_dataset_takes_sources(self):
        try:
            import torch  # noqa: F401
            from emlio.torch import EmlioDataset
        except ImportError as e:
            self.skipTest("PyTorch not importable: %s" % e)
        ds = EmlioDataset(None, 20, sources=[("a", self.ea, 1),
                                             ("b", self.eb, 1)], seed=5)
        items = list(iter(ds))
        # (data, offsets, labels) per batch: 160 samples in batches of 20.
        self.assertEqual(len(items), 8)
        self.assertEqual(sum(len(labels) for _, _, labels in items), 160)

    def test_bad_sources_are_refused(self):
        with self.assertRaises(emlio.EmlioError) as cm:
            emlio.Loader(None, 8, sources=[("a", self.ea, 0)])
        self.assertIn("positive, finite", str(cm.exception))
        with self.assertRaises(emlio.EmlioError) as cm:
            emlio.Loader(None, 8, sources=[("a", self.ea), ("a", self.eb)])
        self.assertIn("two sources are named 'a'", str(cm.exception))
        with self.assertRaises(ValueError):
            emlio.Loader(self.ea, 8, sources=[("a", self.ea)])
        with self.assertRaises(TypeError):
            emlio.Loader(None, 8, sources=[{"name": "a"}])


if __name__ == "__main__":
    _support.main()
