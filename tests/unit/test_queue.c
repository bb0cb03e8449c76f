/* test_queue.c - the bounded queue between pipeline stages.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <pthread.h>

#include "queue.h"

static void
test_queue_fifo_and_close(void **state)
{
    (void)state;
    emlio__queue_t *q = emlio__queue_new(3);
    int a, b, c;
    void *out;
    assert_int_equal(emlio__queue_push(q, &a), 0);
    assert_int_equal(emlio__queue_push(q, &b), 0);
    assert_int_equal(emlio__queue_push(q, &c), 0);
    assert_int_equal(emlio__queue_len(q), 3);
    assert_int_equal(emlio__queue_pop(q, &out), 0);
    assert_ptr_equal(out, &a);
    emlio__queue_close(q);
    /* Closed: pushes fail, pops drain what is left, then end. */
    assert_int_equal(emlio__queue_push(q, &a), EMLIO_ECLOSED);
    assert_int_equal(emlio__queue_pop(q, &out), 0);
    assert_ptr_equal(out, &b);
    assert_int_equal(emlio__queue_pop(q, &out), 0);
    assert_ptr_equal(out, &c);
    assert_int_equal(emlio__queue_pop(q, &out), EMLIO_ECLOSED);
    emlio__queue_destroy(&q);
    assert_null(q);
    emlio__queue_destroy(&q);
}

typedef struct {
    emlio__queue_t *q;
    int base;
    int n;
} s_producer_t;

static void *
s_produce(void *arg)
{
    s_producer_t *p = arg;
    for (int i = 0; i < p->n; i++)
        if (emlio__queue_push(p->q, (void *)(intptr_t)(p->base + i + 1)) != 0)
            break;
    return NULL;
}

/* Four producers into a queue of two: everything arrives exactly once and
 * the queue never holds more than its capacity. */
static void
test_queue_bounded_many_producers(void **state)
{
    (void)state;
    emlio__queue_t *q = emlio__queue_new(2);

    enum { P = 4, N = 5000 };

    pthread_t t[P];
    s_producer_t p[P];
    for (int i = 0; i < P; i++) {
        p[i] = (s_producer_t){ q, i * N, N };
        pthread_create(&t[i], NULL, s_produce, &p[i]);
    }
    uint8_t *seen = calloc(P * N + 1, 1);
    for (int i = 0; i < P * N; i++) {
        void *item;
        assert_true(emlio__queue_len(q) <= 2);
        assert_int_equal(emlio__queue_pop(q, &item), 0);
        intptr_t v = (intptr_t)item;
        assert_true(v >= 1 && v <= P * N);
        assert_int_equal(seen[v], 0);
        seen[v] = 1;
    }
    for (int i = 0; i < P; i++)
        pthread_join(t[i], NULL);
    free(seen);
    emlio__queue_destroy(&q);
}

static void *
s_pop_one(void *arg)
{
    void *item;
    return (void *)(intptr_t)emlio__queue_pop(arg, &item);
}

/* close() wakes a consumer blocked on an empty queue. */
static void
test_queue_close_wakes_waiters(void **state)
{
    (void)state;
    emlio__queue_t *q = emlio__queue_new(1);
    pthread_t t;
    pthread_create(&t, NULL, s_pop_one, q);
    emlio__queue_close(q);
    void *rc;
    pthread_join(t, &rc);
    assert_int_equal((intptr_t)rc, EMLIO_ECLOSED);
    emlio__queue_destroy(&q);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_fifo_and_close),
        cmocka_unit_test(test_queue_bounded_many_producers),
        cmocka_unit_test(test_queue_close_wakes_waiters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
