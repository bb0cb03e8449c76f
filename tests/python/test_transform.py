# tests/python/test_transform.py - the transform pipeline (emlio/transform.h)
# against torchvision's PIL pipeline on the same JPEG bytes: fidelity of
# resize(256),center_crop(224) and of random_resized_crop (median PSNR), the
# RandomResizedCrop box distribution (two-sample Kolmogorov-Smirnov test
# against torchvision's get_params over 10,000 draws), and the generator as
# docs/transform.md defines it, re-implemented here from the text.
# Run from the repository root: B=<build dir> /usr/bin/python3 <this file>.
# SPDX-License-Identifier: MIT
import ctypes
import glob
import io
import math
import os
import shutil
import tempfile
import unittest

import _support

try:
    import numpy as np
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image
except ImportError as e:  # the Debian packages are test dependencies
    np = None
    MISSING = str(e)

M64 = (1 << 64) - 1


class Lib:
    """The transform functions of libemlio.so through ctypes."""

    def __init__(self):
        lib = ctypes.CDLL(os.environ["EMLIO_LIBRARY"])
        vp, u64, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
        lib.emlio_transform_parse.argtypes = [
            ctypes.c_char_p, ctypes.POINTER(vp), ctypes.c_char_p, sz]
        lib.emlio_transform_destroy.argtypes = [ctypes.POINTER(vp)]
        lib.emlio_transform_spec.restype = ctypes.c_char_p
        lib.emlio_transform_spec.argtypes = [vp]
        lib.emlio_transform_output_bytes.restype = sz
        lib.emlio_transform_output_bytes.argtypes = [vp]
        lib.emlio_transform_height.restype = ctypes.c_uint32
        lib.emlio_transform_height.argtypes = [vp]
        lib.emlio_transform_width.restype = ctypes.c_uint32
        lib.emlio_transform_width.argtypes = [vp]
        lib.emlio_transform_ws_new.restype = vp
        lib.emlio_transform_ws_destroy.argtypes = [ctypes.POINTER(vp)]
        lib.emlio_transform_apply.argtypes = [
            vp, vp, ctypes.c_char_p, sz, u64, u64, u64, ctypes.c_void_p,
            ctypes.c_char_p, sz]
        lib.emlio_transform_crop_params.argtypes = [
            vp, sz, ctypes.c_uint32, ctypes.c_uint32, u64, u64, u64,
            ctypes.POINTER(ctypes.c_uint32 * 4)]
        lib.emlio_transform_sample_key.restype = u64
        lib.emlio_transform_sample_key.argtypes = [ctypes.c_char_p, u64]
        self.lib = lib
        self.ws = ctypes.c_void_p(lib.emlio_transform_ws_new())

    def close(self):
        self.lib.emlio_transform_ws_destroy(ctypes.byref(self.ws))

    def parse(self, spec):
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = self.lib.emlio_transform_parse(spec.encode(), ctypes.byref(h),
                                            err, 512)
        if rc != 0:
            raise ValueError(err.value.decode())
        return h

    def free(self, h):
        self.lib.emlio_transform_destroy(ctypes.byref(h))

    def apply(self, t, data, seed=1, epoch=0, key=0):
        """The output as an (H, W, 3) uint8 array."""
        n = self.lib.emlio_transform_output_bytes(t)
        out = np.empty(n, np.uint8)
        err = ctypes.create_string_buffer(512)
        rc = self.lib.emlio_transform_apply(
            t, self.ws, data, len(data), seed, epoch, key,
            out.ctypes.data_as(ctypes.c_void_p), err, 512)
        if rc != 0:
            raise RuntimeError(err.value.decode())
        return out.reshape(self.lib.emlio_transform_height(t),
                           self.lib.emlio_transform_width(t), 3)

    def crop(self, t, op, w, h, seed, epoch, key):
        """(top, left, height, width), as torchvision's get_params."""
        box = (ctypes.c_uint32 * 4)()
        rc = self.lib.emlio_transform_crop_params(t, op, w, h, seed, epoch,
                                                  key, ctypes.byref(box))
        if rc != 0:
            raise RuntimeError("crop_params: %d" % rc)
        return tuple(box)


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def ks_2samp(x, y):
    """Two-sample Kolmogorov-Smirnov statistic D and its asymptotic p-value
    (Numerical Recipes' ksone/kstwo with Stephens' correction)."""
    x, y = np.sort(np.asarray(x)), np.sort(np.asarray(y))
    allv = np.concatenate([x, y])
    cdf_x = np.searchsorted(x, allv, side="right") / len(x)
    cdf_y = np.searchsorted(y, allv, side="right") / len(y)
    d = float(np.max(np.abs(cdf_x - cdf_y)))
    en = math.sqrt(len(x) * len(y) / (len(x) + len(y)))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 0.2:
        return d, 1.0
    p = 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * lam * lam)
                for j in range(1, 101))
    return d, min(max(p, 0.0), 1.0)


