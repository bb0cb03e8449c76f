/* test_tuner.c - the stream tuner against simulated paths: it must open
 * streams where the TCP windows limit, stay put where they do not, and say
 * what limits.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "tuner.h"

#define MS    1000000ull
#define MIB   (1ull << 20)
#define START 2u

/* A path: each stream carries 85% of window / RTT (what iperf3 shows with
 * a 4 MiB buffer at 30 ms here), all of them together at most `link`
 * bytes/s; the consumer would take `demand` bytes/s. */
typedef struct {
    uint64_t rtt_ns;
    uint64_t window;
    double link;
    double demand;
    double host_idle; /* this host's idle CPU share; -1 unknown */
} s_path_t;

/* Runs the tuner for `seconds` of simulated time on path p, ticking every
 * 50 ms like a client polling, and returns the streams it ends with. */
static uint32_t
s_simulate(emlio__tuner_t *t, const s_path_t *p, double seconds,
           uint32_t streams)
{
    uint64_t now = 0, bytes = 0, wait = 0;
    emlio__tuner_init(t, streams, 64, false, now);
    for (uint64_t step = 0; step < (uint64_t)(seconds * 20); step++) {
        double per_stream =
            0.85 * (double)p->window / ((double)p->rtt_ns / 1e9);
        double net = per_stream * streams;
        if (net > p->link)
            net = p->link;
        double rate = net < p->demand ? net : p->demand;
        now += 50 * MS;
        bytes += (uint64_t)(rate * 0.05);
        /* The consumer waits for the share of its demand the network
         * does not meet. */
        if (rate < p->demand)
            wait += (uint64_t)(50 * MS * (1.0 - rate / p->demand));
        emlio__tuner_input_t in = {
            .now_ns = now,
            .bytes = bytes,
            .wait_ns = wait,
            .streams = streams,
            .window = p->window,
            .queued = 2 * p->window, /* the client keeps two windows out */
            .rtt_ns = p->rtt_ns,
            .srtt_ns = p->rtt_ns + MS / 2,
            .host_idle = p->host_idle,
        };
        uint32_t want = emlio__tuner_step(t, &in);
        if (want > streams)
            streams = want;
    }
    return streams;
}

/* 30 ms, 4 MiB windows (~119 MB/s a stream), a 1.2 GB/s link and a
 * consumer that would take 2 GB/s: the tuner grows to about link /
 * per-stream (~10) and stops once a step no longer pays. */
static void
test_tuner_grows_on_a_window_limited_path(void **state)
{
    (void)state;
    emlio__tuner_t t;
    s_path_t p = { 30 * MS, 4 * MIB, 1.2e9, 2e9, 0.5 };
    uint32_t streams = s_simulate(&t, &p, 10, START);
    assert_true(streams >= 8);
    assert_true(streams <= 32);
    assert_true(t.settled);
    /* With enough streams the link, not the windows, limits. */
    assert_int_not_equal(t.limit, EMLIO_LIMIT_WINDOW);
    assert_true(t.rate > 0.9 * p.link);
}

/* 100 ms: ~36 MB/s a stream; more streams than at 30 ms. */
static void
test_tuner_grows_further_at_100ms(void **state)
{
    (void)state;
    emlio__tuner_t t;
    s_path_t p = { 100 * MS, 4 * MIB, 1.0e9, 2e9, -1 };
    uint32_t streams = s_simulate(&t, &p, 30, START);
    assert_true(streams >= 16);
    assert_true(t.rate > 0.9 * p.link);
}

/* 0.05 ms: one stream could carry 70 GB/s; the link (1.2 GB/s) limits, so
 * two streams stay two. */
static void
test_tuner_stays_few_on_a_fast_path(void **state)
{
    (void)state;
    emlio__tuner_t t;
    s_path_t p = { 50000, 4 * MIB, 1.2e9, 2e9, 0.4 };
    assert_int_equal(s_simulate(&t, &p, 5, START), START);
    assert_int_equal(t.limit, EMLIO_LIMIT_DAEMON);
    /* The same with this host's CPUs saturated: they are named. */
    p.host_idle = 0.02;
    assert_int_equal(s_simulate(&t, &p, 5, START), START);
    assert_int_equal(t.limit, EMLIO_LIMIT_CPU);
    assert_string_equal(emlio_limit_name(EMLIO_LIMIT_CPU), "cpu");
}

/* A slow consumer (100 MB/s) on a window-limited path: the consumer, not
 * the network, waits, so no streams are opened. */
static void
test_tuner_leaves_a_slow_consumer_alone(void **state)
{
    (void)state;
    emlio__tuner_t t;
    s_path_t p = { 30 * MS, 4 * MIB, 1.2e9, 100e6, 0.5 };
    assert_int_equal(s_simulate(&t, &p, 5, START), START);
    assert_int_equal(t.limit, EMLIO_LIMIT_CONSUMER);
}

/* Pinned streams (--streams N) are measured but never changed; without an
 * RTT (inproc, ipc) the windows never count as the limit. */
static void
test_tuner_pinned_and_unmeasured(void **state)
{
    (void)state;
    emlio__tuner_t t;
    emlio__tuner_init(&t, 3, 64, true, 0);
    emlio__tuner_input_t in = { .now_ns = 1000 * MS,
                                .bytes = 300000000,
                                .wait_ns = 900 * MS,
                                .streams = 3,
                                .window = 4 * MIB,
                                .queued = 8 * MIB,
                                .rtt_ns = 30 * MS,
                                .srtt_ns = 31 * MS,
                                .host_idle = -1 };
    assert_int_equal(emlio__tuner_step(&t, &in), 3);
    assert_int_equal(t.limit, EMLIO_LIMIT_WINDOW);

    emlio__tuner_init(&t, 2, 64, false, 0);
    in.streams = 2;
    in.rtt_ns = 0;
    assert_int_equal(emlio__tuner_step(&t, &in), 2);
    assert_int_equal(t.limit, EMLIO_LIMIT_DAEMON);
    /* Not a tick yet: 0 means "ask again later". */
    in.now_ns += 10 * MS;
    assert_int_equal(emlio__tuner_step(&t, &in), 0);
    assert_string_equal(emlio_limit_name(EMLIO_LIMIT_WINDOW), "window");
    assert_string_equal(emlio_limit_name(99), "unknown");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tuner_grows_on_a_window_limited_path),
        cmocka_unit_test(test_tuner_grows_further_at_100ms),
        cmocka_unit_test(test_tuner_stays_few_on_a_fast_path),
        cmocka_unit_test(test_tuner_leaves_a_slow_consumer_alone),
        cmocka_unit_test(test_tuner_pinned_and_unmeasured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
