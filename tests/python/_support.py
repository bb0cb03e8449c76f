# tests/python/_support.py - shared helpers of the Python tests: paths, a
# synthetic dataset, an emliod child on a run-time port, and a unittest main
# that ends with the "N passed, N failed, N skipped" line tests/run.sh counts.
# SPDX-License-Identifier: MIT
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("B", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
EMLIO = os.path.join(BUILD, "bin", "emlio")
EMLIOD = os.path.join(BUILD, "bin", "emliod")

# The bindings are imported from the tree, not from an installed copy.
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
os.environ.setdefault("EMLIO_LIBRARY", os.path.join(BUILD, "libemlio.so"))


def import_torch():
    """(torch, "") where torch imports, else (None, why): the torch tests
    skip, saying why and which Debian package brings it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the machine
        return None, ("torch is not importable (%s): apt-get install "
                      "python3-torch" % exc)
    return torch, ""


def run(*argv, timeout=120):
    """Runs a command; returns its stdout, raising with stderr on failure."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (
            " ".join(argv), p.returncode, p.stderr.decode(errors="replace")))
    return p.stdout.decode()


def make_dataset(root, samples=300, classes=3, nbytes="8K",
                 shard_bytes="256K", seed=0, pack_seed=None):
    """emlio synth + emlio pack into root/img and root/shards. Returns the
    list of (source JPEG path, label) in pack order (classes sorted, then
    paths sorted; label = class index). pack_seed shuffles the records in
    the shards (the list keeps the sorted order then)."""
    img = os.path.join(root, "img")
    shards = os.path.join(root, "shards")
    run(EMLIO, "synth", img, "--samples", str(samples), "--classes",
        str(classes), "--bytes", str(nbytes), "--seed", str(seed), "--quiet")
    # pack shuffles by default; without pack_seed keep the class order the
    # returned list describes.
    extra = (["--no-shuffle"] if pack_seed is None
             else ["--seed", str(pack_seed)])
    run(EMLIO, "pack", img, shards, "--shard-bytes", str(shard_bytes),
        "--quiet", *extra)
    files = []
    for label, cls in enumerate(sorted(os.listdir(img))):
        d = os.path.join(img, cls)
        for name in sorted(os.listdir(d)):
            files.append((os.path.join(d, name), label))
    return shards, files


class Daemon:
    """emliod serving data_dir on tcp://127.0.0.1:<free port>."""

    def __init__(self, data_dir, *extra, timeout=30.0):
        # stderr goes to a file: a pipe nobody reads could fill and stall
        # the daemon.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [EMLIOD, "--data", data_dir, "--bind", "tcp://127.0.0.1:*",
             "--log-level", "warn"] + list(extra),
            stdout=subprocess.PIPE, stderr=self.log)
        self.endpoint = None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    break
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    buf += chunk
        finally:
            sel.close()
        line = buf.decode(errors="replace").strip()
        prefix = "emliod: listening on "
        if not line.startswith(prefix):
            self.stop()
            raise RuntimeError("emliod did not start: %r %s" % (
                line, self.stderr()))
        self.endpoint = line[len(prefix):].split()[0]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class DatasetCase(unittest.TestCase):
    """A TestCase class with one dataset and one daemon for all its tests.
    Subclasses set SAMPLES, CLASSES, NBYTES, SHARD_BYTES."""

    SAMPLES = 300
    CLASSES = 3
    NBYTES = "8K"
    SHARD_BYTES = "256K"
    PACK_SEED = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-py.")
        try:
            cls.shards, cls.files = make_dataset(
                cls.tmp, cls.SAMPLES, cls.CLASSES, cls.NBYTES,
                cls.SHARD_BYTES, pack_seed=cls.PACK_SEED)
            cls.daemon = Daemon(cls.shards)
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        cls.endpoint = cls.daemon.endpoint

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)


def main():
    """unittest main that prints 'N passed, N failed, N skipped' last and
    exits non-zero on failure. Skipped tests are counted apart (their reason
    is printed); a run that only skipped exits 77."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(
        sys.modules["__main__"])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(
        suite)
    bad = len(result.failures) + len(result.errors) + len(
        result.unexpectedSuccesses)
    skipped = len(result.skipped)
    good = result.testsRun - bad - skipped
    for test, reason in result.skipped:
        print("skipped %s: %s" % (test.id(), reason))
    sys.stdout.flush()
    print("%d passed, %d failed, %d skipped" % (good, bad, skipped))
    if bad or result.testsRun == 0:
        sys.exit(1)
    sys.exit(77 if good == 0 else 0)
