# emlio/torch.py - EmlioDataset, a PyTorch IterableDataset over emlio.Loader.
# Imports torch only when this module is imported.
# SPDX-License-Identifier: MIT
"""PyTorch adapter.

    from emlio.torch import EmlioDataset, DataLoader
    ds = EmlioDataset("tcp://node1:5555", batch_size=256, seed=1)
    loader = DataLoader(ds)   # batch_size=None implied; num_workers=0:
                              # EMLIO's threads are in C already
    for epoch in range(10):
        for data, offsets, labels in tqdm(loader):  # len(loader) = batches
            jpeg_i = data[offsets[i]:offsets[i + 1]]   # uint8 tensor
        torch.save(loader.state_dict(), "ckpt")     # resumable mid-epoch

Each item is one whole batch (EMLIO batches on the daemon side), so a
DataLoader must not batch again: ``emlio.torch.DataLoader`` (a
``torch.utils.data.DataLoader`` subclass) sets ``batch_size=None``, and
a plain ``torch.utils.data.DataLoader(ds, batch_size=None)`` works too;
any other ``batch_size`` or ``shuffle=True`` raises ``ValueError`` at once.

By default an item is a tuple ``(data, offsets, labels)``: every sample's
bytes copied into one contiguous uint8 tensor, int64 offsets of length
B + 1, and int64 labels of length B. With ``output="list"`` an item is
``(list of B uint8 tensors, labels)``. With ``transform="SPEC"`` (a string:
EMLIO's own decode and augment in C, docs/transform.md, placed by
``decode_at``) an item is ``(images, labels)``: images a uint8 tensor
(B, H, W, 3) that ``pin_memory`` and ``.cuda(non_blocking=True)`` accept;
with ``layout="CHW"`` the same memory seen as (B, 3, H, W), which is
PyTorch's channels_last format: no copy, and what cuDNN convolutions run
fastest on. :func:`normalize` turns either into float on the device, as
torchvision's ``ToTensor()`` + ``Normalize(mean, std)`` do::

    ds = EmlioDataset(ep, 256, transform="random_resized_crop(224)",
                      layout="CHW")
    for images, labels in DataLoader(ds, pin_memory=True):
        x = emlio.torch.normalize(images.cuda(non_blocking=True))

With ``transform=f``, ``f`` runs on
each sample (a 1-D uint8 tensor of its bytes; a dict {field: tensor} with
``fields=``) inside the DataLoader worker, and an item is ``(samples,
labels)``: the results stacked into one tensor when they are tensors of
one shape, else a list.

``len(ds)`` is the number of batches this rank gets per epoch (equal on
every rank), whatever ``num_workers`` is.

Workers: with ``num_workers=W > 0`` the workers split this rank's batches
of the epoch (worker w takes every W-th of those not yet delivered), each
through its own connection, so together they deliver every batch of the
rank exactly once, the same batches as with ``num_workers=0``, and the
DataLoader hands them out in plan order. ``emlio.torch.DataLoader`` moves
to the next epoch on each ``iter()`` (``set_epoch`` chooses one) and keeps
track of the batches handed out in this process, so ``state_dict()`` and
``load_state_dict()`` (on the loader or the dataset) resume exactly the
batches not yet handed out, with or without workers. With a plain torch
DataLoader and workers, the workers run on copies of the dataset: call
``set_epoch`` each epoch, and resume state is not available (the dataset
cannot see what the DataLoader handed out).

Rank and world size: the arguments, else ``torch.distributed`` when it is
initialized, else RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, else 0 of 1.
"""

import os
import sys

import torch
import torch.utils.data as _tud
from torch.utils.data import IterableDataset, get_worker_info

from . import _state
from .errors import StateError
from .loader import Loader, rank_and_world


def _dist_rank_world():
    try:
        import torch.distributed as dist
    except ImportError:
        return None, None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, None


