# emlio/loader.py - Loader and Batch: the Python face of emlio_client_t.
# Zero-copy sample views over the client's batch memory, resume state, stats.
# SPDX-License-Identifier: MIT
"""The :class:`Loader` and its :class:`Batch` objects.

Zero-copy and batch lifetime
----------------------------
A batch's sample bytes live in memory that libemlio received from ZeroMQ.
``batch.samples`` / ``batch[i]`` are *views* of that memory (NumPy uint8
arrays made with ``np.frombuffer``, or memoryviews without NumPy); nothing
is copied. The memory goes back to the client when the batch is released:

* Iterating a Loader (``for batch in loader``) releases each batch when the
  next one is requested, and the last one when the loop ends or is left.
* A batch still referenced when its iterator goes away (``b =
  next(iter(loader))``: the temporary iterator is collected at once) is
  its holder's: it lives until the last reference goes (its memory goes
  back at the loader's next step), ``batch.release()``, or
  ``loader.close()``.
* ``batch.keep()`` opts a batch out of that: it then lives until
  ``batch.release()`` (or ``with batch:``), or until ``loader.close()``.
* After release, NumPy views handed out earlier point to freed memory;
  reading them is undefined (they cannot be revoked). Memoryviews (the
  no-NumPy path) are revoked and raise ValueError. Use ``batch.copy()``,
  ``batch.concat()`` or ``np.array(view)`` to keep bytes beyond the batch.

Labels (``batch.labels``, int64) and ids (``batch.ids``) are copies, valid
forever. The views are made lazily on first access, so a loop that does not
look at the bytes costs two ctypes calls per batch.

Threads: a Loader and its batches are used by one thread at a time (the C
client's rule); ZeroMQ's own threads keep receiving in the background.
"""

import ctypes
import errno as _errno
import logging
import os
import sys
import threading
import time
import weakref

from . import _args, _lib
from .errors import (EINVAL, ESTATE, EmlioError, InvalidArgumentError,
                     NotFoundError, StateError, make_error)

try:
    import numpy as _np
except ImportError:  # the core works without NumPy
    _np = None

_C = _lib.lib
_next = _C.emlio_client_next
_samples = _C.emlio_batch_samples
_epoch_of = _C.emlio_batch_epoch
_index_of = _C.emlio_batch_index
_release = _C.emlio_batch_release
_batch_images = _C.emlio_batch_images
_memmove = ctypes.memmove
_U8 = ctypes.c_uint8
_SAMPLE_SIZE = ctypes.sizeof(_lib.Sample)

# ctypes makes (and caches) one array type per length, and making one costs
# about 10 us: with JPEG sizes all different that would dominate. The views
# therefore come from a handful of power-of-two array types, cut to the
# sample's length by np.frombuffer(count=len); only len bytes are ever
# visible through the view.
_POW2_TYPES = [_U8 * (1 << k) for k in range(48)]


def _window(n):
    """A ctypes uint8 array type of at least n bytes (n >= 1)."""
    return _POW2_TYPES[(n - 1).bit_length()]

if _np is not None:
    # emlio_sample_t as a NumPy record, so labels, lengths, shards and
    # records of a whole batch come out of one np.frombuffer call.
    _SAMPLE_DTYPE = _np.dtype({
        "names": [f[0] for f in _lib.Sample._fields_],
        "formats": [_np.uintp, _np.uintp, _np.int64, _np.uint32, _np.uint64,
                    _np.bool_, _np.uint32],
        "offsets": [getattr(_lib.Sample, f[0]).offset
                    for f in _lib.Sample._fields_],
        "itemsize": _SAMPLE_SIZE,
    })
    _frombuffer = _np.frombuffer
    _uint8 = _np.uint8

_LOG_LEVELS = {
    "error": _lib.EMLIO_LOG_ERROR,
    "warn": _lib.EMLIO_LOG_WARN,
    "warning": _lib.EMLIO_LOG_WARN,
    "info": _lib.EMLIO_LOG_INFO,
    "debug": _lib.EMLIO_LOG_DEBUG,
}
_PY_LEVELS = {
    _lib.EMLIO_LOG_ERROR: logging.ERROR,
    _lib.EMLIO_LOG_WARN: logging.WARNING,
    _lib.EMLIO_LOG_INFO: logging.INFO,
    _lib.EMLIO_LOG_DEBUG: logging.DEBUG,
}


def version():
    """The loaded library's version as a (major, minor, patch) tuple."""
    return _lib.version


def strerror(code):
    """libemlio's text for a return code."""
    return _C.emlio_strerror(code).decode("utf-8", "replace")


def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise InvalidArgumentError(
            EINVAL, "invalid value '%s' for %s" % (v, name)) from None


def rank_and_world(rank=None, world_size=None):
    """Rank and world size: the arguments, else RANK/WORLD_SIZE (torchrun),
    else SLURM_PROCID/SLURM_NTASKS, else 0 of 1."""
    for r_name, w_name in (("RANK", "WORLD_SIZE"),
                           ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank is not None and world_size is not None:
            break
        r, w = _env_int(r_name), _env_int(w_name)
        if r is None or w is None:
            continue
        if rank is None:
            rank = r
        if world_size is None:
            world_size = w
    rank = 0 if rank is None else _args.check(_args.LOADER_ARG["rank"], rank)
    world_size = 1 if world_size is None else _args.check(
        _args.LOADER_ARG["world_size"], world_size)
    if not rank < world_size:
        raise InvalidArgumentError(
            EINVAL, "invalid rank=%d: not below world_size=%d" % (
                rank, world_size))
    return rank, world_size


_Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
           ".-:+=^!/*?&<>()[]{}@%$#")


def _read_key(arg, value):
    """A CURVE key given as its 40 Z85 characters or as the path of a key
    file (`emlio keygen`: NAME.key public, NAME.key_secret secret)."""
    if len(value) == 40 and not os.path.exists(value):
        if not set(value) <= _Z85:
            raise InvalidArgumentError(
                EINVAL, "invalid %s: 40 characters but not a Z85 key (nor "
                "an existing key file)" % arg)
        key = value.encode()
    else:
        buf = ctypes.create_string_buffer(41)
        rc = _C.emlio_curve_read_key(value.encode(), buf)
        if rc < 0:
            raise InvalidArgumentError(
                EINVAL, "invalid %s=%r: cannot read a key from it: %s" % (
                    arg, value, "not a Z85 key" if rc == -1004
                    else strerror(rc)))
        key = buf.value
    pub = ctypes.create_string_buffer(41)
    if _C.emlio_curve_public(pub, key) < 0 and arg == "client_key":
        raise InvalidArgumentError(
            EINVAL, "invalid client_key: not a Z85 secret key (40 "
            "characters, or a NAME.key_secret file)")
    return key, pub.value


