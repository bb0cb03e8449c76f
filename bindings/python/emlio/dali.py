# emlio/dali.py - a source for NVIDIA DALI's fn.external_source.
# Needs NumPy; DALI itself is imported only by the pipeline helper.
# SPDX-License-Identifier: MIT
"""DALI adapter: feed EMLIO batches to ``fn.external_source``.

    from nvidia.dali import fn, pipeline_def, types
    from emlio.dali import ExternalSource

    src = ExternalSource("tcp://node1:5555", batch_size=256, seed=1)

    @pipeline_def(batch_size=256, num_threads=4, device_id=0)
    def pipe():
        jpegs, labels = fn.external_source(
            source=src, num_outputs=2, batch=True, cycle="raise",
            dtype=[types.UINT8, types.INT32])
        images = fn.decoders.image(jpegs, device="mixed")
        ...

Contract (what DALI sees):

* ``iter(src)`` starts the next epoch (0, 1, 2, ... or the one chosen by
  ``set_epoch``) and returns an iterator over it. Each ``next()`` returns
  a tuple ``(jpegs, labels)``: ``jpegs`` a list of B one-dimensional
  ``np.uint8`` arrays, ``labels`` an ``np.ndarray`` of shape ``(B, 1)``
  and dtype ``label_dtype`` (int32 by default, as DALI's readers give).
  B is ``batch_size`` except for a short last batch when drop_last is
  False; DALI accepts a smaller batch from an external source.
* At the end of an epoch the iterator raises ``StopIteration``.
* With ``cycle="raise"`` DALI calls ``iter(src)`` again right after the
  StopIteration, so the next ``pipe.run()`` after ``pipe.reset()`` reads the
  next epoch: one pipeline, many epochs. With ``cycle=None`` (DALI's
  default, "no") DALI calls ``iter()`` once when the pipeline is built and
  the source is exhausted after one epoch: build a new pipeline (or use
  ``cycle="raise"``) for the next one. ``cycle="quiet"`` runs epochs back
  to back without telling DALI where they end.
* The arrays are copies: DALI keeps references to what the source returns
  until it has copied them, and the EMLIO batch is released when the next
  one is taken. All samples of a batch share one contiguous buffer (one
  copy per batch); each array is a slice of it.

With ``transform="random_resized_crop(224),horizontal_flip"`` (EMLIO's own
decode and augment, on the daemons or here: docs/transform.md) a batch is
``(images, labels)``, ``images`` one uint8 array (B, H, W, 3): declare
``layout=["HWC", ""]`` and skip ``fn.decoders``.

A 0-argument callable is also offered: ``source=src.next_batch`` returns
the next batch and raises StopIteration at the end of an epoch, then starts
the following epoch on the next call (DALI's callable protocol, which it calls
again after ``pipe.reset()``).
"""

import numpy as np

from .loader import Loader


class _EpochIterator:
    def __init__(self, owner, epoch):
        self._owner = owner
        self._gen = owner._loader.epoch(epoch)
        self.epoch = epoch

    def __iter__(self):
        return self

    def __next__(self):
        # The generator releases the previous batch when asked for the next
        # one; everything returned below is a copy, so that is safe.
        batch = next(self._gen)
        return self._owner._convert(batch)

    def close(self):
        self._gen.close()


