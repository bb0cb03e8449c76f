/* test_plan.c - unit tests of the epoch planner: exactly-once, equal
 * batches, remainder rules, determinism, replicas and locality.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <math.h>

/* A test inventory: shards named "shard-NNNNN" with one holder each, unless
 * a test rewrites them. Owns its names and holder arrays. */
struct inv {
    emlio_plan_shard_t *shards;
    char (*names)[32];
    uint32_t (*holders)[4];
    size_t n;
};

static void
inv_init(struct inv *v, size_t n, const uint64_t *records, uint32_t daemons)
{
    v->n = n;
    v->shards = calloc(n ? n : 1, sizeof(*v->shards));
    v->names = calloc(n ? n : 1, sizeof(*v->names));
    v->holders = calloc(n ? n : 1, sizeof(*v->holders));
    assert_non_null(v->shards);
    assert_non_null(v->names);
    assert_non_null(v->holders);
    for (size_t i = 0; i < n; i++) {
        snprintf(v->names[i], sizeof(v->names[i]), "shard-%05zu", i);
        v->holders[i][0] = (uint32_t)(i % daemons);
        v->shards[i].name = v->names[i];
        v->shards[i].records = records[i];
        v->shards[i].bytes = records[i] * 1000;
        v->shards[i].holders = v->holders[i];
        v->shards[i].n_holders = 1;
    }
}

static void
inv_release(struct inv *v)
{
    free(v->shards);
    free(v->names);
    free(v->holders);
}

/* Uneven sizes: 1 .. 97 records, deterministic. */
static uint64_t *
uneven_records(size_t n)
{
    uint64_t *r = calloc(n, sizeof(*r));
    assert_non_null(r);
    for (size_t i = 0; i < n; i++)
        r[i] = 1 + (i * 37 + 11) % 97;
    return r;
}

/* Index of the first shard with the same name, so replicas count as one. */
static size_t
canon(const emlio_plan_shard_t *shards, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (strcmp(shards[j].name, shards[i].name) == 0)
            return j;
    return i;
}

static bool
holds(const emlio_plan_shard_t *s, uint32_t daemon)
{
    for (uint32_t h = 0; h < s->n_holders; h++)
        if (s->holders[h] == daemon)
            return true;
    return false;
}

/* Builds the plan of every rank and checks the epoch-wide contract:
 * exactly-once (or at most once with drop_last), equal batch counts and
 * sizes, the remainder counts, and that each sample is read from a daemon
 * that holds its shard (any entry of the same name). Returns the number of
 * batches per rank. */
static size_t
check_epoch(const emlio_plan_shard_t *shards, size_t n,
            const emlio_plan_params_t *tmpl)
{
    emlio_plan_params_t p = *tmpl;
    uint32_t world = p.world;
    uint64_t *offset = calloc(n + 1, sizeof(*offset));
    size_t *first = calloc(n + 1, sizeof(*first));
    assert_non_null(offset);
    assert_non_null(first);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        offset[i] = total;
        first[i] = canon(shards, i);
        if (first[i] == i)
            total += shards[i].records;
    }
    uint8_t *seen = calloc(total ? total : 1, 1);
    assert_non_null(seen);
    emlio_plan_t *plan = emlio_plan_new();
    assert_non_null(plan);

    size_t batches = 0;
    uint64_t per_rank = 0;
    size_t last_len = 0;
    uint64_t pad_total = 0;
    uint64_t real_total = 0;
    for (uint32_t r = 0; r < world; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, shards, n, &p), 0);
        assert_int_equal(emlio_plan_dataset_size(plan), total);
        size_t nb = emlio_plan_batch_count(plan);
        uint64_t count = 0;
        size_t len = 0;
        for (size_t b = 0; b < nb; b++) {
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
            assert_non_null(s);
            if (b + 1 < nb || p.drop_last)
                assert_int_equal(len, p.batch_size);
            assert_true(len >= 1 && len <= p.batch_size);
            for (size_t k = 0; k < len; k++) {
                assert_true(s[k].shard < n);
                size_t c = first[s[k].shard];
                assert_true(s[k].record < shards[c].records);
                assert_true(holds(&shards[s[k].shard], s[k].daemon));
                if (s[k].pad) {
                    pad_total++;
                } else {
                    uint64_t id = offset[c] + s[k].record;
                    assert_int_equal(seen[id], 0);
                    seen[id] = 1;
                    real_total++;
                }
            }
            count += len;
        }
        assert_int_equal(count, emlio_plan_sample_count(plan));
        if (r == 0) {
            batches = nb;
            per_rank = count;
            last_len = len;
        }
        assert_int_equal(nb, batches);
        assert_int_equal(count, per_rank);
        assert_int_equal(len, last_len);
    }
    uint64_t world_b = (uint64_t)world * p.batch_size;
    if (p.drop_last) {
        assert_int_equal(per_rank, total / world_b * p.batch_size);
        assert_int_equal(pad_total, 0);
        assert_int_equal(real_total, per_rank * world);
        assert_int_equal(emlio_plan_dropped_count(plan), total - real_total);
        assert_int_equal(emlio_plan_dropped_count(plan), total % world_b);
    } else {
        assert_int_equal(per_rank, (total + world - 1) / world);
        assert_int_equal(real_total, total);
        assert_int_equal(pad_total, per_rank * world - total);
        assert_int_equal(emlio_plan_dropped_count(plan), 0);
        assert_int_equal(batches, (per_rank + p.batch_size - 1) / p.batch_size);
    }
    emlio_plan_destroy(&plan);
    free(seen);
    free(offset);
    free(first);
    return batches;
}

/* Whether plans a (over shards sa) and b (over sb) assign the same samples
 * by name, record, daemon and pad flag. */
static void
assert_same_plan(const emlio_plan_t *a, const emlio_plan_shard_t *sa,
                 const emlio_plan_t *b, const emlio_plan_shard_t *sb)
{
    assert_int_equal(emlio_plan_batch_count(a), emlio_plan_batch_count(b));
    assert_int_equal(emlio_plan_pad_count(a), emlio_plan_pad_count(b));
    for (size_t i = 0; i < emlio_plan_batch_count(a); i++) {
        size_t na;
        size_t nb;
        const emlio_plan_sample_t *x = emlio_plan_batch(a, i, &na);
        const emlio_plan_sample_t *y = emlio_plan_batch(b, i, &nb);
        assert_int_equal(na, nb);
        for (size_t k = 0; k < na; k++) {
            assert_string_equal(sa[x[k].shard].name, sb[y[k].shard].name);
            assert_int_equal(x[k].record, y[k].record);
            assert_int_equal(x[k].daemon, y[k].daemon);
            assert_int_equal(x[k].pad, y[k].pad);
        }
    }
}

/* Number of samples of two plans that sit at the same position with the
 * same identity. */
static size_t
same_positions(const emlio_plan_t *a, const emlio_plan_t *b)
{
    size_t same = 0;
    for (size_t i = 0; i < emlio_plan_batch_count(a); i++) {
        size_t na;
        size_t nb;
        const emlio_plan_sample_t *x = emlio_plan_batch(a, i, &na);
        const emlio_plan_sample_t *y = emlio_plan_batch(b, i, &nb);
        for (size_t k = 0; k < na && k < nb; k++)
            same += x[k].shard == y[k].shard && x[k].record == y[k].record;
    }
    return same;
}

