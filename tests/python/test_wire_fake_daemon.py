#!/usr/bin/python3
"""libemlio (`emlio fetch`) against fake daemons written from docs/protocol.md:

- a daemon that speaks versions 1 to 3 only refuses libemlio's HELLO (4)
  with EMLIO_EVERSION: the fetch fails saying so, naming the daemon, and
  never says another version (section 15: there is one);
- a daemon that answers HELLO with the WELCOME of another version is
  refused, the message naming the version it said;
- a daemon whose BATCH of raw samples has no offset table, or a bad one
  (overlapping spans, a span past the packed frame, too few pairs):
  libemlio refuses it with a message naming the table (section 5.4.1).

Needs python3-zmq and python3-msgpack. Run from the repository root:
    B=build /usr/bin/python3 tests/python/test_wire_fake_daemon.py
The last line is "N passed, N failed"; the exit status is non-zero on any
failure.
"""
import os
import subprocess
import sys
import threading
import unittest

import msgpack
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T_HELLO, T_WELCOME, T_GET, T_BATCH, T_ERROR = 1, 2, 3, 4, 5
EVERSION = -1007
RECORDS = 300

# CRC-32C: the binding's pure-Python one, which scripts/tfrecord_raw.py loads
# by path, so that libemlio is only what the test runs.
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from tfrecord_raw import crc32c  # noqa: E402


def sample(record):
    """The bytes of record `record`: small and distinct (60-120 B)."""
    return bytes((record * 7 + i) & 0xFF for i in range(60 + record % 61))


class FakeDaemon(threading.Thread):
    """A ROUTER that speaks versions 1 to `top`; `bad` names the offset table
    fault of its packed batches (v4 only); `welcome_v`, the version its
    WELCOME says (None: the HELLO's)."""

    def __init__(self, top, bad=None, welcome_v=None):
        super().__init__(daemon=True)
        self.top, self.bad, self.welcome_v = top, bad, welcome_v
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.hellos = []
        self.stop = False

    def send(self, ident, header, frames=()):
        self.sock.send_multipart([ident, msgpack.packb(header)] + list(frames))

    def hello(self, ident, h):
        v = h.get("v")
        self.hellos.append(v)
        if not 1 <= v <= self.top:
            self.send(ident, {"t": T_ERROR, "id": 0, "code": EVERSION,
                              "msg": "protocol version %d not supported (server "
                                     "speaks 1 to %d)" % (v, self.top)})
            return
        w = {"t": T_WELCOME, "v": self.welcome_v or v, "name": "fake", "dataset": "00000000deadbeef",
             "max_batch": 64, "max_credit": 16, "max_streams": 64,
             "id": h.get("id", 0)}
        if h.get("session") and h.get("stream", 0) > 0:
            w.update(joined=True, shards=[])
        else:
            w["shards"] = [["a.tfrecord", RECORDS, 100000]]
        self.send(ident, w)

    def get(self, ident, h, packed):
        items = h["items"]
        recs = [items[i + 1] for i in range(0, len(items), 2)]
        quads, data = [], [sample(r) for r in recs]
        for r, d in zip(recs, data):
            quads += [0, r, r % 3, crc32c(d)]
        header = {"t": T_BATCH, "id": h["id"], "samples": quads}
        if not packed or self.bad == "unpacked":
            self.send(ident, header, data)
            return
        table, off = [], 0
        for d in data:
            table += [off, len(d)]
            off += len(d)
        if self.bad == "overlap" and len(table) >= 4:
            table[2] -= 1
        elif self.bad == "range":
            table[-1] += 1
        elif self.bad == "count":
            table = table[:-2]
        header["pack"] = table
        self.send(ident, header, [b"".join(data)])

    def run(self):
        versions = {}
        while not self.stop:
            if not self.sock.poll(50):
                continue
            ident, raw = self.sock.recv_multipart()[:2]
            h = msgpack.unpackb(raw, raw=False)
            if h["t"] == T_HELLO:
                self.hello(ident, h)
                if 1 <= h["v"] <= self.top:
                    versions[ident] = h["v"]
            elif h["t"] == T_GET:
                self.get(ident, h, versions.get(ident, 1) >= 4)
        self.sock.close()


def fetch(port, *extra):
    b = os.environ.get("B", "build")
    exe = os.path.join(b if os.path.isabs(b) else os.path.join(ROOT, b), "bin", "emlio")
    return subprocess.run([exe, "fetch", "--connect", "tcp://127.0.0.1:%d" % port,
                           "--batch", "8", "--quiet", "--timeout-ms", "10000"] + list(extra),
                          capture_output=True, text=True, timeout=60)


class FakeDaemonTest(unittest.TestCase):
    def serve(self, top, bad=None, welcome_v=None):
        d = FakeDaemon(top, bad, welcome_v)
        d.start()
        self.addCleanup(d.join)
        self.addCleanup(setattr, d, "stop", True)
        return d

    def test_old_daemon_is_refused_without_fallback(self):
        d = self.serve(3)
        r = fetch(d.port, "--verify", "--epochs", "2")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("tcp://127.0.0.1:%d" % d.port, r.stderr)
        self.assertIn("protocol version 4 not supported", r.stderr)
        self.assertTrue(d.hellos and all(v == 4 for v in d.hellos), d.hellos)

    def test_welcome_of_another_version_is_refused(self):
        d = self.serve(4, welcome_v=7)
        r = fetch(d.port)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("daemon 'tcp://127.0.0.1:%d' speaks protocol 7, we speak 4"
                      % d.port, r.stderr)

    def test_v4_daemon_packed_batches_verified(self):
        d = self.serve(4)
        r = fetch(d.port, "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(d.hellos[0], 4)
        self.assertNotIn(2, d.hellos)

    def test_bad_pack_tables_refused(self):
        for bad, words in (("overlap", "overlaps"), ("range", "outside the packed frame"),
                           ("count", "pack table lists"),
                           ("unpacked", "without its offset table")):
            with self.subTest(bad=bad):
                d = self.serve(4, bad)
                r = fetch(d.port)
                self.assertNotEqual(r.returncode, 0, r.stdout)
                self.assertIn("daemon 'tcp://127.0.0.1:%d' sent a" % d.port,
                              r.stderr)
                self.assertIn(words, r.stderr)


def main():
    res = unittest.main(exit=False, verbosity=2).result
    bad = len(res.failures) + len(res.errors)
    print("%d passed, %d failed" % (res.testsRun - bad, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
