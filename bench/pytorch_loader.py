#!/usr/bin/python3
"""PyTorch DataLoader baseline for bench/run: raw bytes, one file per sample.

  --mode http  : one HTTP GET per sample (keep-alive connection per worker)
                 against BASE_URL/<relative path>, e.g. nginx behind a relay
  --mode local : open()+read() of each file of the local ImageFolder tree

No decode (EMLIO delivers bytes too). Batches are collated into one flat
uint8 tensor plus an int64 offsets tensor (what a real pipeline hands to a
decoder), which crosses the worker->main boundary in shared memory; or with
--collate bytes as a pickled list of bytes objects.

Runs until --max-samples or --max-seconds after the first batch (whichever
comes first), with a
random permutation per epoch. Last stdout line: JSON with the totals and
the steady-state rate (batches arriving after --warmup-s from the first).
"""
import argparse
import http.client
import json
import os
import sys
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


def list_files(root):
    out = []
    for d in sorted(os.listdir(root)):
        p = os.path.join(root, d)
        if not os.path.isdir(p):
            continue
        for f in sorted(os.listdir(p)):
            if f.lower().endswith((".jpg", ".jpeg")):
                out.append(d + "/" + f)
    return out


class _Conn:
    pid = None
    conn = None


class FileBytes(Dataset):
    def __init__(self, rel, mode, root, host, port):
        self.rel, self.mode, self.root = rel, mode, root
        self.host, self.port = host, port

    def __len__(self):
        return len(self.rel)

    def _http_get(self, path):
        for attempt in range(3):
            if _Conn.pid != os.getpid() or _Conn.conn is None:
                _Conn.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                _Conn.pid = os.getpid()
            try:
                _Conn.conn.request("GET", "/" + path)
                r = _Conn.conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise RuntimeError("HTTP %d for /%s" % (r.status, path))
                return body
            except (http.client.HTTPException, OSError):
                _Conn.conn.close()
                _Conn.conn = None
                if attempt == 2:
                    raise
        raise RuntimeError("unreachable")

    def __getitem__(self, i):
        path = self.rel[i]
        if self.mode == "http":
            return self._http_get(path)
        with open(os.path.join(self.root, path), "rb") as f:
            return f.read()


class Repeat(Sampler):
    """Random permutation per epoch, `total` indices in all; with world > 1,
    this rank's strided share of each permutation (as DistributedSampler)."""

    def __init__(self, n, total, seed, rank=0, world=1):
        self.n, self.total, self.seed = n, total, seed
        self.rank, self.world = rank, world

    def __len__(self):
        return self.total

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed)
        left, epoch = self.total, 0
        while left > 0:
            perm = torch.randperm(self.n, generator=g).tolist()[self.rank::self.world]
            for i in perm[:left]:
                yield i
            left -= min(left, len(perm))
            epoch += 1


def collate_tensor(batch):
    sizes = torch.tensor([len(b) for b in batch], dtype=torch.int64)
    flat = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    off = 0
    for b in batch:
        n = len(b)
        flat[off:off + n] = torch.frombuffer(b, dtype=torch.uint8)
        off += n
    return flat, torch.cumsum(sizes, 0)


def collate_bytes(batch):
    return batch


def main():
    warnings.filterwarnings("ignore")  # frombuffer on read-only bytes; >2 workers on 2 CPUs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["http", "local"], required=True)
    ap.add_argument("--root", required=True, help="ImageFolder tree (file list; local reads)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-samples", type=int, default=10000)
    ap.add_argument("--max-seconds", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--collate", choices=["tensor", "bytes"], default="tensor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compute-s", type=float, default=0.0,
                    help="hold each batch S seconds, as an accelerator would; reports "
                    "accelerator utilisation (compute / wall), as MLPerf Storage does")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    a = ap.parse_args()

    rel = list_files(a.root)
    if not rel:
        sys.exit("pytorch_loader: no .jpg files under %s" % a.root)
    ds = FileBytes(rel, a.mode, a.root, a.host, a.port)
    # Enough indices that the loader never runs dry before --max-seconds.
    total = max(a.max_samples, a.batch)
    dl = DataLoader(ds, batch_size=a.batch, sampler=Repeat(len(rel), total, a.seed, a.rank, a.world),
                    num_workers=a.workers,
                    collate_fn=collate_tensor if a.collate == "tensor" else collate_bytes)
    t0 = time.monotonic()
    stamps = []  # (time, samples, bytes) per batch
    samples = nbytes = 0
    computed = 0.0
    it = iter(dl)
    for batch in it:
        if a.collate == "tensor":
            n, b = len(batch[1]), int(batch[0].numel())
        else:
            n, b = len(batch), sum(len(x) for x in batch)
        samples += n
        nbytes += b
        if a.compute_s > 0:  # the accelerator works on the batch
            c0 = time.monotonic()
            time.sleep(a.compute_s)
            computed += time.monotonic() - c0
        now = time.monotonic()
        stamps.append((now, n, b))
        # --max-seconds counts from the first batch: 128 workers take seconds to
        # start, which must not eat the measured window.
        if now - stamps[0][0] >= a.max_seconds or samples >= a.max_samples:
            break
    t_end = time.monotonic()
    del it  # shut the workers down
    first = stamps[0][0] - t0 if stamps else 0.0
    # Steady state: batches that arrive after the warm-up window.
    i0 = 0
    if stamps:
        while i0 < len(stamps) - 1 and stamps[i0][0] - stamps[0][0] < a.warmup_s:
            i0 += 1
        if len(stamps) - 1 - i0 < 4:  # too short a window: use everything after batch 0
            i0 = 0
    ss = sum(s[1] for s in stamps[i0 + 1:])
    sb = sum(s[2] for s in stamps[i0 + 1:])
    sdt = stamps[-1][0] - stamps[i0][0] if len(stamps) > 1 else 0.0
    out = {
        "loader": "pytorch-" + ("net" if a.mode == "http" else "local"),
        "workers": a.workers, "batch": a.batch, "collate": a.collate,
        "samples": samples, "bytes": nbytes, "seconds": round(t_end - t0, 6),
        "first_batch_s": round(first, 6),
        "steady_samples": ss, "steady_bytes": sb, "steady_seconds": round(sdt, 6),
        "samples_per_s": round(ss / sdt, 1) if sdt > 0 else 0.0,
        "mb_per_s": round(sb / sdt / 1e6, 2) if sdt > 0 else 0.0,
        "compute_s": round(computed, 6),
        "au": round(computed / (t_end - t0), 4) if t_end > t0 else 0.0,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
