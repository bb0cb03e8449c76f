/* test_plan_rest.c - unit tests of elastic resume in the planner: an
 * epoch's rest after earlier runs (of any world size) consumed part of it,
 * sliced among another number of ranks, exactly once across all runs.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "plan_rest.h"

#define N_SHARDS 13

static char s_names[N_SHARDS][16];
static uint32_t s_holder;

/* 13 shards of 1 .. 97 records (uneven), one daemon. */
static void
make_inventory(emlio_plan_shard_t *shards, uint64_t *total)
{
    *total = 0;
    for (size_t i = 0; i < N_SHARDS; i++) {
        snprintf(s_names[i], sizeof(s_names[i]), "s%02zu", i);
        shards[i] = (emlio_plan_shard_t){ s_names[i], 1 + (i * 37 + 11) % 97,
                                          0,          &s_holder,
                                          1,          0 };
        *total += shards[i].records;
    }
}

/* A sample's identity: its place in the inventory's records. */
static uint64_t
sample_id(const emlio_plan_shard_t *shards, const emlio_plan_sample_t *s)
{
    uint64_t id = 0;
    for (uint32_t i = 0; i < s->shard; i++)
        id += shards[i].records;
    return id + s->record;
}

/* A run of `world` ranks over the rest of the epoch after `done`: rank r
 * delivers its first take[r] batches. Marks every non-pad sample those
 * deliver in seen[] (failing on a repeat), and appends the positions
 * they cover to *out (the next run's done spans, unsorted). */
struct run {
    const emlio_plan_shard_t *shards;
    uint64_t total;
    uint8_t *seen;    /* by sample id */
    uint64_t *pos_of; /* sample id -> position in the uninterrupted order */
    emlio_plan_span_t *out;
    size_t n_out;
};

static void
run_ranks(struct run *run, const emlio_plan_params_t *base, uint32_t world,
          const size_t *take, const emlio_plan_span_t *done, size_t n_done)
{
    uint64_t last_pos = 0;
    bool any = false;
    for (uint32_t r = 0; r < world; r++) {
        emlio_plan_params_t p = *base;
        p.world = world;
        p.rank = r;
        p.batch_size = base->batch_size * base->world / world;
        p.done = done;
        p.n_done = n_done;
        emlio_plan_t *plan = emlio_plan_new();
        assert_int_equal(emlio_plan_build(plan, run->shards, N_SHARDS, &p), 0);
        size_t nb = emlio_plan_batch_count(plan);
        size_t upto = take ? take[r] : nb;
        if (upto > nb)
            upto = nb;
        uint64_t k = 0;
        for (size_t b = 0; b < upto; b++) {
            size_t n;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
            for (size_t j = 0; j < n; j++, k++) {
                uint64_t g = emlio_plan_position(plan, k);
                if (s[j].pad)
                    continue;
                uint64_t id = sample_id(run->shards, &s[j]);
                assert_int_equal(run->seen[id], 0);
                run->seen[id] = 1;
                /* Same sample at the same place as an uninterrupted run;
                 * ranks read the rest in global order. */
                assert_int_equal(run->pos_of[id], g);
                if (any)
                    assert_true(g > last_pos);
                last_pos = g;
                any = true;
                run->out[run->n_out++] = (emlio_plan_span_t){ g, g + 1 };
            }
        }
        emlio_plan_destroy(&plan);
    }
}

