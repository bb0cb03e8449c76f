/* plan_blend.c - an epoch blended from several sources in exact quotas:
 * the quotas, the stratified counts, and the map from a global position
 * to a record (plan_blend.h; docs/planner.md, "Sources").
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <math.h>

#include "plan_blend.h"

/* Streams of the blend's permutations: the top bit set keeps them apart
 * from the windows' streams (window index + 1), the next byte says which
 * permutation, the rest which source or batch. */
#define S_TAG         (UINT64_C(1) << 63)
#define S_MIX         (S_TAG | UINT64_C(1) << 56)
#define S_ORDER       (S_TAG | UINT64_C(2) << 56)
#define S_STREAM      (S_TAG | UINT64_C(3) << 56)
#define S_BATCH       (S_TAG | UINT64_C(4) << 56)
#define S_LOW         ((UINT64_C(1) << 56) - 1)
/* The epoch argument of the streams that do not depend on the epoch. */
#define S_EVERY_EPOCH UINT64_MAX

typedef unsigned __int128 s_u128;

/* A source waiting for one of the samples left over by rounding down:
 * the largest remainder first, then the lowest index. */
typedef struct s_rem {
    double frac; /* weights: the share's fractional part */
    s_u128 num;  /* counts: the remainder's numerator (exact) */
    uint32_t index;
} s_rem_t;

static int
s_cmp_frac(const void *pa, const void *pb)
{
    const s_rem_t *a = pa;
    const s_rem_t *b = pb;
    if (a->frac != b->frac)
        return a->frac < b->frac ? 1 : -1;
    return (a->index > b->index) - (a->index < b->index);
}

static int
s_cmp_num(const void *pa, const void *pb)
{
    const s_rem_t *a = pa;
    const s_rem_t *b = pb;
    if (a->num != b->num)
        return a->num < b->num ? 1 : -1;
    return (a->index > b->index) - (a->index < b->index);
}

static int
s_nomem(char *err)
{
    return emlio__seterr(err, EMLIO_ENOMEM,
                         "cannot plan epoch: out of memory for the sources");
}

/* The largest epoch a blend plans: its quotas are shares in double. */
#define S_MAX_EPOCH ((uint64_t)1 << 53)

/* Sizes and checks each source, and the epoch's total. */
static int
s_check_sources(emlio__blend_t *b, const emlio_plan_params_t *p,
                const uint64_t *sizes, uint64_t *fixed_out, double *wsum_out,
                char *err)
{
    uint64_t sum = 0, fixed = 0;
    double wsum = 0;
    for (size_t s = 0; s < p->n_sources; s++) {
        const emlio_plan_source_t *src = &p->sources[s];
        uint64_t size = src->samples ? src->samples : sizes[s];
        if (!src->samples && !(isfinite(src->weight) && src->weight > 0))
            return emlio__seterr(err, EMLIO_EINVAL,
                                 "source %zu: weight %g is not a positive, "
                                 "finite number",
                                 s, src->weight);
        if (size > UINT64_MAX - sum || src->samples > UINT64_MAX - fixed)
            return emlio__seterr(err, EMLIO_EINVAL,
                                 "cannot plan epoch: the sources hold more "
                                 "than 2^64 - 1 samples");
        sum += size;
        fixed += src->samples;
        if (!src->samples)
            wsum += src->weight;
        b->src[s].size = sizes[s];
    }
    if (!isfinite(wsum))
        return emlio__seterr(err, EMLIO_EINVAL,
                             "the sources' weights add up past the largest "
                             "number: scale them down");
    b->total = p->epoch_samples ? p->epoch_samples : sum;
    /* The shares are computed in double, exact below 2^53 samples; past
     * it the floors may add up past 2^64 (a resume state's blend read
     * from disk asked for 2^64 - 6, and the quotas' loop ran ~2^64
     * times). Refused, not rounded. */
    if (b->total > S_MAX_EPOCH)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "an epoch of %" PRIu64 " samples is more than "
                             "the planner's 2^53",
                             b->total);
    if (fixed > b->total)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "the sources' fixed sample counts add up to "
                             "%" PRIu64 ", more than the epoch's %" PRIu64,
                             fixed, b->total);
    if (fixed < b->total && wsum == 0)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "the sources' fixed sample counts add up to "
                             "%" PRIu64 " of the epoch's %" PRIu64
                             " and no source has a weight to take the rest",
                             fixed, b->total);
    *fixed_out = fixed;
    *wsum_out = wsum;
    return 0;
}

