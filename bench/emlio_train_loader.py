#!/usr/bin/python3
"""emlio client for bench/train_input: training-ready images from emliod.

emlio.Loader with a transform spec and a placement (decode_at server, client
or auto); each batch's images are a uint8 (B, SIZE, SIZE, 3) NumPy array in
the consumer's hands (zero-copy). Epochs run back to back until the
--seconds steady window after --warmup-s is over. Last stdout line: JSON
from bench/train_meter.py, plus the loader's stats (placement, bytes).

Exit status 3, with {"error": ...} as the JSON line, when this emlio has no
transform API yet (issue 17), so the harness can report the row as missing
rather than failed.
"""
import argparse
import inspect
import json
import os
import sys

from train_meter import Meter

HERE = os.path.dirname(os.path.abspath(__file__))
# After PYTHONPATH (bench/train_input sets it; a test may put a stand-in first).
sys.path.append(os.path.join(os.path.dirname(HERE), "bindings", "python"))

NEEDED = ("transform", "decode_at", "transform_threads")


def unavailable(why):
    print(json.dumps({"error": why}), flush=True)
    sys.exit(3)


def loader_stats(ld):
    """Whatever figures the Loader has, merged: epoch_stats() (bytes,
    samples, path), then stats() and transform_stats() (issue 17: where the
    transforms ran, and why), where they exist. Never fails the run."""
    out = {}
    for name in ("epoch_stats", "stats", "transform_stats"):
        fn = getattr(ld, name, None)
        if not callable(fn):
            continue
        try:
            d = fn()
        except Exception as e:  # figures are optional, the images are not
            out[name + "_error"] = "%s: %s" % (type(e).__name__, e)
            continue
        if not isinstance(d, dict):
            d = {name: d}
        out.update((k, v) for k, v in d.items()
                   if isinstance(v, (int, float, str, bool, list, dict, type(None))))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connect", required=True)
    ap.add_argument("--decode-at", choices=["server", "client", "auto"], required=True)
    ap.add_argument("--transform-threads", type=int, default=2,
                    help="client-side decode threads (transform_threads)")
    ap.add_argument("--spec", default="random_resized_crop(224),horizontal_flip")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0, help="steady window")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--warm-batches", type=int, default=1, help="batches before the window")
    ap.add_argument("--min-batches", type=int, default=1, help="batches in the window")
    ap.add_argument("--wire-dev")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loader-args", default="{}", help="JSON of further Loader keywords")
    a = ap.parse_args()

    try:
        import emlio
    except Exception as e:
        unavailable("cannot import emlio (%s: %s)" % (type(e).__name__, e))
    params = inspect.signature(emlio.Loader.__init__).parameters
    missing = [p for p in NEEDED if p not in params]
    if missing and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unavailable("emlio.Loader has no %s argument: the transform API of issue 17 is not in "
                    "this tree" % ", ".join(missing))
    try:
        ld = emlio.Loader(a.connect, batch_size=a.batch, seed=a.seed, transform=a.spec,
                          decode_at=a.decode_at, transform_threads=a.transform_threads,
                          **json.loads(a.loader_args))
    except TypeError as e:
        unavailable("emlio.Loader refused the transform arguments: %s" % e)
    want = (a.size, a.size, 3)
    m = Meter(a.seconds, a.warmup_s, a.wire_dev, a.warm_batches, a.min_batches)
    done, epoch, per_epoch = False, 0, []
    with ld:
        while not done:
            for b in ld.epoch(epoch):
                imgs = b.images
                if imgs.dtype.name != "uint8" or tuple(imgs.shape[1:]) != want \
                        or imgs.shape[0] != len(b):
                    sys.exit("emlio_train_loader: batch %d of epoch %d is %s %s, expected "
                             "uint8 (%d, %d, %d, 3)" % (b.index, epoch, imgs.dtype,
                                                        imgs.shape, len(b), a.size, a.size))
                # The consumer reads the tensor (one byte per image here; a
                # training step would copy it to the GPU).
                int(imgs[:, a.size // 2, a.size // 2, 0].sum())
                if m.batch(len(b)):
                    done = True
                    break
            per_epoch.append(loader_stats(ld))
            epoch += 1
        out = m.result()
        out.update(loader="emlio-" + a.decode_at, decode_at=a.decode_at,
                   transform_threads=a.transform_threads, batch=a.batch,
                   shape=[a.batch, a.size, a.size, 3], dtype="uint8", epochs=epoch,
                   stats=per_epoch[-1] if per_epoch else {},
                   epoch_stats=per_epoch[:-1][-8:])
    print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
