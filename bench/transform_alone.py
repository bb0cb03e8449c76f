#!/usr/bin/python3
"""The transform alone, one core: EMLIO's C transform vs PIL + torchvision.

bench/train_input's fallback while bench/transform_bench.py (issue 17's own
micro-benchmark) is not in the tree. Both sides get the same JPEG files,
read into memory first (no file I/O in the loop), and run
RandomResizedCrop(SIZE) + horizontal flip to a uint8 tensor in one thread:
  emlio        emlio_transform_apply() of LIB (ctypes), spec
               "random_resized_crop(SIZE),horizontal_flip", seed 1, a new
               epoch per pass over the files (new crops)
  torchvision  PIL.Image.open().convert("RGB") + RandomResizedCrop(SIZE) +
               RandomHorizontalFlip + PILToTensor (torch threads: 1)
Rate per core = images / CPU-seconds of the measuring thread
(time.thread_time), so other load on the machine slows the wall clock but
not the figure. Each side runs --repeat times for --seconds; median and
spread. Usage: transform_alone.py --root TREE --lib LIBEMLIO [--which emlio,torchvision]
Last stdout line: JSON {"emlio": {...} | {"error": ...}, "torchvision": {...}}.
"""
import argparse
import ctypes
import io
import json
import os
import statistics
import sys
import time

from pytorch_loader import list_files


def load_files(root, limit):
    out = [(rel, open(os.path.join(root, rel), "rb").read()) for rel in list_files(root)]
    # Spread the subset over all classes rather than the first few.
    step = max(1, len(out) // limit)
    return out[::step][:limit]


def timed(step, files, seconds):
    """Runs step(name, data, pass) over files until `seconds` of thread CPU;
    returns (images, thread CPU s, wall s)."""
    c0, w0 = time.thread_time(), time.monotonic()
    n, p = 0, 0
    while True:
        for i, (name, data) in enumerate(files):
            step(i, name, data, p)
            n += 1
            if time.thread_time() - c0 >= seconds:
                return n, time.thread_time() - c0, time.monotonic() - w0
        p += 1


def emlio_side(lib_path, size):
    """The step function over libemlio's transform, or raises RuntimeError."""
    try:
        lib = ctypes.CDLL(lib_path)
    except OSError as e:
        raise RuntimeError("cannot load %s: %s" % (lib_path, e))
    try:
        parse, apply_ = lib.emlio_transform_parse, lib.emlio_transform_apply
        ws_new, out_bytes = lib.emlio_transform_ws_new, lib.emlio_transform_output_bytes
        skey = lib.emlio_transform_sample_key
    except AttributeError as e:
        raise RuntimeError("%s has no transform module (issue 17 not built in): %s"
                           % (lib_path, e))
    vp, u64 = ctypes.c_void_p, ctypes.c_uint64
    parse.argtypes = [ctypes.c_char_p, ctypes.POINTER(vp), ctypes.c_char_p, ctypes.c_size_t]
    parse.restype = ctypes.c_int
    ws_new.argtypes, ws_new.restype = [], vp
    out_bytes.argtypes, out_bytes.restype = [vp], ctypes.c_size_t
    skey.argtypes, skey.restype = [ctypes.c_char_p, u64], u64
    apply_.argtypes = [vp, vp, ctypes.c_char_p, ctypes.c_size_t, u64, u64, u64, vp,
                       ctypes.c_char_p, ctypes.c_size_t]
    apply_.restype = ctypes.c_int
    err = ctypes.create_string_buffer(512)
    t = vp()
    spec = "random_resized_crop(%d),horizontal_flip" % size
    if parse(spec.encode(), ctypes.byref(t), err, len(err)) < 0:
        raise RuntimeError("emlio_transform_parse(%r): %s" % (spec, err.value.decode()))
    ws = ws_new()
    nout = out_bytes(t)
    if not ws or nout != size * size * 3:
        raise RuntimeError("emlio transform: workspace %s, output %d bytes" % (ws, nout))
    out = ctypes.create_string_buffer(nout)
    keys = {}

    def step(i, name, data, p):
        k = keys.get(i)
        if k is None:
            k = keys[i] = skey(name.encode(), i)
        rc = apply_(t, ws, data, len(data), 1, p, k, out, err, len(err))
        if rc < 0:
            raise RuntimeError("emlio_transform_apply(%s): %d %s" % (name, rc, err.value.decode()))
    return step


def torchvision_side(size):
    import torch
    from PIL import Image
    from torchvision import transforms
    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.PILToTensor()])

    def step(i, name, data, p):
        tf(Image.open(io.BytesIO(data)).convert("RGB"))
    return step


def measure(make, files, seconds, repeat):
    try:
        step = make()
        step(0, files[0][0], files[0][1], 0)  # warm: first-call costs, page faults
    except Exception as e:
        return {"error": "%s" % e}
    rates, walls = [], []
    for _ in range(repeat):
        n, cpu, wall = timed(step, files, seconds)
        rates.append(n / cpu)
        walls.append(n / wall)
    med = statistics.median(rates)
    return {"images_per_cpu_s": round(med, 1), "images_per_wall_s": round(statistics.median(walls), 1),
            "runs": [round(r, 1) for r in rates],
            "spread_pct": round(100 * (max(rates) - min(rates)) / med, 1)
            if med and len(rates) > 1 else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--lib", required=True, help="libemlio.so")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--files", type=int, default=300, help="distinct JPEGs in the loop")
    ap.add_argument("--seconds", type=float, default=5.0, help="CPU-seconds per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--which", default="emlio,torchvision")
    a = ap.parse_args()
    files = load_files(a.root, a.files)
    if not files:
        sys.exit("transform_alone: no JPEGs under %s" % a.root)
    res = {"files": len(files), "mean_bytes": round(sum(len(d) for _, d in files) / len(files)),
           "size": a.size}
    sides = {"emlio": lambda: emlio_side(a.lib, a.size), "torchvision": lambda: torchvision_side(a.size)}
    for w in a.which.split(","):
        res[w] = measure(sides[w], files, a.seconds, a.repeat)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
