/* test_fairq.c - weighted deficit round robin (src/server/fairq.c): shares
 * by weight whatever each flow queues, no credit kept while idle, and a
 * dispatch that could not go stays first in line.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <string.h>

#include "fairq.h"

#define S_ITEMS 4000

typedef struct s_item {
    emlio__fairq_item_t fq;
    int flow;
} s_item_t;

static s_item_t s_items[S_ITEMS];

/* Pops n items and counts each flow's bytes among them. */
static void
s_drain(emlio__fairq_t *q, size_t n, uint64_t *bytes, size_t n_flows)
{
    memset(bytes, 0, n_flows * sizeof(*bytes));
    for (size_t i = 0; i < n; i++) {
        emlio__fairq_item_t *it = emlio__fairq_peek(q);
        assert_non_null(it);
        assert_ptr_equal(emlio__fairq_peek(q), it); /* peek is stable */
        bytes[((s_item_t *)it)->flow] += it->cost;
        emlio__fairq_pop(q);
    }
}

/* Flow 0 queues 3,000 items (a job with many streams), flow 1 only 300:
 * while both have items they get equal bytes, not 10:1. */
static void
test_fairq_equal_shares_whatever_is_queued(void **state)
{
    (void)state;
    emlio__fairq_t q;
    emlio__fairq_init(&q, 1000);
    emlio__fairq_flow_t f[2] = { { .weight = 1 }, { .weight = 1 } };
    size_t k = 0;
    for (int i = 0; i < 3000; i++, k++) {
        s_items[k] = (s_item_t){ .fq.cost = 700, .flow = 0 };
        assert_int_equal(emlio__fairq_push(&q, &f[0], &s_items[k].fq), 0);
        if (i % 10 == 0) {
            k++;
            s_items[k] = (s_item_t){ .fq.cost = 900, .flow = 1 };
            assert_int_equal(emlio__fairq_push(&q, &f[1], &s_items[k].fq), 0);
        }
    }
    uint64_t bytes[2];
    /* 300 items of flow 1 are 270,000 bytes: within the first 600
     * dispatches both are busy. */
    s_drain(&q, 500, bytes, 2);
    double ratio = (double)bytes[0] / (double)bytes[1];
    assert_true(ratio > 0.95 && ratio < 1.05);
    /* Once flow 1 is empty, flow 0 gets everything (work-conserving). */
    s_drain(&q, q.n_items, bytes, 2);
    assert_int_equal(f[0].n, 0);
    assert_int_equal(f[1].n, 0);
    assert_null(emlio__fairq_peek(&q));
    assert_int_equal(q.n_ring, 0);
    emlio__fairq_release(&q);
}

/* Weights 3:1 give 3:1 bytes, with items of mixed sizes. */
static void
test_fairq_weights(void **state)
{
    (void)state;
    emlio__fairq_t q;
    emlio__fairq_init(&q, 4096);
    emlio__fairq_flow_t f[2] = { { .weight = 3 }, { .weight = 1 } };
    for (size_t k = 0; k < 2000; k++) {
        int flow = (int)(k % 2);
        s_items[k] =
            (s_item_t){ .fq.cost = 1000 + (k * 7919) % 9000, .flow = flow };
        assert_int_equal(emlio__fairq_push(&q, &f[flow], &s_items[k].fq), 0);
    }
    uint64_t bytes[2];
    s_drain(&q, 800, bytes, 2);
    double ratio = (double)bytes[0] / (double)bytes[1];
    assert_true(ratio > 2.8 && ratio < 3.2);
    emlio__fairq_release(&q);
}

/* A flow that went idle comes back with no saved credit, behind the
 * flows already waiting; an item costlier than a quantum still goes. */
static void
test_fairq_idle_flow_keeps_no_credit(void **state)
{
    (void)state;
    emlio__fairq_t q;
    emlio__fairq_init(&q, 100);
    emlio__fairq_flow_t f[3] = { { .weight = 1 },
                                 { .weight = 1 },
                                 { .weight = 1 } };
    s_items[0] = (s_item_t){ .fq.cost = 10, .flow = 0 };
    assert_int_equal(emlio__fairq_push(&q, &f[0], &s_items[0].fq), 0);
    assert_ptr_equal(emlio__fairq_peek(&q), &s_items[0].fq);
    emlio__fairq_pop(&q);
    assert_false(f[0].in_ring);
    assert_int_equal(f[0].deficit, 0); /* 90 unused: not kept */
    /* Flow 1 queues a big item (5 quanta) and flow 2 small ones. */
    s_items[1] = (s_item_t){ .fq.cost = 500, .flow = 1 };
    assert_int_equal(emlio__fairq_push(&q, &f[1], &s_items[1].fq), 0);
    for (int i = 0; i < 10; i++) {
        s_items[2 + i] = (s_item_t){ .fq.cost = 100, .flow = 2 };
        assert_int_equal(emlio__fairq_push(&q, &f[2], &s_items[2 + i].fq), 0);
    }
    uint64_t bytes[3];
    s_drain(&q, 5, bytes, 3);
    /* Flow 2 went once per round while flow 1 saved up for its item. */
    assert_int_equal(bytes[2], 400);
    assert_int_equal(bytes[1], 500);
    emlio__fairq_release(&q);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fairq_equal_shares_whatever_is_queued),
        cmocka_unit_test(test_fairq_weights),
        cmocka_unit_test(test_fairq_idle_flow_keeps_no_credit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
