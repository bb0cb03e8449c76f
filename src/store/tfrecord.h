/* tfrecord.h - internal helpers of the TFRecord module (writing side).
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TFRECORD_PRIV_H
#define EMLIO_TFRECORD_PRIV_H

#include <sys/stat.h>

#include "beneath.h"
#include "buf.h"
#include "emlio/tfrecord.h"

/* Opens the shard (and the index beside it) beneath root from now on:
 * rel is the end of the handle's path relative to the root. The root's
 * descriptor is borrowed and must stay open while the handle opens files.
 * Without this, files are opened as named (still only regular files). */
void emlio__tfrecord_confine(emlio_tfrecord_t *self, const emlio__root_t *root,
                             const char *rel);

/* Maps the file from fd (open read-only on the handle's file, st its
 * fstat), for a handle not mapped now; the shard cache's open. The fd
 * stays the caller's. Returns 0 or < 0 (message in errmsg). */
int emlio__tfrecord_map_fd(emlio_tfrecord_t *self, int fd,
                           const struct stat *st);

/* Unmaps the file but keeps its index and size, so that count, loc and
 * size still answer; record and verify must not be called until it is
 * mapped again (emlio__tfrecord_map_fd). The shard cache's close. */
void emlio__tfrecord_unmap(emlio_tfrecord_t *self);

/* Replaces the file's mapping by zero pages of the same size, in place, so
 * pointers into it stay valid but no longer depend on the file (which may
 * shrink: touching a mapped page past its end raises SIGBUS). Returns 0 or
 * -errno. */
int emlio__tfrecord_blank(emlio_tfrecord_t *self);

/* Prefetches record i into the CPU caches: its index entry (data false),
 * or its framing and stored CRC (data true, the index entry read). Does
 * nothing for i out of range; never faults. */
void emlio__tfrecord_prefetch(const emlio_tfrecord_t *self, size_t i,
                              bool data);

/* Takes the record table from the dataset index (dsindex.h): table[0,
 * len) holds `records` emlio_tfrecord_loc_t, borrowed from a mapping that
 * outlives the handle, for a file of size bytes (checked again by open).
 * The table is checked against crc when a record is first asked for; a
 * mismatch rescans the mapping (same count) or refuses every record with
 * EMLIO_EFORMAT. Needs no open file. Returns the record count,
 * EMLIO_EFORMAT (a table of the wrong size) or -ESTALE (the mapped file
 * has another size). */
int emlio__tfrecord_adopt(emlio_tfrecord_t *self, const void *table, size_t len,
                          uint64_t records, uint64_t size, uint32_t crc);

/* The record table (what the dataset index stores): *len bytes. */
const void *emlio__tfrecord_table(const emlio_tfrecord_t *self, size_t *len);

/* The two parsers of untrusted bytes behind emlio_tfrecord_scan and
 * emlio_tfrecord_load_index, working on memory so they can be fuzzed without
 * files. base[0, size) is the shard (base may be NULL when size is 0); name
 * is the shard's name for messages. On success *locs_out (owned by the
 * caller, freed with emlio_free; NULL when there are no records) and *n_out
 * receive the index and the record count is returned. On failure nothing is
 * allocated, *locs_out is NULL, *n_out is 0, errbuf (EMLIO_ERRMSG_LEN bytes,
 * or NULL) holds a message naming the file and offset, and the return is
 * EMLIO_EFORMAT, EMLIO_ECORRUPT or EMLIO_ENOMEM as documented for the
 * public functions. A shard of more than INT_MAX records is EMLIO_EFORMAT,
 * since the count is returned as an int. */
int emlio__tfrecord_scan_mem(const uint8_t *base, size_t size, bool verify_data,
                             const char *name, emlio_tfrecord_loc_t **locs_out,
                             size_t *n_out, char *errbuf);

/* Parses DALI index text[0, len) (not NUL-terminated) named idx_name and
 * checks it against the shard base[0, size) named name, as
 * emlio_tfrecord_load_index documents. Same ownership and returns as
 * emlio__tfrecord_scan_mem (EMLIO_EFORMAT or EMLIO_ENOMEM on failure). */
int emlio__tfrecord_parse_index(const char *text, size_t len,
                                const char *idx_name, const uint8_t *base,
                                size_t size, const char *name,
                                emlio_tfrecord_loc_t **locs_out, size_t *n_out,
                                char *errbuf);

#endif /* EMLIO_TFRECORD_PRIV_H */
