/* test_plan_blend.c - unit tests of epochs blended from several sources:
 * exact quotas, subsampling that rotates, repeats, stratified global
 * batches, bad sources, an elastic resume of a stratified epoch, and
 * weights changed in the middle of an epoch.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <math.h>

#define MAX_SHARDS 64

/* Sources of shards named "shard-NNN" in each source (the same names in
 * every source: they are distinct shards all the same). */
struct blend_inv {
    emlio_plan_shard_t shards[MAX_SHARDS];
    char names[MAX_SHARDS][32];
    uint32_t holder[MAX_SHARDS];
    uint64_t first[MAX_SHARDS]; /* the shard's first sample in a flat id */
    size_t n;
    uint64_t samples; /* all shards' records */
};

/* Source s gets shards[s] shards of per[s] records each. */
static void
blend_inv_init(struct blend_inv *v, size_t n_sources, const size_t *shards,
               const uint64_t *per)
{
    memset(v, 0, sizeof(*v));
    for (size_t s = 0; s < n_sources; s++)
        for (size_t i = 0; i < shards[s]; i++) {
            size_t k = v->n++;
            assert_true(k < MAX_SHARDS);
            snprintf(v->names[k], sizeof(v->names[k]), "shard-%03zu", i);
            v->holder[k] = (uint32_t)s;
            v->shards[k] =
                (emlio_plan_shard_t){ v->names[k],   per[s], per[s] * 100,
                                      &v->holder[k], 1,      (uint32_t)s };
            v->first[k] = v->samples;
            v->samples += per[s];
        }
}

/* Runs every rank's plan of one epoch: hits[id] counts how often each
 * sample came (padding left out), by_source[s] the samples of source s. */
static void
run_epoch(const struct blend_inv *v, emlio_plan_params_t p, uint32_t *hits,
          uint64_t *by_source)
{
    emlio_plan_t *plan = emlio_plan_new();
    assert_non_null(plan);
    for (uint32_t r = 0; r < p.world; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, v->shards, v->n, &p), 0);
        for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
            size_t n;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
            for (size_t i = 0; i < n; i++) {
                if (s[i].pad)
                    continue;
                assert_int_equal(s[i].source, v->shards[s[i].shard].source);
                assert_true(s[i].record < v->shards[s[i].shard].records);
                hits[v->first[s[i].shard] + s[i].record]++;
                by_source[s[i].source]++;
            }
        }
    }
    emlio_plan_destroy(&plan);
}

static uint64_t
source_quota(const struct blend_inv *v, const emlio_plan_params_t *p, size_t s)
{
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v->shards, v->n, p), 0);
    uint64_t q = emlio_plan_source_quota(plan, s);
    emlio_plan_destroy(&plan);
    return q;
}

/* Quotas within one of each exact share, adding up to the epoch; each
 * source's samples as often as its quota allows, never more. */
static void
test_blend_quotas(void **state)
{
    (void)state;
    const size_t shards[] = { 3, 2, 1 };
    const uint64_t per[] = { 100, 40, 7 };
    const double weight[] = { 1, 3, 0.5 };
    struct blend_inv v;
    blend_inv_init(&v, 3, shards, per);
    emlio_plan_source_t src[3];
    for (size_t s = 0; s < 3; s++)
        src[s] = (emlio_plan_source_t){ weight[s], 0 };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.batch_size = 8;
    p.sources = src;
    p.n_sources = 3;
    const uint64_t size[] = { 300, 80, 7 };
    uint64_t e = 387;
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        p.epoch = epoch;
        uint32_t hits[387] = { 0 };
        uint64_t by[3] = { 0 };
        run_epoch(&v, p, hits, by);
        uint64_t sum = 0;
        for (size_t s = 0; s < 3; s++) {
            double share = (double)e * weight[s] / 4.5;
            assert_true(fabs((double)by[s] - share) < 1.0);
            assert_int_equal(by[s], source_quota(&v, &p, s));
            sum += by[s];
            /* Each sample floor(q / n) or ceil(q / n) times. */
            uint64_t lo = by[s] / size[s], hi = lo + (by[s] % size[s] != 0);
            uint64_t base = s == 0 ? 0 : s == 1 ? 300 : 380;
            for (uint64_t i = 0; i < size[s]; i++)
                assert_true(hits[base + i] >= lo && hits[base + i] <= hi);
        }
        assert_int_equal(sum, e);
    }
}