static void
test_plan_rest_resumes_on_other_world_sizes(void **state)
{
    (void)state;
    emlio_plan_shard_t shards[N_SHARDS];
    uint64_t total;
    make_inventory(shards, &total);
    emlio_plan_params_t base;
    emlio_plan_params_init(&base);
    base.world = 12; /* the global batch: 12 x 2 = 24 */
    base.batch_size = 2;
    base.seed = 77;
    base.epoch = 3;
    base.window_shards = 4;

    /* The uninterrupted order, from one rank of batch 24. */
    uint64_t *pos_of = calloc(total, sizeof(*pos_of));
    assert_non_null(pos_of);
    emlio_plan_params_t one = base;
    one.world = 1;
    one.batch_size = 24;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, shards, N_SHARDS, &one), 0);
    uint64_t k = 0;
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t n;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
        for (size_t j = 0; j < n; j++, k++)
            pos_of[sample_id(shards, &s[j])] = k;
    }
    assert_int_equal(k, total);
    emlio_plan_destroy(&plan);

    struct run run = { shards,
                       total,
                       calloc(total, 1),
                       pos_of,
                       calloc(total, sizeof(emlio_plan_span_t)),
                       0 };
    assert_non_null(run.seen);
    assert_non_null(run.out);
    /* 4 ranks take 3, 0, 5, 1 batches; then 2 ranks take 4 and 2; then 3
     * ranks finish the epoch. */
    const size_t take4[] = { 3, 0, 5, 1 };
    run_ranks(&run, &base, 4, take4, NULL, 0);
    emlio__spans_normalize(run.out, &run.n_out);
    size_t n_done1 = run.n_out;
    assert_true(n_done1 >= 3); /* the slices are not contiguous */
    emlio_plan_span_t *done1 = calloc(n_done1, sizeof(*done1));
    assert_non_null(done1);
    memcpy(done1, run.out, n_done1 * sizeof(*done1));

    const size_t take2[] = { 4, 2 };
    run_ranks(&run, &base, 2, take2, done1, n_done1);
    emlio__spans_normalize(run.out, &run.n_out);
    run_ranks(&run, &base, 3, NULL, run.out, run.n_out);
    for (uint64_t id = 0; id < total; id++)
        assert_int_equal(run.seen[id], 1);
    free(done1);
    free(run.out);
    free(run.seen);
    free(pos_of);
}

static void
test_plan_rest_counts_and_slices(void **state)
{
    (void)state;
    emlio_plan_shard_t shards[N_SHARDS];
    uint64_t total;
    make_inventory(shards, &total);
    const emlio_plan_span_t done[] = { { 0, 10 }, { 10, 11 }, { 40, 101 } };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.rank = 2;
    p.batch_size = 8;
    p.done = done;
    p.n_done = 3;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, shards, N_SHARDS, &p), 0);
    uint64_t rest = total - 72; /* 545: one pad on 3 ranks */
    assert_int_equal(emlio_plan_rest_size(plan), rest);
    assert_int_equal(emlio_plan_dataset_size(plan), total);
    uint64_t first, count;
    assert_int_equal(emlio_plan_slice(rest, 3, 2, 8, false, &first, &count), 0);
    assert_int_equal(emlio_plan_sample_count(plan), count);
    assert_int_equal(first, 2 * count);
    assert_int_equal(emlio_plan_pad_count(plan), 1);
    assert_int_equal(3 * count - rest, 1);
    /* Padding repeats the start of the rest: position 11 (0..10 are
     * consumed, and touching spans count as one). */
    assert_int_equal(emlio_plan_position(plan, count - 1), 11);
    /* drop_last drops what does not fill a global batch of the rest. */
    p.drop_last = true;
    assert_int_equal(emlio_plan_build(plan, shards, N_SHARDS, &p), 0);
    assert_int_equal(emlio_plan_dropped_count(plan), rest % 24);
    assert_int_equal(emlio_plan_sample_count(plan), rest / 24 * 8);
    /* All consumed: nothing to plan, no padding. */
    const emlio_plan_span_t all[] = { { 0, total } };
    p.drop_last = false;
    p.done = all;
    p.n_done = 1;
    assert_int_equal(emlio_plan_build(plan, shards, N_SHARDS, &p), 0);
    assert_int_equal(emlio_plan_batch_count(plan), 0);
    assert_int_equal(emlio_plan_sample_count(plan), 0);
    assert_int_equal(emlio_plan_slice(5, 0, 0, 1, false, &first, &count),
                     EMLIO_EINVAL);
    assert_int_equal(emlio_plan_slice(5, 2, 2, 1, false, &first, &count),
                     EMLIO_EINVAL);
    emlio_plan_destroy(&plan);
}

