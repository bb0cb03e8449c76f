# emlio/_lib.py - finds and loads libemlio.so, declares its C API for ctypes.
# Standard library only; the prototypes mirror include/emlio.h and
# include/emlio/client.h.
# SPDX-License-Identifier: MIT
"""Loading of libemlio and the ctypes prototypes of its public API.

The library is looked up, in order:

1. ``$EMLIO_LIBRARY`` (a path to ``libemlio.so``), the only one tried when
   set;
2. what ``pip install`` recorded (``_build_config.py``): the installed
   library pkg-config found then, or the copy the package carries;
3. in a source tree, ``$B/libemlio.so`` where ``B`` is the build directory
   (default ``build``), relative to the repository root;
4. ``pkg-config --variable=libdir libemlio`` now;
5. the system loader (``libemlio.so.ABI`` on ``LD_LIBRARY_PATH``, the
   ldconfig cache).

The run-time ``emlio_version()`` is checked against the version these
bindings were written for.
"""

import ctypes
import ctypes.util
import os
import subprocess



def _binding_version():
    """The version of this package: recorded by the build backend when installed,
    else the source tree's VERSION file (the single source of both)."""
    try:
        from ._build_config import VERSION as text
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        try:
            with open(os.path.join(here, "..", "..", "..", "VERSION")) as f:
                text = f.read().strip()
        except OSError:
            raise ImportError("emlio: no _build_config.py and no VERSION "
                              "file: install with pip or run from the "
                              "source tree") from None
    return tuple(int(x) for x in text.split(".")[:3])


# The C API version these bindings were written against (VERSION).
BINDING_VERSION = _binding_version()
# The Makefile's ABI rule: MAJOR, or 0.MINOR while MAJOR is 0.
_SONAME = "libemlio.so.%s" % (
    BINDING_VERSION[0] if BINDING_VERSION[0] else "0.%d" % BINDING_VERSION[1])

EMLIO_SHUFFLE_NONE = 0
EMLIO_SHUFFLE_WINDOW = 1

EMLIO_LOG_ERROR = 0
EMLIO_LOG_WARN = 1
EMLIO_LOG_INFO = 2
EMLIO_LOG_DEBUG = 3


