/* emlio/tfrecord.h - memory-mapped TFRecord shards and their record indexes.
 * SPDX-License-Identifier: MIT
 *
 * A TFRecord file is a sequence of records, each framed as
 *
 *     uint64 length (little endian)
 *     uint32 masked CRC32C of the 8 length bytes
 *     byte   data[length]
 *     uint32 masked CRC32C of data
 *
 * emlio_tfrecord_t maps one file read-only and keeps an index of
 * (offset, length) per record so any record is reachable in O(1). The index
 * comes from one scan of the file, or from an index file in the text format
 * of NVIDIA DALI's tfrecord2idx ("<offset> <total_size>\n" per record, where
 * total_size = length + 16), so DALI users can reuse the same files.
 *
 * Never trust the file: every length is checked against the mapping before
 * it is used, and every failure leaves a message naming the file and byte
 * offset in emlio_tfrecord_errmsg().
 *
 * Thread rules: open/scan/load_index/write_index are used by one thread.
 * After that, emlio_tfrecord_record, _verify and _advise may be called from
 * many threads at once (they only read the mapping and the index).
 */
#ifndef EMLIO_TFRECORD_H
#define EMLIO_TFRECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of framing around each record's data: 8 + 4 before, 4 after. */
#define EMLIO_TFRECORD_OVERHEAD 16

/* Largest record data length we accept (1 GiB); anything above is treated
 * as corruption rather than an allocation request. */
#define EMLIO_TFRECORD_MAX_RECORD (1u << 30)

typedef struct emlio_tfrecord emlio_tfrecord_t;

/* Where one record sits in the file. */
typedef struct emlio_tfrecord_loc {
    uint64_t offset; /* offset of the record's length field */
    uint64_t len;    /* length of the record's data */
} emlio_tfrecord_loc_t;

/* Allocates a handle for the file at path (copied). Opens nothing.
 * Returns NULL only when out of memory. */
EMLIO_EXPORT emlio_tfrecord_t *emlio_tfrecord_new(const char *path);

/* Unmaps the file and frees the handle. Accepts NULL; sets *self_p NULL. */
EMLIO_EXPORT void emlio_tfrecord_destroy(emlio_tfrecord_t **self_p);

/* Opens and maps the file read-only. An empty file is valid (0 records).
 * Returns 0, -errno, or EMLIO_EINVAL if already open. */
EMLIO_EXPORT int emlio_tfrecord_open(emlio_tfrecord_t *self);

/* Builds the index by walking the framing from offset 0 to the end.
 * verify_data also checks every record's data CRC (reads every byte);
 * otherwise only the length fields and their CRCs are checked.
 * Returns the record count, EMLIO_EFORMAT (bad framing, a length CRC that
 * does not match, a record that runs past the end of the file),
 * EMLIO_ECORRUPT (a data CRC that does not match) or EMLIO_ENOMEM. On error
 * the index is left empty. */
EMLIO_EXPORT int emlio_tfrecord_scan(emlio_tfrecord_t *self, bool verify_data);

/* Reads a DALI-format index file and checks it against the mapping: offsets
 * strictly increasing, every record inside the file, the records tiling the
 * file exactly, each record's length field equal to total_size - 16 with a
 * valid length CRC. Returns the record count, -errno (cannot read it),
 * EMLIO_EFORMAT (a malformed line, or an index that does not describe this
 * file; the message gives the index line) or EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_tfrecord_load_index(emlio_tfrecord_t *self,
                                           const char *idx_path);

/* Writes the current index to idx_path in DALI's format, atomically (a
 * temporary file renamed over idx_path). Returns 0 or -errno. */
EMLIO_EXPORT int emlio_tfrecord_write_index(const emlio_tfrecord_t *self,
                                            const char *idx_path);

/* The path given to emlio_tfrecord_new. */
EMLIO_EXPORT const char *emlio_tfrecord_path(const emlio_tfrecord_t *self);

/* Records in the index (0 before scan/load_index). */
EMLIO_EXPORT size_t emlio_tfrecord_count(const emlio_tfrecord_t *self);

/* Size of the mapped file in bytes. */
EMLIO_EXPORT uint64_t emlio_tfrecord_size(const emlio_tfrecord_t *self);

/* The index entry of record i (i < count), borrowed. */
EMLIO_EXPORT const emlio_tfrecord_loc_t *
emlio_tfrecord_loc(const emlio_tfrecord_t *self, size_t i);

/* Points *data at record i's bytes inside the mapping (zero-copy; valid
 * until the handle is destroyed) and stores its length and the data CRC32C
 * stored in the file (unmasked) in *stored_crc when not NULL. Checks the
 * index entry against the mapping but not the data CRC. Returns 0,
 * EMLIO_ENOTFOUND (i out of range) or EMLIO_EFORMAT. Thread-safe. */
EMLIO_EXPORT int emlio_tfrecord_record(const emlio_tfrecord_t *self, size_t i,
                                       const uint8_t **data, size_t *len,
                                       uint32_t *stored_crc);

/* Checks record i's data against its stored CRC. Returns 0,
 * EMLIO_ECORRUPT, EMLIO_ENOTFOUND or EMLIO_EFORMAT. Thread-safe; writes no
 * error message (callers name the shard and offset themselves). */
EMLIO_EXPORT int emlio_tfrecord_verify(const emlio_tfrecord_t *self, size_t i);

/* Page-cache hints for records [first, first + n): advice is
 * EMLIO_ADVISE_WILLNEED (start readahead now) or EMLIO_ADVISE_DONTNEED
 * (done with these pages). Best effort; returns 0 or -errno. Thread-safe. */
#define EMLIO_ADVISE_WILLNEED 1
#define EMLIO_ADVISE_DONTNEED 2
EMLIO_EXPORT int emlio_tfrecord_advise(const emlio_tfrecord_t *self,
                                       size_t first, size_t n, int advice);

/* The last failure's text, e.g.
 * "bad length crc in 'a.tfrecord' at offset 4096". Never NULL. */
EMLIO_EXPORT const char *emlio_tfrecord_errmsg(const emlio_tfrecord_t *self);

/* Appends one framed record (length, masked CRC-32C of the length, data,
 * masked CRC-32C of the data) to out: the writing side of the format above.
 * Returns 0 or EMLIO_ENOMEM (out is then unchanged). Reentrant. */
EMLIO_EXPORT int emlio_tfrecord_append(emlio_buf_t *out, const uint8_t *data,
                                       size_t len);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_TFRECORD_H */
