# tests/python/test_tensors.py - decoded tensors from Python: Loader's
# transform= and decode_at=, batch.images as a zero-copy (B, H, W, 3) view,
# the same bytes as the C library gives on the raw JPEGs wherever they are
# decoded, transform_stats, argument errors, EmlioDataset in a DataLoader
# with workers, the DALI adapter, and the ResNet-18 example.
# SPDX-License-Identifier: MIT
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import unittest

import _support

import emlio  # noqa: E402
from emlio import _lib  # noqa: E402

SPEC = "random_resized_crop(64),horizontal_flip"
SIDE = 64


def _c_transform(spec):
    """The C library's transform, called directly (the reference)."""
    C = _lib.lib
    C.emlio_transform_parse.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
        ctypes.c_size_t]
    C.emlio_transform_ws_new.restype = ctypes.c_void_p
    C.emlio_transform_sample_key.restype = ctypes.c_uint64
    C.emlio_transform_sample_key.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    C.emlio_transform_apply.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p,
        ctypes.c_char_p, ctypes.c_size_t]
    t = ctypes.c_void_p()
    err = ctypes.create_string_buffer(512)
    assert C.emlio_transform_parse(spec.encode(), ctypes.byref(t), err,
                                   512) == 0, err.value
    ws = ctypes.c_void_p(C.emlio_transform_ws_new())

    def apply(data, seed, epoch, shard, record):
        out = ctypes.create_string_buffer(SIDE * SIDE * 3)
        key = C.emlio_transform_sample_key(shard.encode(), record)
        rc = C.emlio_transform_apply(t, ws, data, len(data), seed, epoch,
                                     key, out, err, 512)
        assert rc == 0, err.value
        return out.raw
    return apply


