/* emlio/dataset.h - a data directory as emliod reads it, for tools.
 * SPDX-License-Identifier: MIT
 *
 * Opens a --data directory the way emliod does (docs/formats.md): TFRecord
 * shards, WebDataset tar shards or an ImageFolder tree, each shard a list
 * of records, each record a list of named fields. `emlio inspect`, `index`
 * and `pack` use it so that every format is understood alike.
 *
 *   emlio_dataset_t *ds = emlio_dataset_new();
 *   if (!ds || emlio_dataset_open(ds, "/data", NULL, 0) < 0)
 *       die(emlio_dataset_errmsg(ds));
 *   for (size_t s = 0; s < emlio_dataset_shard_count(ds); s++)
 *       printf("%s %zu\n", emlio_dataset_shard_name(ds, s),
 *              emlio_dataset_shard_records(ds, s));
 *   emlio_dataset_destroy(&ds);
 *
 * Thread rules: one thread at a time per handle.
 */
#ifndef EMLIO_DATASET_H
#define EMLIO_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emlio_dataset emlio_dataset_t;

/* emlio_dataset_open flags. */
#define EMLIO_DATASET_MIXED       1 /* several formats at once are fine */
#define EMLIO_DATASET_WRITE_INDEX 2 /* write missing or stale index files */
#define EMLIO_DATASET_REINDEX                 \
    4 /* ignore index files: scan every shard \
         (and rewrite them with WRITE_INDEX) */
#define EMLIO_DATASET_VERIFY          8 /* check every TFRecord data CRC */
/* follow symlinks that stay inside dir (by default they are left out;
 * nothing outside dir is ever read: docs/security.md) */
#define EMLIO_DATASET_FOLLOW_SYMLINKS 16

/* Allocates a closed handle; NULL only when out of memory. */
EMLIO_EXPORT emlio_dataset_t *emlio_dataset_new(void);

/* Closes and frees. Accepts NULL; sets *self_p NULL. */
EMLIO_EXPORT void emlio_dataset_destroy(emlio_dataset_t **self_p);

/* Opens dir in format (NULL or "auto", "tfrecord", "tar", "imagefolder")
 * with EMLIO_DATASET_* flags. Returns the shard count or an error (message
 * in emlio_dataset_errmsg, naming file and offset for a corrupt shard). */
EMLIO_EXPORT int emlio_dataset_open(emlio_dataset_t *self, const char *dir,
                                    const char *format, int flags);

/* Opens one shard file as a dataset of one shard: "*.tar" as a WebDataset
 * shard, any other name as a TFRecord file (`emlio inspect FILE`, `emlio
 * index`). Flags: EMLIO_DATASET_VERIFY, EMLIO_DATASET_REINDEX (scan even
 * when FILE.idx is valid) and EMLIO_DATASET_WRITE_INDEX (write FILE.idx
 * after a scan; unlike emlio_dataset_open, a failed write is an error, as
 * a tool that was asked to index must say so). The fingerprint of a single
 * file is "". Returns the record count or an error (message in
 * emlio_dataset_errmsg, naming the file and, for a corrupt one, the
 * offset). */
EMLIO_EXPORT int emlio_dataset_open_file(emlio_dataset_t *self,
                                         const char *path, int flags);

/* Receives what opening a directory left out (symbolic links not
 * followed, unreadable directories, stale file lists and indexes rebuilt),
 * one line each; msg is borrowed for the call. */
typedef void emlio_dataset_log_fn(void *userdata, const char *msg);

/* Installs fn (NULL: discard, the default) for the next emlio_dataset_open.
 * fn is called from the opening thread. */
EMLIO_EXPORT void emlio_dataset_set_log(emlio_dataset_t *self,
                                        emlio_dataset_log_fn *fn,
                                        void *userdata);

/* The last failure's text; never NULL. */
EMLIO_EXPORT const char *emlio_dataset_errmsg(const emlio_dataset_t *self);

/* The dataset fingerprint clients see (16 hex digits, borrowed). */
EMLIO_EXPORT const char *emlio_dataset_fingerprint(const emlio_dataset_t *self);

EMLIO_EXPORT size_t emlio_dataset_shard_count(const emlio_dataset_t *self);
/* Shard i's name (relative path or class directory), its format
 * ("tfrecord", "tar", "imagefolder"), records and bytes. Borrowed strings;
 * NULL / 0 past the count. */
EMLIO_EXPORT const char *emlio_dataset_shard_name(const emlio_dataset_t *self,
                                                  size_t i);
EMLIO_EXPORT const char *emlio_dataset_shard_format(const emlio_dataset_t *self,
                                                    size_t i);
EMLIO_EXPORT size_t emlio_dataset_shard_records(const emlio_dataset_t *self,
                                                size_t i);
EMLIO_EXPORT uint64_t emlio_dataset_shard_bytes(const emlio_dataset_t *self,
                                                size_t i);

/* The file of record r of shard s in an ImageFolder: its path relative to
 * the data directory ("cat/x.jpg"), for messages and for tools that want
 * the file's name or size. NULL for TFRecord and tar records (they are
 * parts of a shard) and past the count. Borrowed until the next call on
 * the handle. */
EMLIO_EXPORT const char *emlio_dataset_record_name(emlio_dataset_t *self,
                                                   size_t s, size_t r);

/* Called once per field of a record: tar members (field = extension),
 * an ImageFolder file (field = its lower-case extension, "jpg", "png",
 * ...) and a TFRecord record (field "", the whole serialized record).
 * Return 0 to go on. */
typedef int emlio_dataset_field_fn(void *userdata, const char *field,
                                   const uint8_t *data, size_t len);

/* Reads record r of shard s: calls fn per field and stores the label (-1
 * when none: tar "cls", ImageFolder class index, TFRecord
 * image/class/label) in *label when not NULL. Returns 0, fn's non-zero
 * value, EMLIO_ENOTFOUND, or an error reading the file. */
EMLIO_EXPORT int emlio_dataset_record(const emlio_dataset_t *self, size_t s,
                                      size_t r, emlio_dataset_field_fn *fn,
                                      void *userdata, int64_t *label);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_DATASET_H */