static void
test_plan_params_init_defaults(void **state)
{
    (void)state;
    emlio_plan_params_t p;
    memset(&p, 0xff, sizeof(p));
    emlio_plan_params_init(&p);
    assert_int_equal(p.world, 1);
    assert_int_equal(p.rank, 0);
    assert_int_equal(p.batch_size, 32);
    assert_int_equal(p.epoch, 0);
    assert_int_equal(p.seed, 0);
    assert_int_equal(p.shuffle, EMLIO_SHUFFLE_WINDOW);
    assert_int_equal(p.window_shards, 0);
    assert_false(p.drop_last);
}

static void
test_plan_destroy_accepts_null(void **state)
{
    (void)state;
    emlio_plan_t *plan = NULL;
    emlio_plan_destroy(NULL);
    emlio_plan_destroy(&plan);
    plan = emlio_plan_new();
    assert_non_null(plan);
    assert_int_equal(emlio_plan_batch_count(plan), 0);
    assert_string_equal(emlio_plan_errmsg(plan), "");
    emlio_plan_destroy(&plan);
    assert_null(plan);
    emlio_plan_destroy(&plan);
}

static void
test_plan_exactly_once_across_ranks(void **state)
{
    (void)state;
    static const uint32_t worlds[] = { 1, 3, 4, 7 };
    static const uint32_t batches[] = { 1, 5, 8, 32, 1000 };
    uint64_t *records = uneven_records(23);
    struct inv v;
    inv_init(&v, 23, records, 3);
    for (size_t w = 0; w < EMLIO_ARRAY_SIZE(worlds); w++)
        for (size_t b = 0; b < EMLIO_ARRAY_SIZE(batches); b++)
            for (int shuffle = 0; shuffle <= 1; shuffle++)
                for (int drop = 0; drop <= 1; drop++) {
                    emlio_plan_params_t p;
                    emlio_plan_params_init(&p);
                    p.world = worlds[w];
                    p.batch_size = batches[b];
                    p.shuffle = shuffle;
                    p.drop_last = drop;
                    p.seed = 42;
                    p.epoch = w + b;
                    check_epoch(v.shards, v.n, &p);
                }
    inv_release(&v);
    free(records);
}

static void
test_plan_equal_batches_across_ranks(void **state)
{
    (void)state;
    /* 100 samples, 3 ranks, batch 8: 34 per rank (2 of them padding),
     * batches 8 8 8 8 2 on every rank. */
    uint64_t records[] = { 30, 30, 40 };
    struct inv v;
    inv_init(&v, 3, records, 2);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.batch_size = 8;
    assert_int_equal(check_epoch(v.shards, v.n, &p), 5);
    emlio_plan_t *plan = emlio_plan_new();
    uint64_t pads = 0;
    for (uint32_t r = 0; r < 3; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        assert_int_equal(emlio_plan_sample_count(plan), 34);
        size_t len;
        emlio_plan_batch(plan, 4, &len);
        assert_int_equal(len, 2);
        pads += emlio_plan_pad_count(plan);
    }
    assert_int_equal(pads, 2);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

static void
test_plan_drop_last_counts(void **state)
{
    (void)state;
    /* 100 samples, 3 ranks, batch 8: 4 full batches each, 4 dropped. */
    uint64_t records[] = { 30, 30, 40 };
    struct inv v;
    inv_init(&v, 3, records, 1);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.batch_size = 8;
    p.drop_last = true;
    assert_int_equal(check_epoch(v.shards, v.n, &p), 4);
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_dropped_count(plan), 4);
    assert_int_equal(emlio_plan_pad_count(plan), 0);
    assert_int_equal(emlio_plan_sample_count(plan), 32);
    /* Fewer samples than one global batch: nothing is read. */
    p.batch_size = 64;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_batch_count(plan), 0);
    assert_int_equal(emlio_plan_dropped_count(plan), 100);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

static void
test_plan_pad_repeats_start_of_order(void **state)
{
    (void)state;
    /* 10 samples over 4 ranks: 3 each, the last rank's last 2 repeat the
     * first 2 of the global order, which are rank 0's first 2. */
    uint64_t records[] = { 4, 6 };
    struct inv v;
    inv_init(&v, 2, records, 1);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 4;
    p.batch_size = 2;
    p.seed = 7;
    check_epoch(v.shards, v.n, &p);
    emlio_plan_t *first = emlio_plan_new();
    emlio_plan_t *last = emlio_plan_new();
    assert_int_equal(emlio_plan_build(first, v.shards, v.n, &p), 0);
    p.rank = 3;
    assert_int_equal(emlio_plan_build(last, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_pad_count(first), 0);
    assert_int_equal(emlio_plan_pad_count(last), 2);
    size_t n0;
    size_t n3;
    const emlio_plan_sample_t *a = emlio_plan_batch(first, 0, &n0);
    const emlio_plan_sample_t *z = emlio_plan_batch(last, 1, &n3);
    assert_int_equal(n0, 2);
    assert_int_equal(n3, 1);
    assert_true(z[0].pad);
    assert_int_equal(z[0].shard, a[1].shard);
    assert_int_equal(z[0].record, a[1].record);
    /* One sample over 4 ranks: every rank gets it once, three as pads. */
    uint64_t one[] = { 1 };
    struct inv u;
    inv_init(&u, 1, one, 1);
    p.rank = 0;
    check_epoch(u.shards, u.n, &p);
    emlio_plan_destroy(&first);
    emlio_plan_destroy(&last);
    inv_release(&u);
    inv_release(&v);
}

static void
test_plan_empty_inventory(void **state)
{
    (void)state;
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 2;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, NULL, 0, &p), 0);
    assert_int_equal(emlio_plan_batch_count(plan), 0);
    assert_int_equal(emlio_plan_dataset_size(plan), 0);
    /* Shards without records take part but contribute nothing. */
    uint64_t records[] = { 0, 5, 0, 0, 0, 0, 3 };
    struct inv v;
    inv_init(&v, 7, records, 2);
    check_epoch(v.shards, v.n, &p);
    p.batch_size = 3;
    check_epoch(v.shards, v.n, &p);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