class Batch:
    """One batch of samples, borrowed from the client until released.

    ``len(batch)``, ``batch[i]`` (a zero-copy view of sample i),
    ``batch.samples`` (all views, made once), ``batch.labels`` (int64 copy),
    ``batch.ids`` (list of (shard name, record, pad)), ``batch.epoch``,
    ``batch.index`` (position in this rank's plan of the epoch),
    ``batch.nbytes``. ``keep()``, ``release()``, ``copy()``, ``concat()``.
    With a transform, ``batch.images`` is the batch's tensors: one uint8
    array (B, H, W, 3) over the batch's memory (no copy).
    """

    __slots__ = ("_loader", "_ptr", "_addr", "_n", "epoch", "index",
                 "_kept", "_views", "_records", "_mvs", "_images", "_fin",
                 "__weakref__")

    def __init__(self, loader, ptr, addr, n, epoch, index):
        # Weak: the loader holds its live batches, and a strong reference
        # back would make a cycle that only the cycle collector frees, so a
        # dropped loader would keep its sockets and threads until then.
        self._loader = weakref.ref(loader)
        self._ptr = ptr  # ctypes.c_void_p holding the emlio_batch_t *
        self._addr = addr  # address of the emlio_sample_t array
        self._n = n
        self.epoch = epoch
        self.index = index
        self._kept = False
        self._views = None
        self._records = None
        self._mvs = None
        self._images = None
        self._fin = None  # set once the batch outlived its iterator

    # -- lifetime ---------------------------------------------------------

    @property
    def released(self):
        return self._ptr is None

    def keep(self):
        """Keeps the batch past the next iteration step; the caller then
        releases it (release(), ``with``, or loader.close()). Returns self."""
        self._kept = True
        return self

    def release(self):
        """Returns the batch memory to the client. Idempotent. Views made
        from this batch must not be used afterwards."""
        ptr = self._ptr
        if ptr is None:
            return
        self._ptr = None
        if self._fin is not None:
            self._fin.detach()
            self._fin = None
        self._views = None
        self._records = None
        self._images = None
        if self._mvs is not None:
            for mv in self._mvs:
                mv.release()
            self._mvs = None
        loader = self._loader() if self._loader is not None else None
        self._loader = None
        if loader is not None:
            loader._live.pop(id(self), None)
        _release(ctypes.byref(ptr))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def _check(self):
        if self._ptr is None:
            raise EmlioError(-1002, "batch %d of epoch %d was released"
                             % (self.index, self.epoch))

    def _owner(self):
        # The batch refers to its loader weakly (a dropped loader is freed
        # without the cycle collector); a live batch's loader is alive.
        self._check()
        loader = self._loader() if self._loader is not None else None
        if loader is None:
            raise EmlioError(-1002, "batch %d of epoch %d outlived its "
                             "loader" % (self.index, self.epoch))
        return loader

    # -- contents ---------------------------------------------------------

    def __len__(self):
        return self._n

    def _recs(self):
        """The emlio_sample_t array as a NumPy record array (a view)."""
        if self._records is None:
            self._check()
            raw = _window(self._n * _SAMPLE_SIZE).from_address(self._addr)
            self._records = _frombuffer(raw, _SAMPLE_DTYPE, self._n)
        return self._records

    def _cstructs(self):
        self._check()
        return (_lib.Sample * self._n).from_address(self._addr)

    @property
    def samples(self):
        """Zero-copy views of every sample (list of np.uint8 arrays, or of
        memoryviews without NumPy), valid until the batch is released."""
        views = self._views
        if views is None:
            self._check()
            if _np is not None:
                recs = self._recs()
                types = _POW2_TYPES
                fb = _frombuffer
                t = _uint8
                views = [fb(types[(ln - 1).bit_length()].from_address(p), t,
                            ln) if ln else _np.empty(0, t)
                         for p, ln in zip(recs["data"].tolist(),
                                          recs["len"].tolist())]
            else:
                views = [memoryview(_window(s.len).from_address(s.data))
                         .cast("B")[:s.len] if s.len else memoryview(b"")
                         for s in self._cstructs()]
                self._mvs = views
            self._views = views
        return views

    def __getitem__(self, i):
        if self._views is not None:
            return self._views[i]
        if isinstance(i, slice):
            return self.samples[i]
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("sample index out of range")
        self._check()
        s = _lib.Sample.from_address(self._addr + i * _SAMPLE_SIZE)
        if _np is not None:
            if not s.len:
                return _np.empty(0, _uint8)
            return _frombuffer(_window(s.len).from_address(s.data), _uint8,
                               s.len)
        return self.samples[i]

    def __iter__(self):
        return iter(self.samples)

    def field(self, name):
        """Zero-copy views of one field of every sample (a name from
        ``loader.fields``, or an index into ``loader.field_names``): a list
        of np.uint8 arrays (memoryviews without NumPy), valid until the
        batch is released. A sample the daemon skipped gives an empty
        view."""
        loader = self._owner()
        k = name if isinstance(name, int) else loader._field_index.get(name)
        if k is None or not 0 <= k < len(loader.field_names):
            raise NotFoundError(-1008, "no field '%s' in this loader (it "
                                "has %s)" % (name, ",".join(loader.fields)))
        data = ctypes.c_void_p()
        ln = ctypes.c_size_t()
        out = []
        for i in range(self._n):
            _C.emlio_batch_field(self._ptr, i, k, ctypes.byref(data),
                                 ctypes.byref(ln))
            n = ln.value
            if not n:
                out.append(_np.empty(0, _uint8) if _np is not None
                           else memoryview(b""))
            elif _np is not None:
                out.append(_frombuffer(_window(n).from_address(data.value),
                                       _uint8, n))
            else:
                mv = memoryview(_window(n).from_address(data.value))
                out.append(mv.cast("B")[:n])
        return out

    @property
    def fields(self):
        """{field name: field(name)} for the loader's fields."""
        return {f: self.field(f) for f in self._owner().fields}

    def concat_field(self, name):
        """Field `name` of every sample copied into one contiguous uint8
        array, and int64 offsets of length len(batch) + 1 (NumPy only)."""
        views = self.field(name)
        lens = _np.fromiter((len(v) for v in views), _np.int64, len(views))
        offsets = _np.zeros(len(views) + 1, _np.int64)
        _np.cumsum(lens, out=offsets[1:])
        data = _np.empty(int(offsets[-1]), _uint8)
        for v, a, b in zip(views, offsets[:-1].tolist(),
                           offsets[1:].tolist()):
            data[a:b] = v
        return data, offsets

    def hold_images(self):
        """``images`` as an array that keeps this batch alive for as long as
        anything uses its memory (a ``torch.from_numpy`` tensor of it, say):
        no copy of the block. The batch is kept (not released at the next
        iteration step) and goes back to the client at the loader's first
        step after the last user of the array is gone, on the loader's own
        thread (the client is not thread-safe, a garbage collector may run
        anywhere)."""
        arr = self.images
        self._kept = True
        return _np.asarray(_Hold(self, arr))

    @property
    def images(self):
        """The batch's decoded tensors (a Loader with ``transform=``): one
        NumPy uint8 array of shape (B, H, W, 3), RGB, over the batch's
        memory (zero-copy: valid until the batch is released; copy it, or
        ``torch.from_numpy(...).clone()``, to keep it). Sample i of
        ``samples``/``labels``/``ids`` is ``images[i]``. Normalise to float
        on the GPU: float32 is 4x the bytes."""
        if self._images is not None:
            return self._images
        self._check()
        if _np is None:
            raise RuntimeError("batch.images needs NumPy")
        n = ctypes.c_size_t()
        h = ctypes.c_uint32()
        w = ctypes.c_uint32()
        addr = _batch_images(self._ptr, ctypes.byref(n), ctypes.byref(h),
                             ctypes.byref(w))
        if not h.value:
            raise EmlioError(-1009, "this loader delivers encoded samples: "
                             "pass transform= (e.g. \"random_resized_crop"
                             "(224),horizontal_flip\") for tensors")
        shape = (n.value, h.value, w.value, 3)
        size = n.value * h.value * w.value * 3
        if not size:
            self._images = _np.empty(shape, _uint8)
        else:
            raw = _window(size).from_address(addr)
            self._images = _frombuffer(raw, _uint8, size).reshape(shape)
        return self._images

    @property
    def labels(self):
        """Labels as an int64 array (a copy; list without NumPy); -1 for a
        record without one."""
        if _np is not None:
            return self._recs()["label"].copy()
        return [s.label for s in self._cstructs()]

    @property
    def lengths(self):
        """Sample sizes in bytes (int64 array copy; list without NumPy)."""
        if _np is not None:
            return self._recs()["len"].astype(_np.int64)
        return [s.len for s in self._cstructs()]

    @property
    def pads(self):
        """Which samples are padding repeats (bool array; list without
        NumPy)."""
        if _np is not None:
            return self._recs()["pad"].copy()
        return [bool(s.pad) for s in self._cstructs()]

    @property
    def sources(self):
        """Each sample's source index (uint32 array; list without NumPy):
        0 for a job without sources (docs/planner.md, "Sources")."""
        if _np is not None:
            return self._recs()["source"].copy()
        return [s.source for s in self._cstructs()]

    @property
    def nbytes(self):
        if _np is not None:
            return int(self._recs()["len"].sum())
        return sum(s.len for s in self._cstructs())

    @property
    def ids(self):
        """[(shard name, record, pad)] per sample."""
        loader = self._loader() if self._loader is not None else None
        names = loader.shard_names if loader is not None else None
        self._check()
        if _np is not None:
            recs = self._recs()
            return [(names[sh], rec, bool(pad)) for sh, rec, pad in
                    zip(recs["shard"].tolist(), recs["record"].tolist(),
                        recs["pad"].tolist())]
        return [(names[s.shard], s.record, bool(s.pad))
                for s in self._cstructs()]

    def copy(self):
        """The samples as a list of bytes objects (copies)."""
        self._check()
        at = ctypes.string_at
        return [at(s.data, s.len) if s.len else b""
                for s in self._cstructs()]

    def concat(self):
        """Copies every sample into one contiguous uint8 buffer. Returns
        (data, offsets): sample i is data[offsets[i]:offsets[i + 1]].
        NumPy arrays (data uint8, offsets int64 of len(batch) + 1); without
        NumPy a bytearray and a list. One memmove per sample, no views."""
        self._check()
        if _np is not None:
            recs = self._recs()
            lens = recs["len"]
            offsets = _np.zeros(self._n + 1, _np.int64)
            _np.cumsum(lens, out=offsets[1:])
            data = _np.empty(int(offsets[-1]), _uint8)
            base = data.ctypes.data
            mm = _memmove
            for p, off, ln in zip(recs["data"].tolist(),
                                  offsets[:-1].tolist(), lens.tolist()):
                mm(base + off, p, ln)
            return data, offsets
        structs = self._cstructs()
        offsets = [0]
        for s in structs:
            offsets.append(offsets[-1] + s.len)
        data = bytearray(offsets[-1])
        base = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
        for s, off in zip(structs, offsets):
            _memmove(base + off, s.data, s.len)
        return data, offsets

    def __repr__(self):
        state = "released" if self._ptr is None else (
            "kept" if self._kept else "live")
        return "<emlio.Batch epoch=%d index=%d samples=%d %s>" % (
            self.epoch, self.index, self._n, state)


