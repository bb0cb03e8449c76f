# tests/python/test_train_input.py - the arithmetic of bench/train_input
# (issue 17's benchmark) without root, network or daemons: the steady
# window of bench/train_meter.py under a fake clock, per-image figures and
# the wire ratio of one cell, the median and spread of repeats, the targets'
# PASS/MISS/n/a, the parsing of bench/transform_bench.py's table, the CPU
# pinning of servers and clients, and the emlio client's clean
# "unavailable" exit on a binding without transforms.
# Run from the repository root: B=<build dir> /usr/bin/python3 <this file>.
# SPDX-License-Identifier: MIT
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

import _support

BENCH = os.path.join(_support.ROOT, "bench")
sys.path.insert(0, BENCH)

import train_meter  # noqa: E402  (needs bench/ on the path)


def load_train_input():
    path = os.path.join(BENCH, "train_input")
    loader = importlib.machinery.SourceFileLoader("train_input", path)
    spec = importlib.util.spec_from_loader("train_input", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


ti = load_train_input()


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class MeterTest(unittest.TestCase):
    def setUp(self):
        self.clock = FakeClock()
        self._mono = train_meter.time.monotonic
        train_meter.time.monotonic = self.clock
        self._cpu = train_meter.tree_cpu
        self.cpu = {"v": 0.0}
        train_meter.tree_cpu = lambda pid: self.cpu["v"]

    def tearDown(self):
        train_meter.time.monotonic = self._mono
        train_meter.tree_cpu = self._cpu

    def feed(self, m, n, dt, cpu_per_batch=0.0):
        """n batches of 10 images, dt apart; returns the batch that ended it."""
        for i in range(n):
            self.clock.t += dt
            self.cpu["v"] += cpu_per_batch
            if m.batch(10):
                return i
        return None

    def test_train_meter_window_skips_warmup_and_counts_cpu(self):
        m = train_meter.Meter(seconds=2.0, warmup_s=1.0)
        end = self.feed(m, 100, 0.25, cpu_per_batch=0.5)
        self.assertIsNotNone(end)
        r = m.result()
        # The window opens on the batch 1 s after the first, closes 2 s later.
        self.assertEqual(r["steady_images"], 80)
        self.assertAlmostEqual(r["steady_seconds"], 2.0)
        self.assertAlmostEqual(r["images_per_s"], 40.0)
        self.assertAlmostEqual(r["steady_client_cpu_s"], 4.0)
        self.assertIsNone(r["steady_server_cpu_s"])
        self.assertIsNone(r["steady_wire_bytes"])

    def test_train_meter_waits_for_waves(self):
        # warm_batches and min_batches hold the window open past the times.
        m = train_meter.Meter(seconds=1.0, warmup_s=0.0, warm_batches=5, min_batches=20)
        end = self.feed(m, 100, 0.1)
        r = m.result()
        self.assertEqual(end, 24)  # batch 5 opens it, 20 more close it
        self.assertEqual(r["steady_images"], 200)

    def test_train_meter_caps_window_at_three_times(self):
        m = train_meter.Meter(seconds=1.0, warmup_s=0.0, min_batches=10 ** 6)
        self.feed(m, 100, 0.5)
        self.assertAlmostEqual(m.result()["steady_seconds"], 3.0)

    def test_train_meter_short_run_falls_back(self):
        m = train_meter.Meter(seconds=10.0, warmup_s=5.0)
        self.feed(m, 3, 1.0)
        r = m.result()
        self.assertEqual(r["images"], 30)
        self.assertEqual(r["steady_images"], 30)  # everything since the first
        self.assertIsNone(r["steady_client_cpu_s"])


def dataset_context(mean_bytes=100000.0):
    """What cell_row reads of bench/train_input's run context: the
    dataset's mean JPEG size and sample count."""
    return types.SimpleNamespace(
        info={"mean_bytes": mean_bytes, "samples": 10})


def client_json(images_per_s, n=1000, cpu=1.0, server=0.5, wire=140000000, images=1200):
    return {"steady_images": n, "steady_seconds": n / images_per_s,
            "images_per_s": images_per_s, "steady_client_cpu_s": cpu,
            "steady_server_cpu_s": server, "steady_wire_bytes": wire, "images": images,
            "epoch_stats": [{"samples": 100, "bytes": 15052800}]}


class RowsTest(unittest.TestCase):
    def row(self, loader, rtt, ips, cpu=1.0, wire=140000000):
        res = {"client_cpu_s": 3.0}
        en = {"energy_j": 60.0, "energy_source": "model"}
        return ti.cell_row(dataset_context(), loader, rtt, "delayline", "", res, en,
                           client_json(ips, cpu=cpu, wire=wire))

    def test_train_input_cell_row_per_image(self):
        r = self.row("emlio-server", 30, 500.0)
        self.assertEqual(r["client_cpu_ms_per_image"], 1.0)
        self.assertEqual(r["server_cpu_ms_per_image"], 0.5)
        self.assertEqual(r["client_cpu_ms_per_image_whole_run"], 2.5)
        self.assertEqual(r["wire_bytes_per_image"], 140000)
        self.assertEqual(r["wire_vs_jpeg"], 1.4)
        self.assertEqual(r["payload_bytes_per_image"], 150528)
        self.assertEqual(r["j_per_image"], 0.05)

    def test_train_input_median_and_spread(self):
        rows = [self.row("torch-http", 30, v) for v in (90.0, 110.0, 100.0)]
        m = ti.median_row(rows)
        self.assertEqual(m["images_per_s"], 100.0)
        self.assertEqual(m["spread_pct"], 20.0)
        self.assertEqual(m["_x"]["runs"], [90.0, 100.0, 110.0])
        self.assertEqual(ti.median_row(rows[:2])["images_per_s"], 90.0)  # lower median
        self.assertEqual(ti.median_row(rows[:1])["spread_pct"], "")

    def test_train_input_targets(self):
        xe = ti.new_row("transform-emlio", "", "none", "")
        xe.update(images_per_s=900.0)
        xt = ti.new_row("transform-torchvision", "", "none", "")
        xt.update(images_per_s=300.0)
        rows = [xe, xt,
                self.row("emlio-server", 30, 1000.0, cpu=0.3, wire=130000000),
                self.row("torch-http", 30, 200.0, cpu=5.0, wire=101000000)]
        got = {name: (st, d) for name, st, d in ti.targets(rows, [30])}
        st = {k.split(" >=")[0].split(" <=")[0].split(":")[0]: v[0] for k, v in got.items()}
        self.assertEqual(st["transform alone"], "PASS")
        self.assertEqual(st["decode_at=server"], "PASS")  # 0.3 / 5.0 = 0.06x
        self.assertEqual(st["emlio-server 30 ms"], "PASS")  # 5x
        self.assertEqual(st["emlio-server wire bytes"], "PASS")  # 1.3x
        rows[2] = self.row("emlio-server", 30, 500.0, cpu=1.0, wire=150000000)
        st = [s for _, s, _ in ti.targets(rows, [30])]
        self.assertEqual(st, ["PASS", "PASS", "MISS", "MISS", "MISS"])
        st = [s for _, s, _ in ti.targets(rows[3:], [30])]
        self.assertEqual(st, ["n/a"] * 5)

    def test_train_input_parses_transform_bench(self):
        text = ("100 JPEGs, mean 110 KB, 0.19 MP; one thread\n"
                "| pipeline | images/s | vs torchvision |\n|---|---|---|\n"
                "| emlio random_resized_crop(224),horizontal_flip | 1,012 | 2.9x |\n"
                "| torchvision RandomResizedCrop(224)+RandomHorizontalFlip | 350 | 1.00x |\n"
                "| libjpeg-turbo full decode only (reference) | 445 | 1.27x |\n")
        j = ti.parse_transform_bench(text)
        self.assertEqual(j["emlio"]["images_per_cpu_s"], 1012.0)
        self.assertEqual(j["torchvision"]["images_per_cpu_s"], 350.0)
        self.assertEqual(j["libjpeg_full_decode"]["images_per_cpu_s"], 445.0)
        j = ti.parse_transform_bench('noise\n{"emlio": {"images_per_cpu_s": 5}}\n')
        self.assertEqual(j["emlio"]["images_per_cpu_s"], 5)


class PinTest(unittest.TestCase):
    def test_train_input_pins_server_and_client(self):
        self.assertEqual([ti.cpu_count(c) for c in ("0", "0-3", "0,2-3")], [1, 4, 3])
        seen = []
        real = ti.br.run_cell
        ti.br.run_cell = lambda cx, tag, server, argv, timeout, **kw: seen.append((server, argv))
        try:
            cx = dataset_context()
            cx.server_cpus, cx.client_cpus = "0", "1"
            ti.run_cell(cx, "t", {"argv": ["emliod", "--data", "d"]},
                        ["ip", "netns", "exec", "ns", "python3", "x.py"], 10)
            cx.server_cpus = None
            ti.run_cell(cx, "t", None, ["python3", "x.py"], 10)
        finally:
            ti.br.run_cell = real
        self.assertEqual(seen[0][0]["argv"], ["taskset", "-c", "0", "emliod", "--data", "d"])
        self.assertEqual(seen[0][1], ["ip", "netns", "exec", "ns", "taskset", "-c", "1",
                                      "python3", "x.py"])
        self.assertEqual(seen[1], (None, ["taskset", "-c", "1", "python3", "x.py"]))


class ClientTest(unittest.TestCase):
    def test_emlio_train_loader_unavailable_without_transform_api(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "emlio"))
            with open(os.path.join(d, "emlio", "__init__.py"), "w") as f:
                f.write("class Loader:\n"
                        "    def __init__(self, endpoints, batch_size, seed=0):\n"
                        "        raise AssertionError('must not be called')\n")
            p = subprocess.run(
                [sys.executable, os.path.join(BENCH, "emlio_train_loader.py"), "--connect",
                 "tcp://127.0.0.1:1", "--decode-at", "server"],
                env=dict(os.environ, PYTHONPATH=d), capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 3, p.stderr)
        err = json.loads(p.stdout.strip().splitlines()[-1])["error"]
        self.assertIn("transform, decode_at, transform_threads", err)


if __name__ == "__main__":
    _support.main()
