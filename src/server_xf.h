/* server_xf.h - the daemon's side of transforms: the specs its clients
 * asked for (parsed once each), and the pool that runs them.
 * SPDX-License-Identifier: MIT
 *
 * A GET names its transform by the canonical spec text (docs/protocol.md
 * 5.6). Parsing on every GET would cost more than a small batch's header,
 * so each distinct text is parsed once and kept for the daemon's life; at
 * most EMLIO_SERVER_XF_MAX_SPECS distinct ones, so a client cycling through
 * specs cannot grow the daemon's memory. Only the frontend thread looks
 * specs up; the parsed pipelines are immutable and shared by the transform
 * threads.
 */
#ifndef EMLIO_SERVER_XF_H
#define EMLIO_SERVER_XF_H

#include <stddef.h>
#include <stdint.h>

#include "xfstage.h"

#define EMLIO_SERVER_XF_MAX_SPECS 16

typedef struct emlio__server_xf {
    size_t threads;      /* 0: this daemon does not transform */
    uint64_t max_pixels; /* per image; 0 = the library default */
    emlio__workpool_t *pool;
    emlio__xf_blocks_t *blocks;

    struct {
        char *text; /* as the GET spelled it */
        emlio_transform_t *transform;
    } specs[EMLIO_SERVER_XF_MAX_SPECS];

    size_t n_specs;
} emlio__server_xf_t;

/* Starts the pool (threads > 0). 0 or an error; errbuf says why. */
int emlio__server_xf_start(emlio__server_xf_t *xf, size_t threads,
                           uint64_t max_pixels, char *errbuf);

/* Joins the pool (queued transforms run first) and frees the specs. The
 * block pool lives on while frames still hold blocks. */
void emlio__server_xf_stop(emlio__server_xf_t *xf);

/* The pipeline for spec[0..len): 0 with *out set, EMLIO_EINVAL (a bad spec,
 * or this daemon does not transform: errbuf says which), EMLIO_ELIMIT (too
 * many distinct specs) or EMLIO_ENOMEM. Frontend thread only. */
int emlio__server_xf_lookup(emlio__server_xf_t *xf, const char *spec,
                            size_t len, const emlio_transform_t **out,
                            char *errbuf);

#endif /* EMLIO_SERVER_XF_H */
