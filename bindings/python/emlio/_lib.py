# emlio/_lib.py - finds and loads libemlio.so, declares its C API for ctypes.
# Standard library only; the prototypes mirror include/emlio.h and
# include/emlio/client.h.
# SPDX-License-Identifier: MIT
"""Loading of libemlio and the ctypes prototypes of its public API.

The library is looked up, in order:

1. ``$EMLIO_LIBRARY`` (a path to ``libemlio.so``);
2. ``$B/libemlio.so`` where ``B`` is the build directory (default ``build``),
   relative to the repository root when it is not absolute;
3. the system loader (``libemlio.so`` on ``LD_LIBRARY_PATH`` / ldconfig).

The run-time ``emlio_version()`` is checked against the version these
bindings were written for.
"""

import ctypes
import ctypes.util
import os

# The C API version these bindings were written against (include/emlio.h).
BINDING_VERSION = (0, 1, 0)

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
        ("reserved", ctypes.c_uint64 * 8),
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
        ("reserved", ctypes.c_uint64 * 8),
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


def _candidates():
    env = os.environ.get("EMLIO_LIBRARY")
    if env:
        # An explicit choice is the only one tried: a wrong path must fail
        # loudly, not silently fall back to another build.
        return [env], True
    out = []
    build = os.environ.get("B", "build")
    if not os.path.isabs(build):
        build = os.path.join(_repo_root(), build)
    out.append(os.path.join(build, "libemlio.so"))
    found = ctypes.util.find_library("emlio")
    if found:
        out.append(found)
    out.append("libemlio.so")
    return out, False


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
    fn("emlio_client_shard_name", ctypes.c_char_p, vp, ctypes.c_size_t)
    fn("emlio_client_shard_records", ctypes.c_uint64, vp, ctypes.c_size_t)
    fn("emlio_client_begin_epoch", ctypes.c_int, vp, ctypes.c_uint64)
    fn("emlio_client_next", ctypes.c_int, vp, _c_void_pp)
    # The sample array is returned as a plain address: the Loader builds
    # its views from it with as few Python objects as possible.
    fn("emlio_batch_samples", vp, vp, ctypes.POINTER(ctypes.c_size_t))
    fn("emlio_batch_epoch", ctypes.c_uint64, vp)
    fn("emlio_batch_index", ctypes.c_uint64, vp)
    fn("emlio_batch_release", None, _c_void_pp)
    fn("emlio_client_stats", None, vp, ctypes.POINTER(ClientStats))
    fn("emlio_client_save_state", ctypes.c_int, vp,
       ctypes.POINTER(_c_u8_p), ctypes.POINTER(ctypes.c_size_t))
    fn("emlio_client_free_blob", None, _c_u8_p)
    fn("emlio_client_load_state", ctypes.c_int, vp, ctypes.c_char_p,
       ctypes.c_size_t)
    fn("emlio_client_plan", vp, vp)
    fn("emlio_client_errmsg", ctypes.c_char_p, vp)
    fn("emlio_plan_batch_count", ctypes.c_size_t, vp)
    fn("emlio_plan_sample_count", ctypes.c_uint64, vp)
    fn("emlio_plan_pad_count", ctypes.c_uint64, vp)
    fn("emlio_plan_dataset_size", ctypes.c_uint64, vp)


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
    for which, struct in ((1, ClientConfig), (2, ClientStats), (3, Sample)):
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
        "cannot load libemlio (set EMLIO_LIBRARY or B, the build directory):"
        " " + "; ".join(errors))


lib, path, version = load()