_wait_log = logging.getLogger("emlio.loader")


def _watch(ref, stop, first):
    """Watchdog thread of one Loader: logs a warning when next() has waited
    `first` seconds without a batch, and again each time the wait doubles.
    Holds the loader weakly, so it never keeps one alive."""
    tick = min(1.0, first / 4)
    warned_at = None
    last = None
    while not stop.wait(tick):
        loader = ref()
        if loader is None:
            return
        since = loader._waiting_since
        if since != last:  # another wait (or none): start counting again
            last = since
            warned_at = None
        if since is None:
            continue
        waited = time.monotonic() - since
        due = first if warned_at is None else 2 * warned_at
        if waited >= due:
            warned_at = waited
            _wait_log.warning(
                "no batch from %s for %.0f s (epoch %s, timeout after %.0f "
                "s); is emliod running and reachable there?",
                loader.endpoints, waited, loader._iterating
                if loader._iterating is not None else "-",
                loader.config.get("timeout_ms", 0) / 1000.0)
        del loader


class _Hold:
    """The owner of an array over a batch's memory (Batch.hold_images): when
    the last array, tensor or view of it goes, the batch is handed to its
    loader to release at its next step."""

    __slots__ = ("_batch", "_owner", "__array_interface__")

    def __init__(self, batch, arr):
        self._batch = batch
        # The loader lives while the memory is used: a loader collected
        # (an EmlioDataset gone out of scope) or closed would otherwise
        # free the block under a tensor that still points into it.
        self._owner = batch._loader()
        self.__array_interface__ = arr.__array_interface__
        if self._owner is not None:
            self._owner._holds += 1

    def __del__(self):
        loader = self._owner
        if loader is None:
            return
        loader._holds -= 1  # under the GIL
        loader._handed.append(self._batch)
        if loader._closing and loader._holds == 0:
            loader._finish_close()