/* The quotas: fixed counts as asked, the rest of the epoch by weight,
 * each the floor of its exact share, and the samples rounding left over
 * one each to the largest fractional parts (Hamilton's method): every
 * quota is within one of its share and they add up to the epoch. */
static int
s_quotas(emlio__blend_t *b, const emlio_plan_params_t *p, const uint64_t *sizes,
         char *err)
{
    uint64_t fixed = 0;
    double wsum = 0;
    int rc = s_check_sources(b, p, sizes, &fixed, &wsum, err);
    if (rc < 0)
        return rc;
    uint64_t rest = b->total - fixed;
    s_rem_t *rem = emlio_calloc(p->n_sources, sizeof(*rem));
    if (!rem)
        return s_nomem(err);
    size_t n_rem = 0;
    uint64_t given = 0;
    for (size_t s = 0; s < p->n_sources; s++) {
        const emlio_plan_source_t *src = &p->sources[s];
        if (src->samples) {
            b->src[s].quota = src->samples;
            continue;
        }
        double share = (double)rest * (src->weight / wsum);
        double whole = floor(share);
        uint64_t q = whole >= (double)rest ? rest : (uint64_t)whole;
        b->src[s].quota = q;
        given += q;
        rem[n_rem++] = (s_rem_t){ share - whole, 0, (uint32_t)s };
    }
    qsort(rem, n_rem, sizeof(*rem), s_cmp_frac);
    /* Rounding in double can leave the floors a few samples above the
     * rest as well as below: take those back from the smallest parts. */
    for (size_t i = 0; given < rest && n_rem; i = (i + 1) % n_rem, given++)
        b->src[rem[i].index].quota++;
    for (size_t i = n_rem; given > rest;) {
        i = i ? i - 1 : n_rem - 1;
        if (b->src[rem[i].index].quota > 0) {
            b->src[rem[i].index].quota--;
            given--;
        }
    }
    emlio_free(rem);
    for (size_t s = 0; s < p->n_sources; s++)
        if (b->src[s].quota && !b->src[s].size)
            return emlio__seterr(err, EMLIO_EINVAL,
                                 "source %zu has no samples, but its share of "
                                 "the epoch is %" PRIu64,
                                 s, b->src[s].quota);
    return 0;
}

/* Stratified counts (docs/planner.md, "Stratified batches"). In a full
 * global batch of G positions source s has the share f = G q / E: it gets
 * floor(f), plus one in `extras` of the full batches, so every full batch
 * is within one of its share; the extras are apportioned by largest
 * remainder of nf frac(f), and what is left of each quota is within one
 * of its share of the short last batch too. Exact integer arithmetic. */
static int
s_stratify(emlio__blend_t *b, uint64_t gbatch, char *err)
{
    uint64_t e = b->total;
    b->batch = gbatch;
    b->full = e / gbatch;
    if (e == 0)
        return 0;
    s_rem_t *rem = emlio_calloc(b->n, sizeof(*rem));
    if (!rem)
        return s_nomem(err);
    uint64_t per_sum = 0;
    s_u128 xsum = 0;
    for (size_t s = 0; s < b->n; s++) {
        emlio__blend_source_t *src = &b->src[s];
        s_u128 num = (s_u128)gbatch * src->quota;
        src->per = (uint64_t)(num / e);
        s_u128 x = (s_u128)b->full * (num % e);
        src->extras = (uint64_t)(x / e);
        rem[s] = (s_rem_t){ 0, x % e, (uint32_t)s };
        per_sum += src->per;
        xsum += src->extras;
    }
    s_u128 want = (s_u128)b->full * (gbatch - per_sum);
    qsort(rem, b->n, sizeof(*rem), s_cmp_num);
    for (size_t i = 0; xsum < want; i++, xsum++)
        b->src[rem[i].index].extras++;
    emlio_free(rem);
    uint64_t first = 0;
    for (size_t s = 0; s < b->n; s++) {
        emlio__blend_source_t *src = &b->src[s];
        src->extra_first = first;
        first += src->extras;
        assert(src->quota >= b->full * src->per + src->extras);
        src->last = src->quota - b->full * src->per - src->extras;
    }
    return 0;
}

