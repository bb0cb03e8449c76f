# emlio/torch.py - EmlioDataset, a PyTorch IterableDataset over emlio.Loader.
# Imports torch only when this module is imported.
# SPDX-License-Identifier: MIT
"""PyTorch adapter.

    from torch.utils.data import DataLoader
    from emlio.torch import EmlioDataset
    ds = EmlioDataset("tcp://node1:5555", batch_size=256, seed=1)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for data, offsets, labels in DataLoader(ds, batch_size=None):
            jpeg_i = data[offsets[i]:offsets[i + 1]]   # uint8 tensor

Each item is one whole batch (EMLIO batches on the daemon side), so use
``DataLoader(ds, batch_size=None)``. By default an item is a tuple
``(data, offsets, labels)``: every sample's bytes copied into one
contiguous uint8 tensor, int64 offsets of length B + 1, and int64 labels of
length B. One copy, one tensor allocation per batch; slices of ``data`` are
views, which ``torchvision.io.decode_jpeg`` takes as they are. With
``output="list"`` an item is ``(list of B uint8 tensors, labels)``, each
tensor its own copy.

The bytes are copied out of the zero-copy batch because the batch returns
to the client right after; the tensors are ordinary, owned tensors.

Rank and world size: the arguments, else ``torch.distributed`` when it is
initialized, else RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, else 0 of 1.
With ``num_workers=W > 0`` each worker is its own EMLIO rank
(rank * W + worker_id of world * W), so the workers together still read
every sample exactly once per epoch; call ``set_epoch`` each epoch then,
since the workers run on copies of the dataset.
"""

import os

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .loader import Loader, rank_and_world


def _dist_rank_world():
    try:
        import torch.distributed as dist
    except ImportError:
        return None, None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, None


class EmlioDataset(IterableDataset):
    """An IterableDataset yielding whole EMLIO batches as tensors.

    ``endpoints``, ``batch_size`` and the keyword arguments are those of
    :class:`emlio.Loader` (seed, shuffle, drop_last, in_order, streams,
    inflight, verify, timeout_ms, connect_timeout_ms, ...), except
    ``epochs``: each ``iter()`` runs one epoch, the next one, unless
    :meth:`set_epoch` chose it. ``output`` is "concat" (default) or
    "list"; ``skip_pad`` leaves out padding repeats.
    """

    def __init__(self, endpoints, batch_size, rank=None, world_size=None,
                 output="concat", skip_pad=False, state=None, **loader_kw):
        super().__init__()
        if output not in ("concat", "list"):
            raise ValueError("output must be 'concat' or 'list'")
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
        self._loader_kw = loader_kw
        self._state = state
        self._epoch = None
        self._next_epoch = 0
        self._loader = None
        self._loader_key = None

    def set_epoch(self, epoch):
        """The epoch the next iter() runs."""
        self._epoch = int(epoch)

    def _get_loader(self):
        info = get_worker_info()
        if info is None or info.num_workers <= 1:
            rank, world = self.rank, self.world_size
        else:
            rank = self.rank * info.num_workers + info.id
            world = self.world_size * info.num_workers
        key = (rank, world, os.getpid())
        if self._loader is None or self._loader_key != key:
            if self._loader is not None:
                self._loader.close()
            self._loader = Loader(self.endpoints, self.batch_size, rank=rank,
                                  world_size=world, state=self._state,
                                  **self._loader_kw)
            self._loader_key = key
            if self._state is not None:
                self._next_epoch = self._loader.next_epoch
                self._state = None
        return self._loader

    def state_dict(self):
        """The loader's resume state (see emlio.Loader.state_dict); only
        meaningful with num_workers=0."""
        return self._get_loader().state_dict()

    def epoch_stats(self):
        return self._get_loader().epoch_stats()

    def __iter__(self):
        loader = self._get_loader()
        if self._epoch is not None:
            epoch = self._epoch
            self._epoch = None
        else:
            epoch = self._next_epoch
        self._next_epoch = epoch + 1
        # The loader continues a loaded resume state when it is for this
        # epoch.
        for batch in loader.epoch(epoch):
            yield self._convert(batch)

    def _convert(self, batch):
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

    def _convert_fields(self, batch):
        """fields=[...]: ({field: (data, offsets)}, labels), or with
        output="list" ({field: [tensor per sample]}, labels)."""
        keep = ~batch.pads if self.skip_pad else None
        labels = torch.from_numpy(batch.labels)
        if keep is not None:
            labels = labels[torch.from_numpy(keep)]
        out = {}
        for f in self._loader.fields:
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


def split_batch(data, offsets):
    """The samples of a concatenated batch as a list of uint8 tensor views."""
    o = offsets.tolist()
    return [data[o[i]:o[i + 1]] for i in range(len(o) - 1)]