class TensorCase(_support.DatasetCase):
    SAMPLES = 96
    CLASSES = 3
    NBYTES = "12K"
    SHARD_BYTES = "200K"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.daemon.stop()
        cls.daemon = _support.Daemon(cls.shards, "--transform-threads", "2")
        cls.endpoint = cls.daemon.endpoint

    def digests(self, where, threads=1, epoch=0, **kw):
        ld = emlio.Loader(self.endpoint, batch_size=8, seed=7,
                          transform=SPEC, decode_at=where,
                          transform_threads=threads, **kw)
        out = {}
        try:
            for b in ld.epoch(epoch):
                im = b.images
                self.assertEqual(im.shape, (len(b), SIDE, SIDE, 3))
                self.assertEqual(im.dtype.name, "uint8")
                # Zero-copy: sample i's bytes are images[i].
                self.assertEqual(b.samples[0].ctypes.data, im.ctypes.data)
                for i, (name, rec, pad) in enumerate(b.ids):
                    if not pad:
                        out[(name, rec)] = hashlib.sha256(
                            im[i].tobytes()).hexdigest()
            stats = ld.transform_stats()
        finally:
            ld.close()
        return out, stats

    def test_same_bytes_as_the_library_on_the_raw_jpegs(self):
        raw = {}
        ld = emlio.Loader(self.endpoint, batch_size=8, seed=7)
        for b in ld.epoch(0):
            for v, (name, rec, pad) in zip(b.samples, b.ids):
                raw[(name, rec)] = v.tobytes()
        ld.close()
        apply = _c_transform(SPEC)
        want = {k: hashlib.sha256(apply(v, 7, 0, k[0], k[1])).hexdigest()
                for k, v in raw.items()}
        self.assertEqual(len(want), self.SAMPLES)
        for where in ("server", "client", "auto"):
            for threads in (1, 3):
                got, stats = self.digests(where, threads)
                self.assertEqual(got, want, "%s, %d threads" % (where,
                                                                threads))
                self.assertEqual(stats["decode_at"], where)

    def test_placement_is_reported(self):
        _, s = self.digests("server")
        self.assertEqual(s["server_share"], 1.0)
        self.assertEqual(s["batches_client"], 0)
        self.assertGreater(s["server_ms_per_image"], 0)
        _, s = self.digests("client", 2)
        self.assertEqual(s["server_share"], 0.0)
        self.assertGreater(s["client_ms_per_image"], 0)
        self.assertEqual(s["client_threads"], 2)
        # Sized from this machine's memory over the 2 threads, 32-512 MiB.
        self.assertGreaterEqual(s["client_decode_max_bytes"], 32 << 20)
        self.assertLessEqual(s["client_decode_max_bytes"], 512 << 20)
        _, s = self.digests("auto")
        self.assertIn("server share", s["why"])
        self.assertGreater(s["batches_server"] + s["batches_client"], 0)

    def test_another_epoch_other_crops(self):
        a, _ = self.digests("server", epoch=0)
        b, _ = self.digests("server", epoch=1)
        same = sum(a[k] == b[k] for k in a)
        self.assertLessEqual(same, len(a) // 20)

    def test_class_names_from_the_daemon(self):
        ld = emlio.Loader(self.endpoint, batch_size=4)
        try:
            want = open(os.path.join(self.shards,
                                     "classes.txt")).read().split()
            self.assertEqual(len(want), self.CLASSES)
            self.assertEqual(ld.classes, want)
        finally:
            ld.close()

    def test_argument_errors(self):
        with self.assertRaises(emlio.InvalidArgumentError) as e:
            emlio.Loader(self.endpoint, batch_size=4, transform="rotate(3)")
        self.assertIn("rotate", str(e.exception))
        with self.assertRaises(ValueError) as e:
            emlio.Loader(self.endpoint, batch_size=4, transform=SPEC,
                         decode_at="sever")
        self.assertIn("decode_at", str(e.exception))
        with self.assertRaises(TypeError):
            emlio.Loader(self.endpoint, batch_size=4, transform=SPEC,
                         transform_threads=1.5)
        ld = emlio.Loader(self.endpoint, batch_size=4)
        try:
            for b in ld.epoch(0):
                with self.assertRaises(emlio.EmlioError) as e:
                    b.images
                self.assertIn("transform=", str(e.exception))
                break
        finally:
            ld.close()

    def test_tensors_are_the_batch_memory_and_keep_it(self):
        # emlio.torch hands out the batch's block itself (no copy) and the
        # tensor keeps the batch: kept tensors stay valid while later
        # batches arrive, and a batch goes back once its tensor is gone.
        import gc
        import torch
        from emlio.torch import EmlioDataset
        want, _ = self.digests("server")
        ds = EmlioDataset(self.endpoint, batch_size=8, seed=7,
                          transform=SPEC, decode_at="server", skip_pad=False)
        kept = []
        for images, labels in ds:
            self.assertEqual(images.dtype, torch.uint8)
            kept.append(images)
        # Every tensor still holds its batch's bytes after the epoch: the
        # same images the loader's batches had (hashes by position).
        got = sorted(hashlib.sha256(t[i].numpy().tobytes()).hexdigest()
                     for t in kept for i in range(t.shape[0]))
        self.assertEqual(len(got), self.SAMPLES)
        self.assertEqual(got, sorted(want.values()))
        ld = emlio.Loader(self.endpoint, batch_size=8, seed=7,
                          transform=SPEC, decode_at="server")
        try:
            it = ld.epoch(0)
            b = next(it)
            arr = b.hold_images()
            self.assertEqual(arr.ctypes.data, b.images.ctypes.data)
            t = torch.from_numpy(arr)
            del arr
            next(it)  # a held batch is not released by the next step
            self.assertFalse(b.released)
            self.assertTrue(t.is_contiguous())
            del t
            gc.collect()
            next(it)  # ... but at the first step after its last user
            self.assertTrue(b.released)
        finally:
            ld.close()

    def test_tensors_outlive_their_dataset_and_loader(self):
        # Tensors kept from an EmlioDataset that is gone (its loader
        # collected), or from a Loader closed while they live, keep their
        # bytes: the loader frees the batches when the last tensor goes.
        # (They were freed at once before: later batches' bytes showed.)
        import gc
        import torch
        from emlio.torch import EmlioDataset
        kw = dict(batch_size=8, seed=7, transform=SPEC, decode_at="server",
                  in_order=True)
        want = [i.clone() for i, _ in EmlioDataset(self.endpoint, **kw)]
        for _ in range(3):
            held = [i for i, _ in EmlioDataset(self.endpoint, **kw)]
            gc.collect()
            for _ in EmlioDataset(self.endpoint, **kw):
                pass  # other batches, in memory the freed ones would reuse
            self.assertEqual([torch.equal(a, b) for a, b in zip(want, held)],
                             [True] * len(want))
        ld = emlio.Loader(self.endpoint, batch_size=8, seed=7,
                          transform=SPEC, decode_at="server", in_order=True)
        t = torch.from_numpy(next(ld.epoch(0)).hold_images())
        ld.close()
        with self.assertRaises(emlio.EmlioError):
            next(ld.epoch(1))  # closed: no more calls while t lives
        self.assertTrue(torch.equal(t, want[0]))
        del t
        gc.collect()
        self.assertIsNone(ld._client)  # freed with the last tensor

    def test_chw_layout_and_normalize(self):
        # layout="CHW" is the same memory seen as (B, 3, H, W): channels
        # last, no copy; normalize() equals torchvision's ToTensor() +
        # Normalize(mean, std) on each image.
        import torch
        from emlio.torch import EmlioDataset, normalize
        kw = dict(batch_size=8, seed=7, transform=SPEC, decode_at="server",
                  in_order=True)
        hwc = [(i.clone(), l) for i, l in EmlioDataset(self.endpoint, **kw)]
        chw = list(EmlioDataset(self.endpoint, layout="CHW", **kw))
        self.assertEqual(len(hwc), len(chw))
        for (a, la), (b, lb) in zip(hwc, chw):
            self.assertEqual(tuple(b.shape[1:]), (3, SIDE, SIDE))
            self.assertTrue(
                b.is_contiguous(memory_format=torch.channels_last))
            self.assertTrue(torch.equal(a.permute(0, 3, 1, 2), b))
            self.assertTrue(torch.equal(la, lb))
        images = chw[0][0]
        x = normalize(images)
        self.assertEqual(x.dtype, torch.float32)
        self.assertEqual(tuple(x.shape), tuple(images.shape))
        try:
            from torchvision import transforms as T
        except ImportError:
            T = None
        mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        for k in range(images.shape[0]):
            img = images[k].permute(1, 2, 0).numpy()  # H, W, 3 uint8
            if T is not None:
                want = T.Normalize(mean, std)(T.ToTensor()(img))
            else:
                want = (torch.from_numpy(img).permute(2, 0, 1).float() / 255
                        - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(
                            std).view(3, 1, 1)
            self.assertLess(float((x[k] - want).abs().max()), 1e-5)
        # HWC input, other statistics, other dtype; bad arguments refused.
        y = normalize(hwc[0][0], mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                      layout="HWC", dtype=torch.float64)
        self.assertEqual(y.dtype, torch.float64)
        self.assertAlmostEqual(float(y.min()), -1.0, delta=1.0)
        self.assertTrue(bool((y >= -1).all()) and bool((y <= 1).all()))
        with self.assertRaises(TypeError):
            normalize(x)
        with self.assertRaises(ValueError):
            normalize(images, mean=(0.5,), std=(0.5,))
        with self.assertRaises(ValueError):
            EmlioDataset(self.endpoint, layout="NCHW", **kw)

    def test_emlio_dataset_with_workers_yields_uint8_tensors(self):
        import torch
        from emlio.torch import DataLoader, EmlioDataset
        ds = EmlioDataset(self.endpoint, batch_size=8, seed=7,
                          transform=SPEC, decode_at="server")
        dl = DataLoader(ds, num_workers=2)
        got = {}
        n = 0
        for images, labels in dl:
            self.assertEqual(images.dtype, torch.uint8)
            self.assertEqual(tuple(images.shape[1:]), (SIDE, SIDE, 3))
            self.assertEqual(images.shape[0], labels.shape[0])
            self.assertTrue(images.is_contiguous())
            x = images.permute(0, 3, 1, 2).float().div_(255)  # NCHW
            self.assertEqual(tuple(x.shape[1:]), (3, SIDE, SIDE))
            n += images.shape[0]
            if torch.cuda.is_available():
                images.pin_memory().cuda(non_blocking=True)
        self.assertEqual(n, self.SAMPLES)
        self.assertEqual(len(dl), (self.SAMPLES + 7) // 8)
        del got

    def test_dali_adapter_hands_decoded_batches(self):
        from emlio.dali import ExternalSource
        src = ExternalSource(self.endpoint, batch_size=8, seed=7,
                             transform=SPEC, decode_at="client")
        try:
            it = iter(src)
            images, labels = next(it)
            self.assertEqual(images.shape, (8, SIDE, SIDE, 3))
            self.assertEqual(images.dtype.name, "uint8")
            self.assertEqual(labels.shape, (8, 1))
            total = 8 + sum(len(i) for i, _ in it)
            self.assertEqual(total, self.SAMPLES)
        finally:
            src.close()

    def test_resnet18_example_trains(self):
        script = os.path.join(_support.ROOT, "examples", "train_resnet18.py")
        p = subprocess.run(
            [sys.executable, script, "--connect", self.endpoint, "--steps",
             "2", "--batch", "8", "--size", "64", "--classes", "3",
             "--decode-at", "auto", "--transform-threads", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-2000:])
        summary = json.loads(p.stdout.decode().strip().splitlines()[-1])
        self.assertEqual(summary["steps"], 2)
        self.assertTrue(summary["finite"])
        self.assertEqual(summary["decode_at"], "auto")


class CorruptImageCase(unittest.TestCase):
    """on_corrupt="skip" leaves out an image that does not decode, on
    whichever side decodes it; "fail" (the default) raises naming it."""

    @classmethod
    def setUpClass(cls):
        import tempfile
        from PIL import Image
        cls.tmp = tempfile.TemporaryDirectory()
        for c in range(2):
            os.mkdir(os.path.join(cls.tmp.name, "c%d" % c))
            for i in range(10):
                path = os.path.join(cls.tmp.name, "c%d" % c, "%02d.jpg" % i)
                Image.new("RGB", (80 + i, 72), (30 * i, 9 * c, 100)).save(path)
        # The header survives, the scan is noise: it fails to decode.
        bad = os.path.join(cls.tmp.name, "c1", "03.jpg")
        data = bytearray(open(bad, "rb").read())
        data[200:] = b"\x55" * (len(data) - 200)
        open(bad, "wb").write(bytes(data))
        cls.daemon = _support.Daemon(cls.tmp.name, "--transform-threads", "2",
                                     "--on-corrupt", "skip")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.tmp.cleanup()

    def test_skip_leaves_the_bad_image_out_wherever_decoded(self):
        for where in ("client", "server", "auto"):
            ld = emlio.Loader(self.daemon.endpoint, batch_size=4, seed=3,
                              transform=SPEC, decode_at=where,
                              on_corrupt="skip", log_level="error")
            try:
                seen, skipped = set(), 0
                for b in ld.epoch(0):
                    self.assertEqual(b.images.shape[0], len(b))
                    for name, rec, pad in b.ids:
                        if not pad:
                            seen.add((name, rec))
                    skipped = ld.epoch_stats()["skipped"]
                self.assertEqual(len(seen), 19, where)
                self.assertNotIn(("c1", 3), seen)
                self.assertEqual(skipped, 1, where)
            finally:
                ld.close()

    def test_fail_names_the_file(self):
        ld = emlio.Loader(self.daemon.endpoint, batch_size=4, seed=3,
                          transform=SPEC, decode_at="client")
        try:
            with self.assertRaises(emlio.EmlioError) as e:
                for _ in ld.epoch(0):
                    pass
            # The daemon names the record for a client that decodes.
            self.assertIn("cannot decode file 'c1/03.jpg' (record 3)",
                          str(e.exception))
        finally:
            ld.close()
        with self.assertRaises(ValueError) as e:
            emlio.Loader(self.daemon.endpoint, batch_size=4,
                         on_corrupt="ignore")
        self.assertIn("on_corrupt", str(e.exception))


if __name__ == "__main__":
    _support.main()
