/* test_iolanes.c - the client's I/O lanes (iolanes.h): where streams go,
 * when one more lane is taken, and that a context's own I/O threads are
 * found and measured among other contexts' threads.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <pthread.h>
#include <unistd.h>
#include <zmq.h>

#include "emlio_internal.h"
#include "iolanes.h"

#define MS 1000000ull

/* Places n streams and returns how many went to lane 0, lane 1. */
static void
s_place(emlio__iolanes_t *l, int n, int *on0, int *on1)
{
    *on0 = *on1 = 0;
    for (int i = 0; i < n; i++) {
        uint64_t mask = 0;
        uint32_t lane = emlio__iolanes_place(l, &mask);
        assert_int_equal(mask, (uint64_t)1 << lane);
        assert_true(lane < l->used);
        *on0 += lane == 0;
        *on1 += lane == 1;
    }
}

/* Tuned streams start on one lane; a lane full in two ticks in a row (not
 * one: a burst) brings the next in, and new
 * streams then fill the emptier lane first; never more lanes than there
 * are threads. */
static void
test_iolanes_start_on_one_and_spread_when_full(void **state)
{
    (void)state;
    emlio__iolanes_t l;
    emlio__iolanes_init(&l, 2, 7, false);
    int on0, on1;
    s_place(&l, 4, &on0, &on1);
    assert_int_equal(on0, 4);
    assert_int_equal(on1, 0);

    uint64_t run[EMLIO_IOLANES_MAX] = { 0 };
    run[0] = 1000 * MS;
    assert_false(emlio__iolanes_step(&l, 10000 * MS, run)); /* records */
    run[0] += 70 * MS; /* 70% of the 100 ms tick: not full */
    assert_false(emlio__iolanes_step(&l, 10100 * MS, run));
    assert_true(l.busiest > 0.69 && l.busiest < 0.71);
    assert_int_equal(l.used, 1);
    run[0] += 80 * MS; /* 80%: full, once: a burst */
    assert_false(emlio__iolanes_step(&l, 10200 * MS, run));
    run[0] += 50 * MS; /* and over */
    assert_false(emlio__iolanes_step(&l, 10300 * MS, run));
    run[0] += 80 * MS; /* full in two ticks in a row */
    assert_false(emlio__iolanes_step(&l, 10400 * MS, run));
    assert_int_equal(l.used, 1);
    run[0] += 90 * MS;
    assert_true(emlio__iolanes_step(&l, 10500 * MS, run));
    assert_int_equal(l.used, 2);
    s_place(&l, 4, &on0, &on1);
    assert_int_equal(on1, 4); /* the new lane catches up first */
    s_place(&l, 2, &on0, &on1);
    assert_int_equal(on0, 1);
    assert_int_equal(on1, 1);
    /* Both full: there is no third thread to take. */
    for (uint64_t t = 10600; t <= 10800; t += 100) {
        run[0] += 100 * MS;
        run[1] += 100 * MS;
        assert_false(emlio__iolanes_step(&l, t * MS, run));
    }
    assert_int_equal(l.used, 2);
    /* A closed stream frees its place. */
    emlio__iolanes_remove(&l, 1);
    emlio__iolanes_remove(&l, 1);
    s_place(&l, 1, &on0, &on1);
    assert_int_equal(on1, 1);
}

/* Unknown run times (a thread not found, a read that failed) and a clock
 * that did not move say nothing; fixed streams use every lane from the
 * start; the thread count is clamped. */