class ExternalSource:
    """A batch source for ``fn.external_source(source=..., num_outputs=2,
    batch=True)`` (with ``fields=[...]``: ``num_outputs=len(fields) + 1``,
    one output per field, then the labels). Arguments are those of :class:`emlio.Loader` (except
    ``epochs``), plus ``label_dtype`` (np.int32 by default) and
    ``skip_pad`` (leave out padding repeats; batches may then be short)."""

    def __init__(self, endpoints, batch_size, label_dtype=np.int32,
                 skip_pad=False, **loader_kw):
        if "epochs" in loader_kw:
            raise TypeError("ExternalSource runs one epoch per iter(); use "
                            "set_epoch() instead of epochs=")
        self._loader = Loader(endpoints, batch_size, **loader_kw)
        # fields=[...]: one DALI output per field, then the labels.
        self._fields = (list(self._loader.fields)
                        if loader_kw.get("fields") is not None else None)
        self.batch_size = batch_size
        self.label_dtype = np.dtype(label_dtype)
        self.skip_pad = skip_pad
        self._chosen = None
        self._current = None  # iterator used by next_batch()

    @property
    def loader(self):
        return self._loader

    def set_epoch(self, epoch):
        """The epoch the next iter() (or next_batch() after an epoch end)
        starts."""
        self._chosen = int(epoch)

    def _start(self):
        if self._chosen is not None:
            e, self._chosen = self._chosen, None
        else:
            e = self._loader.next_epoch
        return _EpochIterator(self, e)

    def __iter__(self):
        if self._current is not None:
            self._current.close()
            self._current = None
        return self._start()

    def next_batch(self):
        """DALI's callable protocol: the next batch, StopIteration at the end
        of an epoch; the call after that starts the next epoch."""
        if self._current is None:
            self._current = self._start()
        try:
            return next(self._current)
        except StopIteration:
            self._current = None
            raise

    def _convert(self, batch):
        if self._loader.transform is not None:
            return self._convert_images(batch)
        if self._fields:
            return self._convert_fields(batch)
        data, offsets = batch.concat()
        labels = batch.labels
        o = offsets.tolist()
        if self.skip_pad:
            keep = (~batch.pads).tolist()
            jpegs = [data[o[i]:o[i + 1]] for i in range(len(batch)) if keep[i]]
            labels = labels[np.asarray(keep, dtype=bool)]
        else:
            jpegs = [data[o[i]:o[i + 1]] for i in range(len(batch))]
        return jpegs, labels.astype(self.label_dtype).reshape(-1, 1)

    def _convert_images(self, batch):
        """A Loader with transform=: (images, labels), images one uint8
        array (B, H, W, 3), a copy (DALI holds it until it has copied it),
        for ``fn.external_source(..., layout=["HWC", ""])``: already
        decoded and augmented, so the pipeline only normalises (on the
        GPU: ``fn.crop_mirror_normalize(images.gpu(), ...)``)."""
        images = batch.images.copy()
        labels = batch.labels
        if self.skip_pad:
            keep = ~batch.pads
            images, labels = images[keep], labels[keep]
        return images, labels.astype(self.label_dtype).reshape(-1, 1)

    def _convert_fields(self, batch):
        """fields=[...]: one output per field (a list of B uint8 arrays in
        one contiguous buffer each) and the labels last, so
        ``num_outputs=len(fields) + 1``."""
        keep = (~batch.pads).tolist() if self.skip_pad else None
        outs = []
        for f in self._fields:
            data, offsets = batch.concat_field(f)
            o = offsets.tolist()
            outs.append([data[o[i]:o[i + 1]] for i in range(len(batch))
                         if keep is None or keep[i]])
        labels = batch.labels
        if keep is not None:
            labels = labels[np.asarray(keep, dtype=bool)]
        outs.append(labels.astype(self.label_dtype).reshape(-1, 1))
        return tuple(outs)

    def epoch_stats(self):
        return self._loader.epoch_stats()

    def state_dict(self):
        return self._loader.state_dict()

    def close(self):
        if self._current is not None:
            self._current.close()
            self._current = None
        self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def pipeline(source, batch_size, num_threads=4, device_id=0, size=224,
             cycle="raise"):
    """A DALI pipeline that decodes the JPEGs on the GPU ("mixed"), resizes
    them to size x size and normalizes them. Imports DALI; returns the built
    pipeline, whose outputs are (images NCHW float, labels)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=num_threads,
                  device_id=device_id)
    def _pipe():
        jpegs, labels = fn.external_source(
            source=source, num_outputs=2, batch=True, cycle=cycle,
            dtype=[types.UINT8, types.INT32])
        images = fn.decoders.image(jpegs, device="mixed",
                                   output_type=types.RGB)
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW",
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
            std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels.gpu()

    pipe = _pipe()
    pipe.build()
    return pipe