# The generator of docs/transform.md, from its text.
def mix(z):
    z ^= z >> 30
    z = (z * 0xbf58476d1ce4e5b9) & M64
    z ^= z >> 27
    z = (z * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def stream_key(seed, epoch, sample, op):
    return mix(mix(mix(mix(seed) ^ epoch) ^ sample) ^ op)


def draw(key, n):
    return mix((key + (n + 1) * 0x9e3779b97f4a7c15) & M64)


def uniform(key, n):
    return (draw(key, n) >> 11) * 2.0 ** -53


def below(key, n, bound):
    return (draw(key, n) * bound) >> 64


def rrc_params(key, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's get_params with the generator above."""
    area = height * width
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for a in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * uniform(key, 4 * a))
        aspect = math.exp(lo + (hi - lo) * uniform(key, 4 * a + 1))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return (below(key, 4 * a + 2, height - h + 1),
                    below(key, 4 * a + 3, width - w + 1), h, w)
    in_ratio = width / height
    w, h = width, height
    if in_ratio < ratio[0]:
        h = round(w / ratio[0])
    elif in_ratio > ratio[1]:
        w = round(h * ratio[1])
    return ((height - h) // 2, (width - w) // 2, h, w)


@unittest.skipIf(np is None, "numpy/torch/torchvision/PIL missing")
class TransformTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emlio-transform-")
        img = os.path.join(cls.tmp, "img")
        # ~110 KB ImageNet-like JPEGs of mixed sizes (synth's default), and
        # 500x375 ones (the ImageNet median shape).
        _support.run(_support.EMLIO, "synth", img, "--samples", "30",
                     "--classes", "3", "--seed", "7", "--quiet")
        _support.run(_support.EMLIO, "synth", img + "-500", "--samples", "24",
                     "--classes", "3", "--seed", "8", "--width", "500",
                     "--height", "375", "--quiet")
        cls.files = sorted(glob.glob(img + "*/*/*.jpg"))
        cls.lib = Lib()

    @classmethod
    def tearDownClass(cls):
        cls.lib.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def test_resize_center_crop_matches_torchvision(self):
        t = self.lib.parse("resize(256),center_crop(224)")
        ref = T.Compose([T.Resize(256), T.CenterCrop(224)])
        scores = []
        for path in self.files:
            data = self.read(path)
            ours = self.lib.apply(t, data)
            theirs = np.asarray(ref(Image.open(io.BytesIO(data)).convert(
                "RGB")))
            self.assertEqual(ours.shape, theirs.shape)
            scores.append(psnr(ours, theirs))
        self.lib.free(t)
        med = float(np.median(scores))
        exact = sum(s == 99.0 for s in scores)
        print("resize(256),center_crop(224) vs torchvision PIL: median PSNR "
              "%.1f dB, min %.1f dB, %d of %d byte-identical"
              % (med, min(scores), exact, len(scores)))
        self.assertGreaterEqual(len(scores), 50)
        self.assertGreaterEqual(med, 30.0)

    def test_random_resized_crop_matches_torchvision_on_its_box(self):
        """The same box through torchvision's resized_crop (+ flip)."""
        t = self.lib.parse("random_resized_crop(224),horizontal_flip")
        scores = []
        for i, path in enumerate(self.files):
            data = self.read(path)
            img = Image.open(io.BytesIO(data)).convert("RGB")
            key = self.lib.lib.emlio_transform_sample_key(b"shard", i)
            top, left, h, w = self.lib.crop(t, 0, img.width, img.height, 1,
                                            3, key)
            theirs = F.resized_crop(img, top, left, h, w, [224, 224])
            if uniform(stream_key(1, 3, key, 1), 0) < 0.5:
                theirs = F.hflip(theirs)
            ours = self.lib.apply(t, data, seed=1, epoch=3, key=key)
            scores.append(psnr(ours, np.asarray(theirs)))
        self.lib.free(t)
        med = float(np.median(scores))
        exact = sum(s == 99.0 for s in scores)
        print("random_resized_crop(224),horizontal_flip vs torchvision on "
              "the same box: median PSNR %.1f dB, min %.1f dB, %d of %d "
              "byte-identical" % (med, min(scores), exact, len(scores)))
        self.assertGreaterEqual(med, 30.0)

    def test_crop_distribution_matches_get_params(self):
        """Area fraction and aspect ratio over 10,000 draws: two-sample KS
        against torchvision's RandomResizedCrop.get_params."""
        width, height, n = 500, 375, 10000
        img = Image.new("RGB", (width, height))
        torch.manual_seed(0)
        scale, ratio = (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0)
        theirs = [T.RandomResizedCrop.get_params(img, scale, ratio)
                  for _ in range(n)]

        def stats(boxes):
            area = [h * w / (width * height) for _, _, h, w in boxes]
            aspect = [w / h for _, _, h, w in boxes]
            return area, aspect

        def ours_for(spec):
            t = self.lib.parse(spec)
            boxes = [self.lib.crop(t, 0, width, height, 5, 0, k)
                     for k in range(n)]
            self.lib.free(t)
            return boxes

        ours = ours_for("random_resized_crop(224)")
        (oa, orat), (ta, trat) = stats(ours), stats(theirs)
        d_area, p_area = ks_2samp(oa, ta)
        d_ratio, p_ratio = ks_2samp(orat, trat)
        print("RandomResizedCrop vs torchvision get_params, %d draws each: "
              "area KS D=%.4f p=%.3f; aspect KS D=%.4f p=%.3f"
              % (n, d_area, p_area, d_ratio, p_ratio))
        self.assertGreater(p_area, 0.001)
        self.assertGreater(p_ratio, 0.001)
        # The test has power: a different scale range is told apart.
        wrong, _ = stats(ours_for("random_resized_crop(224,scale=0.2:1)"))
        d_wrong, p_wrong = ks_2samp(wrong, ta)
        print("control, scale=0.2:1: area KS D=%.4f p=%.2g" % (d_wrong,
                                                                p_wrong))
        self.assertLess(p_wrong, 0.001)

    def test_generator_is_reproducible_from_the_docs(self):
        t = self.lib.parse("horizontal_flip,random_resized_crop(224,"
                           "scale=0.25:0.75,ratio=0.5:2)")
        for k in range(2000):
            key = self.lib.lib.emlio_transform_sample_key(b"s", k)
            for (w, h) in ((500, 375), (64, 900)):
                got = self.lib.crop(t, 1, w, h, 9, 2, key)
                want = rrc_params(stream_key(9, 2, key, 1), w, h,
                                  (0.25, 0.75), (0.5, 2.0))
                self.assertEqual(got, want, "sample %d, %dx%d" % (k, w, h))
        self.lib.free(t)
        # The sample key: mix(fnv1a64(name) ^ mix(record + 1)).
        h = 0xcbf29ce484222325
        for c in b"train-00003.tfrecord":
            h = ((h ^ c) * 0x100000001b3) & M64
        self.assertEqual(
            self.lib.lib.emlio_transform_sample_key(b"train-00003.tfrecord",
                                                    41),
            mix(h ^ mix(42)))

    def test_bad_input_raises(self):
        t = self.lib.parse("random_resized_crop(32)")
        for data in (b"", b"\xff\xd8\xff", b"GIF89a" + b"\0" * 100,
                     self.read(self.files[0])[:5000]):
            with self.assertRaises(RuntimeError):
                self.lib.apply(t, data)
        self.lib.free(t)
        with self.assertRaisesRegex(ValueError, "unknown operation"):
            self.lib.parse("random_crop(224)")


if __name__ == "__main__":
    _support.main()
