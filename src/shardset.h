/* shardset.h - the shards of one data directory: found, mapped, indexed.
 * SPDX-License-Identifier: MIT
 *
 * Used by the server. Shards are ordered by their path relative to the data
 * directory; that relative path is their name on the wire, and the dataset
 * fingerprint covers every (name, records, bytes) so a client can tell when
 * a restarted daemon serves something else.
 */
#ifndef EMLIO_SHARDSET_H
#define EMLIO_SHARDSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emlio/tfrecord.h"

typedef struct emlio_shard {
    char *name; /* path relative to the data directory */
    emlio_tfrecord_t *file;
} emlio_shard_t;

typedef struct emlio_shardset {
    emlio_shard_t *shards;
    size_t n;
    uint64_t records;
    uint64_t bytes;
    char fingerprint[17]; /* 16 hex digits */
} emlio_shardset_t;

/* Log hook for non-fatal events (an index that could not be written). */
typedef void emlio_shardset_log_fn(void *userdata, const char *msg);

/* Finds every *.tfrecord under dir (recursively, following no symlinked
 * directories), maps each, loads its "<file>.idx" when it is valid and
 * otherwise scans the file (verify_data: checking every data CRC) and, if
 * write_index, writes the index. Returns the shard count or an error with
 * errbuf naming the file (see emlio_server_load). */
int emlio__shardset_load(emlio_shardset_t *self, const char *dir,
                         bool verify_data, bool write_index,
                         emlio_shardset_log_fn *log, void *userdata,
                         char *errbuf);

/* Unmaps and frees everything; leaves self empty. */
void emlio__shardset_release(emlio_shardset_t *self);

#endif /* EMLIO_SHARDSET_H */