class ClientConfig(ctypes.Structure):
    """emlio_client_config_t."""

    _fields_ = [
        ("batch_size", ctypes.c_uint32),
        ("world", ctypes.c_uint32),
        ("rank", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("shuffle", ctypes.c_int),
        ("window_shards", ctypes.c_uint32),
        ("drop_last", ctypes.c_bool),
        ("streams", ctypes.c_uint32),
        ("inflight", ctypes.c_uint32),
        ("in_order", ctypes.c_bool),
        ("verify", ctypes.c_bool),
        ("connect_timeout_ms", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("curve_server_key", ctypes.c_char_p),
        ("curve_public_key", ctypes.c_char_p),
        ("curve_secret_key", ctypes.c_char_p),
        ("end_epoch", ctypes.c_uint64),
        ("transform", ctypes.c_char_p),
        ("decode_at", ctypes.c_int32),
        ("transform_threads", ctypes.c_uint32),
        ("max_pixels", ctypes.c_uint64),
        ("request_bytes", ctypes.c_uint64),
        ("io_threads", ctypes.c_uint32),
        ("disjoint_shards", ctypes.c_bool),
        ("share", ctypes.c_bool),
        ("share_join_mode", ctypes.c_uint8),
        ("on_corrupt", ctypes.c_uint8),
        ("job", ctypes.c_char_p),
        ("job_weight", ctypes.c_uint32),
        ("reserved32", ctypes.c_uint32),
        ("share_join", ctypes.c_uint64),
        ("fields", ctypes.c_char_p),
        ("sources", ctypes.c_void_p),  # const emlio_source_t *
        ("n_sources", ctypes.c_uint32),
        ("stratify", ctypes.c_bool),
        ("epoch_samples", ctypes.c_uint64),
    ]


class Source(ctypes.Structure):
    """emlio_source_t: one source of a blended job."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("endpoints", ctypes.c_char_p),
        ("weight", ctypes.c_double),
        ("samples", ctypes.c_uint64),
    ]


# enum emlio_share_join
EMLIO_SHARE_JOIN_AUTO = 0
EMLIO_SHARE_JOIN_AT = 1

# enum emlio_decode_at
DECODE_AT = {"auto": 0, "client": 1, "server": 2}


class XfStats(ctypes.Structure):
    """emlio_client_xf_stats_t: where the transforms ran, and why."""

    _fields_ = [
        ("decode_at", ctypes.c_int32),
        ("server_share", ctypes.c_double),
        ("decided", ctypes.c_bool),
        ("batches_server", ctypes.c_uint64),
        ("batches_client", ctypes.c_uint64),
        ("client_ms_per_image", ctypes.c_double),
        ("server_ms_per_image", ctypes.c_double),
        ("client_threads", ctypes.c_uint32),
        ("server_threads", ctypes.c_uint32),
        ("predicted_ips", ctypes.c_double),
        ("predicted_j_per_image", ctypes.c_double),
        ("fastest_ips", ctypes.c_double),
        ("bound", ctypes.c_char_p),
        ("why", ctypes.c_char * 320),
        ("client_ws_bytes", ctypes.c_uint64),
    ]


class Sample(ctypes.Structure):
    """emlio_sample_t: one zero-copy sample of a batch."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("label", ctypes.c_int64),
        ("shard", ctypes.c_uint32),
        ("record", ctypes.c_uint64),
        ("pad", ctypes.c_bool),
        ("source", ctypes.c_uint32),
    ]


class ClientStats(ctypes.Structure):
    """emlio_client_stats_t."""

    _fields_ = [
        ("epoch", ctypes.c_uint64),
        ("batches", ctypes.c_uint64),
        ("samples", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("wait_s", ctypes.c_double),
        ("first_batch_s", ctypes.c_double),
        ("inflight", ctypes.c_uint32),
        ("retries", ctypes.c_uint64),
        ("skipped", ctypes.c_uint64),
        ("rtt_ms", ctypes.c_double),
        ("mb_per_s", ctypes.c_double),
        ("streams", ctypes.c_uint32),
        ("limit", ctypes.c_int32),
        ("window", ctypes.c_uint64),
        ("io_threads", ctypes.c_uint32),
        ("disk_pct", ctypes.c_uint32),
        ("disk_read_bytes", ctypes.c_uint64),
        ("shared_bytes", ctypes.c_uint64),
        ("share_join", ctypes.c_uint64),
    ]


class StreamStats(ctypes.Structure):
    """emlio_stream_stats_t: one TCP stream of a client."""

    _fields_ = [
        ("daemon", ctypes.c_uint32),
        ("stream", ctypes.c_uint32),
        ("ready", ctypes.c_bool),
        ("mb_per_s", ctypes.c_double),
        ("rtt_ms", ctypes.c_double),
        ("bytes", ctypes.c_uint64),
        ("io_thread", ctypes.c_uint32),
        ("reserved32", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 1),
    ]


# void (*)(void *userdata, int level, const char *module, const char *msg)
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                          ctypes.c_char_p, ctypes.c_char_p)

_c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_c_u8_p = ctypes.POINTER(ctypes.c_uint8)


def _repo_root():
    # bindings/python/emlio/_lib.py -> the repository root
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", ".."))


def _recorded():
    """The library pip install recorded or carried, if any."""
    try:
        from . import _build_config as cfg
    except ImportError:
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    if cfg.BUNDLED:
        out.append(os.path.join(here, cfg.BUNDLED))
    if cfg.LIBRARY:
        out.append(cfg.LIBRARY)
    return out


def _pkg_config_library():
    try:
        libdir = subprocess.run(
            ["pkg-config", "--variable=libdir", "libemlio"],
            capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    return [os.path.join(libdir, _SONAME)] if libdir else []


def _search():
    """The places after EMLIO_LIBRARY, in order; lazily, so pkg-config runs
    only when nothing before it was found."""
    yield from _recorded()
    root = _repo_root()
    if os.path.exists(os.path.join(root, "VERSION")):
        build = os.environ.get("B", "build")
        if not os.path.isabs(build):
            build = os.path.join(root, build)
        yield os.path.join(build, "libemlio.so")
    yield from _pkg_config_library()
    found = ctypes.util.find_library("emlio")
    if found:
        yield found
    yield _SONAME
    yield "libemlio.so"


def _candidates():
    env = os.environ.get("EMLIO_LIBRARY")
    if env:
        # An explicit choice is the only one tried: a wrong path must fail
        # loudly, not silently fall back to another build.
        return [env], True
    return _search(), False


def _declare(lib):
    """Sets argtypes/restype of every function the bindings call."""
    vp = ctypes.c_void_p

    def fn(name, restype, *argtypes):
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)

    fn("emlio_version", ctypes.c_int)
    fn("emlio_struct_size", ctypes.c_size_t, ctypes.c_int)
    fn("emlio_strerror", ctypes.c_char_p, ctypes.c_int)
    fn("emlio_ctx_new", vp)
    fn("emlio_ctx_destroy", None, _c_void_pp)
    fn("emlio_ctx_set_log", None, vp, LOG_FN, vp, ctypes.c_int)
    fn("emlio_client_config_init", None, ctypes.POINTER(ClientConfig))
    fn("emlio_client_new", vp, vp, ctypes.POINTER(ClientConfig))
    fn("emlio_client_destroy", None, _c_void_pp)
    fn("emlio_client_connect", ctypes.c_int, vp, ctypes.c_char_p)
    fn("emlio_client_shard_count", ctypes.c_size_t, vp)
    fn("emlio_client_class_count", ctypes.c_size_t, vp)
    fn("emlio_client_class_name", ctypes.c_char_p, vp, ctypes.c_size_t)
    fn("emlio_client_shard_name", ctypes.c_char_p, vp, ctypes.c_size_t)
    fn("emlio_client_shard_records", ctypes.c_uint64, vp, ctypes.c_size_t)
    fn("emlio_client_begin_epoch", ctypes.c_int, vp, ctypes.c_uint64)
    fn("emlio_client_next", ctypes.c_int, vp, _c_void_pp)
    # The sample array is returned as a plain address: the Loader builds
    # its views from it with as few Python objects as possible.
    fn("emlio_batch_samples", vp, vp, ctypes.POINTER(ctypes.c_size_t))
    fn("emlio_client_field_count", ctypes.c_size_t, vp)
    fn("emlio_client_field_name", ctypes.c_char_p, vp, ctypes.c_size_t)
    fn("emlio_batch_field", ctypes.c_int, vp, ctypes.c_size_t,
       ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
       ctypes.POINTER(ctypes.c_size_t))
    fn("emlio_batch_epoch", ctypes.c_uint64, vp)
    fn("emlio_batch_index", ctypes.c_uint64, vp)
    fn("emlio_batch_release", None, _c_void_pp)
    fn("emlio_client_stats", None, vp, ctypes.POINTER(ClientStats))
    fn("emlio_batch_images", ctypes.c_void_p, vp,
       ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint32),
       ctypes.POINTER(ctypes.c_uint32))
    fn("emlio_client_xf_stats", None, vp, ctypes.POINTER(XfStats))
    fn("emlio_client_streams", ctypes.c_size_t, vp,
       ctypes.POINTER(StreamStats), ctypes.c_size_t)
    fn("emlio_limit_name", ctypes.c_char_p, ctypes.c_int)
    fn("emlio_client_daemon_endpoint", ctypes.c_char_p, vp, ctypes.c_size_t)
    fn("emlio_client_save_state", ctypes.c_int, vp,
       ctypes.POINTER(_c_u8_p), ctypes.POINTER(ctypes.c_size_t))
    fn("emlio_client_free_blob", None, _c_u8_p)
    fn("emlio_client_load_state", ctypes.c_int, vp, ctypes.c_char_p,
       ctypes.c_size_t)
    fn("emlio_client_load_states", ctypes.c_int, vp,
       ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t),
       ctypes.c_size_t)
    fn("emlio_client_plan", vp, vp)
    fn("emlio_client_errmsg", ctypes.c_char_p, vp)
    fn("emlio_plan_batch_count", ctypes.c_size_t, vp)
    fn("emlio_plan_sample_count", ctypes.c_uint64, vp)
    fn("emlio_plan_pad_count", ctypes.c_uint64, vp)
    fn("emlio_plan_dataset_size", ctypes.c_uint64, vp)
    fn("emlio_curve_read_key", ctypes.c_int, ctypes.c_char_p,
       ctypes.c_char_p)
    fn("emlio_curve_public", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


def _check_version(lib, path):
    v = lib.emlio_version()
    major, minor, patch = v // 10000, v // 100 % 100, v % 100
    want_major, want_minor, _ = BINDING_VERSION
    # Before 1.0 a minor release may change the ABI, so 0.x must match
    # exactly in major.minor; from 1.0 on, newer minors are compatible.
    ok = major == want_major and (
        minor == want_minor if major == 0 else minor >= want_minor)
    if not ok:
        raise ImportError(
            "libemlio '%s' is version %d.%d.%d; these bindings need %d.%d.x"
            % (path, major, minor, patch, want_major, want_minor))
    return (major, minor, patch)


def _check_layout(lib, path):
    """Refuses a library whose structs differ from the mirrors above: a
    mismatch would corrupt memory instead of failing."""
    for which, struct in ((1, ClientConfig), (2, ClientStats), (3, Sample),
                          (6, StreamStats)):
        have = lib.emlio_struct_size(which)
        if have != ctypes.sizeof(struct):
            raise ImportError(
                "libemlio '%s' has a %d-byte %s, these bindings expect %d:"
                " rebuild one or the other" % (path, have, struct.__name__,
                                               ctypes.sizeof(struct)))


def load():
    """Loads libemlio and returns (CDLL, path, version tuple)."""
    names, explicit = _candidates()
    errors = []
    for name in names:
        if os.sep in name and not os.path.exists(name) and not explicit:
            errors.append("%s: no such file" % name)
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append("%s: %s" % (name, exc))
            continue
        _declare(lib)
        version = _check_version(lib, name)
        _check_layout(lib, name)
        return lib, name, version
    raise ImportError(
        "cannot load libemlio (install it, or set EMLIO_LIBRARY or B, the"
        " build directory):"
        " " + "; ".join(errors))


lib, path, version = load()
