# tests/python/test_sources.py - emlio.Loader(sources=...) against two real
# emliod daemons with different datasets: exact quotas per epoch, every
# sample's source in Batch.sources, stratified batches, bad sources refused,
# and weights changed in the middle of an epoch through load_state_dict.
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
        # No endpoints: the sources name the daemons.
        with emlio.Loader(sources=srcs, batch_size=16, seed=3) as loader:
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
        ds = EmlioDataset(sources=[("a", self.ea, 1), ("b", self.eb, 1)],
                          batch_size=20, seed=5)
        with self.assertRaises(TypeError):  # keyword-only after two
            EmlioDataset(None, 20, 0)
        items = list(iter(ds))
        # (data, offsets, labels) per batch: 160 samples in batches of 20.
        self.assertEqual(len(items), 8)
        self.assertEqual(sum(len(labels) for _, _, labels in items), 160)

    def test_weights_changed_mid_epoch(self):
        # An epoch of 80 begun at 1:1 on 2 ranks (3 batches of 4 each),
        # finished at 1:3 on 1 rank from both states: a 20, b 60, and no
        # sample twice (b has 40: 60 of it repeats 20, but none of a's).
        def srcs(wb):
            return [("a", self.ea, 1), ("b", self.eb, wb)]
        seen = collections.Counter()
        states = []
        for r in range(2):
            with emlio.Loader(None, 4, sources=srcs(1), epoch_samples=80,
                              rank=r, world_size=2, seed=8,
                              in_order=True) as ld:
                for i, batch in enumerate(ld.epoch(0)):
                    for s, (shard, rec, _) in zip(batch.sources.tolist(),
                                                  batch.ids):
                        seen[(s, shard, rec)] += 1
                    if i == 2:
                        break
                states.append(ld.state_dict())
        self.assertEqual(sum(seen.values()), 24)
        with emlio.Loader(None, 8, sources=srcs(3), epoch_samples=80,
                          seed=8) as ld:
            left = ld.load_state_dict(states)
            self.assertEqual(left, 7)  # 56 samples in batches of 8
            for batch in ld:
                for s, (shard, rec, _) in zip(batch.sources.tolist(),
                                              batch.ids):
                    seen[(s, shard, rec)] += 1
            self.assertEqual(ld.epoch_stats()["epoch"], 0)
        per = collections.Counter()
        for (s, _, _), n in seen.items():
            per[s] += n
        self.assertEqual(per, {0: 20, 1: 60})
        self.assertEqual(max(n for (s, _, _), n in seen.items() if s == 0), 1)
        # b: 60 of 40 samples, each once or twice.
        self.assertEqual({n for (s, _, _), n in seen.items() if s == 1},
                         {1, 2})
        # One rank's state of the two, with other weights: refused.
        with emlio.Loader(None, 4, sources=srcs(3), epoch_samples=80,
                          rank=0, world_size=2, seed=8) as ld:
            with self.assertRaises(emlio.StateError) as cm:
                ld.load_state_dict(states[0])
            self.assertIn("every rank's state", str(cm.exception))

    def test_a_state_names_the_source_whose_data_changed(self):
        # Format 6 keeps a fingerprint per source: a state resumed with
        # source 'b' served by a daemon of other data is refused naming
        # 'b'; with the two daemons swapped, as sources in another order;
        # the same state as format 5 (no fingerprints) still resumes.
        import struct
        from emlio import _state
        srcs = [("a", self.ea, 1), ("b", self.eb, 1)]
        with emlio.Loader(sources=srcs, batch_size=4, seed=2,
                          epoch_samples=40) as ld:
            for i, _ in enumerate(ld.epoch(0)):
                if i == 1:
                    break
            state = ld.state_dict()
        blob = state["emlio_state"]
        self.assertEqual(struct.unpack_from("<I", blob, 4)[0], 6)
        c, _ = _support.make_dataset(os.path.join(self.tmp, "c"), 44, 2)
        other = _support.Daemon(c)
        try:
            with emlio.Loader(sources=[("a", self.ea, 1),
                                       ("b", other.endpoint, 1)],
                              batch_size=4, seed=2, epoch_samples=40) as ld:
                with self.assertRaises(emlio.StateError) as cm:
                    ld.load_state_dict(state)
        finally:
            other.stop()
        self.assertIn("other data in source 'b'", str(cm.exception))
        swapped = [("a", self.eb, 1), ("b", self.ea, 1)]
        with emlio.Loader(sources=swapped, batch_size=4, seed=2,
                          epoch_samples=40) as ld:
            with self.assertRaises(emlio.StateError) as cm:
                ld.load_state_dict(state)
        self.assertIn("names, order", str(cm.exception))
        header, epoch, n, done = _state.parse(blob)
        fixed, tail, section = _state._split(header)
        five = (fixed[:4] + struct.pack("<I", 5) + fixed[8:] + tail +
                section[:8] + section[8 + 16:])
        with emlio.Loader(sources=srcs, batch_size=4, seed=2,
                          epoch_samples=40) as ld:
            left = ld.load_state_dict(_state.make(five, epoch, n, done))
            self.assertEqual(left, 8)  # 40 samples, 2 of 10 batches taken

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