class Loader:
    """Pulls batches from emliod daemons through libemlio's client.

    Parameters
    ----------
    endpoints : str or list of str
        ZeroMQ endpoints of the daemons ("tcp://host:port"), a list or one
        comma-separated string.
    batch_size : int
        Samples per batch.

    Every other parameter is keyword-only (``Loader(ep, 256, seed=1)``).

    epochs : int or None
        With ``None`` (the default) each ``iter(loader)`` runs *one* epoch,
        the next one (0, 1, 2, ...), like a PyTorch DataLoader. With an int
        N, ``iter(loader)`` runs the epochs that are left of 0..N-1 in one
        pass. ``loader.epoch(e)`` runs a given epoch either way.
    shuffle : bool or "window" / "none"
        Window shuffle (shard order + records within shard windows), or
        file order.
    seed : int
        Shuffle seed, shared by all ranks.
    rank, world_size : int or None
        This rank and the job size; when not given, RANK/WORLD_SIZE, else
        SLURM_PROCID/SLURM_NTASKS, else 0 of 1.
    in_order : bool
        Deliver batches in plan order (default: as they arrive).
    state : bytes or dict or None
        Resume state from :meth:`state_dict`: the epoch it was saved in
        continues with exactly the batches not yet delivered.
    streams, inflight : int
        TCP streams per daemon (0, the default: tuned - two, and more while
        the path's TCP windows limit the rate; see :meth:`path_stats`);
        batches in flight (0 = auto, from the measured bandwidth-delay
        product). Either way the next epoch's first batches are requested
        while the current one's last arrive (none past ``epochs``).
    request_bytes : int
        Bytes one request asks for: each daemon's share of a batch is asked
        for in parts of about this size, spread over the streams and put
        back together here (0, the default: 2 MiB). Large batches then
        arrive sooner on long paths and are checked while in cache.
    io_threads : int
        ZeroMQ I/O threads the streams use, 1 or 2 (0, the default: one for
        daemons on other hosts, two once it runs 3/4 of a CPU; both at once
        for a daemon on this host or fixed ``streams``).
    drop_last : bool
        Drop the remainder instead of delivering a short last batch.
    verify : bool
        Check each sample's CRC-32C.
    timeout_ms, connect_timeout_ms : int
        Fail when no reply comes for this long; give up connecting.
    window_shards : int
        Shards per shuffle window. 0 (the default) shuffles the whole
        dataset uniformly; a few shards per window read fewer files at a
        time but mix batches only across those shards (docs/planner.md).
    log_level : None, int or "error"/"warn"/"info"/"debug"
        Route libemlio's log to the ``logging`` module (logger
        ``emlio.<module>``) up to this level. None keeps it silent.
    name : str
        Client name sent to the daemons (their logs show it).
    fields : None, str or list of str
        The fields wanted of every sample, in this order (``["jpg",
        "cls"]`` or ``"jpg,cls"``, as webdataset's ``to_tuple``), asked of
        the daemons: one started with ``--fields`` serves any of its list,
        one without any field its shards have (tar member extensions,
        TFRecord feature keys, ImageFolder ``image``/``label``). A name a
        daemon cannot serve raises ``NotFoundError`` naming it. None: the
        daemons' own fields.
    server_key, client_key : str or path
        CURVE encryption and authentication, both or neither, as for
        ``emlio fetch --server-key/--client-key``: the daemon's public key
        and this client's *secret* key (its public key is derived), each
        as 40 Z85 characters or the path of a key file written by
        ``emlio keygen`` (``NAME.key``, ``NAME.key_secret``).
    transform : str or None
        Deliver decoded, augmented uint8 tensors instead of encoded bytes:
        a spec such as ``"random_resized_crop(224),horizontal_flip"`` or
        ``"resize(256),center_crop(224)"`` (docs/transform.md). Each batch
        then has ``batch.images``, a (B, H, W, 3) uint8 array; the bytes
        are the same whichever side decodes, for any thread count, rank
        split or resume. An unknown operation raises ``InvalidArgumentError``
        naming it.
    decode_at : "auto", "client" or "server"
        Where the decoding runs: on the daemons (``emliod
        --transform-threads``), here, or (``auto``, the default) a share of
        the batches on each side, chosen per epoch by measured time and
        energy (the least joules per image within 10% of the fastest); see
        :meth:`transform_stats`.
    transform_threads : int
        Decode threads here (0, the default: one per CPU).
    max_pixels : int
        Refuse images of more pixels (0: 100 million).
    on_corrupt : "fail" or "skip"
        An image that does not decode here: ``"fail"`` (the default) raises
        from the iterator naming its shard and record; ``"skip"`` leaves it
        out of its batch (logged, and counted in
        ``epoch_stats()["skipped"]``). Batches the daemons decode follow
        ``emliod --on-corrupt``: give both the same policy under ``auto``.
    disjoint_shards : bool
        Daemons that hold different files under one shard name (an
        ImageFolder whose class directories are split over nodes by files)
        serve them as distinct shards. Without it such a job is refused at
        connect, naming the shard and both daemons, rather than read as
        replicas (docs/formats.md, "One dataset on several nodes").
    job : str
        The training job this loader belongs to (1..64 printable bytes),
        the same on every rank: the daemons share their readers among jobs
        by weight, whatever the number of streams each opens (None: the
        environment's EMLIO_JOB, TORCHELASTIC_RUN_ID or SLURM_JOB_ID, else
        a job of its own). docs/fairness.md.
    job_weight : int
        The weight the job asks for, 1..1000; the daemon caps it by its
        policy (emliod --job-weight). 0: the policy's.
    share : bool
        Share reads with the other jobs over this dataset (docs/fairness.md,
        "Shared reads"): epochs are planned from the dataset's shared
        schedule, so every sharing job reads the same windows of shards in
        the same order (each in this seed's order inside a window), and the
        daemons serve them from chunks they read once for all. Every sample
        still comes exactly once per epoch. ``epoch_stats()["shared_bytes"]``
        says how much came from another job's read. Default False.
    share_join : int or None
        With ``share``: where epoch 0 begins in the shared schedule
        (docs/planner.md, "Joining"). None (default): where the daemons'
        other sharing jobs are reading now, so a job started late reads
        what they read from its first batch (from the start when none is,
        or for an unnamed job of several ranks); an int: that cursor (0:
        the start; ``epoch_stats()["share_join"]`` of another run, to
        repeat its order). A loaded state keeps its own.
    wait_warning_s : float
        Log a warning (logger ``emlio.loader``) when a batch has been
        awaited this long without a word from the daemons, naming them,
        and again each time the wait doubles. Default 5; 0 turns it off.

    Arguments are checked against the C client's ranges: a wrong type
    raises ``TypeError``, a value out of range ``ValueError``
    (:class:`emlio.InvalidArgumentError`); the message names the argument.
    Raises :class:`emlio.EmlioError` (a subclass by code) when connecting
    fails; the message names the daemon.

    One Loader runs one epoch at a time: while an iterator of it is live
    (started and neither exhausted nor closed), starting another one, or
    calling begin_epoch() or load_state_dict(), raises ``RuntimeError``.
    Finish the first, or ``close()`` it (leaving a ``for`` loop does).
    """

    def __init__(self, endpoints=None, batch_size=None, *, epochs=None,
                 shuffle=True,
                 seed=0, rank=None, world_size=None, in_order=False,
                 state=None, streams=0, inflight=0, drop_last=False,
                 verify=True, timeout_ms=60000, connect_timeout_ms=10000,
                 window_shards=0, log_level=None, name=None, fields=None,
                 server_key=None, client_key=None, wait_warning_s=5.0,
                 transform=None, decode_at="auto", transform_threads=0,
                 max_pixels=0, on_corrupt="fail", request_bytes=0,
                 io_threads=0,
                 disjoint_shards=False, job=None, job_weight=0,
                 share=False, share_join=None, sources=None, stratify=False,
                 epoch_samples=0):
        self._client = None
        self._ctx = None
        self._live = {}
        self._handed = []  # held batches whose last user is gone
        self._holds = 0  # arrays over batch memory alive (_Hold)
        self._closing = False  # close() waits for _holds to reach 0
        # Batches that outlived their iterator (_adopt): weakly held; the
        # memory of those collected waits in _orphans for the next step.
        self._adopted = weakref.WeakValueDictionary()
        self._orphans = []
        self._log_cb = None
        self._iterating = None  # the epoch a live iterator runs, or None
        self._waiting_since = None  # monotonic start of a blocking next()
        self._watchdog = None
        # A forked child (DataLoader workers) inherits this object but must
        # not touch the parent's ZeroMQ context: close() only forgets it there.
        self._pid = os.getpid()
        # endpoints may be left out for sources= (they name the daemons),
        # so both have defaults; a batch size is still required.
        if batch_size is None:
            raise TypeError("Loader() needs batch_size")
        if endpoints is None and sources is None:
            raise TypeError("Loader() needs endpoints (or sources=)")
        args = _args.check_all(_args.LOADER_ARGS, locals())
        self.sources = None
        if args["sources"] is not None:
            if endpoints is not None:
                raise _args.bad_value("endpoints", endpoints, "None with "
                                      "sources (they name the daemons)")
            self.sources = _args.check_sources(args["sources"])
            endpoints = ",".join(s[1] for s in self.sources)
        else:
            endpoints = _args.check_endpoints(endpoints)
        self.endpoints = endpoints
        self.batch_size = args["batch_size"]
        self.epochs = args["epochs"]
        self.rank, self.world_size = rank_and_world(args["rank"],
                                                    args["world_size"])
        self._wait_warning_s = args["wait_warning_s"]
        shuffle_mode = (_lib.EMLIO_SHUFFLE_WINDOW
                        if args["shuffle"] == "window"
                        else _lib.EMLIO_SHUFFLE_NONE)

        cfg = _lib.ClientConfig()
        _C.emlio_client_config_init(ctypes.byref(cfg))
        for a in _args.LOADER_ARGS:
            if a.field is not None:
                setattr(cfg, a.field, args[a.name])
        cfg.world = self.world_size
        cfg.rank = self.rank
        cfg.shuffle = shuffle_mode
        # Known epochs: the overlap never requests past the last one.
        cfg.end_epoch = 0 if self.epochs is None else self.epochs
        self._name = (args["name"] or "emlio-python").encode()
        cfg.name = self._name  # the config is copied by emlio_client_new
        self._keys = self._curve_keys(cfg, args["server_key"],
                                      args["client_key"])
        self.transform = args["transform"]
        # Borrowed by the C client until connect returns (it keeps its
        # parsed copy); a bad spec fails connect with EMLIO_EINVAL.
        self._spec = (self.transform.encode()
                      if self.transform is not None else None)
        cfg.transform = self._spec
        cfg.decode_at = _lib.DECODE_AT[args["decode_at"]]
        cfg.on_corrupt = 1 if args["on_corrupt"] == "skip" else 0
        # Copied by emlio_client_new.
        self._job = args["job"].encode() if args["job"] is not None else None
        cfg.job = self._job
        # The fields asked of the daemons (HELLO), in this order; they
        # check each against what they serve.
        fields = args["fields"]
        if isinstance(fields, str):
            fields = [f for f in fields.split(",") if f]
        if fields is not None:
            fields = list(fields)
            if not fields or not all(isinstance(f, str) and f
                                     for f in fields):
                raise ValueError("fields=%r: expected a non-empty list of "
                                 "field names" % (args["fields"],))
            cfg.fields = ",".join(fields).encode()
        if args["share_join"] is not None:
            cfg.share_join_mode = _lib.EMLIO_SHARE_JOIN_AT
            cfg.share_join = args["share_join"]
        if self.sources:
            # Copied by emlio_client_new, which checks them (bad ones fail
            # connect, naming the source).
            self._src = (_lib.Source * len(self.sources))(*[
                _lib.Source(n.encode(), e.encode(), w, k)
                for n, e, w, k in self.sources])
            cfg.sources = ctypes.cast(self._src, ctypes.c_void_p)
            cfg.n_sources = len(self.sources)
        self.config = {
            a.name: args[a.name] for a in _args.LOADER_ARGS
            if a.field is not None}
        self.config.update({
            "rank": self.rank, "world_size": self.world_size,
            "shuffle": shuffle_mode == _lib.EMLIO_SHUFFLE_WINDOW,
            "curve": self._keys is not None,
            "transform": self.transform, "decode_at": args["decode_at"],
            "on_corrupt": args["on_corrupt"]})

        ctx = _C.emlio_ctx_new()
        if not ctx:
            raise MemoryError("emlio_ctx_new: out of memory")
        self._ctx = ctypes.c_void_p(ctx)
        if log_level is not None:
            self._install_log(log_level)
        client = _C.emlio_client_new(self._ctx, ctypes.byref(cfg))
        if not client:
            self.close()
            raise MemoryError("emlio_client_new: out of memory")
        self._client = ctypes.c_void_p(client)
        self._bp = ctypes.c_void_p()
        self._np = ctypes.c_size_t()
        self._resume = None  # epoch loaded from a state, not yet iterated
        self._next_epoch = 0  # what iter() runs next
        try:
            self._call(_C.emlio_client_connect(
                self._client, None if self.sources else endpoints.encode()))
            self.source_names = [s[0] for s in self.sources or ()]
            self._keys = None  # the client has its copy
            n = _C.emlio_client_shard_count(self._client)
            self.shard_names = [
                _C.emlio_client_shard_name(self._client, i).decode(
                    "utf-8", "replace") for i in range(n)]
            self.shard_records = [
                _C.emlio_client_shard_records(self._client, i)
                for i in range(n)]
            # Class names in label order, when the daemons know them (an
            # ImageFolder's directories, or the classes.txt of emlio pack);
            # None otherwise.
            nc = _C.emlio_client_class_count(self._client)
            self.classes = [
                _C.emlio_client_class_name(self._client, i).decode(
                    "utf-8", "replace") for i in range(nc)] or None
            # Fields the daemons serve ([""] = one unnamed
            # field), and those asked for by fields= (all by default).
            self.field_names = [
                _C.emlio_client_field_name(self._client, i).decode(
                    "utf-8", "replace")
                for i in range(_C.emlio_client_field_count(self._client))]
            # Asked for by name, the daemons serve exactly those (connect
            # refused any they cannot); else all they serve.
            self.fields = (list(self.field_names) if fields is None
                           else fields)
            self._field_index = {f: self.field_names.index(f)
                                 for f in self.fields}
            if state is not None:
                self.load_state_dict(state)
        except BaseException:
            self.close()
            raise

    # -- plumbing ---------------------------------------------------------

    @staticmethod
    def _curve_keys(cfg, server_key, client_key):
        """Puts the CURVE keys into cfg; returns the buffers it points to
        (kept on the loader until connect is done), or None."""
        if server_key is None and client_key is None:
            return None
        if server_key is None or client_key is None:
            missing = "server_key" if server_key is None else "client_key"
            raise InvalidArgumentError(
                EINVAL, "missing %s: server_key and client_key go together "
                "(the daemon's public key and this client's secret key)"
                % missing)
        server, _ = _read_key("server_key", server_key)
        secret, public = _read_key("client_key", client_key)
        cfg.curve_server_key = server
        cfg.curve_public_key = public
        cfg.curve_secret_key = secret
        return (server, public, secret)

    def _install_log(self, level):
        if isinstance(level, str):
            if level.lower() not in _LOG_LEVELS:
                raise InvalidArgumentError(
                    -1009, "invalid log level '%s'" % level)
            level = _LOG_LEVELS[level.lower()]

        def sink(userdata, lvl, module, msg):
            # Called from library threads; logging is thread-safe. Never
            # let an exception cross back into C.
            try:
                mod = module.decode("utf-8", "replace") if module else "lib"
                logging.getLogger("emlio." + mod).log(
                    _PY_LEVELS.get(lvl, logging.DEBUG), "%s",
                    msg.decode("utf-8", "replace") if msg else "")
            except Exception:
                pass

        self._log_cb = _lib.LOG_FN(sink)
        _C.emlio_ctx_set_log(self._ctx, self._log_cb, None, int(level))

    def _errmsg(self):
        if not self._client:
            return ""
        return _C.emlio_client_errmsg(self._client).decode("utf-8", "replace")

    def _call(self, rc):
        if rc < 0:
            raise make_error(rc, self._errmsg(), strerror(rc))
        return rc

    def _require_open(self):
        if not self._client or self._closing:
            raise EmlioError(-1002, "loader is closed")

    # -- low-level protocol -----------------------------------------------

    def _check_idle(self, what):
        """Refuses what while an iterator runs an epoch: the C client has
        one current epoch, and changing it under the iterator would make it
        yield another epoch's batches silently."""
        if self._iterating is not None:
            raise RuntimeError(
                "cannot %s: an iterator of this loader is still running "
                "epoch %d; exhaust it or call its close() first (one "
                "Loader runs one epoch at a time)" % (what, self._iterating))

    def begin_epoch(self, epoch):
        """Plans epoch for this rank and starts requesting its batches; a
        previous unfinished epoch is abandoned. Returns its batch count."""
        self._require_open()
        self._check_idle("begin epoch %s" % (epoch,))
        return self._begin(_args.check_int("epoch", epoch, 0, _args.U64_MAX))

    def _begin(self, epoch):
        n = self._call(_C.emlio_client_begin_epoch(self._client, epoch))
        self._resume = None
        return n

    def next_batch(self):
        """The next batch of the current epoch, or None at its end. The
        caller owns the batch: release it (or close the loader). Retries
        when a signal interrupts the wait (KeyboardInterrupt and the like
        are raised by Python between the retries)."""
        client = self._client
        if not client:
            self._require_open()
        while self._handed:  # released here, on the loader's thread
            self._handed.pop().release()
        self._release_orphans()
        bp = self._bp
        if self._watchdog is None and self._wait_warning_s:
            self._arm_watchdog()
        while True:
            self._waiting_since = time.monotonic()
            try:
                rc = _next(client, ctypes.byref(bp))
            finally:
                self._waiting_since = None
            if rc > 0:
                break
            if rc == 0:
                return None
            if rc != -_errno.EINTR:
                raise make_error(rc, self._errmsg(), strerror(rc))
        ptr = ctypes.c_void_p(bp.value)
        addr = _samples(ptr, ctypes.byref(self._np))
        b = Batch(self, ptr, addr, self._np.value, _epoch_of(ptr),
                  _index_of(ptr))
        self._live[id(b)] = b
        return b

    def _release_orphans(self):
        while self._orphans:
            _release(ctypes.byref(self._orphans.pop()))

    def _arm_watchdog(self):
        """Starts the thread that warns about long silent waits (once per
        loader and process; it ends with the loader)."""
        if self._watchdog is not None:
            return
        stop = threading.Event()
        t = threading.Thread(target=_watch, name="emlio-wait-watchdog",
                             args=(weakref.ref(self), stop,
                                   self._wait_warning_s), daemon=True)
        self._watchdog = (stop,)
        t.start()

    # -- iteration --------------------------------------------------------

    def _run(self, epoch, fresh):
        """Yields the batches of epoch, releasing each (unless kept) when
        the next is asked for or the iteration stops."""
        self._check_idle("start iterating epoch %d" % epoch)
        if fresh:
            self._begin(epoch)
        self._iterating = epoch
        b = None
        try:
            while True:
                b = self.next_batch()
                if b is None:
                    return
                yield b
                if not b._kept:
                    b.release()
                b = None
        finally:
            self._iterating = None
            if b is not None and not b._kept:
                # Held beyond this frame and the loader's table (say
                # b = next(iter(loader)), whose iterator is collected at
                # once): the batch is its holder's now, released when the
                # last reference goes, or at close().
                if sys.getrefcount(b) > 3:
                    self._adopt(b)
                else:
                    b.release()

    def _adopt(self, b):
        self._live.pop(id(b), None)
        self._adopted[id(b)] = b
        b._kept = True
        b._fin = weakref.finalize(b, self._orphans.append, b._ptr)

    def epoch(self, e):
        """Iterates epoch e. If a loaded resume state is for epoch e and not
        yet run, this continues it instead of starting over."""
        e = _args.check_int("epoch", e, 0, _args.U64_MAX)
        self._require_open()
        self._check_idle("start iterating epoch %d" % e)
        fresh = self._resume != e
        self._resume = None
        if self._next_epoch <= e:
            self._next_epoch = e + 1
        return self._run(e, fresh)

    def __iter__(self):
        self._require_open()
        if self.epochs is None:
            return self.epoch(self._next_epoch)
        return self._multi()

    def _multi(self):
        while self._next_epoch < self.epochs:
            yield from self.epoch(self._next_epoch)

    def num_batches(self):
        """Batches this rank gets in the current epoch (the plan's count),
        or None when no epoch has been started."""
        info = self.plan_info()
        return None if info is None else info["batches"]

    @property
    def next_epoch(self):
        """The epoch iter() starts next."""
        return self._next_epoch

    def set_epoch(self, e):
        """Makes iter() start at epoch e (like DistributedSampler)."""
        self._next_epoch = _args.check_int("epoch", e, 0, _args.U64_MAX)

    @property
    def dataset_size(self):
        return sum(self.shard_records)

    # -- state and figures -------------------------------------------------

    def state_dict(self):
        """Resume state: {"emlio_state": bytes, "epoch": e, "next_epoch": n,
        "batch_size": b, "rank": r, "world_size": w}. A batch counts as
        delivered once the loader handed it out. Load it with ``state=`` or
        load_state_dict() on a Loader with the same configuration."""
        self._require_open()
        blob = ctypes.POINTER(ctypes.c_uint8)()
        n = ctypes.c_size_t()
        self._call(_C.emlio_client_save_state(
            self._client, ctypes.byref(blob), ctypes.byref(n)))
        try:
            data = ctypes.string_at(blob, n.value)
        finally:
            _C.emlio_client_free_blob(blob)
        st = self.epoch_stats()
        return {"emlio_state": data, "epoch": st["epoch"],
                "next_epoch": self._next_epoch,
                "batch_size": self.batch_size, "rank": self.rank,
                "world_size": self.world_size}

    @staticmethod
    def _state_blob(state):
        if isinstance(state, dict) and "emlio_state" not in state:
            raise StateError(ESTATE, "state has no 'emlio_state' entry (keys: "
                             "%s): pass what state_dict() returned"
                             % (", ".join(sorted(map(str, state))) or "none"))
        blob = state["emlio_state"] if isinstance(state, dict) else state
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError("state must be the dict state_dict() returned "
                            "or its 'emlio_state' bytes, not %s"
                            % type(blob).__name__)
        return bytes(blob)

    def load_state_dict(self, state):
        """Resumes from state_dict() output (or its raw bytes). Returns the
        batches still to come in the saved epoch; iter() (or epoch(e) with
        the saved epoch) delivers exactly those, then goes on with the next
        epochs.

        Elastic resume: a list of every rank's state_dict() of the last
        run (as torch.distributed.all_gather_object gives it), whatever
        its world size, resumes the job on this loader's world size with
        the same global batch: the samples not consumed yet are split
        among the new ranks (docs/planner.md, "Elastic resume")."""
        self._require_open()
        self._check_idle("load a resume state")
        if isinstance(state, (list, tuple)):
            blobs = [self._state_blob(s) for s in state]
            n = len(blobs)
            left = self._call(_C.emlio_client_load_states(
                self._client, (ctypes.c_char_p * n)(*blobs),
                (ctypes.c_size_t * n)(*map(len, blobs)), n))
        else:
            blob = self._state_blob(state)
            left = self._call(_C.emlio_client_load_state(
                self._client, blob, len(blob)))
        e = self.epoch_stats()["epoch"]
        if left > 0:
            self._resume = e
            self._next_epoch = e
        else:
            # Nothing left of that epoch: carry on with the next one.
            self._resume = None
            self._next_epoch = e + 1
        return left

    def epoch_stats(self):
        """Figures of the current (or just finished) epoch: epoch, batches,
        samples, bytes, seconds, wait_s, first_batch_s, inflight, retries,
        skipped, and the network path: rtt_ms, mb_per_s, streams, window
        (bytes one stream may have in flight), io_threads (ZeroMQ I/O
        threads the streams use), disk_pct (the share of their readers'
        time the daemons said they wait for their devices, with
        ``emliod --io read``), disk_read_bytes (what their reads took
        from the file systems for this epoch's batches; over bytes, the
        read amplification), shared_bytes (of bytes, those copied from a
        read another job made: ``share=True``) and limit (what limits the rate:
        "consumer", "window", "network", "daemon", "cpu", "disk" or
        "unknown")."""
        self._require_open()
        st = _lib.ClientStats()
        _C.emlio_client_stats(self._client, ctypes.byref(st))
        out = {f: getattr(st, f) for f, _ in _lib.ClientStats._fields_
               if not f.startswith("reserved")}
        out["limit"] = _C.emlio_limit_name(st.limit).decode()
        return out

    def path_stats(self):
        """The client's TCP streams, one dict each: daemon (endpoint),
        stream, ready, mb_per_s (over the tuner's last tick), rtt_ms
        (TCP_INFO), bytes, io_thread (the ZeroMQ I/O thread carrying it)."""
        self._require_open()
        n = _C.emlio_client_streams(self._client, None, 0)
        arr = (_lib.StreamStats * max(n, 1))()
        n = min(n, _C.emlio_client_streams(self._client, arr, n))
        return [{"daemon": _C.emlio_client_daemon_endpoint(
                    self._client, s.daemon).decode(),
                 "stream": s.stream, "ready": bool(s.ready),
                 "mb_per_s": s.mb_per_s, "rtt_ms": s.rtt_ms,
                 "bytes": s.bytes, "io_thread": s.io_thread}
                for s in arr[:n]]

    def transform_stats(self):
        """Where the transforms run and why (a Loader with ``transform=``;
        {} without): decode_at, server_share (the daemons' share of this
        epoch's batches), decided (auto: chosen from measurements, not
        still measuring both sides), batches_server/batches_client,
        client_ms_per_image/server_ms_per_image (CPU per image, measured),
        client_threads/server_threads, client_decode_max_bytes (what one
        decode here may hold, sized from the memory this process may use),
        and for auto the chosen share's
        predicted_images_per_s and predicted_j_per_image, fastest_images_per_s,
        bound (what limits it) and why (one line with the figures)."""
        self._require_open()
        if self.transform is None:
            return {}
        x = _lib.XfStats()
        _C.emlio_client_xf_stats(self._client, ctypes.byref(x))
        names = {v: k for k, v in _lib.DECODE_AT.items()}
        return {"decode_at": names.get(x.decode_at, "unknown"),
                "server_share": x.server_share, "decided": bool(x.decided),
                "batches_server": x.batches_server,
                "batches_client": x.batches_client,
                "client_ms_per_image": x.client_ms_per_image,
                "server_ms_per_image": x.server_ms_per_image,
                "client_threads": x.client_threads,
                "server_threads": x.server_threads,
                "client_decode_max_bytes": x.client_ws_bytes,
                "predicted_images_per_s": x.predicted_ips,
                "predicted_j_per_image": x.predicted_j_per_image,
                "fastest_images_per_s": x.fastest_ips,
                "bound": (x.bound or b"").decode(),
                "why": x.why.decode("utf-8", "replace")}

    def plan_info(self):
        """This rank's plan of the current epoch: batches, samples, pads,
        dataset size; None before the first epoch."""
        self._require_open()
        plan = _C.emlio_client_plan(self._client)
        if not plan:
            return None
        return {"batches": _C.emlio_plan_batch_count(plan),
                "samples": _C.emlio_plan_sample_count(plan),
                "pads": _C.emlio_plan_pad_count(plan),
                "dataset_size": _C.emlio_plan_dataset_size(plan)}

    # -- teardown -----------------------------------------------------------

    def close(self):
        """Releases every batch still held (kept ones too), then frees the
        client and its context. Idempotent. Batches whose memory arrays or
        tensors still use (``hold_images``, emlio.torch's tensors) are
        released, and the client freed, when the last of those goes: the
        loader takes no more calls meanwhile. In a process forked from the
        one that made the loader it only drops the references: ZeroMQ
        contexts must not be used across fork."""
        if self._pid != os.getpid():
            for b in list(self._live.values()) + list(self._adopted.values()):
                if b._fin is not None:
                    b._fin.detach()
                    b._fin = None
                b._ptr = None
                b._loader = None
            self._live.clear()
            self._orphans.clear()
            self._client = None
            self._ctx = None
            return
        if self._watchdog is not None:
            self._watchdog[0].set()
            self._watchdog = None
        if self._holds > 0:
            # Tensors still point into batches: finish when they are gone
            # (_Hold.__del__), releasing what is not held meanwhile.
            self._closing = True
            return
        self._finish_close()

    def _finish_close(self):
        self._closing = False
        for b in list(self._live.values()) + list(self._adopted.values()):
            b.release()
        self._live.clear()
        while self._handed:
            self._handed.pop().release()
        self._release_orphans()
        if self._client:
            _C.emlio_client_destroy(ctypes.byref(self._client))
            self._client = None
        if self._ctx:
            _C.emlio_ctx_destroy(ctypes.byref(self._ctx))
            self._ctx = None
        self._log_cb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<emlio.Loader %s batch=%d rank=%d/%d%s>" % (
            self.endpoints, self.batch_size, self.rank, self.world_size,
            "" if self._client else " closed")