def _check_not_batched(ds):
    """Raises when a DataLoader batches the items again (batch_size not
    None): they would come out wrapped in an extra dimension and fail far
    from the cause. The fetcher that calls iter() on the dataset says
    whether it collates (torch.utils.data._utils.fetch)."""
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            return
        obj = f.f_locals.get("self")
        if (type(obj).__name__ == "_IterableDatasetFetcher" and
                getattr(obj, "dataset", None) is ds):
            if obj.auto_collation:
                raise ValueError(
                    "EmlioDataset yields whole batches: create the "
                    "DataLoader with batch_size=None (or use "
                    "emlio.torch.DataLoader), not batch_size=%s"
                    % getattr(obj, "batch_size", "N"))
            return
        f = f.f_back


class EmlioDataset(IterableDataset):
    """An IterableDataset yielding whole EMLIO batches as tensors.

    ``endpoints``, ``batch_size`` and the keyword arguments are those of
    :class:`emlio.Loader` (seed, shuffle, drop_last, in_order, streams,
    inflight, verify, timeout_ms, connect_timeout_ms, server_key,
    client_key, ...), except ``epochs``: each ``iter()`` runs one epoch,
    the next one, unless :meth:`set_epoch` chose it. ``output`` is
    "concat" (default) or "list"; ``skip_pad`` leaves out padding repeats;
    ``transform`` is EMLIO's transform spec when a string (decoded
    tensors, see :class:`emlio.Loader`'s ``transform`` and ``decode_at``),
    or a callable applied to each sample in the worker. ``layout``, for
    a spec: "HWC" (default, images (B, H, W, 3)) or "CHW" (the same
    memory as (B, 3, H, W), channels_last; no copy).
    """

    def __init__(self, endpoints=None, batch_size=None, *, rank=None,
                 world_size=None, output="concat", skip_pad=False, state=None,
                 transform=None, layout="HWC", **loader_kw):
        super().__init__()
        if batch_size is None:
            raise TypeError("EmlioDataset() needs batch_size")
        if endpoints is None and loader_kw.get("sources") is None:
            raise TypeError("EmlioDataset() needs endpoints (or sources=)")
        if output not in ("concat", "list"):
            raise ValueError("invalid output=%r: expected 'concat' or "
                             "'list'" % (output,))
        if layout not in LAYOUTS:
            raise ValueError("invalid layout=%r: expected 'HWC' or 'CHW'"
                             % (layout,))
        self.layout = layout
        if isinstance(transform, str):
            # EMLIO's spec: the C client decodes; items carry tensors.
            loader_kw["transform"] = transform
            self.spec = transform
            transform = None
        else:
            self.spec = None
        if transform is not None and not callable(transform):
            raise TypeError("transform must be a spec string or callable, "
                            "not %s" % type(transform).__name__)
        if "epochs" in loader_kw:
            raise TypeError("EmlioDataset runs one epoch per iter(); use "
                            "set_epoch() instead of epochs=")
        if rank is None or world_size is None:
            dr, dw = _dist_rank_world()
            rank = dr if rank is None else rank
            world_size = dw if world_size is None else world_size
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.endpoints = endpoints
        self.batch_size = batch_size
        self.output = output
        self.skip_pad = skip_pad
        self.transform = transform
        self._loader_kw = loader_kw
        self._epoch = None
        self._next_epoch = 0
        self._loader = None
        self._loader_key = None
        self._probed = None  # {"batches", "header", "classes"} of the plan
        self._resume = None  # (epoch, set of delivered batches) to resume
        self._resume_header = None  # that state's header (config, dataset)
        self._resume_batches = None  # (epoch, its batches in that state)
        self._state = None  # the blob behind _resume, for num_workers=0
        self._run = None  # (epoch, delivered at start, order of the rest)
        self._handed = 0  # batches of _run handed out by the DataLoader
        if state is not None:
            self.load_state_dict(state)

    # -- epochs, length, plan ------------------------------------------

    def set_epoch(self, epoch):
        """The epoch the next iter() runs."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError("invalid epoch=%r: expected an integer >= 0"
                             % (epoch,))
        self._epoch = epoch

    def _probe(self):
        """This rank's batches per epoch and the header of its resume
        states, from a short-lived connection that asks for one batch
        (cached; the DataLoader's workers inherit it)."""
        if self._probed is None:
            kw = dict(self._loader_kw, inflight=1, streams=1,
                      name="emlio-python-probe")
            with Loader(self.endpoints, self.batch_size, epochs=1,
                        rank=self.rank, world_size=self.world_size,
                        **kw) as ld:
                n = ld.begin_epoch(0)
                blob = ld.state_dict()["emlio_state"]
                classes = ld.classes
            self._probed = {"batches": n, "header": _state.parse(blob)[0],
                            "classes": classes}
        return self._probed

    @property
    def classes(self):
        """Class names in label order, as torchvision's ImageFolder has
        them (the union over every daemon, sorted), when the daemons know
        them (an ImageFolder tree, or the classes.txt of emlio pack); None
        otherwise. Asks the daemons once (cached)."""
        classes = self._probe()["classes"]
        return None if classes is None else list(classes)

    @property
    def class_to_idx(self):
        """{class name: label}, as torchvision's ImageFolder has it; None
        when the daemons know no class names."""
        classes = self.classes
        return None if classes is None else {c: i for i, c in
                                              enumerate(classes)}

    def __len__(self):
        """Batches per epoch for this rank (all workers together)."""
        return self._probe()["batches"]

    def _take_epoch(self):
        """The epoch the next iteration runs; advances the next one."""
        if self._epoch is not None:
            epoch, self._epoch = self._epoch, None
        else:
            epoch = self._next_epoch
        self._next_epoch = epoch + 1
        return epoch

    def _check_resume_header(self, epoch):
        """The probe for epoch ({"batches", "header"}), after checking that
        a loaded state fits this dataset (the library checks it too, but
        the workers write their own headers)."""
        probe = self._probe()
        if self._resume_header is None:
            return probe
        h = _state.HEADER
        if self._resume_header[8:h] != probe["header"][8:h]:
            raise StateError(-1013, "resume state was made with another "
                             "seed, world, rank, batch size, shuffle or "
                             "dataset than this EmlioDataset")
        # The loaded state's own cursor of the shared schedule goes on; what
        # earlier runs consumed (elastic resume) is of its epoch only, whose
        # plan is the rest, with its own batch count.
        if self._resume_batches and self._resume_batches[0] == epoch:
            return dict(probe, header=self._resume_header,
                        batches=self._resume_batches[1])
        return dict(probe, header=_state.without_spans(self._resume_header))

    def _delivered_at_start(self, epoch):
        if self._resume is not None and self._resume[0] == epoch:
            return set(self._resume[1])
        return set()

    # -- iteration --------------------------------------------------------

    def __iter__(self):
        _check_not_batched(self)
        info = get_worker_info()
        if info is None:
            return self._iter_main()
        return self._iter_worker(info.id, info.num_workers)

    def _iter_main(self):
        """num_workers=0: one Loader in this process, kept across epochs."""
        loader = self._get_loader()
        epoch = self._take_epoch()
        self._run = None
        self._resume = None  # the loader has it (state=)
        # The loader continues a loaded resume state for this epoch.
        for batch in loader.epoch(epoch):
            yield self._convert(batch)

    def _iter_worker(self, worker, workers):
        """A DataLoader worker: this rank's batches of the epoch that are
        not delivered yet, every workers-th of them from the worker-th on,
        in plan order (so the DataLoader's round robin hands out the rank's
        batches in plan order, and what it handed out is always the
        delivered set plus a prefix of the rest)."""
        if self._run is not None:
            epoch, done, rest = self._run  # set by emlio.torch.DataLoader
        else:
            epoch = self._take_epoch()
            done = self._delivered_at_start(epoch)
            rest = None
        probe = self._check_resume_header(epoch)
        n = probe["batches"]
        if rest is None:
            rest = [i for i in range(n) if i not in done]
        mine = set(rest[worker::workers])
        if not mine:
            return
        blob = _state.make(probe["header"], epoch, n,
                           set(range(n)) - mine)
        kw = dict(self._loader_kw, in_order=True)
        with Loader(self.endpoints, self.batch_size, epochs=epoch + 1,
                    rank=self.rank, world_size=self.world_size,
                    **kw) as loader:
            loader.load_state_dict(blob)
            for batch in loader.epoch(epoch):
                yield self._convert(batch)

    def _get_loader(self):
        key = (self.rank, self.world_size, os.getpid())
        if self._loader is None or self._loader_key != key:
            if self._loader is not None:
                self._loader.close()
            self._loader = Loader(self.endpoints, self.batch_size,
                                  rank=self.rank, world_size=self.world_size,
                                  state=self._state, **self._loader_kw)
            self._loader_key = key
            self._state = None
        return self._loader

    # -- resume state ----------------------------------------------------

    def state_dict(self):
        """Resume state in this process: what emlio.torch.DataLoader (or,
        with num_workers=0, this dataset) has handed out. Same layout as
        emlio.Loader.state_dict()."""
        if self._run is not None:
            epoch, done, rest = self._run
            delivered = done | set(rest[:self._handed])
            probe = self._check_resume_header(epoch)
            blob = _state.make(probe["header"], epoch, probe["batches"],
                               delivered)
            return {"emlio_state": blob, "epoch": epoch,
                    "next_epoch": self._next_epoch,
                    "batch_size": self.batch_size, "rank": self.rank,
                    "world_size": self.world_size}
        if self._loader is not None and self._loader._pid == os.getpid():
            st = self._loader.state_dict()
            st["next_epoch"] = self._next_epoch
            return st
        raise RuntimeError(
            "no epoch has been run through this EmlioDataset in this "
            "process: with num_workers > 0, iterate it through "
            "emlio.torch.DataLoader, which records the batches it hands "
            "out (a plain torch DataLoader cannot tell the dataset)")

    def _merge_states(self, states):
        """Elastic resume: every rank's state of the last run, merged by
        the library into this rank's state of the rest of their epoch (a
        one-rank state whose header carries what the job consumed)."""
        kw = dict(self._loader_kw, inflight=1, streams=1,
                  name="emlio-python-resume")
        with Loader(self.endpoints, self.batch_size, rank=self.rank,
                    world_size=self.world_size, **kw) as ld:
            ld.load_state_dict(list(states))
            return ld.state_dict()["emlio_state"]

    def load_state_dict(self, state):
        """Resumes from state_dict(): the saved epoch runs next and
        delivers exactly the batches not handed out before (with any
        num_workers), then the epochs after it."""
        if isinstance(state, (list, tuple)):
            state = self._merge_states(state)
        blob = state["emlio_state"] if isinstance(state, dict) else state
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError("state must be the dict state_dict() returned "
                            "or its 'emlio_state' bytes, not %s"
                            % type(blob).__name__)
        try:
            header, epoch, n, done = _state.parse(blob)
        except ValueError as exc:
            raise StateError(-1013, str(exc)) from None
        self._resume = (epoch, done)
        self._resume_header = header
        self._resume_batches = (epoch, n)
        self._state = bytes(blob)
        self._run = None
        self._handed = 0
        self._epoch = None
        self._next_epoch = epoch if len(done) < n else epoch + 1
        if self._loader is not None:
            self._loader.close()
            self._loader = None

    def epoch_stats(self):
        return self._get_loader().epoch_stats()

    # -- conversion --------------------------------------------------------

    def _convert(self, batch):
        if self.spec is not None:
            return self._images(batch)
        if self.transform is not None:
            return self._transformed(batch)
        if self._loader_kw.get("fields") is not None:
            return self._convert_fields(batch)
        labels = torch.from_numpy(batch.labels)
        if self.skip_pad:
            keep = ~batch.pads
            if not keep.all():
                samples = [s for s, k in zip(batch.samples, keep) if k]
                labels = labels[torch.from_numpy(keep)]
                return self._from_views(samples, labels)
        if self.output == "list":
            return self._from_views(batch.samples, labels)
        data, offsets = batch.concat()
        return torch.from_numpy(data), torch.from_numpy(offsets), labels

    def _images(self, batch):
        """(uint8 images (B, H, W, 3), labels): a tensor over the batch's
        block, no copy (issue 31: the block was copied here, then again by
        pin_memory); the tensor keeps the batch alive, and the batch goes
        back to the client once the tensor and its views are gone."""
        images = torch.from_numpy(batch.hold_images())
        labels = torch.from_numpy(batch.labels)
        if self.skip_pad:
            keep = torch.from_numpy(~batch.pads)
            if not bool(keep.all()):
                images, labels = images[keep], labels[keep]
        if self.layout == "CHW":
            images = images.permute(0, 3, 1, 2)  # a view: channels_last
        return images, labels

    def _transformed(self, batch):
        """(transform of each sample, labels); stacked when possible."""
        keep = (~batch.pads).tolist() if self.skip_pad else None
        labels = torch.from_numpy(batch.labels)
        fields = batch._owner().fields if self._loader_kw.get(
            "fields") is not None else None
        if fields is not None:
            cols = {f: batch.field(f) for f in fields}
            samples = [{f: torch.from_numpy(cols[f][i].copy())
                        for f in fields} for i in range(len(batch))]
        else:
            samples = [torch.from_numpy(v.copy()) for v in batch.samples]
        if keep is not None:
            samples = [s for s, k in zip(samples, keep) if k]
            labels = labels[torch.tensor(keep, dtype=torch.bool)]
        out = [self.transform(s) for s in samples]
        if out and all(isinstance(o, torch.Tensor) for o in out) and \
                len({tuple(o.shape) for o in out}) == 1:
            out = torch.stack(out)
        return out, labels

    def _convert_fields(self, batch):
        """fields=[...]: ({field: (data, offsets)}, labels), or with
        output="list" ({field: [tensor per sample]}, labels)."""
        keep = ~batch.pads if self.skip_pad else None
        labels = torch.from_numpy(batch.labels)
        if keep is not None:
            labels = labels[torch.from_numpy(keep)]
        out = {}
        for f in batch._owner().fields:
            if self.output == "list" or keep is not None:
                views = batch.field(f)
                if keep is not None:
                    views = [v for v, k in zip(views, keep.tolist()) if k]
                made = self._from_views(views, labels)
                out[f] = made[0] if self.output == "list" else made[:2]
            else:
                data, offsets = batch.concat_field(f)
                out[f] = (torch.from_numpy(data), torch.from_numpy(offsets))
        return out, labels

    def _from_views(self, views, labels):
        if self.output == "list":
            return [torch.from_numpy(v.copy()) for v in views], labels
        lens = torch.tensor([len(v) for v in views], dtype=torch.int64)
        offsets = torch.zeros(len(views) + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=offsets[1:])
        data = torch.empty(int(offsets[-1]), dtype=torch.uint8)
        flat = data.numpy()
        for v, a, b in zip(views, offsets[:-1].tolist(),
                           offsets[1:].tolist()):
            flat[a:b] = v
        return data, offsets, labels

    def close(self):
        if self._loader is not None:
            self._loader.close()
            self._loader = None

    def __getstate__(self):
        # The live Loader (a C client) does not travel to worker processes;
        # each worker makes its own.
        d = dict(self.__dict__)
        d["_loader"] = None
        d["_loader_key"] = None
        return d


class DataLoader(_tud.DataLoader):
    """A torch DataLoader for an EmlioDataset: batch_size=None (items are
    whole batches), the next epoch on each iter(), and state_dict() /
    load_state_dict() that resume exactly the batches not handed out yet,
    with or without workers. persistent_workers is not supported (each
    epoch's workers get the epoch and what to skip when they start)."""

    def __init__(self, dataset, *args, **kw):
        if not isinstance(dataset, EmlioDataset):
            raise TypeError("emlio.torch.DataLoader needs an EmlioDataset, "
                            "not %s" % type(dataset).__name__)
        if args:
            raise TypeError("pass DataLoader options by keyword")
        if kw.setdefault("batch_size", None) is not None:
            raise ValueError("EmlioDataset yields whole batches: "
                             "batch_size must be None, not %r"
                             % (kw["batch_size"],))
        if kw.get("shuffle"):
            raise ValueError("shuffle=True does not apply: the daemons' "
                             "plan shuffles (EmlioDataset(shuffle=..., "
                             "seed=...))")
        if kw.get("persistent_workers"):
            raise ValueError("persistent_workers=True is not supported "
                             "with EmlioDataset")
        super().__init__(dataset, **kw)

    def __iter__(self):
        ds = self.dataset
        if self.num_workers == 0:
            yield from super().__iter__()
            return
        epoch = ds._take_epoch()
        n = ds._check_resume_header(epoch)["batches"]
        done = ds._delivered_at_start(epoch)
        ds._run = (epoch, done, [i for i in range(n) if i not in done])
        ds._handed = 0
        ds._resume = None
        for item in super().__iter__():
            ds._handed += 1
            yield item

    def state_dict(self):
        return self.dataset.state_dict()

    def load_state_dict(self, state):
        self.dataset.load_state_dict(state)


LAYOUTS = ("HWC", "CHW")
# torchvision's ImageNet statistics, the usual Normalize(mean, std).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def normalize(images, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW",
              dtype=torch.float32):
    """uint8 images -> ``dtype``, ``(x / 255 - mean) / std`` per channel,
    on whatever device ``images`` is (call it after ``.cuda()``: the
    uint8 batch crosses the bus, a quarter of the float one). ``layout``
    says where the channels are: "CHW" (B, 3, H, W), as
    ``EmlioDataset(layout="CHW")`` gives, or "HWC" (B, H, W, 3). The
    result equals torchvision's ``Normalize(mean, std)(ToTensor()(img))``
    for each image, to float rounding; its memory format follows the input
    (channels_last from a CHW view)."""
    if layout not in LAYOUTS:
        raise ValueError("invalid layout=%r: expected 'HWC' or 'CHW'"
                         % (layout,))
    if images.dtype != torch.uint8:
        raise TypeError("normalize wants uint8 images, not %s" % images.dtype)
    axis = 1 if layout == "CHW" else images.dim() - 1
    c = images.shape[axis]
    if len(mean) != c or len(std) != c:
        raise ValueError("mean and std need %d values (the channels), got "
                         "%d and %d" % (c, len(mean), len(std)))
    if any(s == 0 for s in std):
        raise ValueError("std must not be 0")
    shape = [1] * images.dim()
    shape[axis] = c
    m = torch.tensor(mean, dtype=dtype, device=images.device).view(shape)
    s = torch.tensor(std, dtype=dtype, device=images.device).view(shape)
    # One pass: x * (1 / (255 s)) - m / s.
    return torch.addcmul(-m / s, images.to(dtype), 1.0 / (255.0 * s))


def split_batch(data, offsets):
    """The samples of a concatenated batch as a list of uint8 tensor views."""
    o = offsets.tolist()
    return [data[o[i]:o[i + 1]] for i in range(len(o) - 1)]