static void
test_plan_deterministic(void **state)
{
    (void)state;
    uint64_t *records = uneven_records(40);
    struct inv v;
    inv_init(&v, 40, records, 4);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.rank = 1;
    p.batch_size = 16;
    p.seed = 0x1234;
    p.epoch = 5;
    emlio_plan_t *a = emlio_plan_new();
    emlio_plan_t *b = emlio_plan_new();
    assert_int_equal(emlio_plan_build(a, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_build(b, v.shards, v.n, &p), 0);
    assert_same_plan(a, v.shards, b, v.shards);
    /* Rebuilding a used plan gives the same again. */
    assert_int_equal(emlio_plan_build(b, v.shards, v.n, &p), 0);
    assert_same_plan(a, v.shards, b, v.shards);
    emlio_plan_destroy(&a);
    emlio_plan_destroy(&b);
    inv_release(&v);
    free(records);
}

static void
test_plan_independent_of_shard_order(void **state)
{
    (void)state;
    uint64_t *records = uneven_records(30);
    struct inv v;
    inv_init(&v, 30, records, 3);
    /* A copy of the inventory in another order: reversed, then rotated. */
    emlio_plan_shard_t *perm = calloc(30, sizeof(*perm));
    assert_non_null(perm);
    for (size_t i = 0; i < 30; i++)
        perm[i] = v.shards[(29 - i + 11) % 30];
    emlio_plan_t *a = emlio_plan_new();
    emlio_plan_t *b = emlio_plan_new();
    for (int drop = 0; drop <= 1; drop++)
        for (uint32_t r = 0; r < 4; r++) {
            emlio_plan_params_t p;
            emlio_plan_params_init(&p);
            p.world = 4;
            p.rank = r;
            p.batch_size = 7;
            p.seed = 99;
            p.epoch = 3;
            p.drop_last = drop;
            assert_int_equal(emlio_plan_build(a, v.shards, 30, &p), 0);
            assert_int_equal(emlio_plan_build(b, perm, 30, &p), 0);
            assert_same_plan(a, v.shards, b, perm);
        }
    emlio_plan_destroy(&a);
    emlio_plan_destroy(&b);
    free(perm);
    inv_release(&v);
    free(records);
}

static void
test_plan_epochs_differ(void **state)
{
    (void)state;
    uint64_t *records = uneven_records(20);
    struct inv v;
    inv_init(&v, 20, records, 1);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = 10;
    p.seed = 1;
    emlio_plan_t *a = emlio_plan_new();
    emlio_plan_t *b = emlio_plan_new();
    assert_int_equal(emlio_plan_build(a, v.shards, v.n, &p), 0);
    uint64_t n = emlio_plan_sample_count(a);
    for (uint64_t e = 1; e < 5; e++) {
        p.epoch = e;
        assert_int_equal(emlio_plan_build(b, v.shards, v.n, &p), 0);
        /* A fresh permutation leaves few samples in place. */
        assert_true(same_positions(a, b) < n / 10);
    }
    /* So does another seed. */
    p.epoch = 0;
    p.seed = 2;
    assert_int_equal(emlio_plan_build(b, v.shards, v.n, &p), 0);
    assert_true(same_positions(a, b) < n / 10);
    emlio_plan_destroy(&a);
    emlio_plan_destroy(&b);
    inv_release(&v);
    free(records);
}

static void
test_plan_shuffle_none_is_file_order(void **state)
{
    (void)state;
    uint64_t records[] = { 3, 5, 2, 4, 6 };
    struct inv v;
    inv_init(&v, 5, records, 2);
    /* Give the shards to the planner in reverse name order. */
    emlio_plan_shard_t rev[5];
    for (size_t i = 0; i < 5; i++)
        rev[i] = v.shards[4 - i];
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 2;
    p.batch_size = 4;
    p.shuffle = EMLIO_SHUFFLE_NONE;
    p.seed = 1234;
    p.epoch = 9;
    emlio_plan_t *plan = emlio_plan_new();
    size_t shard = 0;
    uint64_t record = 0;
    for (uint32_t r = 0; r < 2; r++) {
        p.rank = r;
        assert_int_equal(emlio_plan_build(plan, rev, 5, &p), 0);
        for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
            size_t len;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
            for (size_t k = 0; k < len; k++) {
                while (record == records[shard]) {
                    shard++;
                    record = 0;
                }
                assert_false(s[k].pad);
                assert_string_equal(rev[s[k].shard].name, v.names[shard]);
                assert_int_equal(s[k].record, record);
                record++;
            }
        }
    }
    assert_int_equal(shard, 4);
    assert_int_equal(record, 6);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

static void
test_plan_replicas_read_once(void **state)
{
    (void)state;
    /* Eight names, each reported by daemon 0 and by daemon 1 as separate
     * entries, plus one entry listing daemons 2 and 3 itself. */
    emlio_plan_shard_t shards[17] = { 0 };
    char names[9][16];
    static const uint32_t d0 = 0;
    static const uint32_t d1 = 1;
    static const uint32_t d23[] = { 3, 2 };
    for (size_t i = 0; i < 8; i++) {
        snprintf(names[i], sizeof(names[i]), "part-%02zu", i);
        for (size_t c = 0; c < 2; c++) {
            emlio_plan_shard_t *s = &shards[c * 8 + i];
            s->name = names[i];
            s->records = 10;
            s->bytes = 4096;
            s->holders = c ? &d1 : &d0;
            s->n_holders = 1;
        }
    }
    snprintf(names[8], sizeof(names[8]), "part-xx");
    shards[16] = (emlio_plan_shard_t){ .name = names[8],
                                       .records = 5,
                                       .bytes = 2048,
                                       .holders = d23,
                                       .n_holders = 2 };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.batch_size = 4;
    check_epoch(shards, 17, &p);
    p.world = 1;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, shards, 17, &p), 0);
    assert_int_equal(emlio_plan_dataset_size(plan), 85);
    uint64_t per_daemon[4] = { 0 };
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t len;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
        for (size_t k = 0; k < len; k++)
            per_daemon[s[k].daemon]++;
    }
    /* Equal bytes: the replicated names split evenly, ties to the lower
     * daemon index. */
    assert_int_equal(per_daemon[0], 40);
    assert_int_equal(per_daemon[1], 40);
    assert_int_equal(per_daemon[2], 5);
    assert_int_equal(per_daemon[3], 0);
    emlio_plan_destroy(&plan);
}

static void
test_plan_replicas_balance_bytes(void **state)
{
    (void)state;
    /* Daemon 0 alone holds a large shard; the small replicated shards then
     * go to daemon 1 until it has caught up. */
    static const uint32_t only0 = 0;
    static const uint32_t both[] = { 0, 1 };
    emlio_plan_shard_t shards[5] = {
        { .name = "big",
          .records = 10,
          .bytes = 4000,
          .holders = &only0,
          .n_holders = 1 },
        { .name = "r1",
          .records = 10,
          .bytes = 1000,
          .holders = both,
          .n_holders = 2 },
        { .name = "r2",
          .records = 10,
          .bytes = 1000,
          .holders = both,
          .n_holders = 2 },
        { .name = "r3",
          .records = 10,
          .bytes = 1000,
          .holders = both,
          .n_holders = 2 },
        { .name = "r4",
          .records = 10,
          .bytes = 1000,
          .holders = both,
          .n_holders = 2 },
    };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = 50;
    emlio_plan_t *plan = emlio_plan_new();
    for (uint64_t e = 0; e < 3; e++) {
        p.epoch = e;
        assert_int_equal(emlio_plan_build(plan, shards, 5, &p), 0);
        size_t len;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, 0, &len);
        assert_int_equal(len, 50);
        for (size_t k = 0; k < len; k++)
            assert_int_equal(s[k].daemon, s[k].shard == 0 ? 0 : 1);
    }
    emlio_plan_destroy(&plan);
}

static void
test_plan_replica_conflict_is_einval(void **state)
{
    (void)state;
    static const uint32_t d0 = 0;
    static const uint32_t d1 = 1;
    emlio_plan_shard_t shards[3] = {
        { .name = "train-7", .records = 12, .holders = &d0, .n_holders = 1 },
        { .name = "train-8", .records = 12, .holders = &d0, .n_holders = 1 },
        { .name = "train-7", .records = 13, .holders = &d1, .n_holders = 1 },
    };
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, shards, 3, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "'train-7'"));
    assert_non_null(strstr(emlio_plan_errmsg(plan), "12 and 13"));
    assert_int_equal(emlio_plan_batch_count(plan), 0);
    emlio_plan_destroy(&plan);
}

