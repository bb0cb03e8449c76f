# tests/python/test_torch_habits.py - EmlioDataset as PyTorch users use it:
# len(), transform= run in the workers, real DataLoader workers that share
# a rank's batches exactly once, state_dict()/load_state_dict() that
# resume exactly once with workers, and clear errors when misused.
# SPDX-License-Identifier: MIT
import hashlib
import os
import unittest

import _support
from _support import DatasetCase

torch, WHY = _support.import_torch()
HAVE_TORCH = torch is not None
if HAVE_TORCH:
    import torch.utils.data as tud
    import emlio
    from emlio.torch import DataLoader, EmlioDataset, split_batch


def _digest(t):
    return hashlib.sha1(bytes(t.numpy())).hexdigest()


def _batch_ids(item):
    data, offsets, labels = item
    return tuple(_digest(s) for s in split_batch(data, offsets))


def _len_and_pid(sample):
    """A transform: the sample's size and the process that ran it."""
    return torch.tensor([len(sample), os.getpid()], dtype=torch.int64)


@unittest.skipUnless(HAVE_TORCH, WHY)
class TorchHabitsTest(DatasetCase):
    SAMPLES = 230
    CLASSES = 3
    B = 16  # 230 samples: 15 batches, the last one short

    def ds(self, **kw):
        kw.setdefault("seed", 4)
        return EmlioDataset(self.endpoint, self.B, rank=kw.pop("rank", 0),
                            world_size=kw.pop("world_size", 1), **kw)

    def plan_order(self, epoch, **kw):
        """The rank's batches of epoch in plan order, from a plain Loader."""
        kw.setdefault("seed", 4)
        with emlio.Loader(self.endpoint, self.B, in_order=True, **kw) as ld:
            return [tuple(hashlib.sha1(bytes(v)).hexdigest()
                          for v in b.samples) for b in ld.epoch(epoch)]

    def test_len_is_batches_per_epoch_for_this_rank(self):
        ds = self.ds()
        self.assertEqual(len(ds), 15)
        for w in (0, 2, 3):
            with self.subTest(num_workers=w):
                items = list(DataLoader(ds, num_workers=w))
                self.assertEqual(len(items), len(ds))
        r1 = self.ds(rank=1, world_size=2, drop_last=True)
        self.assertEqual(len(r1), 230 // (2 * self.B))
        self.assertEqual(len(DataLoader(r1)), len(r1))
        ds.close()

    def test_workers_deliver_the_plan_exactly_once_in_order(self):
        for w in (1, 2, 3):
            with self.subTest(num_workers=w):
                ds = self.ds()
                ds.set_epoch(2)
                got = [_batch_ids(x) for x in
                       tud.DataLoader(ds, batch_size=None, num_workers=w)]
                self.assertEqual(got, self.plan_order(2))
                flat = [s for b in got for s in b]
                self.assertEqual(len(flat), self.SAMPLES)
                self.assertEqual(len(set(flat)), self.SAMPLES)

    def test_two_ranks_with_workers_split_the_dataset(self):
        seen = []
        for rank in (0, 1):
            ds = self.ds(rank=rank, world_size=2)
            for item in DataLoader(ds, num_workers=2):
                seen.extend(_batch_ids(item))
        pads = len(seen) - self.SAMPLES
        self.assertLess(pads, 2)
        self.assertEqual(len(set(seen)), self.SAMPLES)

    def test_emlio_dataloader_moves_to_the_next_epoch(self):
        ds = self.ds()
        dl = DataLoader(ds, num_workers=2)
        e0 = [_batch_ids(x) for x in dl]
        e1 = [_batch_ids(x) for x in dl]
        self.assertEqual(e0, self.plan_order(0))
        self.assertEqual(e1, self.plan_order(1))

    def test_transform_runs_in_the_workers(self):
        ds = self.ds(transform=_len_and_pid)
        lens = set()
        for samples, labels in DataLoader(ds, num_workers=2):
            self.assertEqual(samples.shape, (len(labels), 2))
            self.assertNotIn(os.getpid(), samples[:, 1].tolist())
            lens.update(samples[:, 0].tolist())
        self.assertTrue(lens and min(lens) > 0)
        # Without workers it runs in this process.
        samples, _ = next(iter(DataLoader(self.ds(transform=_len_and_pid))))
        self.assertEqual(set(samples[:, 1].tolist()), {os.getpid()})

    def resume(self, first_workers, then_workers, k):
        """Hands out k batches with first_workers, saves, resumes in a new
        dataset with then_workers: together exactly the epoch's batches."""
        ds = self.ds()
        ds.set_epoch(1)
        dl = DataLoader(ds, num_workers=first_workers)
        before = []
        for item in dl:
            before.append(_batch_ids(item))
            if len(before) == k:
                state = dl.state_dict()
                break
        del dl
        ds.close()
        self.assertEqual(state["epoch"], 1)
        ds2 = self.ds(state=state)
        after = [_batch_ids(x) for x in
                 DataLoader(ds2, num_workers=then_workers)]
        got = sorted(before + after)
        self.assertEqual(got, sorted(self.plan_order(1)))
        # The state after the whole epoch moves on to the next one.
        self.assertEqual(ds2.state_dict()["next_epoch"], 2)
        ds2.close()

    def test_resume_exactly_once_with_workers(self):
        self.resume(2, 2, 5)
        self.resume(3, 2, 4)
        self.resume(2, 0, 3)
        self.resume(0, 3, 6)  # an out-of-order delivered set

    def test_elastic_resume_with_workers(self):
        """Two ranks (batch 8) stop part-way through epoch 1; one rank
        (batch 16: the same global batch) resumes from both states with
        DataLoader workers: together epoch 1 exactly once, and the epoch
        after it is whole."""
        before, states = [], []
        for rank, k in ((0, 3), (1, 5)):
            ds = EmlioDataset(self.endpoint, 8, rank=rank, world_size=2,
                              seed=4)
            ds.set_epoch(1)
            dl = DataLoader(ds, num_workers=2)
            for item in dl:
                before += _batch_ids(item)
                if len(before) >= 8 * (3 if rank == 0 else 8):
                    break
            states.append(dl.state_dict())
            del dl
            ds.close()
        ds2 = self.ds(state=states)
        after = [s for x in DataLoader(ds2, num_workers=2)
                 for s in _batch_ids(x)]
        whole = sorted(s for b in self.plan_order(1) for s in b)
        self.assertEqual(len(whole), self.SAMPLES)
        self.assertEqual(sorted(before + after), whole)
        self.assertLess(len(after), self.SAMPLES)
        nxt = [s for x in DataLoader(ds2, num_workers=2)
               for s in _batch_ids(x)]
        self.assertEqual(sorted(nxt),
                         sorted(s for b in self.plan_order(2) for s in b))
        ds2.close()

    def test_state_of_another_config_is_refused(self):
        ds = self.ds()
        dl = DataLoader(ds, num_workers=2)
        next(iter(dl))
        state = dl.state_dict()
        other = self.ds(seed=5, state=state)
        with self.assertRaises(emlio.StateError):
            list(DataLoader(other, num_workers=2))

    def test_misuse_raises_clear_errors(self):
        ds = self.ds()
        for w in (0, 2):
            with self.subTest(num_workers=w):
                with self.assertRaises(Exception) as cm:
                    next(iter(tud.DataLoader(ds, num_workers=w)))
                self.assertIn("batch_size=None", str(cm.exception))
        with self.assertRaises(ValueError):
            tud.DataLoader(ds, batch_size=None, shuffle=True)
        with self.assertRaises(ValueError) as cm:
            DataLoader(ds, batch_size=8)
        self.assertIn("batch_size", str(cm.exception))
        with self.assertRaises(ValueError):
            DataLoader(ds, shuffle=True)
        with self.assertRaises(TypeError):
            self.ds(transform=3)
        # A plain DataLoader with workers cannot tell the dataset what it
        # handed out: state_dict says what to use instead.
        list(tud.DataLoader(ds, batch_size=None, num_workers=2))
        with self.assertRaises(RuntimeError) as cm:
            ds.state_dict()
        self.assertIn("emlio.torch.DataLoader", str(cm.exception))


if __name__ == "__main__":
    _support.main()