static void
test_plan_rest_rejects_bad_spans(void **state)
{
    (void)state;
    emlio_plan_shard_t shards[N_SHARDS];
    uint64_t total;
    make_inventory(shards, &total);
    const emlio_plan_span_t bad[][2] = {
        { { 5, 5 }, { 9, 10 } },         /* empty */
        { { 9, 12 }, { 4, 6 } },         /* out of order */
        { { 4, 9 }, { 8, 10 } },         /* overlapping */
        { { 4, 9 }, { 10, total + 1 } }, /* past the end */
    };
    const char *why[] = { "empty", "out of order", "out of order",
                          "past the epoch's end" };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    emlio_plan_t *plan = emlio_plan_new();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p.done = bad[i];
        p.n_done = 2;
        assert_int_equal(emlio_plan_build(plan, shards, N_SHARDS, &p),
                         EMLIO_EINVAL);
        assert_non_null(strstr(emlio_plan_errmsg(plan), why[i]));
        assert_int_equal(emlio_plan_batch_count(plan), 0);
    }
    emlio_plan_destroy(&plan);
}

static int
collect(void *arg, uint64_t begin, uint64_t end)
{
    uint8_t *mark = arg;
    for (uint64_t g = begin; g < end; g++) {
        if (mark[g])
            return 1;
        mark[g] = 1;
    }
    return 0;
}

/* rest_map against brute force, spans touching, at the ends, or none. */
static void
test_plan_rest_map_matches_brute_force(void **state)
{
    (void)state;
    const emlio_plan_span_t sp[] = {
        { 0, 2 }, { 2, 3 }, { 5, 6 }, { 9, 12 }, { 15, 20 }
    };
    emlio__rest_t r = { 0 };
    char err[EMLIO_ERRMSG_LEN];
    for (size_t n = 0; n <= 5; n++) {
        assert_int_equal(emlio__rest_set(&r, sp, n, 20, err), 0);
        uint64_t kept[20];
        size_t nk = 0;
        for (uint64_t g = 0; g < 20; g++) {
            bool in = false;
            for (size_t i = 0; i < n; i++)
                in |= g >= sp[i].begin && g < sp[i].end;
            if (!in)
                kept[nk++] = g;
        }
        assert_int_equal(r.done, 20 - nk);
        for (size_t q = 0; q < nk; q++)
            assert_int_equal(emlio__rest_position(&r, q), kept[q]);
        for (size_t q0 = 0; q0 <= nk; q0++)
            for (size_t q1 = q0; q1 <= nk; q1++) {
                uint8_t mark[20] = { 0 };
                assert_int_equal(emlio__rest_map(&r, q0, q1, collect, mark), 0);
                for (size_t q = 0; q < nk; q++)
                    assert_int_equal(mark[kept[q]], q >= q0 && q < q1);
            }
    }
    emlio__rest_release(&r);
    emlio_plan_span_t m[] = {
        { 7, 9 }, { 1, 3 }, { 3, 4 }, { 8, 12 }, { 2, 3 }
    };
    size_t nm = 5;
    emlio__spans_normalize(m, &nm);
    assert_int_equal(nm, 2);
    assert_int_equal(m[0].begin, 1);
    assert_int_equal(m[0].end, 4);
    assert_int_equal(m[1].begin, 7);
    assert_int_equal(m[1].end, 12);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_rest_resumes_on_other_world_sizes),
        cmocka_unit_test(test_plan_rest_counts_and_slices),
        cmocka_unit_test(test_plan_rest_rejects_bad_spans),
        cmocka_unit_test(test_plan_rest_map_matches_brute_force),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
