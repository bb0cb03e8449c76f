/* server_xfspec.h - the daemon's side of transforms: the specs its clients
 * asked for (parsed once each), and the pool that runs them.
 * SPDX-License-Identifier: MIT
 *
 * A GET names its transform by the canonical spec text (docs/protocol.md
 * 5.6). Parsing on every GET would cost more than a small batch's header,
 * so each distinct text is parsed once and kept: at most
 * EMLIO__XFSPEC_MAX at a time, so a client cycling through specs
 * cannot grow the daemon's memory. When the cache is full, the least
 * recently used spec that no request in flight uses makes room (a client
 * that once sent 16 specs must not lock every other client out of
 * transforms); only when all are in use is a new one refused. Only the
 * frontend thread looks specs up and adds users; jobs, on any thread, end
 * their use (the count only falls there, so a spec the frontend sees
 * unused stays unused). The parsed pipelines are immutable and shared by
 * the transform threads.
 */
#ifndef EMLIO_SERVER_XFSPEC_H
#define EMLIO_SERVER_XFSPEC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "xf.h"

#define EMLIO__XFSPEC_MAX 16

typedef struct emlio__xfspecs {
    size_t threads;        /* 0: this daemon does not transform */
    uint64_t max_pixels;   /* per image; 0 = the library default */
    uint64_t ws_max_bytes; /* what one decode may hold (start: below) */
    emlio__workpool_t *pool;
    emlio__xf_blocks_t *blocks;

    struct {
        char *text; /* canonical (emlio_transform_spec) */
        emlio_transform_t *transform;
        atomic_uint users; /* requests in flight that use it */
        uint64_t used_at;  /* tick of its last lookup */
    } specs[EMLIO__XFSPEC_MAX];

    size_t n_specs;
    uint64_t tick;
} emlio__xfspecs_t;

/* Starts the pool (threads > 0). memory_limit: what the daemon may use
 * (MemAvailable or its cgroup's limit; 0: unknown): every decode thread
 * may hold a quarter of it over the threads, between 32 and 512 MiB, so
 * that threads decoding large images at once stay inside the limit (a
 * 296 MB progressive bomb per thread OOM-killed emliod in a 700 MB
 * cgroup). 0 or an error; errbuf says why. */
int emlio__xfspec_start(emlio__xfspecs_t *xf, size_t threads,
                        uint64_t max_pixels, uint64_t memory_limit,
                        char *errbuf);

/* Joins the pool: the transforms queued run first and hand their jobs on.
 * Idempotent. */
void emlio__xfspec_drain(emlio__xfspecs_t *xf);

/* Drains, then frees the specs (no job may use them any more). The block
 * pool lives on while frames still hold blocks. Idempotent. */
void emlio__xfspec_stop(emlio__xfspecs_t *xf);

/* The pipeline for spec[0..len): 0 with *out set and one more use counted
 * in **users_out (the caller ends it with atomic_fetch_sub when its request
 * is done), EMLIO_EINVAL (a bad spec, or this daemon does not transform:
 * errbuf says which), EMLIO_ELIMIT (the cache is full of specs in use) or
 * EMLIO_ENOMEM. Frontend thread only. */
int emlio__xfspec_lookup(emlio__xfspecs_t *xf, const char *spec, size_t len,
                         const emlio_transform_t **out, atomic_uint **users_out,
                         char *errbuf);

#endif /* EMLIO_SERVER_XFSPEC_H */