static void
test_plan_invalid_params(void **state)
{
    (void)state;
    uint64_t records[] = { 10, 10 };
    struct inv v;
    inv_init(&v, 2, records, 1);
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), 0);
    assert_int_equal(emlio_plan_batch_count(plan), 1);

    p.world = 0;
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "world"));
    /* A failed build leaves an empty plan, not the previous one. */
    assert_int_equal(emlio_plan_batch_count(plan), 0);
    assert_int_equal(emlio_plan_sample_count(plan), 0);

    emlio_plan_params_init(&p);
    p.world = 4;
    p.rank = 4;
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "rank 4"));

    emlio_plan_params_init(&p);
    p.batch_size = 0;
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "batch size"));

    emlio_plan_params_init(&p);
    p.shuffle = 9;
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_plan_errmsg(plan), "shuffle"));

    emlio_plan_params_init(&p);
    v.shards[1].n_holders = 0;
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), EMLIO_EINVAL);
    assert_string_equal(emlio_plan_errmsg(plan),
                        "shard 'shard-00001' has no holders");
    v.shards[1].n_holders = 1;
    v.shards[1].name = NULL;
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), EMLIO_EINVAL);
    assert_string_equal(emlio_plan_errmsg(plan), "shard 1 has no name");

    /* A good build afterwards works and clears the message. */
    v.shards[1].name = v.names[1];
    assert_int_equal(emlio_plan_build(plan, v.shards, 2, &p), 0);
    assert_string_equal(emlio_plan_errmsg(plan), "");
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

static void
test_plan_windows_respected(void **state)
{
    (void)state;

    /* 40 equal shards of 50 records, windows of 4: every shard's samples
     * lie inside one aligned block of 200 positions, and a batch that is
     * no longer than a window touches at most two windows. */
    enum { SHARDS = 40, R = 50 };

    uint64_t records[SHARDS];
    for (size_t i = 0; i < SHARDS; i++)
        records[i] = R;
    struct inv v;
    inv_init(&v, SHARDS, records, 4);
    static const uint32_t windows[] = { 1, 4, 8 };
    emlio_plan_t *plan = emlio_plan_new();
    for (size_t w = 0; w < EMLIO_ARRAY_SIZE(windows); w++) {
        emlio_plan_params_t p;
        emlio_plan_params_init(&p);
        p.batch_size = 32;
        p.seed = 5;
        p.epoch = w;
        p.window_shards = windows[w];
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        uint64_t block[SHARDS];
        for (size_t i = 0; i < SHARDS; i++)
            block[i] = UINT64_MAX;
        uint64_t pos = 0;
        size_t max_distinct = 0;
        size_t moved = 0;
        for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
            size_t len;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
            bool touched[SHARDS] = { false };
            size_t distinct = 0;
            for (size_t k = 0; k < len; k++, pos++) {
                uint64_t blk = pos / (R * windows[w]);
                if (block[s[k].shard] == UINT64_MAX)
                    block[s[k].shard] = blk;
                assert_int_equal(block[s[k].shard], blk);
                if (!touched[s[k].shard]) {
                    touched[s[k].shard] = true;
                    distinct++;
                }
                moved += s[k].record != pos % R;
            }
            max_distinct = EMLIO_MAX(max_distinct, distinct);
        }
        assert_true(max_distinct <= 2 * windows[w]);
        /* Records are shuffled inside the window, not left in file order. */
        assert_true(moved > SHARDS * R / 2);
    }
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

/* The shared schedule (docs/planner.md): with params.shared, jobs of
 * different seeds read the same shards in the same windows in the same
 * order (each window's shards the same set), each in its own order inside
 * a window; the schedule changes with the epoch and with the dataset, and
 * each job still gets every sample exactly once. Without it the seeds'
 * windows differ. */
static void
s_window_sets(emlio_plan_t *plan, size_t n_shards, size_t per_window,
              uint64_t *set, uint64_t *order_hash)
{
    /* set[w]: a bitmask of the shards window w's samples come from. */
    uint64_t pos = 0, h = 0;
    memset(set, 0, sizeof(*set) * n_shards);
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t len;
        const emlio_plan_sample_t *smp = emlio_plan_batch(plan, b, &len);
        for (size_t k = 0; k < len; k++, pos++) {
            set[pos / per_window] |= UINT64_C(1) << smp[k].shard;
            h = (h * 31 + smp[k].shard) * 31 + smp[k].record;
        }
    }
    *order_hash = h;
}

static void
test_plan_shared_schedule(void **state)
{
    (void)state;

    enum { SHARDS = 24, R = 40, W = 3 };

    uint64_t records[SHARDS];
    for (size_t i = 0; i < SHARDS; i++)
        records[i] = R;
    struct inv v;
    inv_init(&v, SHARDS, records, 2);
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = 16;
    p.window_shards = W;
    uint64_t a[SHARDS], b[SHARDS], c[SHARDS];
    uint64_t ha, hb, hc;
    for (int shared = 0; shared < 2; shared++) {
        p.shared = shared;
        p.epoch = 3;
        p.seed = 1;
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        s_window_sets(plan, SHARDS, R * W, a, &ha);
        p.seed = 2;
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        s_window_sets(plan, SHARDS, R * W, b, &hb);
        size_t same = 0;
        for (size_t w = 0; w < SHARDS / W; w++)
            same += a[w] == b[w];
        /* Shared: every window the same shards, in the same order; the
         * samples inside in another order. Not shared: hardly any. */
        if (shared)
            assert_int_equal(same, SHARDS / W);
        else
            assert_true(same < 2);
        assert_true(ha != hb);
        /* Every rank of a shared job, and the job as a whole, still reads
         * every sample exactly once. */
        for (uint32_t world = 1; world <= 3; world++) {
            emlio_plan_params_t q = p;
            q.world = world;
            check_epoch(v.shards, v.n, &q);
        }
    }
    /* Another epoch: another shared schedule, common to both seeds. */
    p.shared = true;
    p.epoch = 4;
    p.seed = 1;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    s_window_sets(plan, SHARDS, R * W, c, &hc);
    size_t same = 0;
    for (size_t w = 0; w < SHARDS / W; w++)
        same += c[w] == a[w];
    assert_true(same < SHARDS / W);
    p.seed = 2;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    s_window_sets(plan, SHARDS, R * W, b, &hb);
    assert_memory_equal(b, c, sizeof(uint64_t) * (SHARDS / W));
    /* Another dataset (one shard renamed): another schedule. */
    snprintf(v.names[5], sizeof(v.names[5]), "renamed");
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    s_window_sets(plan, SHARDS, R * W, b, &hb);
    size_t kept = 0;
    for (size_t w = 0; w < SHARDS / W; w++)
        kept += b[w] == c[w];
    assert_true(kept < SHARDS / W);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

/* The default (window 0) is one window over every shard: the same plan as
 * window_shards = S, i.e. a uniform shuffle of the whole dataset. */
static void
test_plan_default_window_is_whole_dataset(void **state)
{
    (void)state;
    uint64_t *records = uneven_records(17);
    struct inv v;
    inv_init(&v, 17, records, 2);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.seed = 3;
    emlio_plan_t *a = emlio_plan_new();
    emlio_plan_t *b = emlio_plan_new();
    assert_int_equal(emlio_plan_build(a, v.shards, v.n, &p), 0);
    p.window_shards = 17;
    assert_int_equal(emlio_plan_build(b, v.shards, v.n, &p), 0);
    assert_same_plan(a, v.shards, b, v.shards);
    emlio_plan_destroy(&a);
    emlio_plan_destroy(&b);
    inv_release(&v);
    free(records);
}

/* log P(X = k) of the hypergeometric law: k of a class's K samples in a
 * batch of n drawn without replacement from N, as a uniform shuffle
 * gives. */
static double
log_hypergeom(unsigned k, unsigned K, unsigned n, unsigned N)
{
    return lgamma(K + 1.0) - lgamma(k + 1.0) - lgamma(K - k + 1.0) +
           lgamma(N - K + 1.0) - lgamma(n - k + 1.0) -
           lgamma(N - K - n + k + 1.0) - lgamma(N + 1.0) + lgamma(n + 1.0) +
           lgamma(N - n + 1.0);
}

#define MIX_CLASSES 10
#define MIX_PER     100 /* samples per class */
#define MIX_BATCH   32
#define MIX_BINS    8 /* counts 0 .. 6, and 7 or more */

/* The shape of a mixing test: classes of `per` samples each, batches of
 * `batch`, over `epochs` epochs. */
struct mix {
    unsigned classes;
    unsigned per;
    unsigned batch;
    unsigned epochs;
};

static const struct mix mix_small = { MIX_CLASSES, MIX_PER, MIX_BATCH, 20 };

/* Pearson's chi-square of the per-batch class counts against a uniform
 * shuffle's: over the epochs, every full batch and every class gives one
 * count k (how many of the batch's samples have that class), and the
 * histogram of k is compared with the hypergeometric law. label_of maps
 * (shard index, record) to the class. */
static double
mix_chi_square(const struct inv *v, const struct mix *m, uint32_t window,
               unsigned (*label_of)(uint32_t shard, uint64_t record))
{
    const unsigned n_total = m->classes * m->per;
    double seen[MIX_BINS] = { 0 };
    double obs = 0;
    unsigned *count = calloc(m->classes, sizeof(*count));
    assert_non_null(count);
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = m->batch;
    p.seed = 11;
    p.window_shards = window;
    for (uint64_t e = 0; e < m->epochs; e++) {
        p.epoch = e;
        assert_int_equal(emlio_plan_build(plan, v->shards, v->n, &p), 0);
        for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
            size_t len;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
            if (len != m->batch)
                continue;
            memset(count, 0, m->classes * sizeof(*count));
            for (size_t i = 0; i < len; i++)
                count[label_of(s[i].shard, s[i].record)]++;
            for (size_t c = 0; c < m->classes; c++) {
                seen[EMLIO_MIN(count[c], (unsigned)MIX_BINS - 1)]++;
                obs++;
            }
        }
    }
    emlio_plan_destroy(&plan);
    free(count);
    double chi = 0;
    double tail = 1;
    for (unsigned k = 0; k < MIX_BINS; k++) {
        double pk = k + 1 < MIX_BINS
                        ? exp(log_hypergeom(k, m->per, m->batch, n_total))
                        : tail;
        tail -= pk;
        double want = pk * obs;
        chi += (seen[k] - want) * (seen[k] - want) / want;
    }
    return chi;
}

