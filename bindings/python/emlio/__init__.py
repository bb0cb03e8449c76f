# emlio - Python bindings for libemlio, the EMLIO data-loading client.
# ctypes over libemlio.so; NumPy is used when present, PyTorch and DALI
# adapters live in emlio.torch and emlio.dali and import those on use.
# SPDX-License-Identifier: MIT
"""EMLIO: stream TFRecord batches from emliod daemons.

    import emlio
    with emlio.Loader("tcp://node1:5555", batch_size=256, seed=1) as loader:
        for epoch in range(10):
            for batch in loader:          # one epoch per iter() (epochs=None)
                jpegs = batch.samples     # zero-copy uint8 views
                labels = batch.labels     # int64 copy
                ...                       # released when the next batch comes

See emlio.loader for the lifetime rules of the zero-copy views,
emlio.torch.EmlioDataset and emlio.dali.ExternalSource for the adapters.
"""

from ._lib import BINDING_VERSION
from ._lib import path as library_path
from .errors import (ClosedError, CorruptError, DeniedError, EmlioError,
                     EmlioMemoryError, EmlioOSError, EmlioTimeoutError,
                     FormatError, InvalidArgumentError, LimitError,
                     MismatchError, NotFoundError, ProtocolError, StateError,
                     VersionError)
from .loader import Batch, Loader, rank_and_world, strerror, version

__version__ = "%d.%d.%d" % version()

__all__ = [
    "Batch", "Loader", "rank_and_world", "strerror", "version",
    "library_path", "BINDING_VERSION",
    "EmlioError", "ClosedError", "CorruptError", "DeniedError",
    "EmlioMemoryError", "EmlioOSError", "EmlioTimeoutError", "FormatError",
    "InvalidArgumentError", "LimitError", "MismatchError", "NotFoundError",
    "ProtocolError", "StateError", "VersionError",
]
