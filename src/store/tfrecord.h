/* tfrecord.h - internal parts of the TFRecord module: its parsers
 * (tfrecord_scan.c) and its table of format operations.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TFRECORD_PRIV_H
#define EMLIO_TFRECORD_PRIV_H

#include "base.h"
#include "emlio/tfrecord.h"
#include "format.h"

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

/* TFRecord behind the format interface (format.h): one record per
 * sample, the image and label from its tf.train.Example (or the whole
 * record with raw), every record's CRC checked as it is read. */
extern const emlio__format_ops_t emlio__format_tfrecord;

#endif /* EMLIO_TFRECORD_PRIV_H */
