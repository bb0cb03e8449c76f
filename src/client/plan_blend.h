/* plan_blend.h - an epoch blended from several sources in exact quotas
 * (docs/planner.md, "Sources"), and the keyed permutation it shares with
 * the planner.
 * SPDX-License-Identifier: MIT
 *
 * The planner lays the sources' records out one source after another
 * (source-major, each in file order) and asks this module, for a global
 * position g of the epoch, which of those records stands there. Three
 * permutations make the answer, none of them stored:
 *
 *   - the epoch's mix: which source holds position g, and the how-many-th
 *     of that source's picks it is (k): a keyed permutation of the
 *     epoch's quotas laid end to end, or, stratified, each global batch
 *     cut by counts that keep every source within one of its share;
 *   - the source's order this epoch (sigma), so that a source's picks do
 *     not come in the same order every epoch;
 *   - the source's stream (pi, the same every epoch): pick k of epoch e is
 *     stream position e * quota + sigma(k), and stream position p is
 *     record pi(p mod size). Consecutive epochs so take consecutive runs
 *     of one fixed permutation: a source subsampled to a quarter shows all
 *     of its samples once in four epochs before any twice, and one
 *     repeated 2.5 times shows each 2 or 3 times an epoch, never more.
 *
 * When the weights change in the middle of an epoch, the blend is built
 * in layers (docs/planner.md, "Weights changed mid-epoch"): each layer
 * after the first is a blend of what is left, whose source s has the part
 * of the rest its new quota still lacks, and whose pick k is the k-th
 * pick of the source's run that no layer before delivered (then the run
 * goes on past what the layers before reached).
 */
#ifndef EMLIO_PLAN_BLEND_H
#define EMLIO_PLAN_BLEND_H

#include "emlio/plan.h"

#define EMLIO__PERM_ROUNDS 6

/* A keyed permutation of [0, m): a Feistel network over the smallest
 * power of two >= m (at least 4), cycle-walked back into [0, m)
 * (docs/planner.md, "Step 3"). */
typedef struct emlio__perm {
    uint64_t key[EMLIO__PERM_ROUNDS];
    uint64_t m;
    uint64_t lo_mask; /* the right half's bits */
    uint64_t hi_mask; /* the left half's bits, shifted down */
    unsigned lo_bits;
} emlio__perm_t;

/* Sets f up as the permutation of [0, m) of one stream of one epoch. */
void emlio__perm_init(emlio__perm_t *f, uint64_t seed, uint64_t epoch,
                      uint64_t stream, uint64_t m);

/* The image of x < m. */
uint64_t emlio__perm_apply(const emlio__perm_t *f, uint64_t x);

/* What the earlier layers of an epoch delivered of one source: pick j of
 * its run (stream position start + j) is taken when bit j is set. The
 * k-th free pick is found in O(log) through the free picks counted before
 * each group of eight words. */
typedef struct emlio__taken {
    uint64_t start;  /* stream position of pick 0: layer 0's */
    uint64_t extent; /* picks [0, extent) that the layers reached */
    uint64_t count;  /* of them, taken */
    uint64_t *bits;  /* ceil(extent / 64) words, bits past extent set */
    uint64_t *zeros; /* free picks before word 8 i */
    size_t cap;      /* words of bits */
    size_t zcap;     /* entries of zeros */
} emlio__taken_t;

/* One source while an epoch is planned. */
typedef struct emlio__blend_source {
    uint64_t base;      /* its first record in the source-major layout */
    uint64_t size;      /* its records */
    uint64_t quota;     /* its picks this epoch */
    uint64_t offset;    /* unstratified: its block in the quotas end to end */
    uint64_t start;     /* stream position of pick 0: epoch * quota mod size */
    uint64_t delivered; /* layers > 0: what the layers before delivered */
    /* Stratified: picks per full global batch (per) plus one in `extras`
     * of them, the extras laid round-robin from position extra_first of
     * the run of all sources' extras; `last` picks in a short last one. */
    uint64_t per;
    uint64_t extras;
    uint64_t extra_first;
    uint64_t last;
    emlio__perm_t stream; /* pi: the same every epoch */
    emlio__perm_t order;  /* sigma: this epoch's */
} emlio__blend_source_t;

typedef struct emlio__blend {
    emlio__blend_source_t *src;
    size_t n;
    size_t cap;
    uint64_t total; /* the epoch's positions (of the rest, in a layer > 0) */
    uint64_t seed;  /* of the mix and order permutations (layer's own) */
    uint64_t stream_seed; /* of the streams: the job's seed */
    uint64_t epoch;
    bool shuffle;
    uint64_t batch;    /* stratified: a global batch's positions; 0 otherwise */
    uint64_t full;     /* stratified: full global batches */
    emlio__perm_t mix; /* unstratified, shuffled: over total */
    uint32_t layer;    /* 0: the epoch's own blend */
    emlio__taken_t *taken; /* layers > 0: n of them */
    size_t taken_cap;
} emlio__blend_t;

/* Per-call scratch of a stratified lookup: the counts of one global batch
 * (n entries each), computed once for all the positions of that batch. */
typedef struct emlio__blend_cache {
    uint64_t batch; /* whose counts these are; UINT64_MAX: none */
    emlio__perm_t perm;
    uint64_t *count;  /* picks of each source in the batch */
    uint64_t *before; /* picks of each source in the batches before */
    size_t cap;
} emlio__blend_cache_t;

/* Sets the blend up for one epoch: sources[s] with sizes[s] records laid
 * out source-major, quotas from the params (emlio/plan.h), built over the
 * params' layers when the weights changed in the epoch. Returns 0,
 * EMLIO_EINVAL (a bad weight or count, or a layer's consumed span: err
 * says which and why) or EMLIO_ENOMEM. Time O(sources + the positions
 * the layers consumed), memory one bit per pick the layers reached. */
int emlio__blend_init(emlio__blend_t *b, const emlio_plan_params_t *p,
                      const uint64_t *sizes, char *err);

void emlio__blend_release(emlio__blend_t *b);

/* The memory b holds, in bytes. */
size_t emlio__blend_memory(const emlio__blend_t *b);

/* Makes room in cache for b's sources and forgets what it held. */
int emlio__blend_cache_reserve(emlio__blend_cache_t *c,
                               const emlio__blend_t *b);
void emlio__blend_cache_release(emlio__blend_cache_t *c);

/* The record (in the source-major layout) at global position g < total,
 * and its source in *source. */
uint64_t emlio__blend_record(const emlio__blend_t *b, emlio__blend_cache_t *c,
                             uint64_t g, uint32_t *source);

#endif /* EMLIO_PLAN_BLEND_H */