static void
test_iolanes_ignore_what_was_not_measured(void **state)
{
    (void)state;
    emlio__iolanes_t l;
    emlio__iolanes_init(&l, 2, 7, false);
    uint64_t run[EMLIO_IOLANES_MAX] = { 0 };
    assert_false(emlio__iolanes_step(&l, 100 * MS, run));
    run[0] = 500 * MS; /* known now, not then */
    assert_false(emlio__iolanes_step(&l, 200 * MS, run));
    run[0] = 0; /* known then, not now */
    assert_false(emlio__iolanes_step(&l, 300 * MS, run));
    run[0] = 900 * MS;
    assert_false(emlio__iolanes_step(&l, 400 * MS, run));
    run[0] = 2000 * MS; /* "ran" 1 s in no time: dt 0 */
    assert_false(emlio__iolanes_step(&l, 400 * MS, run));
    assert_int_equal(l.used, 1);

    emlio__iolanes_init(&l, 2, 7, true);
    assert_int_equal(l.used, 2);
    int on0, on1;
    s_place(&l, 4, &on0, &on1);
    assert_int_equal(on0, 2);
    assert_int_equal(on1, 2);

    emlio__iolanes_init(&l, 0, 7, false);
    assert_int_equal(l.threads, 1);
    emlio__iolanes_init(&l, 1000, 7, true);
    assert_int_equal(l.threads, EMLIO_IOLANES_MAX);
}

/* A client that cannot find its I/O threads (no /proc, a libzmq that does
 * not name them) spreads over every lane after EMLIO_IOLANES_GIVE_UP
 * samples that found none, instead of staying on one for good; without a
 * prefix it uses every lane from the start. */
static void
test_iolanes_spread_when_the_threads_cannot_be_found(void **state)
{
    (void)state;
    emlio__iolanes_t l;
    /* No thread of this process is named "9998/ZMQbg/IO/...": no context
     * with that prefix lives here. */
    emlio__iolanes_init(&l, 2, 9998, false);
    uint64_t now = 1000 * MS;
    for (int i = 1; i < EMLIO_IOLANES_GIVE_UP; i++) {
        assert_false(emlio__iolanes_sample(&l, now += 200 * MS));
        assert_int_equal(l.used, 1);
    }
    assert_true(emlio__iolanes_sample(&l, now += 200 * MS));
    assert_int_equal(l.used, 2);
    assert_true(l.busiest < 0);
    assert_false(emlio__iolanes_sample(&l, now += 200 * MS)); /* all used */

    emlio__iolanes_init(&l, 2, 0, false);
    assert_int_equal(l.used, 2);
}

/* Traffic for the I/O threads of one context: a PUSH and a PULL over TCP
 * loopback, both on I/O thread 0 (ZMQ_AFFINITY 1), `n` messages of 1 MiB
 * (a count, not a time: on a host too busy to run the thread, a time
 * would pass with nothing sent). */