/* The seed of layer m's mix, order and batch permutations: the job's for
 * the epoch's own blend, a new key for each later one. */
static uint64_t
s_layer_seed(uint64_t seed, uint32_t layer)
{
    if (layer == 0)
        return seed;
    uint64_t z = seed + (uint64_t)layer * UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Layer > 0: turns the quotas the layer's weights give the whole epoch
 * into what each source still lacks of them. The rest (the epoch less
 * what the layers before delivered) goes to the sources below their
 * quotas: exactly their deficits when none was delivered past its quota,
 * else in proportion to the deficits by largest remainder, never more
 * than a deficit. */
static int
s_rest_quotas(emlio__blend_t *b, char *err)
{
    uint64_t done = 0, want = 0;
    for (size_t s = 0; s < b->n; s++) {
        emlio__blend_source_t *src = &b->src[s];
        src->delivered = b->taken[s].count;
        done += src->delivered;
        src->quota =
            src->quota > src->delivered ? src->quota - src->delivered : 0;
        want += src->quota;
    }
    if (done > b->total)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "the epoch's size %" PRIu64
                             " is less than the %" PRIu64
                             " samples its earlier weights delivered",
                             b->total, done);
    uint64_t rest = b->total - done;
    b->total = rest;
    if (want == rest)
        return 0;
    s_rem_t *rem = emlio_calloc(b->n, sizeof(*rem));
    if (!rem)
        return s_nomem(err);
    uint64_t given = 0;
    for (size_t s = 0; s < b->n; s++) {
        s_u128 num = (s_u128)rest * b->src[s].quota;
        b->src[s].quota = (uint64_t)(num / want);
        given += b->src[s].quota;
        rem[s] = (s_rem_t){ 0, num % want, (uint32_t)s };
    }
    qsort(rem, b->n, sizeof(*rem), s_cmp_num);
    for (size_t i = 0; given < rest; i++, given++)
        b->src[rem[i].index].quota++;
    emlio_free(rem);
    return 0;
}

/* Sets b up as layer `layer` of the epoch: the sources' weights and the
 * epoch size of that layer, the taken picks of the layers before. */
static int
s_layer(emlio__blend_t *b, const emlio_plan_params_t *p,
        const emlio_plan_source_t *sources, uint64_t epoch_samples,
        const uint64_t *sizes, uint32_t layer, char *err)
{
    emlio_plan_params_t q = *p;
    q.sources = sources;
    q.epoch_samples = epoch_samples;
    memset(b->src, 0, b->n * sizeof(*b->src));
    b->layer = layer;
    b->seed = s_layer_seed(p->seed, layer);
    b->stream_seed = p->seed;
    b->batch = 0;
    b->full = 0;
    int rc = s_quotas(b, &q, sizes, err);
    if (rc == 0 && layer)
        rc = s_rest_quotas(b, err);
    if (rc < 0)
        return rc;
    uint64_t base = 0, offset = 0;
    for (size_t s = 0; s < b->n; s++) {
        emlio__blend_source_t *src = &b->src[s];
        src->base = base;
        src->offset = offset;
        base += src->size;
        offset += src->quota;
        if (layer)
            src->start = b->taken[s].start;
        else if (src->size)
            src->start = (uint64_t)((s_u128)p->epoch * src->quota % src->size);
        emlio__perm_init(&src->stream, p->seed, S_EVERY_EPOCH,
                         S_STREAM | ((uint64_t)s & S_LOW), src->size);
        emlio__perm_init(&src->order, b->seed, p->epoch,
                         S_ORDER | ((uint64_t)s & S_LOW), src->quota);
    }
    emlio__perm_init(&b->mix, b->seed, p->epoch, S_MIX, b->total);
    if (!p->stratify)
        return 0;
    return s_stratify(b, (uint64_t)p->world * p->batch_size, err);
}

static void
s_taken_release(emlio__taken_t *t)
{
    emlio_free(t->bits);
    emlio_free(t->zeros);
    memset(t, 0, sizeof(*t));
}

