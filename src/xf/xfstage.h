/* xfstage.h - the transform stage shared by the daemon and the client:
 * turns the encoded samples of one batch into one contiguous tensor block,
 * one sample per unit of a low-priority work pool.
 * SPDX-License-Identifier: MIT
 *
 * Both ends run the same code on the same bytes with the same keys
 * (seed, epoch, emlio_transform_sample_key(shard name, record)), which is
 * why a sample's tensor is byte-identical wherever it is decoded
 * (docs/transform.md). The daemon calls this between reading a GET's
 * samples and serializing the reply (server_pipeline); the client between
 * a batch's last reply and its hand-over (client_xf).
 *
 * Memory: a batch's block is B x H x W x 3 bytes (38 MB for 256 samples of
 * 224 x 224). Fresh pages cost ~16 us each on our VMs, ~150 ms for such a
 * block, so blocks come from a pool that keeps released ones touched (up
 * to keep_bytes) and is reference-counted: a block still inside a ZeroMQ
 * frame or a user's batch keeps the pool alive after its owner is gone.
 */
#ifndef EMLIO_XFSTAGE_H
#define EMLIO_XFSTAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "emlio/transform.h"

/* ---- tensor blocks ----------------------------------------------------- */

typedef struct emlio__xf_blocks emlio__xf_blocks_t;

/* A pool that keeps up to keep_bytes of released blocks for reuse. */
emlio__xf_blocks_t *emlio__xf_blocks_new(size_t keep_bytes);
/* A block of at least bytes (NULL when out of memory). Thread-safe. Each
 * block holds a reference to the pool until it is put back. */
uint8_t *emlio__xf_block_get(emlio__xf_blocks_t *pool, size_t bytes);
/* Returns a block to its pool (kept or freed). Thread-safe; NULL is a
 * no-op. Usable as a ZeroMQ free function's body. */
void emlio__xf_block_put(uint8_t *block);
/* Drops the owner's reference; the pool goes once its last block is back.
 * Accepts NULL; sets *pool_p NULL. */
void emlio__xf_blocks_release(emlio__xf_blocks_t **pool_p);

/* ---- one batch ------------------------------------------------------------
 */

/* One sample of a job: its encoded bytes (borrowed until done runs) and its
 * generator key; rc and crc are filled in by the stage. */
typedef struct emlio__xf_sample {
    const uint8_t *data;
    size_t len;
    uint64_t key; /* emlio_transform_sample_key(shard name, record) */
    int rc;       /* 0, or the transform's error */
    uint32_t crc; /* CRC-32C of the sample's output slice (want_crc) */
} emlio__xf_sample_t;

typedef struct emlio__xf_job emlio__xf_job_t;
/* Called once, from the worker that finished the job's last sample (or
 * from emlio__xf_job_start itself for an empty job). */
typedef void emlio__xf_done_fn(emlio__xf_job_t *job);

struct emlio__xf_job {
    /* Set by the caller before start. */
    const emlio_transform_t *transform;
    uint64_t seed, epoch;
    emlio__xf_sample_t *samples;
    size_t n;
    uint8_t *block; /* n x emlio_transform_output_bytes(transform) */
    bool want_crc;
    /* Bytes each decode may hold (its workspace and the decoder's own
     * memory: emlio_transform_ws_set_max_bytes); 0: the library default,
     * EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT. */
    uint64_t ws_max_bytes;
    emlio__xf_done_fn *done;
    void *userdata;
    /* Filled by the stage. */
    atomic_size_t remaining;
    atomic_uint_fast64_t cpu_ns; /* CPU time of the transforms, summed */
    atomic_size_t failed;        /* samples whose transform failed */
    atomic_size_t first_failed;  /* index + 1 of the first failure seen */
    char err[256];               /* that failure's text */
    size_t transformed;          /* distinct samples transformed: a
                                    sample named twice is done once */
    void *units;                 /* the stage's own; freed by cleanup */
};

/* Submits every sample of job to pool. 0, or EMLIO_ENOMEM /
 * EMLIO_ECLOSED (nothing submitted, done not called). On 0, done may
 * already have run on a worker, so the caller must not touch job (nor
 * what done frees) after a successful start. */
int emlio__xf_job_start(emlio__xf_job_t *job, emlio__workpool_t *pool);

/* Sample i's failure in its own words (the transform's text, or its
 * code's), NULL when it did not fail. Valid until cleanup. */
const char *emlio__xf_job_error(const emlio__xf_job_t *job, size_t i);

/* Frees what start allocated. */
void emlio__xf_job_cleanup(emlio__xf_job_t *job);

/* What one decode may hold (a job's ws_max_bytes) when `threads` decode
 * at once in a process that may use memory_limit bytes (MemAvailable or
 * its memory cgroup's limit, emlio__io_memory_limit; 0: unknown): a
 * quarter of the limit over the threads, between 32 MiB (a 12 MP baseline
 * JPEG's needs) and EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT. The daemon and
 * the client both size their decode threads by it: a 296 MB progressive
 * bomb per thread OOM-killed emliod in a 700 MB cgroup (issue 34). */
#define EMLIO__XF_WS_MIN_BYTES ((uint64_t)32 << 20)
uint64_t emlio__xf_ws_cap(uint64_t memory_limit, size_t threads);

/* A work pool for transforms: threads each with their own workspace, nice
 * by nice_delta. */
emlio__workpool_t *emlio__xf_pool_new(size_t threads, int nice_delta,
                                      const char *name, int *err);

#endif /* EMLIO_XFSTAGE_H */
