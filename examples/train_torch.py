#!/usr/bin/env python3
# examples/train_torch.py - trains a small CNN on batches streamed by emliod.
# EmlioDataset -> DataLoader(batch_size=None) -> decode_jpeg -> resize -> CNN.
# SPDX-License-Identifier: MIT
"""Train a small CNN on JPEGs served by a running emliod.

    B=build; D=$(mktemp -d)
    $B/bin/emlio synth $D/img --samples 600 --classes 3 --bytes 8K --quiet
    $B/bin/emlio pack $D/img $D/shards --seed 1 --quiet
    $B/bin/emliod --data $D/shards --bind 'tcp://127.0.0.1:*' &
    PYTHONPATH=bindings/python EMLIO_LIBRARY=$B/libemlio.so \\
        /usr/bin/python3 examples/train_torch.py --connect tcp://127.0.0.1:PORT

Prints one line per step ("step N epoch E loss L acc A") and, last, a JSON
line: first_loss (step 0), last_loss (mean of the last few steps).

About the data: `emlio synth` tints each image by its class, class c
making channel c % 3 dominant, on top of random gradients, stripes and
noise. With up to 3 classes the classes are visually distinct (a colour
cast) and the network learns them in a few dozen steps; with more classes,
classes c and c + 3 look alike and the loss falls only to the level of
that ambiguity. `emlio pack` shuffles the records by default (seed 0, or
--seed as above; --no-shuffle sorts them by class, and then a batch from a
few-shard window holds mostly one or two classes and the loss jumps from
batch to batch). --repeat K trains on the first K batches of
epoch 0 over and over (memorization), which makes the loss fall on any
data.
"""

import argparse
import json
import os
import sys
import time

# After site-packages: an installed emlio wins, this tree's is the fallback.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                             "bindings", "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision.io import ImageReadMode, decode_jpeg  # noqa: E402

from emlio.torch import EmlioDataset  # noqa: E402


class SmallCNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def decode_batch(data, offsets, size):
    """JPEG bytes (one concatenated uint8 tensor + offsets) to a float
    NCHW batch of size x size images in [0, 1]."""
    o = offsets.tolist()
    images = []
    for i in range(len(o) - 1):
        img = decode_jpeg(data[o[i]:o[i + 1]], mode=ImageReadMode.RGB)
        img = F.interpolate(img.unsqueeze(0).float(), size=(size, size),
                            mode="bilinear", align_corners=False)
        images.append(img)
    return torch.cat(images) / 255.0


def main():
    ap = argparse.ArgumentParser(description="train a small CNN from emliod")
    ap.add_argument("--connect", required=True, help="emliod endpoint(s)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--epochs", type=int, default=100,
                    help="stop after this many epochs even if steps remain")
    ap.add_argument("--classes", type=int, default=10,
                    help="network outputs (>= the dataset's classes)")
    ap.add_argument("--size", type=int, default=64, help="resize to SxS")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shuffle", choices=("window", "none"), default="window")
    ap.add_argument("--repeat", type=int, default=0,
                    help="train on the first K batches only (memorize)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    ds = EmlioDataset(args.connect, args.batch, seed=args.seed,
                      shuffle=args.shuffle)
    loader = DataLoader(ds, batch_size=None, num_workers=0)
    model = SmallCNN(args.classes)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    def batches():
        if args.repeat:
            ds.set_epoch(0)
            fixed = []
            for item in loader:
                fixed.append((decode_batch(item[0], item[1], args.size),
                              item[2]))
                if len(fixed) == args.repeat:
                    break
            while True:
                for x, y in fixed:
                    yield 0, x, y
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            for data, offsets, labels in loader:
                yield epoch, decode_batch(data, offsets, args.size), labels

    losses = []
    t0 = time.monotonic()
    model.train()
    for step, (epoch, x, y) in enumerate(batches()):
        if step >= args.steps:
            break
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc = (logits.argmax(1) == y).float().mean().item()
        losses.append(loss.item())
        print("step %d epoch %d loss %.4f acc %.3f" % (step, epoch,
                                                        losses[-1], acc),
              flush=True)
    ds.close()
    if not losses:
        raise SystemExit("no batches: is the dataset empty?")
    k = max(1, min(10, len(losses) // 4))
    print(json.dumps({
        "steps": len(losses),
        "first_loss": losses[0],
        "last_loss": sum(losses[-k:]) / k,
        "seconds": round(time.monotonic() - t0, 3)}))


if __name__ == "__main__":
    main()