/* Sets bits [lo, hi) of words to one (set) or zero. */
static void
s_bits_fill(uint64_t *words, uint64_t lo, uint64_t hi, bool set)
{
    for (uint64_t j = lo; j < hi; j++) {
        uint64_t bit = UINT64_C(1) << (j % 64);
        words[j / 64] = set ? words[j / 64] | bit : words[j / 64] & ~bit;
    }
}

/* Extends the picks t covers to [0, extent), the new ones free. */
static int
s_taken_grow(emlio__taken_t *t, uint64_t extent)
{
    if (extent <= t->extent)
        return 0;
    if (extent > UINT64_MAX - 63 || (extent + 63) / 64 > SIZE_MAX / 8)
        return EMLIO_ENOMEM;
    size_t words = (size_t)((extent + 63) / 64);
    size_t had = (size_t)((t->extent + 63) / 64);
    if (words > t->cap) {
        uint64_t *grown = emlio_reallocarray(t->bits, words, sizeof(*grown));
        if (!grown)
            return EMLIO_ENOMEM;
        t->bits = grown;
        t->cap = words;
    }
    memset(t->bits + had, 0, (words - had) * sizeof(*t->bits));
    s_bits_fill(t->bits, t->extent, EMLIO_MIN((uint64_t)had * 64, extent),
                false);
    s_bits_fill(t->bits, extent, (uint64_t)words * 64, true);
    t->extent = extent;
    return 0;
}

/* dst (empty) = a copy of src's picks, without its index. */
static int
s_taken_copy(emlio__taken_t *dst, const emlio__taken_t *src)
{
    size_t words = (size_t)((src->extent + 63) / 64);
    if (words && !(dst->bits = emlio_reallocarray(NULL, words, 8)))
        return EMLIO_ENOMEM;
    if (words)
        memcpy(dst->bits, src->bits, words * 8);
    dst->cap = words;
    dst->extent = src->extent;
    dst->count = src->count;
    dst->start = src->start;
    return 0;
}

/* Counts the free picks before each group of eight words. */
static int
s_taken_index(emlio__taken_t *t)
{
    size_t words = (size_t)((t->extent + 63) / 64);
    size_t groups = words / 8 + 1;
    if (groups > t->zcap) {
        uint64_t *grown = emlio_reallocarray(t->zeros, groups, sizeof(*grown));
        if (!grown)
            return EMLIO_ENOMEM;
        t->zeros = grown;
        t->zcap = groups;
    }
    uint64_t free = 0;
    for (size_t w = 0; w < words; w++) {
        if (w % 8 == 0)
            t->zeros[w / 8] = free;
        free += 64 - (uint64_t)__builtin_popcountll(t->bits[w]);
    }
    if (words % 8 == 0)
        t->zeros[words / 8] = free;
    return 0;
}

/* The pick of the run that is the k-th free one: the k-th zero bit, or
 * past the extent for k at or above the free picks. */
static uint64_t
s_taken_select(const emlio__taken_t *t, uint64_t k)
{
    uint64_t free = t->extent - t->count;
    if (k >= free)
        return t->extent + (k - free);
    size_t words = (size_t)((t->extent + 63) / 64);
    size_t lo = 0, hi = words / 8 + 1;
    while (hi - lo > 1) { /* the last group with fewer than k + 1 before */
        size_t mid = lo + (hi - lo) / 2;
        if (t->zeros[mid] <= k)
            lo = mid;
        else
            hi = mid;
    }
    k -= t->zeros[lo];
    for (size_t w = lo * 8;; w++) {
        uint64_t x = ~t->bits[w];
        uint64_t z = (uint64_t)__builtin_popcountll(x);
        if (k < z) {
            while (k--)
                x &= x - 1;
            return (uint64_t)w * 64 + (uint64_t)__builtin_ctzll(x);
        }
        k -= z;
    }
}

static size_t s_pick(const emlio__blend_t *b, emlio__blend_cache_t *c,
                     uint64_t g, uint64_t *j);

/* Marks one delivery of the record at run offset j of a source of `size`
 * records: offsets j and j + size are one record, so the delivery takes
 * the record's lowest offset not taken yet (its first lap free). The free
 * offsets the next layer takes first are then records not delivered yet,
 * and a source whose epoch stays within its size shows none twice. lap
 * (NULL: scan from lap 0) keeps each record's lowest lap that may be free,
 * for a source repeated so often that scanning would be quadratic. */
