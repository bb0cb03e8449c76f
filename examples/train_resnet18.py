#!/usr/bin/env python3
# examples/train_resnet18.py - torchvision's ResNet-18, the standard ImageNet
# recipe, on uint8 tensors that emliod decodes and augments (or this host,
# or a split of the two, as decode_at says).
# SPDX-License-Identifier: MIT
"""Train torchvision's ResNet-18 for a few steps on decoded tensors.

    B=build; D=$(mktemp -d)
    $B/bin/emlio synth $D/img --samples 256 --classes 4 --quiet
    $B/bin/emliod --data $D/img --bind 'tcp://127.0.0.1:*' --transform-threads 2 &
    PYTHONPATH=bindings/python EMLIO_LIBRARY=$B/libemlio.so \\
        /usr/bin/python3 examples/train_resnet18.py --connect tcp://127.0.0.1:PORT

The recipe is torchvision's ImageNet reference: RandomResizedCrop(224) and
RandomHorizontalFlip (done by EMLIO in C, on the daemon or here), then
ToTensor's scaling and Normalize(mean, std) on the tensors (that, on a GPU,
is where normalisation belongs: a float32 tensor is 4x the bytes of the
uint8 one on the wire and in pinned memory), SGD lr 0.1 (scaled by
batch / 256), momentum 0.9, weight decay 1e-4, cross-entropy. On a CPU a
step of ResNet-18 at 224 x 224 takes seconds, so the default is a handful
of steps: the point is the plumbing (uint8 HWC block -> NCHW float on the
device), and that the loss is finite and moves.

Prints one line per step and, last, a JSON line with the losses and where
the decoding ran (the loader's transform stats).
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
import torchvision  # noqa: E402

import emlio  # noqa: E402

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def to_input(images, device):
    """uint8 (B, H, W, 3) -> normalised float (B, 3, H, W) on device."""
    x = torch.from_numpy(images).to(device, non_blocking=True)
    x = x.permute(0, 3, 1, 2).float()
    return (x - MEAN.to(device)) / STD.to(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connect", required=True, help="tcp://HOST:PORT[,...]")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--classes", type=int, default=10,
                    help="output classes (labels are taken modulo this)")
    ap.add_argument("--decode-at", default="auto",
                    choices=["auto", "client", "server"])
    ap.add_argument("--transform-threads", type=int, default=0)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = "random_resized_crop(%d),horizontal_flip" % args.size
    loader = emlio.Loader(args.connect, batch_size=args.batch, seed=args.seed,
                          transform=spec, decode_at=args.decode_at,
                          transform_threads=args.transform_threads)
    classes = max(args.classes, 2)
    model = torchvision.models.resnet18(num_classes=classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * args.batch / 256,
                          momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    losses = []
    step = 0
    epoch = 0
    t0 = time.monotonic()
    while step < args.steps:
        for batch in loader.epoch(epoch):
            x = to_input(batch.images, device)
            y = torch.from_numpy(batch.labels).to(device) % classes
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            print("step %d epoch %d loss %.4f images %s" %
                  (step, epoch, losses[-1], tuple(batch.images.shape)),
                  flush=True)
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    stats = loader.transform_stats()
    loader.close()
    print(json.dumps({"steps": step, "first_loss": losses[0],
                      "last_loss": losses[-1],
                      "finite": all(l == l and abs(l) < 1e9 for l in losses),
                      "seconds": time.monotonic() - t0,
                      "decode_at": stats.get("decode_at"),
                      "server_share": stats.get("server_share")}))


if __name__ == "__main__":
    main()
