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
#include "imagefolder.h"
#include "tar.h"

/* "A shard is a shard": one of three backends, behind the accessors below
 * (count, size, offset, advice). The server reads records per backend. */
typedef enum emlio_shard_kind {
    EMLIO_SHARD_TFRECORD = 0,
    EMLIO_SHARD_TAR = 1,
    EMLIO_SHARD_IMAGEFOLDER = 2,
} emlio_shard_kind_t;

typedef struct emlio_shard {
    char *name; /* path relative to the data directory */
    emlio_shard_kind_t kind;
    emlio_tfrecord_t *file;  /* EMLIO_SHARD_TFRECORD, else NULL */
    emlio__tar_t *tar;       /* EMLIO_SHARD_TAR, else NULL */
    emlio__folder_t *folder; /* EMLIO_SHARD_IMAGEFOLDER, else NULL */
} emlio_shard_t;

/* Records of the shard. */
size_t emlio__shard_count(const emlio_shard_t *shard);
/* Bytes of the shard (file size; sum of files for a class directory). */
uint64_t emlio__shard_size(const emlio_shard_t *shard);
/* Byte offset of record i in the shard's file, for messages (0 for an
 * ImageFolder class, whose records are files). */
uint64_t emlio__shard_offset(const emlio_shard_t *shard, size_t i);
/* Page-cache advice for records [first, first + n); best effort. */
void emlio__shard_advise(const emlio_shard_t *shard, size_t first, size_t n,
                         int advice);
/* "tfrecord", "tar" or "imagefolder". */
const char *emlio__shard_kind_name(emlio_shard_kind_t kind);

/* How a data directory is read (see emlio_server_config_t). */
typedef struct emlio_shardset_opts {
    const char *format; /* NULL/"auto", "tfrecord", "tar", "imagefolder" */
    bool mixed_formats;
    bool verify_data;
    bool write_index;
    bool rescan; /* ignore existing index files */
} emlio_shardset_opts_t;

typedef struct emlio_shardset {
    emlio_shard_t *shards;
    size_t n;
    uint64_t records;
    uint64_t bytes;
    char fingerprint[17]; /* 16 hex digits */
} emlio_shardset_t;

/* Log hook for non-fatal events (an index that could not be written). */
typedef void emlio_shardset_log_fn(void *userdata, const char *msg);

/* Finds every *.tfrecord and *.tar under dir (recursively, following no
 * symlinked directories), maps each, loads its "<file>.idx" when it is
 * valid (and, for tar, not older than the shard) and otherwise scans the
 * file (verify_data: checking every TFRecord data CRC) and, if
 * write_index, writes the index. With no such files (or format
 * "imagefolder"), dir is read as an ImageFolder tree: one shard per class
 * directory. Several formats at once are EMLIO_EINVAL unless
 * opts->mixed_formats. Returns the shard count or an error with errbuf
 * naming the file (see emlio_server_load). */
int emlio__shardset_load(emlio_shardset_t *self, const char *dir,
                         const emlio_shardset_opts_t *opts,
                         emlio_shardset_log_fn *log, void *userdata,
                         char *errbuf);

/* Unmaps and frees everything; leaves self empty. */
void emlio__shardset_release(emlio_shardset_t *self);

#endif /* EMLIO_SHARDSET_H */