static void
s_mark(emlio__taken_t *t, uint64_t size, uint32_t *lap, uint64_t j)
{
    uint64_t r = j % size;
    uint64_t l = lap ? lap[r] : 0;
    uint64_t o = r + l * size;
    while (t->bits[o / 64] >> (o % 64) & 1) {
        o += size;
        l++;
    }
    assert(o < t->extent);
    t->bits[o / 64] |= UINT64_C(1) << (o % 64);
    t->count++;
    if (lap)
        lap[r] = (uint32_t)(l + 1);
}

/* Laps of a record past which s_mark keeps a lap per record. */
#define S_SCAN_LAPS 64

/* Marks as taken the picks that layer m (set up in b) delivered: the
 * positions of its consumed spans. */
static int
s_take(emlio__blend_t *b, const emlio_plan_layer_t *layer, uint32_t m,
       char *err)
{
    uint64_t prev_end = 0;
    for (size_t i = 0; i < layer->n_done; i++) {
        const emlio_plan_span_t *sp = &layer->done[i];
        if (sp->begin >= sp->end || sp->end > b->total ||
            (i && sp->begin < prev_end))
            return emlio__seterr(err, EMLIO_EINVAL,
                                 "weights %" PRIu32 " of the epoch: consumed "
                                 "span %zu [%" PRIu64 ", %" PRIu64 ") is %s",
                                 m, i, sp->begin, sp->end,
                                 sp->begin >= sp->end ? "empty"
                                 : sp->end > b->total ? "past their end"
                                                      : "out of order");
        prev_end = sp->end;
    }
    /* What the layer reaches of each run: its free picks, then on. The
     * marks go to a copy, so that every lookup sees the layers before. */
    emlio__taken_t *next = emlio_calloc(b->n, sizeof(*next));
    emlio__blend_cache_t cache = { 0 };
    int rc = next ? emlio__blend_cache_reserve(&cache, b) : EMLIO_ENOMEM;
    for (size_t s = 0; s < b->n && rc == 0; s++) {
        const emlio__taken_t *t = &b->taken[s];
        uint64_t free = t->extent - t->count;
        uint64_t reach = b->src[s].quota > free ? b->src[s].quota - free : 0;
        rc = s_taken_copy(&next[s], t);
        if (rc == 0)
            rc = s_taken_grow(&next[s], t->extent + reach);
    }
    /* A lap per record, for the sources repeated past S_SCAN_LAPS laps
     * (so the table is at most 1/16 of the bitmap's bytes). */
    uint32_t **laps = rc == 0 ? emlio_calloc(b->n, sizeof(*laps)) : NULL;
    if (rc == 0 && !laps)
        rc = EMLIO_ENOMEM;
    for (size_t s = 0; s < b->n && rc == 0; s++) {
        uint64_t size = b->src[s].size;
        if (size && next[s].extent / size > S_SCAN_LAPS &&
            next[s].extent / size < UINT32_MAX &&
            !(laps[s] = emlio_calloc((size_t)size, sizeof(**laps))))
            rc = EMLIO_ENOMEM;
    }
    for (size_t i = 0; i < layer->n_done && rc == 0; i++)
        for (uint64_t g = layer->done[i].begin; g < layer->done[i].end; g++) {
            uint64_t j;
            size_t s = s_pick(b, &cache, g, &j);
            s_mark(&next[s], b->src[s].size, laps[s], j);
        }
    for (size_t s = 0; laps && s < b->n; s++)
        emlio_free(laps[s]);
    emlio_free(laps);
    for (size_t s = 0; s < b->n && rc == 0; s++)
        rc = s_taken_index(&next[s]);
    emlio__blend_cache_release(&cache);
    for (size_t s = 0; s < b->n && next; s++) {
        if (rc == 0) {
            s_taken_release(&b->taken[s]);
            b->taken[s] = next[s];
        } else {
            s_taken_release(&next[s]);
        }
    }
    emlio_free(next);
    return rc < 0 ? emlio__seterr(err, rc,
                                  "cannot plan epoch: out of memory for the "
                                  "picks its earlier weights delivered")
                  : 0;
}