/* The 0.999 quantile of chi-square with MIX_BINS - 1 = 7 degrees of
 * freedom: a uniform shuffle exceeds it once in a thousand seeds. */
#define MIX_CRITICAL 24.32

/* ImageFolder: one class per directory, and each directory one shard. */
static unsigned
label_is_shard(uint32_t shard, uint64_t record)
{
    (void)record;
    return shard;
}

/* TFRecords packed from a class-sorted listing without shuffling: 8 shards
 * of 125 records, class = global position / 100. */
static unsigned
label_class_sorted(uint32_t shard, uint64_t record)
{
    return (unsigned)((shard * 125 + record) / MIX_PER);
}

static void
test_plan_default_mixes_like_uniform_shuffle(void **state)
{
    (void)state;
    uint64_t per_class[MIX_CLASSES];
    uint64_t sorted[8];
    for (size_t i = 0; i < MIX_CLASSES; i++)
        per_class[i] = MIX_PER;
    for (size_t i = 0; i < 8; i++)
        sorted[i] = 125;
    struct inv folder;
    struct inv tfrec;
    inv_init(&folder, MIX_CLASSES, per_class, 1);
    inv_init(&tfrec, 8, sorted, 1);
    double f_default = mix_chi_square(&folder, &mix_small, 0, label_is_shard);
    double t_default =
        mix_chi_square(&tfrec, &mix_small, 0, label_class_sorted);
    /* The test can fail: the old default, 4 shards a window, is skewed. */
    double f_four = mix_chi_square(&folder, &mix_small, 4, label_is_shard);
    double t_four = mix_chi_square(&tfrec, &mix_small, 4, label_class_sorted);
    print_message("# chi-square (crit %.2f): imagefolder %.1f (window 4: "
                  "%.1f), sorted tfrecord %.1f (window 4: %.1f)\n",
                  MIX_CRITICAL, f_default, f_four, t_default, t_four);
    assert_true(f_default < MIX_CRITICAL);
    assert_true(t_default < MIX_CRITICAL);
    assert_true(f_four > 10 * MIX_CRITICAL);
    assert_true(t_four > 10 * MIX_CRITICAL);
    inv_release(&folder);
    inv_release(&tfrec);
}

/* The same at a larger domain, where the permutation runs on 17 bits and
 * cycle-walks from 100,000 to 131,072: an ImageFolder of 100 classes of
 * 1000 in batches of 256, 4 epochs, and with it a locality window of 8
 * class shards, which must stay skewed. */
static void
test_plan_default_mixes_like_uniform_shuffle_large(void **state)
{
    (void)state;
    static const struct mix large = { 100, 1000, 256, 4 };
    uint64_t per_class[100];
    for (size_t i = 0; i < 100; i++)
        per_class[i] = 1000;
    struct inv folder;
    inv_init(&folder, 100, per_class, 3);
    double full = mix_chi_square(&folder, &large, 0, label_is_shard);
    double eight = mix_chi_square(&folder, &large, 8, label_is_shard);
    print_message("# chi-square (crit %.2f), 100 classes x 1000, batch 256: "
                  "%.1f (window 8: %.1f)\n",
                  MIX_CRITICAL, full, eight);
    assert_true(full < MIX_CRITICAL);
    assert_true(eight > 10 * MIX_CRITICAL);
    inv_release(&folder);
}

/* The first batch (all 14 samples) of the golden inventory's plan, as
 * "name+record " words. */
static void
s_first_batch(emlio_plan_t *plan, const emlio_plan_shard_t *shards,
              const emlio_plan_params_t *p, char *got, size_t cap)
{
    assert_int_equal(emlio_plan_build(plan, shards, 4, p), 0);
    size_t n;
    const emlio_plan_sample_t *s = emlio_plan_batch(plan, 0, &n);
    assert_int_equal(n, 14);
    size_t len = 0;
    got[0] = '\0';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(got + len, cap - len, "%s%" PRIu64 " ",
                                shards[s[i].shard].name, s[i].record);
}

/* Per cursor of one epoch's plan (batches of one sample): the shards read
 * at it, as a bitmask in sets[cursor - lo]. Checks that the cursors of
 * the epoch are lo .. lo + segments - 1, each one run of batches. */
