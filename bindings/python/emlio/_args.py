# emlio/_args.py - the Loader's arguments as a table: type, the C range,
# and the emlio_client_config_t field each one sets.
# SPDX-License-Identifier: MIT
"""Checks of the Loader's keyword arguments, table-driven.

Every argument is one :class:`Arg` row in :data:`LOADER_ARGS`: its kind
(``int``, ``bool``, ``str``, ``choice``...), its range (the C type's, or
the C client's documented limits), and the ``ClientConfig`` field it sets
(None for those the Python side handles itself). A wrong type raises
``TypeError`` and a value out of range ``ValueError`` (as
:class:`emlio.InvalidArgumentError`, which is both an EmlioError and a
ValueError); either message names the argument, the value and what was
expected. Adding an argument means adding a row (and the keyword).
"""

import numbers
import os

from .errors import EINVAL, InvalidArgumentError

U32_MAX = 2 ** 32 - 1
U64_MAX = 2 ** 64 - 1
INT_MAX = 2 ** 31 - 1


class Arg:
    """One argument: name, kind, range or choices, config field, and
    whether None is allowed (then it means "not given")."""

    __slots__ = ("name", "kind", "lo", "hi", "choices", "field", "none_ok",
                 "doc")

    def __init__(self, name, kind, lo=None, hi=None, choices=None,
                 field=None, none_ok=False, doc=""):
        self.name = name
        self.kind = kind
        self.lo = lo
        self.hi = hi
        self.choices = choices
        self.field = field
        self.none_ok = none_ok
        self.doc = doc


def bad_value(name, value, expected):
    """The ValueError (InvalidArgumentError) for an argument out of range."""
    return InvalidArgumentError(
        EINVAL, "invalid %s=%r: expected %s" % (name, value, expected))


def bad_type(name, value, expected):
    return TypeError("%s must be %s, not %s (%r)" % (
        name, expected, type(value).__name__, value))


