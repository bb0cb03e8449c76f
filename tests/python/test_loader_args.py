# tests/python/test_loader_args.py - the Loader's arguments are checked with
# the C client's ranges (TypeError/ValueError naming the argument), CURVE
# keys from Python against a real CURVE daemon, one live iterator per
# Loader, and the warning after a silent wait that names the daemon.
# SPDX-License-Identifier: MIT
import logging
import os
import shutil
import signal
import tempfile
import threading
import unittest

import _support
from _support import EMLIO, DatasetCase, Daemon, run

import emlio

# Nothing listens there; argument errors must come before any connect.
NOWHERE = "tcp://127.0.0.1:9"


class ArgumentTest(unittest.TestCase):
    def value_error(self, arg, **kw):
        kw.setdefault("batch_size", 8)
        kw.setdefault("connect_timeout_ms", 200)
        kw.setdefault("endpoints", NOWHERE)
        with self.assertRaises(ValueError) as cm:
            emlio.Loader(**kw)
        self.assertIn(arg, str(cm.exception))
        return cm.exception

    def type_error(self, arg, **kw):
        kw.setdefault("batch_size", 8)
        kw.setdefault("connect_timeout_ms", 200)
        with self.assertRaises(TypeError) as cm:
            emlio.Loader(NOWHERE, **kw)
        self.assertIn(arg, str(cm.exception))

    def test_values_past_the_c_ranges_raise(self):
        # issue 19: these used to wrap around silently.
        e = self.value_error("batch_size", batch_size=2 ** 32 + 8)
        self.assertIsInstance(e, emlio.InvalidArgumentError)
        self.value_error("rank", rank=2 ** 32, world_size=2 ** 32)
        self.value_error("world_size", rank=0, world_size=2 ** 32)
        self.value_error("seed", seed=2 ** 70)
        self.value_error("window_shards", window_shards=2 ** 32)
        self.value_error("inflight", inflight=2 ** 32)
        self.value_error("request_bytes", request_bytes=2 ** 64)
        self.value_error("streams", streams=65)
        self.value_error("timeout_ms", timeout_ms=2 ** 31)
        self.value_error("epochs", epochs=2 ** 64)
        self.value_error("request_bytes", request_bytes=2 ** 64)

    def test_negatives_raise(self):
        for name in ("batch_size", "seed", "streams", "inflight",
                     "request_bytes", "window_shards", "timeout_ms", "connect_timeout_ms",
                     "epochs"):
            with self.subTest(name=name):
                kw = {name: -1}
                self.value_error(name, **kw)
        self.value_error("rank", rank=-1, world_size=2)
        self.value_error("world_size", rank=0, world_size=0)
        self.value_error("rank", rank=2, world_size=2)
        self.value_error("batch_size", batch_size=0)
        self.value_error("wait_warning_s", wait_warning_s=-1)

    def test_keyword_only_after_the_first_two(self):
        # 28 positional parameters made a call's meaning depend on their
        # order (issue 31): everything after endpoints and batch_size is
        # named, so adding an option can never shift another.
        with self.assertRaises(TypeError) as cm:
            emlio.Loader(NOWHERE, 8, None, connect_timeout_ms=200)
        self.assertIn("positional", str(cm.exception))

    def test_batch_size_and_a_daemon_are_required(self):
        # Both first parameters have defaults so that sources= can stand
        # in for endpoints (issue 33): leaving either out is still named.
        with self.assertRaises(TypeError) as cm:
            emlio.Loader(NOWHERE, connect_timeout_ms=200)
        self.assertIn("needs batch_size", str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            emlio.Loader(batch_size=8, connect_timeout_ms=200)
        self.assertIn("needs endpoints (or sources=)", str(cm.exception))

    def test_wrong_types_raise_type_error(self):
        self.type_error("batch_size", batch_size="32")
        self.type_error("batch_size", batch_size=32.0)
        self.type_error("batch_size", batch_size=True)
        self.type_error("seed", seed=1.5)
        self.type_error("verify", verify="yes")
        self.type_error("drop_last", drop_last=None)
        self.type_error("shuffle", shuffle=3)
        self.type_error("name", name=7)
        self.value_error("shuffle", shuffle="random")
        with self.assertRaises(TypeError):
            emlio.Loader(5555, 8)

    def test_endpoint_syntax_says_the_expected_form(self):
        for bad in ("node1:5555", "tcp://node1", "tcp://:5555", ""):
            with self.subTest(endpoints=bad):
                e = self.value_error("endpoint", endpoints=bad)
                self.assertIn("tcp://HOST:PORT", str(e))
        e = self.value_error("port", endpoints="tcp://a:1,tcp://b:99999")
        self.assertIn("99999", str(e))

    def test_environment_rank_is_checked(self):
        old = dict(os.environ)
        try:
            os.environ.update(RANK=str(2 ** 32), WORLD_SIZE=str(2 ** 32 + 1))
            self.value_error("rank")
        finally:
            os.environ.clear()
            os.environ.update(old)

    def test_curve_keys_go_together(self):
        e = self.value_error("client_key", server_key="x" * 40)
        self.assertIn("together", str(e))
        self.value_error("server_key", client_key="/nonexistent/a.key")
        e = self.value_error("server_key", server_key="~" * 40,
                             client_key="x" * 40)
        self.assertIn("Z85", str(e))


class CurveTest(unittest.TestCase):
    """A CURVE daemon: keys as files or as Z85 text; a plaintext Loader and
    an unauthorized key are refused."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-curve.")
        cls.shards, cls.files = _support.make_dataset(cls.tmp, samples=40)
        keys = os.path.join(cls.tmp, "keys")
        os.makedirs(os.path.join(keys, "auth"))
        for who in ("server", "client", "intruder"):
            run(EMLIO, "keygen", os.path.join(keys, who))
        shutil.copy(os.path.join(keys, "client.key"),
                    os.path.join(keys, "auth"))
        cls.keys = keys
        cls.daemon = Daemon(cls.shards, "--curve-secret",
                            os.path.join(keys, "server.key_secret"),
                            "--authorized-keys", os.path.join(keys, "auth"))

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def key(self, name):
        return os.path.join(self.keys, name)

    def count(self, **kw):
        with emlio.Loader(self.daemon.endpoint, 8, seed=1,
                          connect_timeout_ms=3000, **kw) as ld:
            self.assertTrue(ld.config["curve"])
            return sum(len(b) for b in ld)

    def test_key_files(self):
        self.assertEqual(self.count(server_key=self.key("server.key"),
                                    client_key=self.key("client.key_secret")),
                         40)

    def test_key_text(self):
        def text(name):
            with open(self.key(name)) as f:
                return f.readline().strip()
        self.assertEqual(self.count(server_key=text("server.key"),
                                    client_key=text("client.key_secret")),
                         40)

    def test_unauthorized_and_plaintext_are_refused(self):
        with self.assertRaises(emlio.EmlioError) as cm:
            self.count(server_key=self.key("server.key"),
                       client_key=self.key("intruder.key_secret"))
        self.assertIn("refused", str(cm.exception))
        with self.assertRaises(emlio.EmlioError):
            emlio.Loader(self.daemon.endpoint, 8, connect_timeout_ms=1500)

    def test_unreadable_key_file_names_it(self):
        with self.assertRaises(ValueError) as cm:
            self.count(server_key=self.key("nope.key"),
                       client_key=self.key("client.key_secret"))
        self.assertIn("server_key", str(cm.exception))
        self.assertIn("nope.key", str(cm.exception))


class IteratorTest(DatasetCase):
    SAMPLES = 64

    def test_second_live_iterator_raises(self):
        with emlio.Loader(self.endpoint, 8, seed=2) as ld:
            first = iter(ld)
            b = next(first)
            self.assertEqual(b.epoch, 0)
            with self.assertRaises(RuntimeError) as cm:
                next(iter(ld))
            self.assertIn("epoch 0", str(cm.exception))
            with self.assertRaises(RuntimeError):
                ld.begin_epoch(5)
            with self.assertRaises(RuntimeError):
                ld.epoch(3)
            # The first iterator is unharmed and finishes its own epoch.
            rest = [x.epoch for x in first]
            self.assertEqual(set(rest), {0})
            self.assertEqual(len(rest) + 1, 8)
            # Once it is done, the next iterator runs the next epoch.
            self.assertEqual({x.epoch for x in ld}, {1})

    def test_a_batch_from_a_temporary_iterator_stays_valid(self):
        # issue 34: b = next(iter(loader)) returned a batch whose every
        # attribute raised "was released" (the iterator, collected at
        # once, released it).
        import gc
        with emlio.Loader(self.endpoint, 8, seed=2) as ld:
            b = next(iter(ld))
            self.assertFalse(b.released)
            self.assertEqual(len(b.labels), 8)
            self.assertEqual(len(b), 8)
            first = bytes(b[0])
            self.assertTrue(first)
            # Dropped, its memory goes back at the loader's next step.
            del b
            gc.collect()
            self.assertEqual(len(ld._orphans), 1)
            c = next(iter(ld))
            self.assertEqual(len(ld._orphans), 0)
            self.assertFalse(c.released)
            c.release()  # explicit release still works, once
            self.assertTrue(c.released)
        # One still held at close() is released by it.
        ld2 = emlio.Loader(self.endpoint, 8, seed=2)
        d = next(iter(ld2))
        ld2.close()
        self.assertTrue(d.released)

    def test_a_foreign_state_dict_is_a_state_error(self):
        # A dict that is not state_dict()'s output names what it lacks and
        # what it has (issue 34: it was a bare KeyError 'emlio_state').
        with emlio.Loader(self.endpoint, 8, seed=2) as ld:
            with self.assertRaises(emlio.StateError) as cm:
                ld.load_state_dict({"foo": 1})
            self.assertIn("emlio_state", str(cm.exception))
            self.assertIn("foo", str(cm.exception))
        with self.assertRaises(emlio.StateError):
            emlio.Loader(self.endpoint, 8, seed=2, state={"foo": 1})

    def test_leaving_a_loop_frees_the_loader(self):
        with emlio.Loader(self.endpoint, 8, seed=2) as ld:
            for b in ld:
                break
            it = iter(ld)
            next(it)
            it.close()
            self.assertEqual(sum(len(b) for b in ld), self.SAMPLES)


class JobTest(unittest.TestCase):
    """Loader(job=, job_weight=) reach the daemon's HELLO (issue 32)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-py.")
        cls.shards, _ = _support.make_dataset(cls.tmp, 64, 2, "4K", "64K")
        cls.daemon = Daemon(cls.shards, "--log-level", "info",
                            "--job-weight", "py=4,*=2")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_named_job_with_capped_weight(self):
        with emlio.Loader(self.daemon.endpoint, 8, job="py",
                          job_weight=9) as ld:
            n = sum(len(b) for b in ld)
        self.assertEqual(n, 64)
        self.assertIn("job py arrived (weight 4)", self.daemon.stderr())

    def test_bad_job_name_is_refused_with_the_reason(self):
        with self.assertRaises(emlio.EmlioError) as cm:
            with emlio.Loader(self.daemon.endpoint, 8, job="x" * 65,
                              connect_timeout_ms=3000) as ld:
                next(iter(ld))
        self.assertIn("bad job name", str(cm.exception))

    def test_job_weight_range_is_checked(self):
        with self.assertRaises(ValueError) as cm:
            emlio.Loader(NOWHERE, 8, job="py", job_weight=1001)
        self.assertIn("job_weight", str(cm.exception))


class ShareTest(unittest.TestCase):
    """Loader(share=True): two jobs of different seeds read the dataset
    about once between them, each every sample once (issue 32)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-py.")
        cls.shards, _ = _support.make_dataset(cls.tmp, 400, 2, "20K", "1M")
        cls.daemon = Daemon(cls.shards, "--io", "read", "--share-bytes", "32M")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def _epoch(self, seed, share, out):
        with emlio.Loader(self.daemon.endpoint, 16, seed=seed, share=share,
                          job="py-%d" % seed) as ld:
            keys = sorted((name, rec) for b in ld
                          for name, rec, pad in b.ids if not pad)
            out[seed] = (keys, ld.epoch_stats())

    def _pair(self, share):
        out = {}
        t = threading.Thread(target=self._epoch, args=(1, share, out))
        t.start()
        self._epoch(2, share, out)
        t.join()
        return out

    def test_two_sharing_jobs_read_once(self):
        shared = self._pair(True)
        alone = self._pair(False)
        self.assertEqual(len(shared[1][0]), 400)
        self.assertEqual(shared[1][0], shared[2][0])  # every sample, once
        self.assertEqual(len(set(shared[1][0])), 400)
        read = sum(shared[s][1]["disk_read_bytes"] for s in (1, 2))
        read_alone = sum(alone[s][1]["disk_read_bytes"] for s in (1, 2))
        got = sum(shared[s][1]["shared_bytes"] for s in (1, 2))
        self.assertGreater(got, 0)
        self.assertEqual(alone[1][1]["shared_bytes"], 0)
        # Sharing reads about half of what two lone jobs read.
        self.assertLess(read, 0.65 * read_alone)

    def test_share_join_is_the_cursor_asked_and_reported(self):
        with emlio.Loader(self.daemon.endpoint, 16, seed=3, share=True,
                          share_join=5, job="py-join") as ld:
            keys = sorted((name, rec) for b in ld
                          for name, rec, pad in b.ids if not pad)
            st = ld.epoch_stats()
        self.assertEqual(st["share_join"], 5)
        self.assertEqual(len(set(keys)), 400)  # still every sample once
        with self.assertRaises(ValueError) as cm:
            emlio.Loader(NOWHERE, 8, share=True, share_join=-1)
        self.assertIn("share_join", str(cm.exception))

    def test_share_must_be_a_bool(self):
        with self.assertRaises(TypeError) as cm:
            emlio.Loader(NOWHERE, 8, share="yes")
        self.assertIn("share", str(cm.exception))


class WaitWarningTest(DatasetCase):
    SAMPLES = 64

    def test_silent_wait_is_logged_with_the_daemon(self):
        with emlio.Loader(self.endpoint, 8, seed=1, inflight=1,
                          wait_warning_s=0.5, timeout_ms=3000) as ld:
            it = iter(ld)
            next(it)
            os.kill(self.daemon.proc.pid, signal.SIGSTOP)
            try:
                with self.assertLogs("emlio.loader", logging.WARNING) as cm:
                    try:
                        for _ in it:
                            pass
                    except emlio.EmlioError:
                        pass  # the timeout after the warning
            finally:
                os.kill(self.daemon.proc.pid, signal.SIGCONT)
            text = "\n".join(cm.output)
            self.assertIn(self.endpoint, text)
            self.assertIn("is emliod running", text)


if __name__ == "__main__":
    _support.main()