/* A source at a quarter of its size shows every sample once in four
 * epochs; one at 2.5x its size each sample 2 or 3 times an epoch. */
static void
test_blend_subsample_and_repeat(void **state)
{
    (void)state;
    const size_t shards[] = { 2, 1 };
    const uint64_t per[] = { 50, 10 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    /* 100 samples of A at a quarter: 25; B exactly 25 of its 10. */
    emlio_plan_source_t src[2] = { { 1, 0 }, { 0, 25 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 2;
    p.batch_size = 5;
    p.sources = src;
    p.n_sources = 2;
    p.epoch_samples = 50;
    uint32_t seen[110] = { 0 };
    for (uint64_t epoch = 0; epoch < 4; epoch++) {
        p.epoch = epoch;
        uint32_t hits[110] = { 0 };
        uint64_t by[2] = { 0 };
        run_epoch(&v, p, hits, by);
        assert_int_equal(by[0], 25);
        assert_int_equal(by[1], 25);
        for (size_t i = 0; i < 100; i++) {
            assert_true(hits[i] <= 1); /* subsampled: no repeat */
            seen[i] += hits[i];
        }
        for (size_t i = 100; i < 110; i++)
            assert_true(hits[i] == 2 || hits[i] == 3);
    }
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(seen[i], 1); /* all once in four epochs */
}

/* Stratified: every global batch (the ranks' batch i together) holds each
 * source's share of it within one sample, the short last one too. */
static void
test_blend_stratified(void **state)
{
    (void)state;
    const size_t shards[] = { 4, 1, 1 };
    const uint64_t per[] = { 25, 37, 9 };
    struct blend_inv v;
    blend_inv_init(&v, 3, shards, per);
    /* Weights in proportion to the sizes: every sample once an epoch. */
    emlio_plan_source_t src[3] = { { 100, 0 }, { 37, 0 }, { 9, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 2;
    p.batch_size = 8;
    p.sources = src;
    p.n_sources = 3;
    p.stratify = true;
    const uint64_t e = 146, g = 16;
    emlio_plan_t *plans[2] = { emlio_plan_new(), emlio_plan_new() };
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        p.epoch = epoch;
        uint64_t q[3];
        for (uint32_t r = 0; r < 2; r++) {
            p.rank = r;
            assert_int_equal(emlio_plan_build(plans[r], v.shards, v.n, &p), 0);
        }
        for (size_t s = 0; s < 3; s++)
            q[s] = emlio_plan_source_quota(plans[0], s);
        size_t nb = emlio_plan_batch_count(plans[0]);
        assert_int_equal(nb, emlio_plan_batch_count(plans[1]));
        assert_int_equal(nb, 10); /* 9 full global batches and 2 left */
        uint32_t hits[146] = { 0 };
        for (size_t b = 0; b < nb; b++) {
            uint64_t count[3] = { 0 }, len = 0;
            for (uint32_t r = 0; r < 2; r++) {
                size_t n;
                const emlio_plan_sample_t *s =
                    emlio_plan_batch(plans[r], b, &n);
                for (size_t i = 0; i < n; i++) {
                    if (s[i].pad)
                        continue;
                    count[s[i].source]++;
                    hits[v.first[s[i].shard] + s[i].record]++;
                    len++;
                }
            }
            assert_int_equal(len, b + 1 < nb ? g : e % g);
            for (size_t s = 0; s < 3; s++) {
                double share = (double)len * (double)q[s] / (double)e;
                assert_true(fabs((double)count[s] - share) < 1.0);
            }
        }
        for (size_t i = 0; i < e; i++)
            assert_int_equal(hits[i], 1);
    }
    emlio_plan_destroy(&plans[0]);
    emlio_plan_destroy(&plans[1]);
}

/* The same inputs give the same order; another seed or epoch another. */
static void
test_blend_deterministic(void **state)
{
    (void)state;
    const size_t shards[] = { 2, 2 };
    const uint64_t per[] = { 30, 20 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    emlio_plan_source_t src[2] = { { 2, 0 }, { 1, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = 100;
    p.sources = src;
    p.n_sources = 2;
    emlio_plan_sample_t first[100], again[100];
    size_t n1, n2;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    memcpy(first, emlio_plan_batch(plan, 0, &n1), sizeof(first));
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    memcpy(again, emlio_plan_batch(plan, 0, &n2), sizeof(again));
    assert_int_equal(n1, 100);
    assert_memory_equal(first, again, n1 * sizeof(first[0]));
    p.epoch = 1;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    memcpy(again, emlio_plan_batch(plan, 0, &n2), sizeof(again));
    assert_memory_not_equal(first, again, n1 * sizeof(first[0]));
    emlio_plan_destroy(&plan);
}

/* Bad sources and options are refused, saying why. */
static void
test_blend_bad_input(void **state)
{
    (void)state;
    const size_t shards[] = { 1, 1 };
    const uint64_t per[] = { 10, 0 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    emlio_plan_source_t src[2] = { { 1, 0 }, { 1, 0 } };
    p.sources = src;
    p.n_sources = 2;
    const double bad[] = { 0, -1, NAN, INFINITY };
    for (size_t i = 0; i < 4; i++) {
        src[0].weight = bad[i];
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p),
                         EMLIO_EINVAL);
        assert_non_null(strstr(emlio_plan_errmsg(plan), "weight"));
    }
    src[0].weight = 1;
    /* Source 1 is empty but its weight asks for half the epoch. */
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "source 1 has no samples"));
    src[1].weight = 1e-12; /* a share below one sample: quota 0 */
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_source_quota(plan, 1), 0);
    assert_int_equal(emlio_plan_dataset_size(plan), 10);
    /* An epoch near 2^64 (a damaged resume state's blend) made the
     * floors of 1:3 add up past 2^64 and the rounding loop run ~2^64
     * times; past 2^53 it is refused. */
    src[1].weight = 3;
    v.shards[1].records = 10;
    p.epoch_samples = UINT64_MAX - 5;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(
        strstr(emlio_plan_errmsg(plan), "more than the planner's 2^53"));
    p.epoch_samples = ((uint64_t)1 << 53) + 1;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    v.shards[1].records = 0;
    src[1].weight = 1e-12;
    src[0].samples = 20; /* fixed counts above the epoch */
    p.epoch_samples = 15;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "more than the epoch"));
    src[0].samples = 0;
    p.epoch_samples = 0;
    p.window_shards = 4;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "mixed whole"));
    p.window_shards = 0;
    p.n_sources = 1; /* shard of source 1 beyond the list */
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "names source 1"));
    p.n_sources = 0; /* without sources the field is not read */
    v.shards[1].source = 7;
    v.shards[1].records = 10; /* then a replica of shard 0's name */
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_dataset_size(plan), 10);
    v.shards[1].records = 0;
    p.stratify = true;
    v.shards[1].source = 0;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "need sources"));
    emlio_plan_destroy(&plan);
}

