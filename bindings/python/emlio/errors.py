# emlio/errors.py - the exception classes raised by the bindings.
# One subclass per EMLIO_E* code; system errors (-errno) become EmlioOSError.
# SPDX-License-Identifier: MIT
"""Exceptions: every failure of libemlio is raised as an :class:`EmlioError`.

``err.code`` is the C return code (an ``EMLIO_E*`` constant or ``-errno``),
``err.errmsg`` the handle's ``emlio_client_errmsg`` text at the time of the
failure, and ``str(err)`` combines both.
"""

import errno as _errno

EPROTO = -1000
EINCOMPLETE = -1001
ECLOSED = -1002
ECORRUPT = -1003
EFORMAT = -1004
ENOMEM = -1005
ETIMEDOUT = -1006
EVERSION = -1007
ENOTFOUND = -1008
EINVAL = -1009
EDENIED = -1010
EMISMATCH = -1011
ELIMIT = -1012
ESTATE = -1013
ECREDIT = -1014


class EmlioError(Exception):
    """A libemlio call failed. ``code`` is its return code, ``errmsg`` the
    library's message about it."""

    def __init__(self, code, errmsg, strerror=None):
        self.code = code
        self.errmsg = errmsg
        self.strerror = strerror
        text = errmsg or strerror or "error %d" % code
        super().__init__(text)


class ProtocolError(EmlioError):
    """EMLIO_EPROTO / EMLIO_EINCOMPLETE: a daemon sent something malformed."""


class ClosedError(EmlioError):
    """EMLIO_ECLOSED: the handle or the peer was closed."""


class CorruptError(EmlioError):
    """EMLIO_ECORRUPT: a sample failed its checksum."""


class FormatError(EmlioError):
    """EMLIO_EFORMAT: a file is not in the expected format."""


class EmlioMemoryError(EmlioError, MemoryError):
    """EMLIO_ENOMEM."""


class EmlioTimeoutError(EmlioError, TimeoutError):
    """EMLIO_ETIMEDOUT: a daemon did not answer in time (connect or next)."""


class VersionError(EmlioError):
    """EMLIO_EVERSION: a daemon speaks an incompatible protocol."""


class NotFoundError(EmlioError):
    """EMLIO_ENOTFOUND: no such shard, record or file."""


class InvalidArgumentError(EmlioError, ValueError):
    """EMLIO_EINVAL: invalid argument, configuration or call order."""


class DeniedError(EmlioError):
    """EMLIO_EDENIED."""


class MismatchError(EmlioError):
    """EMLIO_EMISMATCH: a daemon now serves a different dataset."""


class LimitError(EmlioError):
    """EMLIO_ELIMIT: a configured limit would be exceeded."""


class StateError(EmlioError):
    """EMLIO_ESTATE: resume state is damaged or does not fit this run."""


class EmlioOSError(EmlioError, OSError):
    """A system error (-errno). ``errno`` is set as for OSError."""

    def __init__(self, code, errmsg, strerror=None):
        super().__init__(code, errmsg, strerror)
        self.errno = -code


class InterruptedError_(EmlioError, InterruptedError):
    """-EINTR that could not be retried (only raised internally)."""


_BY_CODE = {
    EPROTO: ProtocolError,
    EINCOMPLETE: ProtocolError,
    ECLOSED: ClosedError,
    ECORRUPT: CorruptError,
    EFORMAT: FormatError,
    ENOMEM: EmlioMemoryError,
    ETIMEDOUT: EmlioTimeoutError,
    EVERSION: VersionError,
    ENOTFOUND: NotFoundError,
    EINVAL: InvalidArgumentError,
    EDENIED: DeniedError,
    EMISMATCH: MismatchError,
    ELIMIT: LimitError,
    ESTATE: StateError,
}


def error_class(code):
    """The exception class for a C return code."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code == -_errno.EINTR:
        return InterruptedError_
    if -1000 < code < 0:
        return EmlioOSError
    return EmlioError


def make_error(code, errmsg, strerror=None):
    """Builds the exception for a failed call."""
    return error_class(code)(code, errmsg, strerror)