static void
s_busy_lane0(void *zctx, int n)
{
    uint64_t lane0 = 1;
    int hwm = 4;
    void *pull = zmq_socket(zctx, ZMQ_PULL);
    void *push = zmq_socket(zctx, ZMQ_PUSH);
    assert_int_equal(zmq_setsockopt(pull, ZMQ_AFFINITY, &lane0, 8), 0);
    assert_int_equal(zmq_setsockopt(push, ZMQ_AFFINITY, &lane0, 8), 0);
    assert_int_equal(zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof(hwm)), 0);
    assert_int_equal(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t len = sizeof(ep);
    assert_int_equal(zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    assert_int_equal(zmq_connect(push, ep), 0);
    static char payload[1 << 20];
    zmq_msg_t m;
    zmq_msg_init(&m);
    for (int i = 0; i < n; i++) {
        assert_int_equal(zmq_send(push, payload, sizeof(payload), 0),
                         (int)sizeof(payload));
        assert_true(zmq_msg_recv(&m, pull, 0) > 0);
    }
    zmq_msg_close(&m);
    int zero = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(push);
    zmq_close(pull);
}

/* Samples l until every lane's thread is found. A thread names itself
 * once it runs, which may be a little after zmq_socket started it: until
 * then a client's tick finds nothing and looks again the next (bounded
 * here only against a hang: 10 s). Every lane is in use, so a sample never
 * takes one. */
static void
s_sample_until_found(emlio__iolanes_t *l)
{
    for (int tries = 0; tries < 10000; tries++) {
        assert_false(emlio__iolanes_sample(l, emlio__now_ns()));
        bool all = true;
        for (uint32_t i = 0; i < l->threads; i++)
            all &= l->tid[i] > 0;
        if (all)
            return;
        usleep(1000);
    }
    fail_msg("the I/O threads named %d/ZMQbg/IO/<i> were not found", l->prefix);
}

/* The lanes of a context are its own I/O threads, found by their names
 * among another context's, and their run time is read: lane 0 carrying
 * 1 MiB messages runs measurably, and more than an idle lane 1. */
static void
test_iolanes_measure_the_contexts_own_threads(void **state)
{
    (void)state;
    emlio_ctx_t *a = emlio_ctx_new();
    emlio_ctx_t *b = emlio_ctx_new();
    assert_non_null(a);
    assert_non_null(b);
    assert_int_not_equal(emlio__ctx_io_prefix(a), emlio__ctx_io_prefix(b));
    /* I/O threads start with a context's first socket. */
    void *sa = zmq_socket(emlio__ctx_zmq(a), ZMQ_DEALER);
    void *sb = zmq_socket(emlio__ctx_zmq(b), ZMQ_DEALER);
    assert_non_null(sa);
    assert_non_null(sb);
    int threads = zmq_ctx_get(emlio__ctx_zmq(a), ZMQ_IO_THREADS);
    assert_int_equal(threads, EMLIO__CTX_IO_THREADS);

    emlio__iolanes_t la, lb;
    emlio__iolanes_init(&la, (uint32_t)threads, emlio__ctx_io_prefix(a), true);
    emlio__iolanes_init(&lb, (uint32_t)threads, emlio__ctx_io_prefix(b), true);
    s_sample_until_found(&la);
    s_sample_until_found(&lb);
    for (uint32_t i = 0; i < la.threads; i++) {
        assert_true(la.tid[i] > 0);
        assert_true(lb.tid[i] > 0);
        for (uint32_t j = 0; j < lb.threads; j++)
            assert_int_not_equal(la.tid[i], lb.tid[j]);
    }
    uint64_t before[2] = { la.run_ns[0], la.run_ns[1] };
    s_busy_lane0(emlio__ctx_zmq(a), 200);
    (void)emlio__iolanes_sample(&la, emlio__now_ns());
    uint64_t ran0 = la.run_ns[0] - before[0];
    uint64_t ran1 = la.run_ns[1] - before[1];
    assert_true(ran0 > 0); /* it copied 200 MiB in and out */
    assert_true(ran0 > ran1);
    assert_true(la.busiest > 0);

    zmq_close(sa);
    zmq_close(sb);
    emlio_ctx_destroy(&a);
    emlio_ctx_destroy(&b);
}

/* A context's I/O thread prefix is its own while it lives: however many
 * contexts come and go meanwhile (the numbers wrap at 9999), none created
 * later gets it, so a client never measures another context's threads. */
static void
test_iolanes_prefix_not_reused_while_the_context_lives(void **state)
{
    (void)state;
    emlio_ctx_t *kept = emlio_ctx_new();
    assert_non_null(kept);
    int mine = emlio__ctx_io_prefix(kept);
    assert_true(mine >= 1 && mine <= 9999);
    for (int i = 0; i < 10000; i++) {
        emlio_ctx_t *c = emlio_ctx_new();
        assert_non_null(c);
        assert_int_not_equal(emlio__ctx_io_prefix(c), mine);
        emlio_ctx_destroy(&c);
    }
    emlio_ctx_destroy(&kept);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iolanes_start_on_one_and_spread_when_full),
        cmocka_unit_test(test_iolanes_ignore_what_was_not_measured),
        cmocka_unit_test(test_iolanes_spread_when_the_threads_cannot_be_found),
        cmocka_unit_test(test_iolanes_measure_the_contexts_own_threads),
        cmocka_unit_test(
            test_iolanes_prefix_not_reused_while_the_context_lives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