/* Layer 0's runs as the taken picks before layer 1: none taken yet. */
static int
s_taken_init(emlio__blend_t *b, char *err)
{
    if (b->n > b->taken_cap) {
        emlio__taken_t *grown =
            emlio_reallocarray(b->taken, b->n, sizeof(*grown));
        if (!grown)
            return s_nomem(err);
        memset(grown + b->taken_cap, 0, (b->n - b->taken_cap) * sizeof(*grown));
        b->taken = grown;
        b->taken_cap = b->n;
    }
    for (size_t s = 0; s < b->n; s++) {
        emlio__taken_t *t = &b->taken[s];
        t->extent = 0;
        t->count = 0;
        t->start = b->src[s].start;
        if (s_taken_index(t) < 0)
            return s_nomem(err);
    }
    return 0;
}

int
emlio__blend_init(emlio__blend_t *b, const emlio_plan_params_t *p,
                  const uint64_t *sizes, char *err)
{
    if (p->n_sources > EMLIO_PLAN_MAX_SOURCES)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "too many sources: %zu (at most %d)", p->n_sources,
                             EMLIO_PLAN_MAX_SOURCES);
    if (p->n_sources > b->cap) {
        emlio__blend_source_t *grown =
            emlio_reallocarray(b->src, p->n_sources, sizeof(*grown));
        if (!grown)
            return s_nomem(err);
        b->src = grown;
        b->cap = p->n_sources;
    }
    b->n = p->n_sources;
    b->epoch = p->epoch;
    b->shuffle = p->shuffle == EMLIO_SHUFFLE_WINDOW;
    if (p->n_layers == 0)
        return s_layer(b, p, p->sources, p->epoch_samples, sizes, 0, err);
    /* What the layers consumed, against the epoch planned now, before
     * any of it is looked up: a state that says it consumed more than the
     * epoch holds is refused at once, not after marking it all. */
    uint64_t fixed = 0, done = 0;
    double wsum = 0;
    int rc = s_check_sources(b, p, sizes, &fixed, &wsum, err);
    for (size_t m = 0; m < p->n_layers && rc == 0; m++) {
        const emlio_plan_layer_t *layer = &p->layers[m];
        if (!layer->sources || (layer->n_done && !layer->done))
            return emlio__seterr(
                err, EMLIO_EINVAL, "weights %zu of the epoch: no %s", m,
                layer->sources ? "consumed spans" : "source array");
        for (size_t i = 0; i < layer->n_done; i++) {
            const emlio_plan_span_t *sp = &layer->done[i];
            uint64_t len = sp->end > sp->begin ? sp->end - sp->begin : 0;
            done = len > UINT64_MAX - done ? UINT64_MAX : done + len;
        }
    }
    if (rc == 0 && done > b->total)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "the epoch's size %" PRIu64 " is less than the "
                             "%" PRIu64 " samples its earlier weights "
                             "delivered",
                             b->total, done);
    for (uint32_t m = 0; m < p->n_layers && rc == 0; m++) {
        const emlio_plan_layer_t *layer = &p->layers[m];
        rc = s_layer(b, p, layer->sources, layer->epoch_samples, sizes, m, err);
        if (rc == 0 && m == 0)
            rc = s_taken_init(b, err);
        if (rc == 0)
            rc = s_take(b, layer, m, err);
    }
    if (rc == 0)
        rc = s_layer(b, p, p->sources, p->epoch_samples, sizes,
                     (uint32_t)p->n_layers, err);
    return rc;
}

void
emlio__blend_release(emlio__blend_t *b)
{
    for (size_t s = 0; s < b->taken_cap; s++)
        s_taken_release(&b->taken[s]);
    emlio_free(b->taken);
    emlio_free(b->src);
    memset(b, 0, sizeof(*b));
}

size_t
emlio__blend_memory(const emlio__blend_t *b)
{
    size_t len = b->cap * sizeof(*b->src) + b->taken_cap * sizeof(*b->taken);
    for (size_t s = 0; s < b->taken_cap; s++)
        len += b->taken[s].cap * 8 + b->taken[s].zcap * 8;
    return len;
}

int
emlio__blend_cache_reserve(emlio__blend_cache_t *c, const emlio__blend_t *b)
{
    c->batch = UINT64_MAX;
    if (b->n <= c->cap)
        return 0;
    uint64_t *count = emlio_reallocarray(c->count, b->n, sizeof(*count));
    if (count)
        c->count = count;
    uint64_t *before = emlio_reallocarray(c->before, b->n, sizeof(*before));
    if (before)
        c->before = before;
    if (!count || !before)
        return EMLIO_ENOMEM;
    c->cap = b->n;
    return 0;
}

