# emlio/_state.py - reads and writes libemlio's resume state blobs, so that
# DataLoader workers can each take a share of one rank's epoch.
# SPDX-License-Identifier: MIT
"""The resume state blob of ``emlio_client_save_state`` (src/client/client_state.c):

    "EMLS", u32 format 6, u64 seed, u32 world, rank, batch_size, shuffle,
    window_shards, drop_last, char dataset[16]    (56 bytes)
    u64 epoch, u64 n_batches, u64 share_join (format 3 on),
    u64 n_spans, n_spans x (u64 begin, u64 end) (format 4 on),
    bitmap[(n + 7) / 8],
    the blend section (format 5): u32 n_sources, u32 n_layers, the
    sources' u64 fingerprints (format 6), the epoch's earlier blends with
    their spans, the saving run's blend,
    u32 crc32c of the rest

(the spans: global positions of the epoch earlier runs of the job
consumed; the blends: the sources' weights, docs/protocol.md "Resume
state")

all little endian; bit i of the bitmap (byte i / 8, bit i % 8) set means
batch i of this rank's plan was delivered. A client that loads a blob
delivers exactly the batches whose bits are clear. EmlioDataset uses that
to give each DataLoader worker its own batches of the rank's plan: it
takes the header from a blob the library made (so the library still
checks seed, world, rank, batch size and dataset) and writes the epoch and
the bitmap itself. The "header" this module hands out is the 56 bytes,
share_join, the spans and the blend section: everything but the epoch,
the count and the bitmap.
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


def _tail_len(fmt, n_spans):
    """Bytes of share_join, n_spans and the spans after the count."""
    if fmt >= 4:
        return 16 + 16 * n_spans
    return 8 if fmt >= 3 else 0


def parse(blob):
    """(header, epoch, n_batches, set of delivered batch indices); raises
    ValueError when blob is not an intact state."""
    blob = bytes(blob)
    if (len(blob) < HEADER + 20 or blob[:4] != _MAGIC or
            struct.unpack_from("<I", blob, len(blob) - 4)[0] !=
            crc32c(blob[:-4])):
        raise ValueError("resume state is damaged or not an emlio state")
    fmt = struct.unpack_from("<I", blob, 4)[0]
    n_spans = 0
    if fmt >= 4:
        if len(blob) < HEADER + 36:
            raise ValueError("resume state is damaged or not an emlio state")
        n_spans = min(struct.unpack_from("<Q", blob, HEADER + 24)[0],
                      len(blob))
    extra = _tail_len(fmt, n_spans)
    if len(blob) < HEADER + 20 + extra:
        raise ValueError("resume state is damaged or not an emlio state")
    epoch, n = struct.unpack_from("<QQ", blob, HEADER)
    tail = blob[HEADER + 16:HEADER + 16 + extra]
    at = HEADER + 16 + extra
    size = (n + 7) // 8
    bitmap = blob[at:at + size] if fmt >= 5 else blob[at:-4]
    section = blob[at + size:-4] if fmt >= 5 else b""
    if len(bitmap) != size or (fmt >= 5 and len(section) < 8):
        raise ValueError("resume state has %d batches but a bitmap of %d "
                         "bytes" % (n, len(bitmap)))
    done = {i for i in range(n) if bitmap[i >> 3] >> (i & 7) & 1}
    return blob[:HEADER] + tail + section, epoch, n, done


def _split(header):
    """(the 56 bytes, the tail, the blend section) of a header."""
    header = bytes(header)
    fmt = struct.unpack_from("<I", header, 4)[0]
    n_spans = struct.unpack_from("<Q", header, HEADER + 8)[0] \
        if fmt >= 4 else 0
    end = HEADER + _tail_len(fmt, n_spans)
    return header[:HEADER], header[HEADER:end], header[end:]


def make(header, epoch, n, delivered):
    """A blob for epoch with the batches in delivered marked delivered."""
    bitmap = bytearray((n + 7) // 8)
    for i in delivered:
        bitmap[i >> 3] |= 1 << (i & 7)
    fixed, tail, section = _split(header)
    body = (fixed + struct.pack("<QQ", epoch, n) + tail + bytes(bitmap) +
            section)
    return body + struct.pack("<I", crc32c(body))


def without_spans(header):
    """header for an epoch other than the one its spans were consumed of:
    the same job, join cursor and weights, no consumed spans and no
    earlier blends (those are of that epoch too)."""
    fixed, tail, section = _split(header)
    if struct.unpack_from("<I", header, 4)[0] < 4:
        return bytes(header)
    if section:
        fmt = struct.unpack_from("<I", header, 4)[0]
        n_src = struct.unpack_from("<I", section, 0)[0]
        digests = section[8:8 + 8 * n_src] if fmt >= 6 else b""
        blend = section[len(section) - (8 + 16 * n_src):] if n_src else b""
        section = struct.pack("<II", n_src, 0) + digests + blend
    return fixed + tail[:8] + struct.pack("<Q", 0) + section
