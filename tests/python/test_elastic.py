# tests/python/test_elastic.py - Loader.load_state_dict with the list of
# every rank's state (as torch.distributed.all_gather_object gives it)
# resumes the epoch on another world size: each sample once over the runs,
# and the library's refusals (a rank missing, another global batch) come
# through as StateError.
# SPDX-License-Identifier: MIT
import unittest

import _support
from _support import DatasetCase

import emlio

GLOBAL_BATCH = 12


class ElasticResumeTest(DatasetCase):
    SAMPLES = 300

    def run_ranks(self, world, states, take, seen):
        """One run of `world` ranks resuming from states (None: the epoch
        starts); rank r takes take[r] batches (None: the rest). Returns
        the states the run saved."""
        out = []
        for rank in range(world):
            with emlio.Loader(self.endpoint, GLOBAL_BATCH // world, seed=5,
                              rank=rank, world_size=world) as ld:
                if states is None:
                    ld.begin_epoch(1)
                    it = ld.epoch(1)
                else:
                    ld.load_state_dict(states)
                    it = iter(ld)
                got = 0
                for batch in it:
                    for shard, record, pad in batch.ids:
                        if not pad:
                            seen[(shard, record)] = seen.get(
                                (shard, record), 0) + 1
                    got += 1
                    if take[rank] is not None and got == take[rank]:
                        break
                out.append(ld.state_dict())
        return out

    def test_four_ranks_then_two_then_three_deliver_each_sample_once(self):
        seen = {}
        a = self.run_ranks(4, None, [2, 5, 0, 3], seen)
        b = self.run_ranks(2, a, [4, 1], seen)
        self.run_ranks(3, b, [None, None, None], seen)
        self.assertEqual(len(seen), self.SAMPLES)
        self.assertEqual(set(seen.values()), {1})

    def test_states_of_another_run_are_state_errors(self):
        a = self.run_ranks(4, None, [1, 1, 1, 1], {})
        with emlio.Loader(self.endpoint, 6, seed=5, rank=0,
                          world_size=2) as ld:
            with self.assertRaises(emlio.StateError) as cm:
                ld.load_state_dict(a[:3])
            self.assertIn("no resume state of rank 3", str(cm.exception))
        with emlio.Loader(self.endpoint, 5, seed=5, rank=0,
                          world_size=2) as ld:
            with self.assertRaises(emlio.StateError) as cm:
                ld.load_state_dict(a)
            self.assertIn("global batch", str(cm.exception))


if __name__ == "__main__":
    _support.main()