void
emlio__blend_cache_release(emlio__blend_cache_t *c)
{
    emlio_free(c->count);
    emlio_free(c->before);
    memset(c, 0, sizeof(*c));
}

/* Of the extras laid at run positions [first, first + n) round-robin over
 * `full` batches (position t goes to batch t mod full), those that went to
 * batches before `batch`. */
static uint64_t
s_extras_before(uint64_t first, uint64_t n, uint64_t full, uint64_t batch)
{
    uint64_t end = first + n;
    uint64_t below_end = end / full * batch + EMLIO_MIN(end % full, batch);
    uint64_t below_first =
        first / full * batch + EMLIO_MIN(first % full, batch);
    return below_end - below_first;
}

/* Fills the cache with global batch i's counts and permutation. */
static void
s_load_batch(const emlio__blend_t *b, emlio__blend_cache_t *c, uint64_t i)
{
    bool full = i < b->full;
    for (size_t s = 0; s < b->n; s++) {
        const emlio__blend_source_t *src = &b->src[s];
        if (full) {
            uint64_t lo =
                s_extras_before(src->extra_first, src->extras, b->full, i);
            uint64_t hi =
                s_extras_before(src->extra_first, src->extras, b->full, i + 1);
            c->count[s] = src->per + (hi - lo);
            c->before[s] = i * src->per + lo;
        } else {
            c->count[s] = src->last;
            c->before[s] = b->full * src->per + src->extras;
        }
    }
    uint64_t len = full ? b->batch : b->total - b->full * b->batch;
    emlio__perm_init(&c->perm, b->seed, b->epoch, S_BATCH | (i & S_LOW), len);
    c->batch = i;
}

/* Stratified: the source of position g and its pick number there. */
static size_t
s_stratified(const emlio__blend_t *b, emlio__blend_cache_t *c, uint64_t g,
             uint64_t *k)
{
    uint64_t i = g / b->batch;
    if (c->batch != i)
        s_load_batch(b, c, i);
    uint64_t o = g % b->batch;
    if (b->shuffle)
        o = emlio__perm_apply(&c->perm, o);
    size_t s = 0;
    while (o >= c->count[s]) {
        o -= c->count[s];
        s++;
    }
    *k = c->before[s] + o;
    return s;
}

/* Unstratified: the quotas end to end, in the epoch's mixed order. */
static size_t
s_mixed(const emlio__blend_t *b, uint64_t g, uint64_t *k)
{
    uint64_t j = b->shuffle ? emlio__perm_apply(&b->mix, g) : g;
    /* The last source whose block starts at or before j: sources without
     * picks share the next one's offset and are skipped over. */
    size_t lo = 0, hi = b->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->src[mid].offset <= j)
            lo = mid;
        else
            hi = mid;
    }
    *k = j - b->src[lo].offset;
    return lo;
}

/* Source and pick (j: the offset in its run) at position g < total. */
static size_t
s_pick(const emlio__blend_t *b, emlio__blend_cache_t *c, uint64_t g,
       uint64_t *j)
{
    assert(g < b->total);
    uint64_t k;
    size_t s = b->batch ? s_stratified(b, c, g, &k) : s_mixed(b, g, &k);
    assert(k < b->src[s].quota);
    if (b->shuffle)
        k = emlio__perm_apply(&b->src[s].order, k);
    *j = b->layer ? s_taken_select(&b->taken[s], k) : k;
    return s;
}

uint64_t
emlio__blend_record(const emlio__blend_t *b, emlio__blend_cache_t *c,
                    uint64_t g, uint32_t *source)
{
    uint64_t j;
    size_t s = s_pick(b, c, g, &j);
    const emlio__blend_source_t *src = &b->src[s];
    /* start + j mod size, without overflow near 2^64. */
    uint64_t step = j % src->size;
    uint64_t p = src->start >= src->size - step
                     ? src->start - (src->size - step)
                     : src->start + step;
    if (b->shuffle)
        p = emlio__perm_apply(&src->stream, p);
    *source = (uint32_t)s;
    return src->base + p;
}
