# tests/python/test_formats.py - WebDataset tar shards written by GNU tar and
# by Python's tarfile (ustar, GNU and pax long names, directories, members
# that are no sample) and ImageFolder trees (nested, hidden, non-image
# files) served by emliod: every sample exactly once per epoch, with the
# bytes and label the reference readers (tarfile; torchvision's ImageFolder)
# give, and clear errors for corrupt, truncated and incomplete data.
# Run from the repository root: B=<build dir> /usr/bin/python3 <this file>.
# SPDX-License-Identifier: MIT
import io
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import time
import unittest

import _support
from _support import Daemon

import emlio

LONG_DIR = "deep/" + "d" * 120 + "/"  # > 100 characters: needs a long name


def wds_samples(path):
    """The samples of a tar as webdataset groups them, read with tarfile:
    [(key, {field: bytes})]; members without a key are skipped."""
    out = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isreg():
                continue
            name = m.name[2:] if m.name.startswith("./") else m.name
            base = name.rsplit("/", 1)[-1]
            dot = base.find(".")
            if dot <= 0:
                continue
            key = name[:len(name) - len(base) + dot]
            field = base[dot + 1:].lower()
            data = tf.extractfile(m).read()
            if out and out[-1][0] == key:
                out[-1][1][field] = data
            else:
                out.append((key, {field: data}))
    return out


def write_tree(root, n, rng, prefix=""):
    """n samples as files: key.jpg, key.cls, key.json (some keys under a
    long directory name), plus a README and a hidden file (no samples).
    Returns the member names in the order to archive them."""
    names = []
    for i in range(n):
        d = LONG_DIR if i % 3 == 0 else ("sub/" if i % 3 == 1 else "")
        key = "%s%s%04d" % (d, prefix, i)
        os.makedirs(os.path.join(root, os.path.dirname(key) or "."),
                    exist_ok=True)
        for field, data in (
                ("cls", str(i % 5).encode()),
                ("jpg", rng.randbytes(200 + rng.randrange(3000))),
                ("json", b'{"i": %d}' % i)):
            with open(os.path.join(root, key + "." + field), "wb") as f:
                f.write(data)
            names.append(key + "." + field)
    with open(os.path.join(root, "README"), "w") as f:
        f.write("not a sample\n")
    with open(os.path.join(root, ".hidden.txt"), "w") as f:
        f.write("not a sample either\n")
    return ["README", ".hidden.txt", "sub", LONG_DIR.rstrip("/")] + names


