# tests/python/test_loader.py - emlio.Loader against a real emliod: exactly
# once, bytes equal the source JPEGs, ranks, resume, errors, batch lifetime.
# Run from the repository root: B=<build dir> /usr/bin/python3 <this file>.
# SPDX-License-Identifier: MIT
import os
import subprocess
import sys
import time
import unittest

import _support
from _support import DatasetCase

import emlio


def _read(path):
    with open(path, "rb") as f:
        return f.read()


class LoaderTest(DatasetCase):
    SAMPLES = 300
    CLASSES = 3

    def setUp(self):
        self.by_bytes = {}
        for path, label in self.files:
            self.by_bytes[_read(path)] = (path, label)
        self.assertEqual(len(self.by_bytes), len(self.files),
                         "synthetic images must be distinct")

    def collect(self, batches):
        """[(shard, record, pad, bytes, label)] of the batches."""
        out = []
        for b in batches:
            ids = b.ids
            labels = b.labels.tolist()
            for i, view in enumerate(b.samples):
                out.append(ids[i] + (bytes(view), labels[i]))
        return out

    def test_version_and_library(self):
        self.assertEqual(emlio.version()[:2], emlio.BINDING_VERSION[:2])
        self.assertTrue(os.path.exists(emlio.library_path))

    def test_epoch_delivers_every_sample_once_with_source_bytes(self):
        with emlio.Loader(self.endpoint, 32, seed=7) as loader:
            got = self.collect(loader)
            stats = loader.epoch_stats()
        keys = [(s, r) for s, r, pad, _, _ in got if not pad]
        self.assertEqual(len(keys), self.SAMPLES)
        self.assertEqual(len(set(keys)), self.SAMPLES)
        seen = set()
        for _, _, _, data, label in got:
            self.assertIn(data, self.by_bytes, "sample is no source file")
            path, want = self.by_bytes[data]
            self.assertEqual(label, want, path)
            seen.add(path)
        self.assertEqual(len(seen), self.SAMPLES)
        self.assertEqual(stats["samples"], self.SAMPLES)
        self.assertEqual(stats["batches"], (self.SAMPLES + 31) // 32)
        self.assertEqual(stats["bytes"],
                         sum(len(d) for d in self.by_bytes))
        for key in ("seconds", "wait_s", "first_batch_s", "inflight",
                    "epoch"):
            self.assertIn(key, stats)

    def test_file_order_matches_pack_order(self):
        # shuffle off, in order: sample i is the i-th file of the sorted
        # ImageFolder tree, with its class index as label.
        with emlio.Loader(self.endpoint, 25, shuffle=False,
                          in_order=True) as loader:
            got = self.collect(loader)
        self.assertEqual(len(got), len(self.files))
        for i, ((path, label), item) in enumerate(zip(self.files, got)):
            self.assertEqual(item[3], _read(path), "sample %d" % i)
            self.assertEqual(item[4], label, "sample %d" % i)

    def test_batches_asked_for_in_parts_come_back_whole(self):
        # request_bytes=1: every sample its own GET, spread over the
        # streams; each batch still arrives whole, in plan order.
        with emlio.Loader(self.endpoint, 25, shuffle=False, in_order=True,
                          request_bytes=1) as loader:
            got = self.collect(loader)
        self.assertEqual(len(got), len(self.files))
        for i, ((path, label), item) in enumerate(zip(self.files, got)):
            self.assertEqual(item[3], _read(path), "sample %d" % i)
            self.assertEqual(item[4], label, "sample %d" % i)

    def test_two_ranks_split_the_dataset(self):
        per_rank = []
        counts = []
        for rank in range(2):
            with emlio.Loader(self.endpoint, 16, seed=3, rank=rank,
                              world_size=2) as loader:
                batches = 0
                keys = []
                for b in loader:
                    batches += 1
                    keys += [(s, r) for s, r, pad in b.ids if not pad]
                per_rank.append(keys)
                counts.append(batches)
        self.assertEqual(counts[0], counts[1])
        a, b = set(per_rank[0]), set(per_rank[1])
        self.assertEqual(len(a), len(per_rank[0]))
        self.assertFalse(a & b)
        self.assertEqual(len(a | b), self.SAMPLES)

    def test_resume_mid_epoch_delivers_exactly_the_rest(self):
        kw = dict(seed=11, world_size=1, rank=0)
        with emlio.Loader(self.endpoint, 20, **kw) as loader:
            it = iter(loader)
            first = []
            for _ in range(6):
                b = next(it)
                first += [(s, r) for s, r, pad in b.ids]
            state = loader.state_dict()
            epoch = state["epoch"]
            it.close()
        self.assertEqual(epoch, 0)
        self.assertIsInstance(state["emlio_state"], bytes)
        with emlio.Loader(self.endpoint, 20, state=state, **kw) as loader:
            rest = []
            epochs = set()
            for b in loader:
                epochs.add(b.epoch)
                rest += [(s, r) for s, r, pad in b.ids]
            self.assertEqual(epochs, {0})
            self.assertEqual(len(first) + len(rest), self.SAMPLES)
            self.assertFalse(set(first) & set(rest))
            self.assertEqual(len(set(first) | set(rest)), self.SAMPLES)
            # The next iteration is the next epoch, complete.
            n = sum(len(b) for b in loader)
            self.assertEqual(n, self.SAMPLES)
            self.assertEqual(loader.epoch_stats()["epoch"], 1)
        # Raw bytes work too, and resuming a finished epoch moves on.
        with emlio.Loader(self.endpoint, 20, **kw) as loader:
            for _ in loader:
                pass
            done = loader.state_dict()["emlio_state"]
        with emlio.Loader(self.endpoint, 20, state=done, **kw) as loader:
            self.assertEqual(loader.next_epoch, 1)
            self.assertEqual({b.epoch for b in loader}, {1})

    def test_state_from_other_config_is_refused(self):
        with emlio.Loader(self.endpoint, 20, seed=1) as loader:
            next(iter(loader))
            state = loader.state_dict()
        with self.assertRaises(emlio.StateError) as cm:
            emlio.Loader(self.endpoint, 20, seed=2, state=state)
        self.assertIn("seed", str(cm.exception))
        with self.assertRaises(emlio.StateError):
            emlio.Loader(self.endpoint, 20, state=b"not a state")

    def test_unreachable_endpoint_fails_fast_and_names_it(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        ep = "tcp://127.0.0.1:%d" % port
        t0 = time.monotonic()
        with self.assertRaises(emlio.EmlioError) as cm:
            emlio.Loader(ep, 8, connect_timeout_ms=300)
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, 5.0)
        err = cm.exception
        # Nothing listens: refused at once (ECONNREFUSED), naming it.
        self.assertIsInstance(err, OSError)
        self.assertEqual(err.code, -111)
        self.assertIn("refused", str(err))
        self.assertIn(ep, str(err))
        self.assertIn(ep, err.errmsg)
        # Something listens but never answers: the connect timeout.
        quiet = socket.socket()
        quiet.bind(("127.0.0.1", 0))
        quiet.listen(4)
        ep = "tcp://127.0.0.1:%d" % quiet.getsockname()[1]
        try:
            with self.assertRaises(emlio.EmlioError) as cm:
                emlio.Loader(ep, 8, connect_timeout_ms=300)
        finally:
            quiet.close()
        err = cm.exception
        self.assertIsInstance(err, emlio.EmlioTimeoutError)
        self.assertIsInstance(err, TimeoutError)
        self.assertEqual(err.code, -1006)
        self.assertIn(ep, str(err))

    def test_bad_arguments(self):
        with self.assertRaises(emlio.InvalidArgumentError):
            emlio.Loader(self.endpoint, 8, rank=2, world_size=2)
        with self.assertRaises(emlio.EmlioError):
            emlio.Loader("not-an-endpoint", 8, connect_timeout_ms=300)
        with self.assertRaises(ValueError):
            emlio.Loader(self.endpoint, 8, shuffle="sideways")

    def test_rank_and_world_from_environment(self):
        saved = dict(os.environ)
        try:
            for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
                os.environ.pop(k, None)
            self.assertEqual(emlio.rank_and_world(), (0, 1))
            os.environ.update(SLURM_PROCID="2", SLURM_NTASKS="4")
            self.assertEqual(emlio.rank_and_world(), (2, 4))
            os.environ.update(RANK="1", WORLD_SIZE="3")
            self.assertEqual(emlio.rank_and_world(), (1, 3))
            self.assertEqual(emlio.rank_and_world(0, 2), (0, 2))
            with emlio.Loader(self.endpoint, 8) as loader:
                self.assertEqual((loader.rank, loader.world_size), (1, 3))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_epochs_argument_and_epoch_method(self):
        with emlio.Loader(self.endpoint, 64, epochs=2, seed=5) as loader:
            epochs = [b.epoch for b in loader]
            self.assertEqual(sorted(set(epochs)), [0, 1])
            self.assertEqual(len(epochs), 2 * ((self.SAMPLES + 63) // 64))
            self.assertEqual(list(loader), [])  # all epochs done
            n = sum(len(b) for b in loader.epoch(7))
            self.assertEqual(n, self.SAMPLES)
            self.assertEqual(loader.epoch_stats()["epoch"], 7)
        with emlio.Loader(self.endpoint, 64, seed=5) as loader:
            self.assertEqual({b.epoch for b in loader}, {0})
            self.assertEqual({b.epoch for b in loader}, {1})
            loader.set_epoch(4)
            self.assertEqual({b.epoch for b in loader}, {4})

    def test_path_stats_and_overlapping_epochs(self):
        # Three epochs in one pass: each epoch's batches are requested
        # while the last one's arrive, and still come exactly once each.
        with emlio.Loader(self.endpoint, 32, epochs=3, seed=9) as loader:
            seen = {}
            for b in loader:
                for shard, record, _pad in b.ids:
                    key = (b.epoch, shard, record)
                    seen[key] = seen.get(key, 0) + 1
            self.assertEqual(len(seen), 3 * self.SAMPLES)
            self.assertEqual(set(seen.values()), {1})
            st = loader.epoch_stats()
            self.assertEqual(st["streams"], 2)  # loopback: never more
            self.assertIn(st["limit"], ("consumer", "window", "network",
                                        "daemon", "cpu", "unknown"))
            # Served from the mappings: the daemon times no device reads
            # and sends no "disk" share.
            self.assertEqual(st["disk_pct"], 0)
            self.assertNotIn("reserved", st)
            self.assertNotIn("reserved32", st)
            # A daemon on this host: both I/O threads at once (iolanes.h).
            self.assertEqual(st["io_threads"], 2)
            streams = loader.path_stats()
            self.assertEqual(len(streams), 2)
            self.assertEqual(streams[0]["daemon"], self.endpoint)
            self.assertTrue(all(s["ready"] for s in streams))
            self.assertEqual([s["io_thread"] for s in streams], [0, 1])
            total = sum(len(_read(path)) for path, _ in self.files)
            self.assertEqual(sum(s["bytes"] for s in streams), 3 * total)
        with emlio.Loader(self.endpoint, 32, streams=3) as loader:
            list(loader)
            self.assertEqual(len(loader.path_stats()), 3)
            # Fixed streams spread over both I/O threads at once.
            self.assertEqual(loader.epoch_stats()["io_threads"], 2)
            self.assertEqual([s["io_thread"] for s in loader.path_stats()],
                             [0, 1, 0])
        with emlio.Loader(self.endpoint, 32, io_threads=1) as loader:
            list(loader)
            self.assertEqual(loader.epoch_stats()["io_threads"], 1)
            self.assertEqual({s["io_thread"] for s in loader.path_stats()},
                             {0})
        with self.assertRaises(ValueError):
            emlio.Loader(self.endpoint, 32, io_threads=3)

    def test_shuffle_differs_between_epochs_and_seeds(self):
        def order(seed, epoch):
            with emlio.Loader(self.endpoint, 300, seed=seed,
                              in_order=True) as loader:
                return [k for b in loader.epoch(epoch) for k in b.ids]
        a = order(1, 0)
        self.assertEqual(a, order(1, 0))
        self.assertNotEqual(a, order(1, 1))
        self.assertNotEqual(a, order(2, 0))

    def test_batch_lifetime(self):
        with emlio.Loader(self.endpoint, 16, seed=2) as loader:
            it = iter(loader)
            first = next(it)
            data0 = bytes(first[0])
            second = next(it)  # releases first
            self.assertTrue(first.released)
            with self.assertRaises(emlio.EmlioError):
                first.samples
            kept = second.keep()
            ids = kept.ids
            third = next(it)
            self.assertFalse(kept.released)
            self.assertEqual(kept.ids, ids)
            self.assertIn(bytes(kept[0]), self.by_bytes)
            self.assertIn(data0, self.by_bytes)
            with kept:
                self.assertEqual(kept.copy()[0], bytes(kept.samples[0]))
            self.assertTrue(kept.released)
            kept.release()  # idempotent
            held = next(it).keep()
            self.assertTrue(third.released)
            it.close()  # leaving the loop releases the current batch ...
        # ... and close() the kept ones.
        self.assertTrue(held.released)
        self.assertEqual(held.epoch, 0)  # plain attributes stay readable

    def test_concat_and_copy_match_views(self):
        with emlio.Loader(self.endpoint, 32, seed=4) as loader:
            for b in loader:
                data, offsets = b.concat()
                self.assertEqual(str(data.dtype), "uint8")
                self.assertEqual(str(offsets.dtype), "int64")
                self.assertEqual(len(offsets), len(b) + 1)
                copies = b.copy()
                for i, v in enumerate(b.samples):
                    self.assertEqual(bytes(data[offsets[i]:offsets[i + 1]]),
                                     bytes(v))
                    self.assertEqual(copies[i], bytes(v))
                    self.assertEqual(bytes(b[i]), bytes(v))
                    self.assertEqual(str(v.dtype), "uint8")
                    self.assertEqual(v.ndim, 1)
                self.assertEqual(b.labels.dtype.name, "int64")
                self.assertEqual(b.lengths.tolist(),
                                 [len(v) for v in b.samples])
                self.assertEqual(b.nbytes, int(offsets[-1]))

    def test_log_callback_routes_to_logging(self):
        # The client itself logs nothing today, so the installed sink is
        # called the way libemlio calls it.
        with emlio.Loader(self.endpoint, 64, log_level="debug") as loader:
            self.assertIsNotNone(loader._log_cb)
            with self.assertLogs("emlio.client", level="WARNING") as cm:
                loader._log_cb(None, 1, b"client", b"slow daemon 'x'")
            self.assertEqual(cm.records[0].getMessage(), "slow daemon 'x'")
            self.assertEqual(cm.records[0].levelname, "WARNING")
            self.assertEqual(sum(len(b) for b in loader), self.SAMPLES)
        with self.assertRaises(ValueError):
            emlio.Loader(self.endpoint, 8, log_level="loud")

    def test_without_numpy(self):
        # The core runs on the standard library alone: memoryview samples
        # that are revoked when the batch is released.
        code = r"""
import sys
sys.modules["numpy"] = None
sys.path.insert(0, sys.argv[2])
import emlio
with emlio.Loader(sys.argv[1], 32, seed=1) as loader:
    n = 0
    for b in loader:
        views = b.samples
        assert isinstance(views[0], memoryview), type(views[0])
        assert bytes(views[0][:2]) == b"\xff\xd8", bytes(views[0][:2])
        assert isinstance(b.labels, list)
        data, offsets = b.concat()
        assert bytes(data[offsets[0]:offsets[1]]) == bytes(views[0])
        n += len(b)
        kept = views[0]
    try:
        kept[0]
    except ValueError:
        print("revoked", n)
"""
        out = subprocess.run(
            [sys.executable, "-c", code, self.endpoint,
             os.path.join(_support.ROOT, "bindings", "python")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        self.assertEqual(out.stdout.decode().split(),
                         ["revoked", str(self.SAMPLES)])


class FaultTest(unittest.TestCase):
    """A daemon of its own per test, stopped or fed a damaged shard."""

    def setUp(self):
        import tempfile
        self.tmp = tempfile.mkdtemp(prefix="emlio-py-fault.")
        self.shards, self.files = _support.make_dataset(
            self.tmp, 120, 2, "8K", "256K")
        self.daemon = _support.Daemon(self.shards)
        self.stopped = False

    def tearDown(self):
        import shutil
        import signal
        if self.stopped:
            os.kill(self.daemon.proc.pid, signal.SIGCONT)
        self.daemon.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pause_daemon(self):
        import signal
        os.kill(self.daemon.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def test_silent_daemon_times_out_naming_it(self):
        with emlio.Loader(self.daemon.endpoint, 8, timeout_ms=400) as loader:
            self.pause_daemon()
            t0 = time.monotonic()
            with self.assertRaises(emlio.EmlioTimeoutError) as cm:
                for _ in loader:
                    pass
            self.assertLess(time.monotonic() - t0, 10)
        self.assertIn(self.daemon.endpoint, str(cm.exception))

    def test_ctrl_c_interrupts_a_blocked_wait(self):
        import signal
        import threading
        main = threading.get_ident()
        with emlio.Loader(self.daemon.endpoint, 8,
                          timeout_ms=30000) as loader:
            self.pause_daemon()
            timer = threading.Timer(
                0.3, lambda: signal.pthread_kill(main, signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            try:
                with self.assertRaises(KeyboardInterrupt):
                    for _ in loader:
                        pass
            finally:
                timer.cancel()
            self.assertLess(time.monotonic() - t0, 10)

    def test_corrupt_record_raises_corrupt_error(self):
        # Damage a byte in the middle of the first shard, which the daemon
        # has mapped: its CRC check fails when it reads the record.
        shard = sorted(f for f in os.listdir(self.shards)
                       if f.endswith(".tfrecord"))[0]
        path = os.path.join(self.shards, shard)
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
        with emlio.Loader(self.daemon.endpoint, 8) as loader:
            with self.assertRaises(emlio.CorruptError) as cm:
                for _ in loader:
                    pass
        self.assertEqual(cm.exception.code, -1003)
        self.assertTrue(cm.exception.errmsg)


if __name__ == "__main__":
    _support.main()
