/* sharecache.h - one read of a shard's bytes serves every job that shares it.
 * SPDX-License-Identifier: MIT
 *
 * Jobs that opt in to shared reads (`emlio fetch --share`, emliod
 * --share-all) plan their epochs from the dataset's shared schedule
 * (docs/planner.md, "Shared schedule"): every sharing job reads the same
 * windows of shards in the same order, each in its own seeded order inside
 * the window. Their reads of a mapped shard that is read from the device
 * (--io read, ioengine.h) go through this cache: the file is cut into
 * chunks of EMLIO__SHARE_CHUNK bytes; the first job to need a chunk reads
 * all of it, at the device's sequential rate, and the record bytes of that
 * job and of every other job whose cursor is in the same window are copied
 * out of it. The cache holds at most its capacity (emliod --share-bytes);
 * the least recently used chunk no reader is copying from makes room. So a
 * job that falls further behind than the cache holds finds its chunks gone
 * and reads them again: on its own, counted as its own reads. A record no
 * chunk can hold room for (every chunk pinned, or a record larger than the
 * cache) is not cached: the caller reads it alone ("bypass").
 *
 *   reader thread (server_pipeline.c)
 *     emlio__share_scope_set(cache, job, &tally)   for one GET
 *       format read op -> ctx->pread -> emlio__shard_pread
 *         -> emlio__share_cache_read
 *     emlio__share_scope_set(NULL, 0, NULL)
 *     tally: bytes read from the device, shared with, or own to the job
 *
 * Chunks are keyed by (owner, identity, index): the shard, and the identity
 * of the file it had when the daemon loaded it (size and mtime), so a file
 * replaced under the daemon never serves its predecessor's bytes. Thread
 * safe: one mutex, held for lookups and bookkeeping, never across a read.
 */
#ifndef EMLIO_SHARECACHE_H
#define EMLIO_SHARECACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes per chunk: large enough for the device's sequential rate (fio
 * reached it from 1 MiB reads at depth 32 here, 4 MiB at depth 2), small
 * enough that a window of a few shards is many chunks. */
#define EMLIO__SHARE_CHUNK ((size_t)4 << 20)
/* The smallest cache: a few chunks per reader thread. */
#define EMLIO__SHARE_MIN   ((uint64_t)8 * EMLIO__SHARE_CHUNK)

typedef struct emlio__share_cache emlio__share_cache_t;

/* What reads through the cache did for one job (or in total). */
typedef struct emlio__share_tally {
    uint64_t loaded; /* bytes of chunks read from the file for it */
    uint64_t shared; /* record bytes copied from chunks another job read */
    uint64_t own;    /* record bytes from chunks this job read */
    uint64_t bypass; /* record bytes the cache had no room for */
} emlio__share_tally_t;

typedef struct emlio__share_stats {
    uint64_t capacity;
    uint64_t held; /* bytes of chunks in the cache now */
    uint64_t peak; /* most bytes held at once */
    uint64_t chunks;
    uint64_t evicted; /* chunks let go to make room */
    emlio__share_tally_t total;
} emlio__share_stats_t;

/* A cache of at most capacity bytes (at least EMLIO__SHARE_MIN; less is
 * raised to it). Returns 0 or EMLIO_ENOMEM. */
int emlio__share_cache_new(emlio__share_cache_t **self_p, uint64_t capacity);
/* Frees every chunk. No read may be in progress. Accepts NULL; sets
 * *self_p NULL. */
void emlio__share_cache_destroy(emlio__share_cache_t **self_p);

/* The file fd (of size file_size, read at align as emlio__io_read wants
 * it) is owner's with identity ident. Copies [offset, offset + len) into a
 * fresh buffer *buf (emlio__iobuf_free it), *data = *buf, reading the
 * chunks that hold it which the cache does not have yet; reader says
 * whose read it is (a job), tally (may be NULL) adds what happened.
 * Returns 1 with *buf set; 0 when the cache has no room for it (nothing
 * was read: the caller reads it itself; tally->bypass counts it); or a
 * read's error: -ESTALE when the file is shorter than file_size, -EIO or
 * another -errno, EMLIO_ENOMEM. */
int emlio__share_cache_read(emlio__share_cache_t *self, const void *owner,
                            uint64_t ident, int fd, unsigned align,
                            uint64_t file_size, uint64_t offset, size_t len,
                            uint64_t reader, uint8_t **buf,
                            const uint8_t **data, emlio__share_tally_t *tally);

void emlio__share_cache_stats(emlio__share_cache_t *self,
                              emlio__share_stats_t *out);

/* The calling thread's scope: while set, emlio__shard_pread reads mapped
 * shards through cache for reader, adding to tally. A reader thread sets
 * it around one GET of a sharing job and clears it (cache NULL) after. */
void emlio__share_scope_set(emlio__share_cache_t *cache, uint64_t reader,
                            emlio__share_tally_t *tally);
/* The scope's cache (NULL: none), and its reader and tally. */
emlio__share_cache_t *emlio__share_scope(uint64_t *reader,
                                         emlio__share_tally_t **tally);

#endif /* EMLIO_SHARECACHE_H */
