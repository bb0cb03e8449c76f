# scripts/tfrecord_raw.py - TFRecord framing in pure Python, shared by the
# bench scripts that write shards and the tests that check them by hand.
# SPDX-License-Identifier: MIT
"""A record is its length (u64 LE), the masked CRC-32C of those 8 bytes,
the data and the masked CRC-32C of the data (TensorFlow's
tensorflow/core/lib/hash/crc32c.h). The CRC-32C is the binding's own
pure-Python one, loaded by path: importing the emlio package would load
libemlio, and these callers check libemlio from outside."""
import importlib.util
import os
import struct


def _load_state():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                        "bindings", "python", "emlio", "_state.py")
    spec = importlib.util.spec_from_file_location("emlio_state_py", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


crc32c = _load_state().crc32c


def masked_crc32c(data):
    """TFRecord's mask: rotate right by 15, then add a constant."""
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    """The bytes of one TFRecord record holding data."""
    head = struct.pack("<Q", len(data))
    return (head + struct.pack("<I", masked_crc32c(head)) + data
            + struct.pack("<I", masked_crc32c(data)))