static void
s_cursor_sets(emlio_plan_t *plan, uint64_t lo, uint64_t *sets)
{
    uint64_t segs = emlio_plan_segments(plan);
    memset(sets, 0, sizeof(*sets) * segs);
    uint64_t prev = lo;
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t len;
        const emlio_plan_sample_t *smp = emlio_plan_batch(plan, b, &len);
        uint64_t c = emlio_plan_batch_cursor(plan, b);
        assert_true(c == prev || c == prev + 1);
        assert_true(c - lo < segs);
        prev = c;
        sets[c - lo] |= UINT64_C(1) << smp[0].shard;
    }
    assert_int_equal(prev, lo + segs - 1);
}

/* Joining the shared schedule (docs/planner.md, "Joining"): a job that
 * starts at cursor J reads, at every cursor, the shards a job that
 * started at 0 reads there, whatever its seed; each of its epochs visits
 * every segment once and delivers every sample exactly once, on any
 * number of ranks; segments are two windows (one shorter), fixed across
 * laps. */
static void
test_plan_shared_join(void **state)
{
    (void)state;

    enum { SHARDS = 25, W = 2, SEGS = 7, EPOCHS = 3 };

    uint64_t records[SHARDS];
    for (size_t i = 0; i < SHARDS; i++)
        records[i] = 3 + i % 5;
    struct inv v;
    inv_init(&v, SHARDS, records, 2);
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = 1;
    p.window_shards = W;
    p.shared = true;
    p.seed = 1;
    uint64_t lead[EPOCHS * SEGS];
    for (uint64_t e = 0; e < EPOCHS; e++) {
        p.epoch = e;
        assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        assert_int_equal(emlio_plan_segments(plan), SEGS);
        s_cursor_sets(plan, e * SEGS, lead + e * SEGS);
    }
    /* Segments: 2 windows of 2 shards, one of the one shard left; the
     * same shards in every lap. */
    size_t short_ones = 0;
    for (size_t c = 0; c < SEGS; c++) {
        int k = __builtin_popcountll(lead[c]);
        assert_true(k == 2 * W || k == SHARDS % (2 * W));
        short_ones += k != 2 * W;
        for (uint64_t e = 1; e < EPOCHS; e++)
            assert_int_equal(lead[c], lead[e * SEGS + c]);
    }
    assert_int_equal(short_ones, 1);
    /* A job of another seed joining at cursors 3, 7 (a lap's start) and
     * 10: the leader's shards at every cursor both cover. */
    static const uint64_t joins[] = { 3, 7, 10 };
    for (size_t j = 0; j < EMLIO_ARRAY_SIZE(joins); j++) {
        p.seed = 9;
        p.share_join = joins[j];
        for (uint64_t e = 0; e < 2; e++) {
            uint64_t mine[SEGS];
            uint64_t lo = joins[j] + e * SEGS;
            p.epoch = e;
            assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
            s_cursor_sets(plan, lo, mine);
            for (uint64_t c = lo; c < lo + SEGS && c < EPOCHS * SEGS; c++)
                assert_int_equal(mine[c - lo], lead[c]);
            for (uint32_t world = 1; world <= 3; world++) {
                emlio_plan_params_t q = p;
                q.world = world;
                q.batch_size = 4;
                check_epoch(v.shards, v.n, &q);
            }
        }
    }
    /* Any cursor a daemon may send, however large, is a valid join. */
    p.share_join = UINT64_MAX - 2;
    p.epoch = 5;
    check_epoch(v.shards, v.n, &p);
    /* Not shared: no segments, no cursors. */
    p.shared = false;
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_segments(plan), 1);
    assert_int_equal(emlio_plan_batch_cursor(plan, 0), 0);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

/* Pins the specified algorithm (docs/planner.md, plan version 2): another
 * implementation that follows the document must reproduce these
 * sequences. Windows of 2 shards for epochs 0 and 1, then the default of
 * one window. */
static void
test_plan_golden_vector(void **state)
{
    (void)state;
    static const uint32_t h = 0;
    emlio_plan_shard_t shards[4] = {
        { .name = "c", .records = 5, .holders = &h, .n_holders = 1 },
        { .name = "a", .records = 4, .holders = &h, .n_holders = 1 },
        { .name = "d", .records = 2, .holders = &h, .n_holders = 1 },
        { .name = "b", .records = 3, .holders = &h, .n_holders = 1 },
    };

    static const struct {
        uint64_t epoch;
        uint32_t window;
        const char *want;
    } cases[] = {
        { 0, 2, "c1 c4 c0 c2 b2 c3 b1 b0 a2 a0 a3 d1 a1 d0 " },
        { 1, 2, "a0 a2 a3 a1 d1 d0 b2 b0 c4 c2 c3 c0 c1 b1 " },
        { 0, 0, "c1 d0 a1 c4 c2 a3 b1 b2 c0 b0 a2 a0 c3 d1 " },
    };

    /* The shared schedule, windows of one shard: segments {d, a} and
     * {c, b} for every seed and epoch, each lap in its own order ({d, a}
     * then {c, b} in lap 0, {a, d} then {b, c} in lap 1), inside each
     * window the seed's order. A job that joins at cursor 1 reads lap 0's
     * second segment, then lap 1's first: what a job that started at 0
     * reads at those cursors. */
    static const struct {
        uint64_t epoch, seed, join;
        const char *want;
    } shared[] = {
        { 0, 1, 0, "d0 d1 a1 a0 a2 a3 c0 c2 c3 c1 c4 b1 b2 b0 " },
        { 0, 2, 0, "d1 d0 a2 a0 a1 a3 c4 c2 c1 c0 c3 b2 b1 b0 " },
        { 1, 1, 0, "a0 a2 a3 a1 d0 d1 b2 b1 b0 c0 c3 c2 c1 c4 " },
        { 0, 1, 1, "c1 c4 c0 c2 c3 b1 b0 b2 a0 a2 a3 a1 d1 d0 " },
        { 1, 1, 1, "b0 b2 b1 c2 c0 c1 c3 c4 a3 a1 a0 a2 d1 d0 " },
    };

    assert_int_equal(EMLIO_PLAN_VERSION, 2);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = 14;
    p.seed = 1;
    emlio_plan_t *plan = emlio_plan_new();
    for (size_t c = 0; c < EMLIO_ARRAY_SIZE(cases); c++) {
        p.epoch = cases[c].epoch;
        p.window_shards = cases[c].window;
        char got[128];
        s_first_batch(plan, shards, &p, got, sizeof(got));
        assert_string_equal(got, cases[c].want);
    }
    p.shared = true;
    p.window_shards = 1;
    for (size_t c = 0; c < EMLIO_ARRAY_SIZE(shared); c++) {
        p.epoch = shared[c].epoch;
        p.seed = shared[c].seed;
        p.share_join = shared[c].join;
        char got[128];
        s_first_batch(plan, shards, &p, got, sizeof(got));
        assert_string_equal(got, shared[c].want);
    }
    emlio_plan_destroy(&plan);
}

/* The permutation behind every window is a bijection: one shard of m
 * records, planned as one batch, holds every record exactly once, for
 * every m up to 600 and around powers of two (where the cycle-walking
 * domain changes size), on several keys. */
