/* plan_rest.h - the rest of an epoch: its global order less the positions
 * earlier runs of the job consumed (docs/planner.md, "Elastic resume").
 * SPDX-License-Identifier: MIT
 *
 * A run that resumes an epoch plans only what is left of it, and on any
 * number of ranks: the positions not consumed, taken in global order, are
 * numbered 0 .. rest - 1 ("rest positions") and sliced among the ranks as
 * a whole epoch would be. This module keeps the consumed spans and maps a
 * rest position back to its global position, in O(log spans).
 */
#ifndef EMLIO_PLAN_REST_H
#define EMLIO_PLAN_REST_H

#include "emlio/plan.h"

/* A consumed span with the consumed positions before it: rest position q
 * lies past span i when q >= begin - done_before. */
typedef struct emlio__rest_span {
    uint64_t begin;
    uint64_t end;
    uint64_t done_before;
} emlio__rest_span_t;

typedef struct emlio__rest {
    emlio__rest_span_t *spans; /* sorted, disjoint, none empty */
    size_t n;
    size_t cap;
    uint64_t done; /* positions they cover */
} emlio__rest_t;

/* Replaces r's spans with a copy of spans[0 .. n), which must be sorted by
 * begin, disjoint, non-empty and end at or before `size` (the epoch's
 * positions). Returns 0, EMLIO_EINVAL (err says which span is wrong) or
 * EMLIO_ENOMEM; on failure r holds no spans. */
int emlio__rest_set(emlio__rest_t *r, const emlio_plan_span_t *spans, size_t n,
                    uint64_t size, char *err);

void emlio__rest_release(emlio__rest_t *r);

/* The global position of rest position q (q < size - r->done). */
uint64_t emlio__rest_position(const emlio__rest_t *r, uint64_t q);

/* Calls emit once for each run of consecutive global positions that the
 * rest positions [q0, q1) cover, in order; stops at the first non-zero
 * return and returns it. */
int emlio__rest_map(const emlio__rest_t *r, uint64_t q0, uint64_t q1,
                    int (*emit)(void *arg, uint64_t begin, uint64_t end),
                    void *arg);

/* The stratified layout of a rest (docs/planner.md, "Stratified
 * batches"): global batch i is rest positions [i G, (i + 1) G), G = world
 * x batch_size, and rank r's batch i its part from i G + r B; the short
 * last one of L positions is cut into world parts of ceil(L / world)
 * (none with drop_last), positions past the rest being padding. */
typedef struct emlio__strata {
    uint64_t global; /* G */
    uint64_t batch;  /* B */
    uint64_t full;   /* full global batches */
    uint64_t part;   /* a rank's part of the short one */
} emlio__strata_t;

void emlio__strata_init(emlio__strata_t *st, uint64_t rest, uint32_t world,
                        uint32_t batch_size, bool drop_last);

/* The first rest position of rank `rank`'s batch i (its length is B for
 * i < full, part for the last). */
uint64_t emlio__strata_first(const emlio__strata_t *st, uint32_t rank,
                             uint64_t i);

/* Sorts spans[0 .. *n) by begin and merges those that overlap or touch,
 * in place; *n receives the count left. */
void emlio__spans_normalize(emlio_plan_span_t *spans, size_t *n);

#endif /* EMLIO_PLAN_REST_H */