/* Weights 1 : 10^3 : 10^-6 plan without a crash, quotas adding up. */
static void
test_blend_extreme_weights(void **state)
{
    (void)state;
    const size_t shards[] = { 1, 1, 1 };
    const uint64_t per[] = { 1000, 1000, 1000 };
    struct blend_inv v;
    blend_inv_init(&v, 3, shards, per);
    emlio_plan_source_t src[3] = { { 1, 0 }, { 1e3, 0 }, { 1e-6, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.sources = src;
    p.n_sources = 3;
    p.stratify = true;
    p.batch_size = 64;
    uint32_t hits[3000] = { 0 };
    uint64_t by[3] = { 0 };
    run_epoch(&v, p, hits, by);
    assert_int_equal(by[0] + by[1] + by[2], 3000);
    assert_int_equal(by[0], 3);
    assert_int_equal(by[1], 2997);
    assert_int_equal(by[2], 0);
}

static int
cmp_span(const void *a, const void *b)
{
    const emlio_plan_span_t *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* A stratified epoch begun on 4 ranks (3 batches each) and finished on 2
 * with the same global batch: every position exactly once. */
static void
test_blend_stratified_elastic(void **state)
{
    (void)state;
    const size_t shards[] = { 3, 2 };
    const uint64_t per[] = { 40, 23 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    emlio_plan_source_t src[2] = { { 1, 0 }, { 2, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.sources = src;
    p.n_sources = 2;
    p.stratify = true;
    p.world = 4;
    p.batch_size = 4;
    const uint64_t e = 166;
    uint32_t hits[166] = { 0 };
    emlio_plan_span_t done[64];
    size_t n_done = 0;
    emlio_plan_t *plan = emlio_plan_new();
    for (uint32_t r = 0; r < 4; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        for (uint64_t k = 0; k < 3 * 4; k++) {
            uint64_t g = emlio_plan_position(plan, k);
            hits[g]++;
            done[n_done++] = (emlio_plan_span_t){ g, g + 1 };
            /* The blend's position map agrees with the batch span's. */
            uint64_t q0, q1;
            assert_int_equal(
                emlio_plan_batch_span(e, 4, r, 4, false, true, k / 4, &q0, &q1),
                0);
            assert_int_equal(g, q0 + k % 4);
        }
    }
    qsort(done, n_done, sizeof(done[0]), cmp_span);
    size_t m = 0;
    for (size_t i = 0; i < n_done; i++)
        if (m && done[m - 1].end == done[i].begin)
            done[m - 1].end = done[i].end;
        else
            done[m++] = done[i];
    p.world = 2;
    p.batch_size = 8;
    p.done = done;
    p.n_done = m;
    for (uint32_t r = 0; r < 2; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        for (uint64_t k = 0; k < emlio_plan_sample_count(plan); k++) {
            size_t n;
            const emlio_plan_sample_t *s =
                emlio_plan_batch(plan, (size_t)(k / 8), &n);
            if (!s[k % 8].pad)
                hits[emlio_plan_position(plan, k)]++;
        }
    }
    for (size_t i = 0; i < e; i++)
        assert_int_equal(hits[i], 1);
    emlio_plan_destroy(&plan);
}

/* One run of a job in an epoch whose weights may have changed: every
 * rank delivers its first `batches` batches (all: SIZE_MAX); hits and
 * by_source count them, done receives the positions (of p's blend). */
struct run_out {
    emlio_plan_span_t done[256];
    size_t n_done;
    uint64_t by_source[2];
    uint64_t quota[2];
};

static void
run_part(const struct blend_inv *v, emlio_plan_params_t p, size_t batches,
         uint32_t *hits, struct run_out *out)
{
    memset(out, 0, sizeof(*out));
    emlio_plan_t *plan = emlio_plan_new();
    for (uint32_t r = 0; r < p.world; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, v->shards, v->n, &p), 0);
        size_t nb = EMLIO_MIN(batches, emlio_plan_batch_count(plan));
        for (size_t b = 0; b < nb; b++) {
            size_t n;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
            for (size_t i = 0; i < n; i++) {
                if (s[i].pad)
                    continue;
                hits[v->first[s[i].shard] + s[i].record]++;
                out->by_source[s[i].source]++;
                uint64_t g = emlio_plan_position(plan, b * p.batch_size + i);
                assert_true(out->n_done < 256);
                out->done[out->n_done++] = (emlio_plan_span_t){ g, g + 1 };
            }
        }
        for (size_t s = 0; s < 2; s++)
            out->quota[s] = emlio_plan_source_quota(plan, s);
    }
    emlio_plan_destroy(&plan);
    qsort(out->done, out->n_done, sizeof(out->done[0]), cmp_span);
    size_t m = 0;
    for (size_t i = 0; i < out->n_done; i++)
        if (m && out->done[m - 1].end == out->done[i].begin)
            out->done[m - 1].end = out->done[i].end;
        else
            out->done[m++] = out->done[i];
    out->n_done = m;
}

/* An epoch of 100 begun at 1:1 on 2 ranks, its weights changed to 1:3
 * on one rank, then to 3:1 on two: no sample twice, every position of
 * the epoch delivered, each change's quotas followed from what was
 * delivered (a source already past its new quota gets no more). */
static void
weight_change(bool stratify)
{
    const size_t shards[] = { 3, 2 };
    const uint64_t per[] = { 40, 50 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    emlio_plan_source_t w0[2] = { { 1, 0 }, { 1, 0 } };
    emlio_plan_source_t w1[2] = { { 1, 0 }, { 3, 0 } };
    emlio_plan_source_t w2[2] = { { 3, 0 }, { 1, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.n_sources = 2;
    p.epoch_samples = 100;
    p.stratify = stratify;
    p.seed = 11;
    p.epoch = 2;
    uint32_t hits[220] = { 0 };
    struct run_out a, b, c;

    p.sources = w0;
    p.world = 2;
    p.batch_size = 5;
    run_part(&v, p, 4, hits, &a);
    assert_int_equal(a.by_source[0] + a.by_source[1], 40);

    emlio_plan_layer_t layers[2] = {
        { w0, 100, a.done, a.n_done },
        { w1, 100, NULL, 0 },
    };
    p.sources = w1;
    p.layers = layers;
    p.n_layers = 1;
    p.world = 1;
    p.batch_size = 10;
    run_part(&v, p, 2, hits, &b);
    assert_int_equal(b.by_source[0] + b.by_source[1], 20);
    /* 1:3 of 100 is 25 and 75, neither reached by the first 40. */
    assert_int_equal(b.quota[0], 25);
    assert_int_equal(b.quota[1], 75);

    layers[1].done = b.done;
    layers[1].n_done = b.n_done;
    p.sources = w2;
    p.n_layers = 2;
    p.world = 2;
    p.batch_size = 5;
    run_part(&v, p, SIZE_MAX, hits, &c);
    uint64_t got[2], total = 0;
    for (size_t s = 0; s < 2; s++) {
        got[s] = a.by_source[s] + b.by_source[s] + c.by_source[s];
        total += got[s];
        assert_int_equal(got[s], c.quota[s]);
    }
    assert_int_equal(total, 100);
    /* 3:1 is 75 and 25: a source delivered past it gets none of the rest,
     * the other all of it. */
    for (size_t s = 0; s < 2; s++) {
        uint64_t before = a.by_source[s] + b.by_source[s];
        uint64_t want = s == 0 ? 75 : 25;
        if (before >= want)
            assert_int_equal(c.by_source[s], 0);
        else if (a.by_source[1 - s] + b.by_source[1 - s] <= 100 - want)
            assert_int_equal(got[s], want);
    }
    for (size_t i = 0; i < 220; i++)
        assert_true(hits[i] <= 1);

    /* A layer's span past its blend's end is refused, naming it. */
    emlio_plan_span_t bad = { 50, 70 }; /* the layer has 60 positions */
    layers[1].done = &bad;
    layers[1].n_done = 1;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "past their end"));
    /* As is an epoch smaller than what was delivered. */
    layers[1].done = b.done;
    layers[1].n_done = b.n_done;
    p.epoch_samples = 50;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "less than the 60"));
    emlio_plan_destroy(&plan);
}

static void
test_blend_weight_change(void **state)
{
    (void)state;
    weight_change(false);
}

static void
test_blend_weight_change_stratified(void **state)
{
    (void)state;
    weight_change(true);
}

/* The k-th free pick over many words: a change after most of a large
 * source was delivered finds exactly the picks left, in any order. */
static void
test_blend_weight_change_large(void **state)
{
    (void)state;
    const size_t shards[] = { 1, 1 };
    const uint64_t per[] = { 5000, 3000 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    emlio_plan_source_t w0[2] = { { 1, 0 }, { 1, 0 } };
    emlio_plan_source_t w1[2] = { { 1, 0 }, { 4, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.sources = w0;
    p.n_sources = 2;
    p.epoch_samples = 6000;
    p.batch_size = 7;
    uint32_t *hits = calloc(8000, sizeof(*hits));
    uint64_t by_source[2] = { 0 };
    /* Positions 1000 .. 3999 of the first blend, delivered. */
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    for (uint64_t k = 1000; k < 4000; k++) {
        size_t n;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, k / 7, &n);
        const emlio_plan_sample_t *x = &s[k % 7];
        hits[v.first[x->shard] + x->record]++;
        by_source[x->source]++;
    }
    emlio_plan_span_t done = { 1000, 4000 };
    emlio_plan_layer_t layer = { w0, 6000, &done, 1 };
    p.sources = w1;
    p.layers = &layer;
    p.n_layers = 1;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_sample_count(plan), 3000);
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t n;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
        for (size_t i = 0; i < n; i++) {
            hits[v.first[s[i].shard] + s[i].record]++;
            by_source[s[i].source]++;
        }
    }
    /* 1:4 of 6000 is 1200 and 4800; the first blend gave ~1500 each. */
    assert_int_equal(by_source[0] + by_source[1], 6000);
    assert_int_equal(by_source[0], emlio_plan_source_quota(plan, 0));
    assert_int_equal(by_source[1], emlio_plan_source_quota(plan, 1));
    assert_true(by_source[1] <= 3000 * 2);
    for (size_t i = 0; i < 5000; i++)
        assert_true(hits[i] <= 1);
    /* Source 1 (3000 samples) gets more than it has: each sample at
     * most twice, and none left out while another comes twice. */
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 5000; i < 8000; i++) {
        lo = EMLIO_MIN(lo, hits[i]);
        hi = EMLIO_MAX(hi, hits[i]);
    }
    assert_true(hi - lo <= 1);
    free(hits);
    emlio_plan_destroy(&plan);
}

/* A layer that repeated a source (3:1, 150 picks of 100 records) and a
 * change that brings it back within its size (1:1, 100): the rest takes
 * the records not delivered yet first, so no record comes twice that had
 * not already come twice under the first weights. A state that says it
 * consumed more than the epoch holds is refused before any lookup. */
static void
test_blend_weight_change_after_repeats(void **state)
{
    (void)state;
    const size_t shards[] = { 1, 1 };
    const uint64_t per[] = { 100, 100 };
    struct blend_inv v;
    blend_inv_init(&v, 2, shards, per);
    emlio_plan_source_t w0[2] = { { 3, 0 }, { 1, 0 } };
    emlio_plan_source_t w1[2] = { { 1, 0 }, { 1, 0 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.sources = w0;
    p.n_sources = 2;
    p.epoch_samples = 200;
    p.batch_size = 10;
    p.seed = 4;
    uint32_t first[200] = { 0 }, hits[200] = { 0 };
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    for (size_t b = 0; b < 4; b++) {
        size_t n;
        const emlio_plan_sample_t *x = emlio_plan_batch(plan, b, &n);
        for (size_t i = 0; i < n; i++)
            first[v.first[x[i].shard] + x[i].record]++;
    }
    memcpy(hits, first, sizeof(hits));
    emlio_plan_span_t done = { 0, 40 };
    emlio_plan_layer_t layer = { w0, 200, &done, 1 };
    p.sources = w1;
    p.layers = &layer;
    p.n_layers = 1;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t n;
        const emlio_plan_sample_t *x = emlio_plan_batch(plan, b, &n);
        for (size_t i = 0; i < n; i++)
            hits[v.first[x[i].shard] + x[i].record]++;
    }
    uint64_t total_a = 0;
    for (size_t r = 0; r < 100; r++) {
        total_a += hits[r];
        assert_true(hits[r] <= EMLIO_MAX(first[r], 1u));
    }
    assert_int_equal(total_a, 100);
    /* A source of 3 records taken 500 times (past 64 laps: a lap kept
     * per record), changed to 250: every record 83 or 84 times. */
    const size_t shards3[] = { 1, 1 };
    const uint64_t per3[] = { 3, 1000 };
    struct blend_inv v3;
    blend_inv_init(&v3, 2, shards3, per3);
    emlio_plan_source_t w3[2] = { { 1, 0 }, { 3, 0 } };
    emlio_plan_params_t q;
    emlio_plan_params_init(&q);
    q.sources = w1;
    q.n_sources = 2;
    q.epoch_samples = 1000;
    q.batch_size = 10;
    uint32_t h3[1003] = { 0 };
    assert_int_equal(emlio_plan_build(plan, v3.shards, v3.n, &q), 0);
    for (size_t b = 0; b < 30; b++) {
        size_t n;
        const emlio_plan_sample_t *x = emlio_plan_batch(plan, b, &n);
        for (size_t i = 0; i < n; i++)
            h3[v3.first[x[i].shard] + x[i].record]++;
    }
    emlio_plan_span_t done3 = { 0, 300 };
    emlio_plan_layer_t layer3 = { w1, 1000, &done3, 1 };
    q.sources = w3;
    q.layers = &layer3;
    q.n_layers = 1;
    assert_int_equal(emlio_plan_build(plan, v3.shards, v3.n, &q), 0);
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t n;
        const emlio_plan_sample_t *x = emlio_plan_batch(plan, b, &n);
        for (size_t i = 0; i < n; i++)
            h3[v3.first[x[i].shard] + x[i].record]++;
    }
    assert_int_equal(h3[0] + h3[1] + h3[2], 250);
    for (size_t r = 0; r < 3; r++)
        assert_true(h3[r] == 83 || h3[r] == 84);
    /* 1,000 consumed of an epoch of 200: refused, saying so. */
    emlio_plan_span_t huge = { 0, 1000 };
    layer.done = &huge;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "less than the 1000"));
    emlio_plan_destroy(&plan);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blend_quotas),
        cmocka_unit_test(test_blend_subsample_and_repeat),
        cmocka_unit_test(test_blend_stratified),
        cmocka_unit_test(test_blend_deterministic),
        cmocka_unit_test(test_blend_bad_input),
        cmocka_unit_test(test_blend_extreme_weights),
        cmocka_unit_test(test_blend_stratified_elastic),
        cmocka_unit_test(test_blend_weight_change),
        cmocka_unit_test(test_blend_weight_change_stratified),
        cmocka_unit_test(test_blend_weight_change_large),
        cmocka_unit_test(test_blend_weight_change_after_repeats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