class TarTest(unittest.TestCase):
    N = 40

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-fmt.")
        rng = random.Random(5)
        src = os.path.join(cls.tmp, "src")
        os.makedirs(src)
        names = write_tree(src, cls.N, rng)
        cls.kinds = {}
        for fmt in ("gnu", "pax", "ustar-short"):
            d = os.path.join(cls.tmp, "gnutar-" + fmt)
            os.makedirs(d)
            members = names if fmt != "ustar-short" else [
                n for n in names if not n.startswith("deep")]
            args = ["--format=" + ("ustar" if fmt.startswith("ustar")
                                   else fmt), "--no-recursion"]
            subprocess.run(["tar", "-C", src, "-cf",
                            os.path.join(d, "a.tar")] + args + members,
                           check=True)
            cls.kinds["gnutar-" + fmt] = d
        for fmt, const in (("pax", tarfile.PAX_FORMAT),
                           ("gnu", tarfile.GNU_FORMAT)):
            d = os.path.join(cls.tmp, "tarfile-" + fmt)
            os.makedirs(d)
            # Two shards, members under "./", one directory member.
            half = 4 + 3 * (cls.N // 2)  # at a sample boundary
            for i, part in enumerate((names[:half], names[half:])):
                with tarfile.open(os.path.join(d, "s%d.tar" % i), "w",
                                  format=const) as tf:
                    for n in part:
                        tf.add(os.path.join(src, n), arcname="./" + n,
                               recursive=False)
            cls.kinds["tarfile-" + fmt] = d

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def reference(self, d):
        """{jpg bytes: label} over every shard of d, and the sample count."""
        want = {}
        n = 0
        for name in sorted(os.listdir(d)):
            if not name.endswith(".tar"):
                continue
            for key, fields in wds_samples(os.path.join(d, name)):
                n += 1
                want[fields["jpg"]] = int(fields["cls"])
        return want, n

    def check_epochs(self, d, *extra):
        want, n = self.reference(d)
        self.assertGreater(n, 0)
        with Daemon(d, *extra) as daemon:
            with emlio.Loader(daemon.endpoint, 7, seed=3, epochs=2) as ld:
                per_epoch = {}
                for b in ld:
                    ids = b.ids
                    labels = b.labels.tolist()
                    for i, view in enumerate(b.samples):
                        shard, record, pad = ids[i][:3]
                        if pad:
                            continue
                        data = bytes(view)
                        self.assertIn(data, want, "not a jpg member")
                        self.assertEqual(labels[i], want[data])
                        per_epoch.setdefault(b.epoch, []).append(
                            (shard, record))
        self.assertEqual(sorted(per_epoch), [0, 1])
        for e, keys in per_epoch.items():
            self.assertEqual(len(keys), n, "epoch %d" % e)
            self.assertEqual(len(set(keys)), n, "epoch %d twice" % e)
        return n

    def test_gnu_tar_gnu_format(self):
        self.assertEqual(self.check_epochs(self.kinds["gnutar-gnu"]), self.N)

    def test_gnu_tar_pax_format(self):
        self.assertEqual(self.check_epochs(self.kinds["gnutar-pax"]), self.N)

    def test_gnu_tar_ustar(self):
        n = self.check_epochs(self.kinds["gnutar-ustar-short"])
        self.assertEqual(n, self.N - (self.N + 2) // 3)

    def test_tarfile_pax_two_shards(self):
        self.assertEqual(self.check_epochs(self.kinds["tarfile-pax"]), self.N)

    def test_tarfile_gnu_two_shards(self):
        self.assertEqual(self.check_epochs(self.kinds["tarfile-gnu"]), self.N)

    def test_index_is_dali_v1_2_and_reused(self):
        d = self.kinds["gnutar-gnu"]
        with Daemon(d):
            pass
        idx = os.path.join(d, "a.tar.idx")
        with open(idx) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "v1.2 %d" % self.N)
        self.assertEqual(len(lines), self.N + 1)
        # ext offset size name per member; offset is the data offset.
        with tarfile.open(os.path.join(d, "a.tar")) as tf:
            byname = {m.name: m for m in tf.getmembers()}
        parts = lines[1].split()
        self.assertEqual(len(parts) % 4, 0)
        for k in range(0, len(parts), 4):
            ext, off, size, name = parts[k:k + 4]
            self.assertEqual(int(off), byname[name].offset_data)
            self.assertEqual(int(size), byname[name].size)
            self.assertTrue(name.endswith("." + ext))
        mtime = os.stat(idx).st_mtime_ns
        with Daemon(d):
            pass
        self.assertEqual(os.stat(idx).st_mtime_ns, mtime, "index rewritten")

    def test_stale_index_is_rebuilt(self):
        d = os.path.join(self.tmp, "stale")
        shutil.copytree(self.kinds["tarfile-pax"], d)
        with Daemon(d):
            pass
        # Shard 0 replaced by one with fewer samples, newer than its index.
        src = os.path.join(d, "s0.tar")
        samples = wds_samples(src)[:5]
        with tarfile.open(src, "w") as tf:
            for key, fields in samples:
                for field, data in fields.items():
                    info = tarfile.TarInfo(key + "." + field)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        future = time.time() + 5
        os.utime(src, (future, future))
        want, n = self.reference(d)
        self.assertEqual(self.check_epochs(d), n)
        with open(src + ".idx") as f:
            self.assertEqual(f.readline().strip(), "v1.2 5")

    def test_field_and_label_options(self):
        d = self.kinds["tarfile-gnu"]
        with Daemon(d, "--field", "json", "--label-field", "cls") as daemon:
            with emlio.Loader(daemon.endpoint, 8, shuffle=False,
                              in_order=True, epochs=1) as ld:
                got = [bytes(v) for b in ld for v in b.samples]
        self.assertEqual(len(got), self.N)
        self.assertTrue(all(g.startswith(b'{"i": ') for g in got))

    def test_missing_field_is_left_out_at_start(self):
        # A sample without the served member is left out when the daemon
        # starts (one log line, a count and an example), not served as
        # another member nor failed every epoch (docs/formats.md).
        d = os.path.join(self.tmp, "missing")
        os.makedirs(d)
        with tarfile.open(os.path.join(d, "m.tar"), "w") as tf:
            for i in range(6):
                fields = {"cls": b"1", "jpg": b"x" * (10 + i)}
                if i == 3:
                    del fields["jpg"]
                for field, data in fields.items():
                    info = tarfile.TarInfo("k%d.%s" % (i, field))
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        for extra in ([], ["--on-corrupt", "skip"]):
            with Daemon(d, "--field", "jpg", *extra) as daemon:
                with emlio.Loader(daemon.endpoint, 6, epochs=1) as ld:
                    n = sum(len(b.samples) for b in ld)
                log = daemon.stderr()
            self.assertEqual(n, 5)
            self.assertIn("left out 1 of 6 samples without a 'jpg' member",
                          log)
            self.assertIn("'k3.cls' in", log)

    def daemon_fails(self, d, *extra):
        p = subprocess.run([_support.EMLIOD, "--data", d, "--bind",
                            "tcp://127.0.0.1:*"] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=20)
        self.assertNotEqual(p.returncode, 0)
        return p.stderr.decode(errors="replace")

    def test_truncated_and_corrupt_tars_name_file_and_offset(self):
        good = os.path.join(self.kinds["gnutar-gnu"], "a.tar")
        with open(good, "rb") as f:
            data = f.read()
        d = os.path.join(self.tmp, "bad")
        os.makedirs(d)
        bad = os.path.join(d, "b.tar")
        with open(bad, "wb") as f:
            f.write(data[:len(data) // 2 + 100])
        err = self.daemon_fails(d, "--no-write-index")
        self.assertIn("b.tar", err)
        self.assertRegex(err, r"truncated tar (member|header) in .* at "
                              r"offset \d+")
        with tarfile.open(good) as tf:
            hdr = [m.offset for m in tf.getmembers()
                   if m.name.startswith("sub/")][2]
        flipped = bytearray(data)
        flipped[hdr + 5] ^= 0x55  # inside a header's name
        with open(bad, "wb") as f:
            f.write(flipped)
        err = self.daemon_fails(d, "--no-write-index")
        self.assertIn("bad tar header checksum in '%s' at offset %d"
                      % (bad, hdr), err)

    def test_several_formats_need_asking(self):
        d = os.path.join(self.tmp, "mixed")
        os.makedirs(d)
        shutil.copy(os.path.join(self.kinds["gnutar-gnu"], "a.tar"), d)
        shards, _ = _support.make_dataset(os.path.join(self.tmp, "mx"), 20,
                                          2, "2K", "16K")
        for name in os.listdir(shards):
            if name.endswith(".tfrecord"):
                shutil.copy(os.path.join(shards, name), d)
        err = self.daemon_fails(d)
        self.assertIn("several formats", err)
        self.assertIn("--mixed-formats", err)
        with Daemon(d, "--format", "tar") as daemon:
            with emlio.Loader(daemon.endpoint, 8, epochs=1) as ld:
                self.assertEqual(sum(len(b.samples) for b in ld), self.N)
        with Daemon(d, "--mixed-formats") as daemon:
            with emlio.Loader(daemon.endpoint, 8, epochs=1) as ld:
                self.assertEqual(sum(len(b.samples) for b in ld),
                                 self.N + 20)


class MultiFieldTest(unittest.TestCase):
    """--fields: protocol v2, one frame per field per sample."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-mf.")
        cls.tar_dir = os.path.join(cls.tmp, "tar")
        os.makedirs(cls.tar_dir)
        rng = random.Random(11)
        cls.want = {}
        with tarfile.open(os.path.join(cls.tar_dir, "a.tar"), "w") as tf:
            for i in range(25):
                fields = {"jpg": rng.randbytes(50 + rng.randrange(900)),
                          "cls": str(i % 4).encode(),
                          "json": b'{"k": %d}' % i}
                cls.want[fields["jpg"]] = fields
                for f, data in fields.items():
                    info = tarfile.TarInfo("s/%03d.%s" % (i, f))
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_tar_fields_by_name(self):
        with Daemon(self.tar_dir, "--fields", "jpg,cls,json") as daemon:
            with emlio.Loader(daemon.endpoint, 6, seed=2, epochs=1) as ld:
                self.assertEqual(ld.field_names, ["jpg", "cls", "json"])
                seen = 0
                for b in ld:
                    f = b.fields
                    self.assertEqual(sorted(f), ["cls", "jpg", "json"])
                    labels = b.labels.tolist()
                    for i in range(len(b)):
                        jpg = bytes(f["jpg"][i])
                        self.assertEqual(bytes(b[i]), jpg)  # field 0
                        want = self.want[jpg]
                        self.assertEqual(bytes(f["cls"][i]), want["cls"])
                        self.assertEqual(bytes(f["json"][i]), want["json"])
                        self.assertEqual(bytes(b.field(2)[i]), want["json"])
                        self.assertEqual(labels[i], int(want["cls"]))
                        seen += 1
                self.assertEqual(seen, 25)
            with emlio.Loader(daemon.endpoint, 6, epochs=1,
                              fields=["json"]) as ld:
                n = sum(len(b.fields["json"]) for b in ld)
                self.assertEqual(n, 25)
            with self.assertRaises(emlio.NotFoundError) as ctx:
                emlio.Loader(daemon.endpoint, 6, fields=["txt"])
            self.assertIn("'txt'", str(ctx.exception))

    def test_client_names_the_fields(self):
        # Issue 34: the fields were the operator's choice only. A client
        # names them (webdataset's to_tuple("jpg", "cls")), in its order,
        # from a daemon without --fields (any field its shards have) or
        # within a daemon's --fields (its limit).
        for extra in ([], ["--fields", "jpg,cls,json"]):
            with Daemon(self.tar_dir, *extra) as daemon:
                with emlio.Loader(daemon.endpoint, 6, seed=2, epochs=1,
                                  fields=["json", "jpg"]) as ld:
                    self.assertEqual(ld.field_names, ["json", "jpg"])
                    seen = 0
                    for b in ld:
                        for i in range(len(b)):
                            jpg = bytes(b.field("jpg")[i])
                            self.assertEqual(bytes(b[i]),
                                             self.want[jpg]["json"])
                            seen += 1
                    self.assertEqual(seen, 25)
                with self.assertRaises(emlio.NotFoundError) as ctx:
                    emlio.Loader(daemon.endpoint, 6, fields="jpg,txt")
                self.assertIn("'txt'", str(ctx.exception))
                with self.assertRaises(emlio.EmlioError) as ctx:
                    emlio.Loader(daemon.endpoint, 6, fields="jpg,jpg")
                self.assertIn("twice", str(ctx.exception))
        with Daemon(self.tar_dir, "--fields", "jpg,cls") as daemon:
            with self.assertRaises(emlio.NotFoundError) as ctx:
                emlio.Loader(daemon.endpoint, 6, fields=["json"])
            self.assertIn("not one this daemon serves", str(ctx.exception))

    def test_torch_and_dali_adapters_take_fields(self):
        with Daemon(self.tar_dir, "--fields", "jpg,cls,json") as daemon:
            try:
                import torch  # noqa: F401
                from emlio.torch import EmlioDataset
            except ImportError as exc:
                print("skip - torch not importable: %s" % exc)
            else:
                ds = EmlioDataset(daemon.endpoint, 6, fields=["jpg", "json"])
                n = 0
                for out, labels in ds:
                    self.assertEqual(sorted(out), ["jpg", "json"])
                    data, offsets = out["jpg"]
                    jd, jo = out["json"]
                    for i in range(len(labels)):
                        jpg = bytes(data[offsets[i]:offsets[i + 1]].numpy())
                        want = self.want[jpg]
                        self.assertEqual(
                            bytes(jd[jo[i]:jo[i + 1]].numpy()), want["json"])
                        self.assertEqual(int(labels[i]), int(want["cls"]))
                        n += 1
                ds.close()
                self.assertEqual(n, 25)
            # The DALI source needs no DALI to be called as DALI calls it.
            from emlio.dali import ExternalSource
            src = ExternalSource(daemon.endpoint, 6, fields="cls,jpg")
            n = 0
            for cls_out, jpg_out, labels in src:
                self.assertEqual(labels.shape, (len(jpg_out), 1))
                for c, j, lab in zip(cls_out, jpg_out, labels[:, 0]):
                    self.assertEqual(bytes(c), self.want[bytes(j)]["cls"])
                    self.assertEqual(int(lab), int(bytes(c)))
                    n += 1
            src.close()
            self.assertEqual(n, 25)

    def test_unknown_field_fails_at_start(self):
        p = subprocess.run([_support.EMLIOD, "--data", self.tar_dir, "--bind",
                            "tcp://127.0.0.1:*", "--fields", "jpg,png"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=20)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("field 'png'", p.stderr.decode())

    def test_old_client_gets_a_clear_error(self):
        # One protocol version (docs/protocol.md 15): a HELLO of 1 is
        # refused by any daemon, with or without --fields, saying which
        # version it speaks.
        import msgpack
        import zmq
        for extra in (("--fields", "jpg,cls"), ()):
            with Daemon(self.tar_dir, *extra) as daemon:
                ctx = zmq.Context()
                try:
                    s = ctx.socket(zmq.DEALER)
                    s.setsockopt(zmq.LINGER, 0)
                    s.connect(daemon.endpoint)
                    s.send(msgpack.packb({"t": 1, "v": 1, "name": "old"}))
                    self.assertTrue(s.poll(10000))
                    h = msgpack.unpackb(s.recv_multipart()[0], raw=False)
                    self.assertEqual(h["t"], 5)
                    self.assertEqual(h["code"], -1007)  # EMLIO_EVERSION
                    self.assertIn("version 4 only", h["msg"])
                finally:
                    ctx.destroy(linger=0)

    def test_sample_without_a_field_is_left_out_at_start(self):
        # One rule with and without --fields (issue 34): a sample that
        # lacks a field served (here sample 2 has no json, and a stray
        # README.txt has neither) is left out when the daemon starts, with
        # one log line, a count and an example; it failed every request
        # that named it.
        d = os.path.join(self.tmp, "holes")
        os.makedirs(d)
        with tarfile.open(os.path.join(d, "h.tar"), "w") as tf:
            info = tarfile.TarInfo("README.txt")
            info.size = 5
            tf.addfile(info, io.BytesIO(b"notes"))
            for i in range(5):
                for f in (("jpg", "json") if i != 2 else ("jpg",)):
                    info = tarfile.TarInfo("%d.%s" % (i, f))
                    info.size = 3
                    tf.addfile(info, io.BytesIO(b"abc"))
        for extra in ([], ["--on-corrupt", "skip"]):
            with Daemon(d, "--fields", "jpg,json", *extra) as daemon:
                with emlio.Loader(daemon.endpoint, 5, epochs=1,
                                  verify=True) as ld:
                    self.assertEqual(sum(len(b.field("json")) for b in ld),
                                     4)
                log = daemon.stderr()
            self.assertIn("left out 2 of 6 samples without every member of "
                          "'jpg,json'", log)
            self.assertIn("'README.txt' in", log)
        # Without --fields the same README is left out the same way.
        with Daemon(d) as daemon:
            with emlio.Loader(daemon.endpoint, 5, epochs=1) as ld:
                self.assertEqual(sum(len(b) for b in ld), 5)
            self.assertIn("left out 1 of 6 samples without an image member",
                          daemon.stderr())

    def test_tfrecord_and_imagefolder_fields(self):
        shards, files = _support.make_dataset(
            os.path.join(self.tmp, "tf"), 30, 3, "2K", "16K")
        by_bytes = {}
        for path, label in files:
            with open(path, "rb") as f:
                by_bytes[f.read()] = label
        with Daemon(shards, "--fields",
                    "image/encoded,image/class/label") as daemon:
            with emlio.Loader(daemon.endpoint, 7, epochs=1) as ld:
                n = 0
                for b in ld:
                    for img, lab in zip(b.field("image/encoded"),
                                        b.field("image/class/label")):
                        self.assertEqual(
                            int.from_bytes(bytes(lab), "little",
                                           signed=True),
                            by_bytes[bytes(img)])
                        n += 1
                self.assertEqual(n, 30)
        img_root = os.path.join(self.tmp, "tf", "img")
        with Daemon(img_root, "--fields", "image,label") as daemon:
            with emlio.Loader(daemon.endpoint, 7, epochs=1) as ld:
                n = 0
                for b in ld:
                    labels = b.labels.tolist()
                    for i, (img, lab) in enumerate(zip(b.field("image"),
                                                       b.field("label"))):
                        want = by_bytes[bytes(img)]
                        self.assertEqual(int.from_bytes(bytes(lab),
                                                        "little"), want)
                        self.assertEqual(labels[i], want)
                        n += 1
                self.assertEqual(n, 30)


class ImageFolderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-if.")
        cls.root = os.path.join(cls.tmp, "root")
        rng = random.Random(9)
        layout = {
            "cat": ["a.jpg", "b.JPEG", "nested/c.png", "nested/deeper/d.jpg"],
            "dog": ["x.jpg", "y.webp", "z.bmp"],
            "bird_2": ["only.png"],
        }
        for cls_name, files in layout.items():
            for rel in files:
                p = os.path.join(cls.root, cls_name, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(rng.randbytes(100 + rng.randrange(5000)))
        # Not served: non-images, hidden files and directories.
        for rel in ("cat/notes.txt", "cat/.hidden.jpg", "dog/._y.jpg",
                    "dog/.cache/e.jpg", ".trash/t/q.jpg", "README.md"):
            p = os.path.join(cls.root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(b"not served")
        cls.n = sum(len(v) for v in layout.values())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def reference(self):
        """{bytes: label}: torchvision's ImageFolder when installed (hidden
        entries left out, which EMLIO never serves), else sorted classes."""
        want = {}
        try:
            from torchvision.datasets import ImageFolder
        except ImportError:
            print("skip - torchvision not importable: labels checked "
                  "against sorted class names only")
            classes = sorted(c for c in os.listdir(self.root)
                             if not c.startswith(".") and
                             os.path.isdir(os.path.join(self.root, c)))
            for label, c in enumerate(classes):
                for dp, dn, fn in os.walk(os.path.join(self.root, c)):
                    dn[:] = [x for x in dn if not x.startswith(".")]
                    for f in fn:
                        if f.startswith(".") or f.endswith((".txt", ".md")):
                            continue
                        with open(os.path.join(dp, f), "rb") as fh:
                            want[fh.read()] = label
            return want
        ds = ImageFolder(self.root, loader=lambda p: p)
        hidden = [c for c in ds.classes if c.startswith(".")]
        for path, label in ds.samples:
            rel = os.path.relpath(path, self.root)
            if any(part.startswith(".") for part in rel.split(os.sep)):
                continue
            # Labels of torchvision shift by hidden classes sorted before.
            label -= sum(1 for c in hidden if c < ds.classes[label])
            with open(path, "rb") as fh:
                want[fh.read()] = label
        return want

    def test_exactly_once_with_torchvision_labels(self):
        want = self.reference()
        self.assertEqual(len(want), self.n)
        with Daemon(self.root) as daemon:
            with emlio.Loader(daemon.endpoint, 3, seed=1, epochs=2) as ld:
                per_epoch = {}
                for b in ld:
                    labels = b.labels.tolist()
                    for i, view in enumerate(b.samples):
                        if b.ids[i][2]:
                            continue
                        data = bytes(view)
                        self.assertIn(data, want)
                        self.assertEqual(labels[i], want[data])
                        per_epoch.setdefault(b.epoch, []).append(data)
        for e in (0, 1):
            self.assertEqual(sorted(per_epoch[e]), sorted(want), e)

    def split(self, name, assign):
        """Two copies of the tree's served files: assign(cls, i) says
        which (0 or 1) holds the class's i-th file (sorted)."""
        roots = [os.path.join(self.tmp, "%s%d" % (name, k)) for k in (0, 1)]
        for cls_name in sorted(os.listdir(self.root)):
            src = os.path.join(self.root, cls_name)
            if cls_name.startswith(".") or not os.path.isdir(src):
                continue
            files = []
            for dp, dn, fn in os.walk(src):
                dn[:] = [x for x in dn if not x.startswith(".")]
                files += [os.path.relpath(os.path.join(dp, f), src)
                          for f in fn if not f.startswith(".") and
                          not f.endswith(".txt")]
            for i, rel in enumerate(sorted(files)):
                dst = os.path.join(roots[assign(cls_name, i)], cls_name, rel)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy(os.path.join(src, rel), dst)
        return roots

    def fetch_all(self, endpoints, **kw):
        """{bytes: label} over one epoch, and the Loader's classes."""
        got = {}
        with emlio.Loader(endpoints, 2, epochs=1, **kw) as ld:
            for b in ld:
                labels = b.labels.tolist()
                for i, view in enumerate(b.samples):
                    if not b.ids[i][2]:
                        self.assertNotIn(bytes(view), got)
                        got[bytes(view)] = labels[i]
            return got, list(ld.classes)

    def test_split_by_classes_labels_are_the_union(self):
        # torchvision numbers the union of the class directories; each
        # daemon numbers only its own: the Loader maps them onto the union.
        want = self.reference()
        roots = self.split("bycls", lambda c, i: 1 if c == "dog" else 0)
        with Daemon(roots[0]) as d0, Daemon(roots[1]) as d1:
            got, classes = self.fetch_all([d1.endpoint, d0.endpoint])
        self.assertEqual(got, want)
        self.assertEqual(classes, ["bird_2", "cat", "dog"])

    def test_torch_dataset_has_torchvision_classes(self):
        # EmlioDataset.classes / class_to_idx are torchvision's, also for a
        # dataset split by classes over two daemons (the union).
        try:
            from emlio.torch import EmlioDataset
        except ImportError as e:
            self.skipTest("torch not importable: %s" % e)
        roots = self.split("dscls", lambda c, i: 1 if c == "dog" else 0)
        with Daemon(roots[0]) as d0, Daemon(roots[1]) as d1:
            ds = EmlioDataset([d1.endpoint, d0.endpoint], 2, rank=0,
                              world_size=1)
            self.assertEqual(ds.classes, ["bird_2", "cat", "dog"])
            self.assertEqual(ds.class_to_idx,
                             {"bird_2": 0, "cat": 1, "dog": 2})
            try:
                from torchvision.datasets import ImageFolder
            except ImportError:
                print("skip - torchvision not importable: classes checked "
                      "against sorted names only")
            else:
                # torchvision also counts hidden directories (.trash),
                # which EMLIO never serves.
                tv = [c for c in ImageFolder(self.root, loader=lambda p: p)
                      .classes if not c.startswith(".")]
                self.assertEqual(ds.classes, tv)
            # The labels of its items follow that numbering.
            want = self.reference()
            for data, offsets, labels in ds:
                for i in range(len(labels)):
                    got = bytes(data[offsets[i]:offsets[i + 1]].numpy())
                    self.assertEqual(int(labels[i]), want[got])
            ds.close()

    def test_split_by_files_refused_then_disjoint(self):
        want = self.reference()
        roots = self.split("byfile", lambda c, i: i % 2)
        with Daemon(roots[0]) as d0, Daemon(roots[1]) as d1:
            eps = [d0.endpoint, d1.endpoint]
            with self.assertRaises(emlio.EmlioError) as cm:
                emlio.Loader(eps, 2, epochs=1)
            self.assertIn("differs between daemon", str(cm.exception))
            got, _ = self.fetch_all(eps, disjoint_shards=True)
        self.assertEqual(got, want)

    def count(self, root, *extra):
        with Daemon(root, *extra) as daemon:
            with emlio.Loader(daemon.endpoint, 4, epochs=1) as ld:
                return sum(len(b) for b in ld)

    def test_file_list_cached_and_revalidated(self):
        root = os.path.join(self.tmp, "cached")
        shutil.copytree(self.root, root)
        cache = os.path.join(root, ".emlio-files")
        # Directories changed within 2 s of their listing are listed
        # again at the next start (a change in the same clock tick would
        # not show): age them so the second start trusts the list.
        old = time.time_ns() - 3600 * 10**9
        for d, _, _ in os.walk(root):
            os.utime(d, ns=(old, old))
        self.assertEqual(self.count(root), self.n)
        with open(cache, "rb") as f:
            self.assertEqual(f.read(12), b"emlio-if\x02\0\0\0")
        before = os.stat(cache).st_mtime_ns
        self.assertEqual(self.count(root), self.n)
        self.assertEqual(os.stat(cache).st_mtime_ns, before, "not reused")
        # A new image in a nested directory makes the list stale.
        with open(os.path.join(root, "cat", "nested", "new.jpg"), "wb") as f:
            f.write(b"new image")
        self.assertEqual(self.count(root), self.n + 1)
        self.assertNotEqual(os.stat(cache).st_mtime_ns, before)
        # A new class too; a removed image as well.
        os.makedirs(os.path.join(root, "eel"))
        with open(os.path.join(root, "eel", "e.png"), "wb") as f:
            f.write(b"eel")
        os.unlink(os.path.join(root, "dog", "z.bmp"))
        self.assertEqual(self.count(root), self.n + 1)
        # A file rewritten in place (same size, new mtime) is reported
        # when read, never served as the listing's file.
        p = os.path.join(root, "bird_2", "only.png")
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.write(b"x" * size)
        os.utime(p, ns=(time.time_ns(), time.time_ns() + 10**9))
        with self.assertRaises(emlio.EmlioError) as ctx:
            self.count(root)
        self.assertIn("bird_2/only.png", str(ctx.exception))

    def test_changed_file_is_an_error_naming_it(self):
        root = os.path.join(self.tmp, "changing")
        shutil.copytree(self.root, root)
        with Daemon(root, "--format", "imagefolder") as daemon:
            with open(os.path.join(root, "dog", "x.jpg"), "ab") as f:
                f.write(b"grown")
            with self.assertRaises(emlio.EmlioError) as ctx:
                with emlio.Loader(daemon.endpoint, 8, epochs=1) as ld:
                    for _ in ld:
                        pass
        self.assertIn("dog/x.jpg", str(ctx.exception))

    def test_changed_file_is_skipped_under_skip(self):
        root = os.path.join(self.tmp, "changing-skip")
        shutil.copytree(self.root, root)
        with Daemon(root, "--format", "imagefolder", "--on-corrupt",
                    "skip") as daemon:
            with open(os.path.join(root, "dog", "x.jpg"), "ab") as f:
                f.write(b"grown")
            n = 0
            with emlio.Loader(daemon.endpoint, 8, epochs=1) as ld:
                for batch in ld:
                    n += len(batch)
            self.assertIn("skipping changed file 'dog/x.jpg'",
                          daemon.stderr())
        self.assertEqual(n, self.n - 1)


if __name__ == "__main__":
    _support.main()
