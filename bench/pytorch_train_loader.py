#!/usr/bin/python3
"""PyTorch DataLoader baseline for bench/train_input: training-ready images.

  --mode local : torchvision ImageFolder on the local tree (PIL loader)
  --mode http  : one HTTP GET per image from nginx (keep-alive connection per
                 worker, as bench/pytorch_loader.py), then PIL in the worker

Both run RandomResizedCrop(SIZE) + RandomHorizontalFlip + PILToTensor in
the DataLoader's workers and collate uint8 (B, 3, SIZE, SIZE) tensors: what
a training step takes (normalisation to float belongs on the GPU, as for
emlio). A random permutation per epoch, repeated; the run ends --seconds
after the --warmup-s window that follows the first batch. Last stdout line:
JSON from bench/train_meter.py plus the batch shape.
"""
import argparse
import io
import json
import sys
import warnings

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

from pytorch_loader import FileBytes, Repeat, list_files
from train_meter import Meter


class HttpImages(Dataset):
    """ImageFolder's (image tensor, class) over one HTTP GET per image."""

    def __init__(self, root, host, port, tf):
        self.rel = list_files(root)
        classes = sorted({r.split("/", 1)[0] for r in self.rel})
        idx = {c: i for i, c in enumerate(classes)}
        self.labels = [idx[r.split("/", 1)[0]] for r in self.rel]
        self.fetch = FileBytes(self.rel, "http", root, host, port)
        self.tf = tf

    def __len__(self):
        return len(self.rel)

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.fetch[i])).convert("RGB")
        return self.tf(img), self.labels[i]


def main():
    warnings.filterwarnings("ignore")  # more workers than CPUs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["http", "local"], required=True)
    ap.add_argument("--root", required=True, help="ImageFolder tree")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seconds", type=float, default=10.0, help="steady window")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--warm-batches", type=int, default=1, help="batches before the window")
    ap.add_argument("--min-batches", type=int, default=1, help="batches in the window")
    ap.add_argument("--wire-dev", help="network device whose rx bytes are the wire bytes")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    tf = transforms.Compose([transforms.RandomResizedCrop(a.size),
                             transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    if a.mode == "local":
        ds = datasets.ImageFolder(a.root, transform=tf)
    else:
        ds = HttpImages(a.root, a.host, a.port, tf)
    if len(ds) == 0:
        sys.exit("pytorch_train_loader: no images under %s" % a.root)
    # Enough indices that the loader never runs dry: the meter ends the run.
    dl = DataLoader(ds, batch_size=a.batch, sampler=Repeat(len(ds), 1 << 40, a.seed),
                    num_workers=a.workers, drop_last=True)
    m = Meter(a.seconds, a.warmup_s, a.wire_dev, a.warm_batches, a.min_batches)
    shape = None
    it = iter(dl)
    for images, labels in it:
        if shape is None:
            shape = list(images.shape)
            if images.dtype != torch.uint8 or shape[1:] != [3, a.size, a.size]:
                sys.exit("pytorch_train_loader: unexpected batch %s %s" % (images.dtype, shape))
        if m.batch(len(labels)):
            break
    out = m.result()
    del it  # shut the workers down
    out.update(loader="torch-" + a.mode, workers=a.workers, batch=a.batch, shape=shape,
               dtype="uint8")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
