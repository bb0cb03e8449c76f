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

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "emlio/tfrecord.h"

/* One shard. A shard that changes under a running daemon must never be
 * read through its mapping once the change is visible (a shrunk file
 * raises SIGBUS on access), so every access to the mapping, including a
 * zero-copy frame that ZeroMQ still holds, counts as a user. Leased shards
 * hold a read lease (F_SETLEASE): a writer's open waits until we have
 * stopped reading and released the lease. Shards that cannot be leased
 * (another process has them open for writing, a file system without
 * leases, a foreign owner without CAP_LEASE) are read with pread into a
 * private copy, which a shrinking file cannot fault. */
typedef struct emlio_shard {
    char *name; /* path relative to the data directory */
    emlio_tfrecord_t *file;
    int fd;        /* open read-only for the lease and copying reads */
    bool leased;   /* holds a read lease; otherwise copying reads */
    bool released; /* changed: lease given back, mapping no longer read */
    bool replaced; /* logged that the path now names another file */
    uint64_t size; /* the size at load */
    dev_t dev;     /* the inode we opened, to notice a rename over it */
    ino_t ino;
    uint64_t changed_ns; /* when the change was seen (frontend only) */
    atomic_uint users;   /* readers and frames in flight in the mapping */
    atomic_bool changed; /* changed on disk: its samples are refused */
    atomic_bool logged;  /* the change has been logged */
} emlio_shard_t;

typedef struct emlio_shardset {
    emlio_shard_t *shards;
    size_t n;
    uint64_t records;
    uint64_t bytes;
    size_t leased;        /* shards holding a read lease */
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

/* Lets a shard's data be read: true and one more user, or false when the
 * shard changed on disk (then nothing may touch its mapping). */
bool emlio__shard_acquire(emlio_shard_t *shard);

/* Ends one use begun by emlio__shard_acquire. */
void emlio__shard_release(emlio_shard_t *shard);

/* Marks shard changed (once; logs why through log) so that no new reader
 * starts on it. Safe from any thread. */
void emlio__shard_mark_changed(emlio_shard_t *shard, const char *why,
                               emlio_shardset_log_fn *log, void *userdata);

/* Reads record i of shard into a fresh copy with pread (copying reads, for
 * shards without a lease): *buf_out is the caller's to free; *data and *len
 * are the record's payload inside it and *stored its stored CRC. Returns 0,
 * EMLIO_ENOTFOUND, EMLIO_ENOMEM, -EIO, or -ESTALE when the file has become
 * shorter than the record (the shard is then marked changed). */
int emlio__shard_read_copy(emlio_shard_t *shard, size_t i, uint8_t **buf_out,
                           const uint8_t **data, size_t *len, uint32_t *stored,
                           emlio_shardset_log_fn *log, void *userdata);

/* Looks for shards that are being changed on disk: a lease break under
 * way, a file that shrank, or a path that now names another file (logged
 * once; the inode we opened is still intact, so it is still served). For a
 * leased shard whose lease is being broken, gives the lease back once its
 * last user is gone (or after grace_ms, replacing the still-used mapping
 * by zero pages, which clients then reject by CRC). Call it from one
 * thread, a few times a second. With check_paths, also stats every path. */
void emlio__shardset_watch(emlio_shardset_t *self, bool check_paths,
                           uint32_t grace_ms, emlio_shardset_log_fn *log,
                           void *userdata);

/* Unmaps and frees everything; leaves self empty. */
void emlio__shardset_release(emlio_shardset_t *self);

#endif /* EMLIO_SHARDSET_H */