def check_int(name, value, lo, hi):
    """value as an int in [lo, hi]; bool and float are refused (a float
    would be silently truncated, a bool is almost always a mix-up)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise bad_type(name, value, "an integer")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise bad_value(name, v, "an integer in %d .. %d" % (lo, hi)
                        if hi is not None else "an integer >= %d" % lo)
    return v


def check_bool(name, value):
    """True/False (NumPy bools and the ints 0 and 1 too)."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_ without NumPy
        return bool(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    raise bad_type(name, value, "True or False")


def check_str(name, value):
    if not isinstance(value, str):
        raise bad_type(name, value, "a string")
    if "\0" in value:
        raise bad_value(name, value, "a string without NUL characters")
    return value


def check_path_or_str(name, value):
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    return check_str(name, value)


def check(arg, value):
    """Checks one value against its row; returns the normalized value."""
    if value is None and arg.none_ok:
        return None
    name = arg.name
    if arg.kind == "int":
        return check_int(name, value, arg.lo, arg.hi)
    if arg.kind == "bool":
        return check_bool(name, value)
    if arg.kind == "str":
        return check_str(name, value)
    if arg.kind == "path":
        return check_path_or_str(name, value)
    if arg.kind == "choice":
        # A bool picks the first (True) or second (False) choice.
        if isinstance(value, bool):
            return arg.choices[0] if value else arg.choices[1]
        if not isinstance(value, str):
            raise bad_type(name, value, "True, False or one of %s"
                           % ", ".join(repr(c) for c in arg.choices))
        if value not in arg.choices:
            raise bad_value(name, value, "one of %s" % ", ".join(
                repr(c) for c in arg.choices))
        return value
    if arg.kind == "seconds":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise bad_type(name, value, "a number of seconds")
        if not 0 <= float(value) < 1e9:
            raise bad_value(name, value, "seconds >= 0 (0: never)")
        return float(value)
    if arg.kind == "any":
        return value
    raise AssertionError("unknown argument kind %r" % arg.kind)


def check_endpoints(value):
    """endpoints as one comma-separated string, checked as the programs
    check --connect (tools/common/tool_util.c): tcp://HOST:PORT,
    ipc://PATH or inproc://NAME."""
    if isinstance(value, (list, tuple)):
        value = ",".join(check_str("endpoints", e) for e in value)
    value = check_str("endpoints", value)
    want = "tcp://HOST:PORT (e.g. tcp://node1:5555), several separated " \
        "by commas"
    if not value:
        raise bad_value("endpoints", value, want)
    for ep in value.split(","):
        scheme, _, rest = ep.partition("://")
        if scheme in ("ipc", "inproc") and rest:
            continue
        host, _, port = ep[6:].rpartition(":")
        if not ep.startswith("tcp://") or not host:
            raise InvalidArgumentError(
                EINVAL, "invalid endpoint %r in endpoints: expected %s"
                % (ep, want))
        if not (port.isdigit() and 1 <= int(port) <= 65535):
            raise InvalidArgumentError(
                EINVAL, "invalid port %r in endpoint %r: expected 1..65535"
                % (port, ep))
    return value


# The Loader's arguments. Ranges are the C client's: uint32 counts, uint64
# seeds and epochs, int milliseconds, at most 64 streams per daemon.
LOADER_ARGS = (
    Arg("batch_size", "int", 1, U32_MAX, field="batch_size"),
    Arg("epochs", "int", 0, U64_MAX, none_ok=True),
    Arg("shuffle", "choice", choices=("window", "none")),
    Arg("seed", "int", 0, U64_MAX, field="seed"),
    Arg("rank", "int", 0, U32_MAX - 1, none_ok=True),
    Arg("world_size", "int", 1, U32_MAX, none_ok=True),
    Arg("in_order", "bool", field="in_order"),
    Arg("streams", "int", 0, 64, field="streams"),
    Arg("inflight", "int", 0, U32_MAX, field="inflight"),
    Arg("request_bytes", "int", 0, U64_MAX, field="request_bytes"),
    Arg("io_threads", "int", 0, 2, field="io_threads"),
    Arg("drop_last", "bool", field="drop_last"),
    Arg("verify", "bool", field="verify"),
    Arg("timeout_ms", "int", 1, INT_MAX, field="timeout_ms"),
    Arg("connect_timeout_ms", "int", 1, INT_MAX,
        field="connect_timeout_ms"),
    Arg("window_shards", "int", 0, U32_MAX, field="window_shards"),
    Arg("name", "str", none_ok=True),
    Arg("server_key", "path", none_ok=True),
    Arg("client_key", "path", none_ok=True),
    Arg("wait_warning_s", "seconds", none_ok=True),
    Arg("log_level", "any", none_ok=True),
    Arg("fields", "any", none_ok=True),
    Arg("state", "any", none_ok=True),
    # Decoded tensors (docs/transform.md): the spec goes to the C client;
    # decode_at and the threads say where it runs.
    Arg("transform", "str", none_ok=True),
    Arg("decode_at", "choice", choices=("auto", "client", "server")),
    Arg("transform_threads", "int", 0, U32_MAX, field="transform_threads"),
    Arg("max_pixels", "int", 0, U64_MAX, field="max_pixels"),
    # An image that does not decode here: fail the epoch, or skip it.
    Arg("on_corrupt", "choice", choices=("fail", "skip")),
    Arg("disjoint_shards", "bool", field="disjoint_shards"),
    # Training jobs (docs/fairness.md): the name every rank says, and the
    # weight asked (the daemon caps it).
    Arg("job", "str", none_ok=True),
    Arg("job_weight", "int", 0, 1000, field="job_weight"),
    # Shared reads (docs/fairness.md): plan from the dataset's shared
    # schedule, served from the chunks the daemons read once for all.
    Arg("share", "bool", field="share"),
    # Where epoch 0 begins in the shared schedule: None (auto) or a cursor.
    Arg("share_join", "int", 0, U64_MAX, none_ok=True),
    # Sources (docs/planner.md, "Sources"): several datasets blended in
    # exact quotas, each on its own daemons; endpoints is then None.
    Arg("sources", "any", none_ok=True),
    Arg("stratify", "bool", field="stratify"),
    Arg("epoch_samples", "int", 0, U64_MAX, field="epoch_samples"),
)


def check_sources(value):
    """sources as a list of (name, endpoints, weight, samples): each a
    dict with name, endpoints (a string or a list) and weight or samples,
    or a tuple (name, endpoints[, weight])."""
    if not isinstance(value, (list, tuple)) or not value:
        raise bad_type("sources", value, "a non-empty list of sources")
    out = []
    for i, src in enumerate(value):
        if isinstance(src, dict):
            unknown = set(src) - {"name", "endpoints", "weight", "samples"}
            if unknown:
                raise bad_value("sources[%d]" % i, src, "only the keys name, "
                                "endpoints, weight and samples (not %s)"
                                % ", ".join(sorted(unknown)))
            if "weight" in src and "samples" in src:
                raise bad_value("sources[%d]" % i, src, "a weight or samples,"
                                " not both")
            name, eps = src.get("name"), src.get("endpoints")
            weight, samples = src.get("weight", 1.0), src.get("samples", 0)
        elif isinstance(src, (list, tuple)) and len(src) in (2, 3):
            name, eps = src[0], src[1]
            weight, samples = (src[2] if len(src) == 3 else 1.0), 0
        else:
            raise bad_type("sources[%d]" % i, src,
                           "a dict or a (name, endpoints[, weight]) tuple")
        name = check_str("sources[%d] name" % i, name)
        eps = check_endpoints(eps)
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise bad_type("sources[%d] weight" % i, weight, "a number")
        samples = check_int("sources[%d] samples" % i, samples, 0, U64_MAX)
        out.append((name, eps, float(weight), samples))
    return out

LOADER_ARG = {a.name: a for a in LOADER_ARGS}


def check_all(table, values):
    """{name: normalized value} for every row of table found in values."""
    return {a.name: check(a, values[a.name]) for a in table
            if a.name in values}