static void
test_plan_feistel_bijective_small_domains(void **state)
{
    (void)state;
    static const uint64_t edges[] = { 1023, 1024, 1025, 2047, 2048,
                                      2049, 4095, 4096, 4097 };
    static const uint64_t seeds[] = { 0, 1, 0xdeadbeefcafeULL };
    uint8_t *seen = calloc(4097, 1);
    assert_non_null(seen);
    emlio_plan_t *plan = emlio_plan_new();
    for (uint64_t i = 1; i <= 600 + EMLIO_ARRAY_SIZE(edges); i++) {
        uint64_t m = i <= 600 ? i : edges[i - 601];
        uint64_t records[1] = { m };
        struct inv v;
        inv_init(&v, 1, records, 1);
        for (size_t k = 0; k < EMLIO_ARRAY_SIZE(seeds) * 2; k++) {
            emlio_plan_params_t p;
            emlio_plan_params_init(&p);
            p.batch_size = (uint32_t)m;
            p.seed = seeds[k / 2];
            p.epoch = k % 2 ? 7 : 0;
            assert_int_equal(emlio_plan_build(plan, v.shards, 1, &p), 0);
            size_t n;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, 0, &n);
            assert_int_equal(n, m);
            memset(seen, 0, m);
            size_t fixed = 0;
            for (size_t j = 0; j < n; j++) {
                assert_true(s[j].record < m);
                assert_int_equal(seen[s[j].record], 0);
                seen[s[j].record] = 1;
                fixed += s[j].record == j;
            }
            /* A uniform permutation has one fixed point on average. */
            if (m >= 64)
                assert_true(fixed < m / 8);
        }
        inv_release(&v);
    }
    emlio_plan_destroy(&plan);
    free(seen);
}

/* The 0.999 quantile of chi-square with k degrees of freedom, by Wilson
 * and Hilferty's cube-root approximation (within 1% for k >= 20). */
static double
chi2_q999(double k)
{
    double c = 1 - 2 / (9 * k) + 3.0902 * sqrt(2 / (9 * k));
    return k * c * c * c;
}

/* Each record lands on each position equally often across keys: the
 * (record, position) table of a one-shard window of m records over many
 * seeds against the uniform 1/m, by Pearson's chi-square with (m - 1)^2
 * degrees of freedom. m = 16 fills the network's domain exactly; 10 and
 * 37 need cycle-walking. */
static void
test_plan_permutation_positions_uniform(void **state)
{
    (void)state;
    static const uint64_t sizes[] = { 10, 16, 37 };

    enum { SEEDS = 4000 };

    emlio_plan_t *plan = emlio_plan_new();
    for (size_t z = 0; z < EMLIO_ARRAY_SIZE(sizes); z++) {
        uint64_t m = sizes[z];
        uint64_t records[1] = { m };
        struct inv v;
        inv_init(&v, 1, records, 1);
        uint32_t *count = calloc(m * m, sizeof(*count));
        assert_non_null(count);
        emlio_plan_params_t p;
        emlio_plan_params_init(&p);
        p.batch_size = (uint32_t)m;
        for (uint64_t seed = 0; seed < SEEDS; seed++) {
            p.seed = seed;
            assert_int_equal(emlio_plan_build(plan, v.shards, 1, &p), 0);
            size_t n;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, 0, &n);
            for (size_t j = 0; j < n; j++)
                count[s[j].record * m + j]++;
        }
        double want = (double)SEEDS / (double)m;
        double chi = 0;
        for (size_t c = 0; c < m * m; c++)
            chi += (count[c] - want) * (count[c] - want) / want;
        double crit = chi2_q999((double)((m - 1) * (m - 1)));
        print_message("# positions of %" PRIu64 " records over %d seeds: "
                      "chi-square %.1f (crit %.1f)\n",
                      m, SEEDS, chi, crit);
        assert_true(chi < crit);
        free(count);
        inv_release(&v);
    }
    emlio_plan_destroy(&plan);
}

/* Exactly once across ranks where nothing divides anything: prime shard
 * counts and record counts, worlds that do not divide the dataset, every
 * window policy, both remainder rules. */
static void
test_plan_exactly_once_odd_sizes(void **state)
{
    (void)state;
    static const uint64_t primes[] = { 2, 3, 5, 7, 11, 13, 97, 101, 997 };
    static const size_t shard_counts[] = { 1, 2, 7, 13 };
    static const uint32_t worlds[] = { 2, 3, 5, 6, 7, 11 };
    static const uint32_t batches[] = { 1, 3, 17 };
    static const uint32_t windows[] = { 0, 1, 3 };
    for (size_t c = 0; c < EMLIO_ARRAY_SIZE(shard_counts); c++) {
        size_t n = shard_counts[c];
        uint64_t records[13];
        for (size_t i = 0; i < n; i++)
            records[i] = primes[(i * 4 + c) % EMLIO_ARRAY_SIZE(primes)];
        struct inv v;
        inv_init(&v, n, records, 3);
        for (size_t w = 0; w < EMLIO_ARRAY_SIZE(worlds); w++)
            for (size_t b = 0; b < EMLIO_ARRAY_SIZE(batches); b++)
                for (size_t x = 0; x < EMLIO_ARRAY_SIZE(windows); x++)
                    for (int drop = 0; drop <= 1; drop++) {
                        emlio_plan_params_t p;
                        emlio_plan_params_init(&p);
                        p.world = worlds[w];
                        p.batch_size = batches[b];
                        p.window_shards = windows[x];
                        p.drop_last = drop;
                        p.seed = 1000 + c;
                        p.epoch = w * 7 + b;
                        check_epoch(v.shards, v.n, &p);
                    }
        inv_release(&v);
    }
}

/* A plan reused across epochs, windows and batch orders gives what a fresh
 * plan gives: nothing of one build (the batch buffer, the window whose
 * keys it holds) leaks into the next. */
static void
test_plan_reuse_matches_fresh(void **state)
{
    (void)state;
    uint64_t *records = uneven_records(19);
    struct inv v;
    inv_init(&v, 19, records, 2);
    emlio_plan_t *used = emlio_plan_new();
    emlio_plan_t *fresh = emlio_plan_new();
    static const uint32_t windows[] = { 0, 2, 5, 0 };
    for (size_t k = 0; k < EMLIO_ARRAY_SIZE(windows); k++) {
        emlio_plan_params_t p;
        emlio_plan_params_init(&p);
        p.world = 2;
        p.rank = (uint32_t)(k % 2);
        p.batch_size = 9;
        p.seed = 77;
        p.epoch = k;
        p.window_shards = windows[k];
        assert_int_equal(emlio_plan_build(used, v.shards, v.n, &p), 0);
        /* Read the last batch first, so the buffer holds other keys. */
        size_t n;
        emlio_plan_batch(used, emlio_plan_batch_count(used) - 1, &n);
        emlio_plan_t *f = emlio_plan_new();
        assert_int_equal(emlio_plan_build(f, v.shards, v.n, &p), 0);
        assert_same_plan(used, v.shards, f, v.shards);
        emlio_plan_destroy(&f);
        /* The same (seed, epoch) twice on another plan: the same order. */
        assert_int_equal(emlio_plan_build(fresh, v.shards, v.n, &p), 0);
        assert_same_plan(used, v.shards, fresh, v.shards);
    }
    emlio_plan_destroy(&used);
    emlio_plan_destroy(&fresh);
    inv_release(&v);
    free(records);
}

/* Plan memory does not grow with the samples: 1000 shards of a million
 * records (10^9 samples, world 8) hold exactly what 1000 shards of a
 * thousand do, well under a megabyte, and so does 10^18 samples, which
 * no stored plan could hold. Their batches are still valid samples. */
