# emlio/_state.py - reads and writes libemlio's resume state blobs, so that
# DataLoader workers can each take a share of one rank's epoch.
# SPDX-License-Identifier: MIT
"""The resume state blob of ``emlio_client_save_state`` (src/client.c):

    "EMLS", u32 format 4, u64 seed, u32 world, rank, batch_size, shuffle,
    window_shards, drop_last, char dataset[16]    (56 bytes)
    u64 epoch, u64 n_batches, u64 share_join (format 3 on),
    u64 n_spans, n_spans x (u64 begin, u64 end) (format 4),
    bitmap[(n + 7) / 8], u32 crc32c of the rest

(the spans: global positions of the epoch earlier runs of the job
consumed, docs/protocol.md "Resume state")

all little endian; bit i of the bitmap (byte i / 8, bit i % 8) set means
batch i of this rank's plan was delivered. A client that loads a blob
delivers exactly the batches whose bits are clear. EmlioDataset uses that
to give each DataLoader worker its own batches of the rank's plan: it
takes the header from a blob the library made (so the library still
checks seed, world, rank, batch size and dataset) and writes the epoch and
the bitmap itself. The "header" this module hands out is the 56 bytes,
share_join and the spans: everything but the epoch, the count and the
bitmap.
"""

import struct

HEADER = 56
_MAGIC = b"EMLS"


def _crc_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    """CRC-32C (Castagnoli), as emlio_crc32c(0, data, len)."""
    crc = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def parse(blob):
    """(header, epoch, n_batches, set of delivered batch indices); raises
    ValueError when blob is not an intact state."""
    blob = bytes(blob)
    if (len(blob) < HEADER + 20 or blob[:4] != _MAGIC or
            struct.unpack_from("<I", blob, len(blob) - 4)[0] !=
            crc32c(blob[:-4])):
        raise ValueError("resume state is damaged or not an emlio state")
    fmt = struct.unpack_from("<I", blob, 4)[0]
    extra = 8 if fmt >= 3 else 0
    if fmt >= 4:
        if len(blob) < HEADER + 36:
            raise ValueError("resume state is damaged or not an emlio state")
        n_spans = struct.unpack_from("<Q", blob, HEADER + 24)[0]
        extra = 16 + 16 * min(n_spans, len(blob))
    if len(blob) < HEADER + 20 + extra:
        raise ValueError("resume state is damaged or not an emlio state")
    epoch, n = struct.unpack_from("<QQ", blob, HEADER)
    tail = blob[HEADER + 16:HEADER + 16 + extra]
    bitmap = blob[HEADER + 16 + extra:-4]
    if len(bitmap) != (n + 7) // 8:
        raise ValueError("resume state has %d batches but a bitmap of %d "
                         "bytes" % (n, len(bitmap)))
    done = {i for i in range(n) if bitmap[i >> 3] >> (i & 7) & 1}
    return blob[:HEADER] + tail, epoch, n, done


def make(header, epoch, n, delivered):
    """A blob for epoch with the batches in delivered marked delivered."""
    bitmap = bytearray((n + 7) // 8)
    for i in delivered:
        bitmap[i >> 3] |= 1 << (i & 7)
    header = bytes(header)
    body = (header[:HEADER] + struct.pack("<QQ", epoch, n) +
            header[HEADER:] + bytes(bitmap))
    return body + struct.pack("<I", crc32c(body))


def without_spans(header):
    """header for an epoch other than the one its spans were consumed of:
    the same job and join cursor, no consumed spans."""
    header = bytes(header)
    if struct.unpack_from("<I", header, 4)[0] < 4:
        return header
    return header[:HEADER + 8] + struct.pack("<Q", 0)