static void
test_plan_memory_independent_of_samples(void **state)
{
    (void)state;

    enum { SHARDS = 1000 };

    static const uint64_t per_shard[] = { 1000, 1000000, 1000000000000000ULL };
    emlio_plan_t *plan[3];
    uint64_t *records = calloc(SHARDS, sizeof(*records));
    assert_non_null(records);
    for (size_t k = 0; k < 3; k++) {
        for (size_t i = 0; i < SHARDS; i++)
            records[i] = per_shard[k];
        struct inv v;
        inv_init(&v, SHARDS, records, 4);
        emlio_plan_params_t p;
        emlio_plan_params_init(&p);
        p.world = 8;
        p.rank = 7;
        p.batch_size = 256;
        p.seed = 5;
        plan[k] = emlio_plan_new();
        assert_int_equal(emlio_plan_build(plan[k], v.shards, v.n, &p), 0);
        uint64_t total = per_shard[k] * SHARDS;
        assert_int_equal(emlio_plan_dataset_size(plan[k]), total);
        assert_int_equal(emlio_plan_sample_count(plan[k]), total / 8);
        assert_true(emlio_plan_memory(plan[k]) < 64 * 1024);
        assert_int_equal(emlio_plan_memory(plan[k]),
                         emlio_plan_memory(plan[0]));
        size_t last = emlio_plan_batch_count(plan[k]) - 1;
        for (size_t b = 0; b <= 1; b++) {
            size_t n;
            const emlio_plan_sample_t *s =
                emlio_plan_batch(plan[k], b ? last : 0, &n);
            assert_true(n >= 1 && n <= 256);
            for (size_t j = 0; j < n; j++) {
                assert_true(s[j].shard < SHARDS);
                assert_true(s[j].record < per_shard[k]);
                assert_false(s[j].pad);
                for (size_t i = 0; i < j; i++)
                    assert_false(s[i].shard == s[j].shard &&
                                 s[i].record == s[j].record);
            }
        }
        /* Another epoch: another first batch (any sample of it staying
         * in place has odds below one in a million). */
        p.epoch = 1;
        emlio_plan_t *next = emlio_plan_new();
        assert_int_equal(emlio_plan_build(next, v.shards, v.n, &p), 0);
        size_t n0;
        size_t n1;
        const emlio_plan_sample_t *a = emlio_plan_batch(plan[k], 0, &n0);
        const emlio_plan_sample_t *z = emlio_plan_batch(next, 0, &n1);
        assert_int_equal(n0, n1);
        size_t same = 0;
        for (size_t j = 0; j < n0; j++)
            same += a[j].shard == z[j].shard && a[j].record == z[j].record;
        assert_true(k == 0 || same == 0);
        emlio_plan_destroy(&next);
        inv_release(&v);
    }
    for (size_t k = 0; k < 3; k++)
        emlio_plan_destroy(&plan[k]);
    free(records);
}

/* Out of memory at each allocation of a build, in turn: EMLIO_ENOMEM, an
 * empty plan, nothing leaked (under ASan), and the plan works afterwards,
 * with replicas so that every table is allocated. */
static void
test_plan_out_of_memory_at_each_allocation(void **state)
{
    (void)state;
    static const uint32_t both[] = { 0, 1 };
    uint64_t *records = uneven_records(12);
    struct inv v;
    inv_init(&v, 12, records, 2);
    v.shards[3].holders = both;
    v.shards[3].n_holders = 2;
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 3;
    p.batch_size = 5;
    p.window_shards = 4;
    emlio_plan_t *want = emlio_plan_new();
    assert_int_equal(emlio_plan_build(want, v.shards, v.n, &p), 0);
    int rc = EMLIO_ENOMEM;
    for (long n = 1; rc == EMLIO_ENOMEM; n++) {
        emlio_plan_t *plan = emlio_plan_new();
        assert_non_null(plan);
        emlio__alloc_fail_at(n);
        rc = emlio_plan_build(plan, v.shards, v.n, &p);
        emlio__alloc_fail_at(0);
        if (rc == EMLIO_ENOMEM) {
            assert_int_equal(emlio_plan_batch_count(plan), 0);
            assert_non_null(strstr(emlio_plan_errmsg(plan), "out of memory"));
            assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
        } else {
            assert_int_equal(rc, 0);
        }
        assert_same_plan(plan, v.shards, want, v.shards);
        emlio_plan_destroy(&plan);
    }
    emlio_plan_destroy(&want);
    inv_release(&v);
    free(records);
}

static void
test_plan_scale_imagenet(void **state)
{
    (void)state;

    /* ImageNet-1k train: 1,281,167 samples over 1024 shards of 1251 or
     * 1252 records; 8 ranks, batch 256. Only correctness is asserted. */
    enum { SHARDS = 1024 };

    const uint64_t total = 1281167;
    uint64_t records[SHARDS];
    for (size_t i = 0; i < SHARDS; i++)
        records[i] = total / SHARDS + (i < total % SHARDS);
    struct inv v;
    inv_init(&v, SHARDS, records, 16);
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 8;
    p.batch_size = 256;
    p.seed = 2024;
    p.epoch = 1;
    assert_int_equal(check_epoch(v.shards, v.n, &p), 626);
    p.drop_last = true;
    assert_int_equal(check_epoch(v.shards, v.n, &p), 625);
    /* A single rank holding the whole epoch. */
    p.world = 1;
    p.drop_last = false;
    emlio_plan_t *plan = emlio_plan_new();
    assert_int_equal(emlio_plan_build(plan, v.shards, v.n, &p), 0);
    assert_int_equal(emlio_plan_sample_count(plan), total);
    emlio_plan_destroy(&plan);
    inv_release(&v);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_params_init_defaults),
        cmocka_unit_test(test_plan_destroy_accepts_null),
        cmocka_unit_test(test_plan_exactly_once_across_ranks),
        cmocka_unit_test(test_plan_equal_batches_across_ranks),
        cmocka_unit_test(test_plan_drop_last_counts),
        cmocka_unit_test(test_plan_pad_repeats_start_of_order),
        cmocka_unit_test(test_plan_empty_inventory),
        cmocka_unit_test(test_plan_deterministic),
        cmocka_unit_test(test_plan_independent_of_shard_order),
        cmocka_unit_test(test_plan_epochs_differ),
        cmocka_unit_test(test_plan_shuffle_none_is_file_order),
        cmocka_unit_test(test_plan_replicas_read_once),
        cmocka_unit_test(test_plan_replicas_balance_bytes),
        cmocka_unit_test(test_plan_replica_conflict_is_einval),
        cmocka_unit_test(test_plan_invalid_params),
        cmocka_unit_test(test_plan_windows_respected),
        cmocka_unit_test(test_plan_default_window_is_whole_dataset),
        cmocka_unit_test(test_plan_default_mixes_like_uniform_shuffle),
        cmocka_unit_test(test_plan_default_mixes_like_uniform_shuffle_large),
        cmocka_unit_test(test_plan_golden_vector),
        cmocka_unit_test(test_plan_shared_schedule),
        cmocka_unit_test(test_plan_shared_join),
        cmocka_unit_test(test_plan_feistel_bijective_small_domains),
        cmocka_unit_test(test_plan_permutation_positions_uniform),
        cmocka_unit_test(test_plan_exactly_once_odd_sizes),
        cmocka_unit_test(test_plan_reuse_matches_fresh),
        cmocka_unit_test(test_plan_memory_independent_of_samples),
        cmocka_unit_test(test_plan_out_of_memory_at_each_allocation),
        cmocka_unit_test(test_plan_scale_imagenet),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
