/* test_tuner.c - the stream tuner against simulated paths: it must open
 * streams where the TCP windows limit, stay put where they do not, and say
 * what limits.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "netpath.h"
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

/* 30 ms, 4 MiB windows, a path that carries 1.2 GB/s, with this host's
 * CPUs saturated: streams are opened while they run full (2, 4, 8 at 85%
 * of window / RTT), then no more: 16 carry the 1.2 GB/s at 54% each, and
 * a stream costs CPU per byte (its ACKs and wake-ups), which busy CPUs
 * have not got (30 ms on the 2-vCPU VM: 20 streams carried what 10 did
 * with twice the batches in flight). With idle CPUs, 54% still counts as
 * window-bound and the tuner tries one step more. */
static void
test_tuner_busy_cpus_open_streams_only_while_full(void **state)
{
    (void)state;
    emlio__tuner_t t;
    s_path_t p = { 30 * MS, 4 * MIB, 1.2e9, 2e9, 0.03 };
    assert_int_equal(s_simulate(&t, &p, 10, START), 16);
    assert_int_equal(t.limit, EMLIO_LIMIT_CPU);
    p.host_idle = 0.5;
    assert_int_equal(s_simulate(&t, &p, 10, START), 32);
}

/* Two daemons, 16 streams each, at 40% of window / RTT each: 32 streams
 * carry the rate, so they neither run full (busy CPUs: no more streams)
 * nor count as window-bound (idle CPUs: the daemons); counted as 16 they
 * looked full, and busy CPUs opened streams past what the rule allows. */
static void
test_tuner_counts_every_daemons_streams(void **state)
{
    (void)state;
    emlio__tuner_t t;
    double per_stream = (double)(4 * MIB) * 1e9 / (double)(30 * MS);
    emlio__tuner_input_t in = {
        .now_ns = 1000 * MS,
        .bytes = (uint64_t)(0.4 * per_stream * 32),
        .wait_ns = 500 * MS,
        .streams = 16,
        .daemons = 2,
        .window = 4 * MIB,
        .queued = 8 * MIB,
        .rtt_ns = 30 * MS,
        .srtt_ns = 31 * MS,
        .host_idle = 0.03,
    };
    emlio__tuner_init(&t, 16, 64, false, 0);
    assert_int_equal(emlio__tuner_step(&t, &in), 16);
    assert_int_equal(t.limit, EMLIO_LIMIT_CPU);
    in.host_idle = 0.5;
    emlio__tuner_init(&t, 16, 64, false, 0);
    assert_int_equal(emlio__tuner_step(&t, &in), 16);
    assert_int_equal(t.limit, EMLIO_LIMIT_DAEMON);
    /* One daemon's 16 streams at 80% run full: they grow. */
    in.daemons = 0;
    in.bytes *= 2;
    in.host_idle = 0.03;
    emlio__tuner_init(&t, 16, 64, false, 0);
    assert_int_equal(emlio__tuner_step(&t, &in), 32);
    assert_int_equal(t.limit, EMLIO_LIMIT_WINDOW);
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

/* The streams a first epoch starts with: enough for the start rate at
 * 85% of window / RTT each, within the bounds; the minimum where nothing
 * is known or one stream would do. */
static void
test_tuner_start_streams(void **state)
{
    (void)state;
    /* 100 ms, 32 MiB: ~285 MB/s a stream, 1 GB/s needs 4. */
    assert_int_equal(emlio__tuner_start_streams(1e9, 32 * MIB, 100 * MS, 2, 16),
                     4);
    /* 30 ms, 32 MiB: one stream would carry ~950 MB/s: the minimum. */
    assert_int_equal(emlio__tuner_start_streams(1e9, 32 * MIB, 30 * MS, 2, 16),
                     2);
    /* 100 ms, 8 MiB (explicit, without CAP_NET_ADMIN): 14.02, so 15. */
    assert_int_equal(emlio__tuner_start_streams(1e9, 8 * MIB, 100 * MS, 2, 16),
                     15);
    /* 100 ms, 4 MiB: 28 wanted, capped. */
    assert_int_equal(emlio__tuner_start_streams(1e9, 4 * MIB, 100 * MS, 2, 16),
                     16);
    /* Loopback, unknown RTT or window, a max below the min. */
    assert_int_equal(emlio__tuner_start_streams(1e9, 32 * MIB, MS / 20, 2, 16),
                     2);
    assert_int_equal(emlio__tuner_start_streams(1e9, 32 * MIB, 0, 2, 16), 2);
    assert_int_equal(emlio__tuner_start_streams(1e9, 0, 100 * MS, 2, 16), 2);
    assert_int_equal(emlio__tuner_start_streams(1e9, 4 * MIB, 100 * MS, 3, 1),
                     3);
}

/* The receive buffer by RTT: autotuned on a short path or before the RTT
 * is known; on a long one fixed from the first byte: rmem_max explicit
 * (with or without CAP_NET_ADMIN); where rmem_max is too small to beat
 * autotuning, forced with CAP_NET_ADMIN, else autotuned. */
static void
test_netpath_plan_recv(void **state)
{
    (void)state;
    emlio__netpath_limits_t root = { 4 * MIB, 32 * MIB, 4 * MIB, 4 * MIB,
                                     true };
    emlio__netpath_limits_t user = root;
    user.net_admin = false;
    emlio__netpath_limits_t small = user;
    small.rmem_max = 208 * 1024;
    small.tcp_rmem_max = 6 * MIB;
    emlio__netpath_limits_t small_root = small;
    small_root.net_admin = true;
    emlio__netpath_bufplan_t p;

    emlio__netpath_plan_recv(&root, 0, &p);
    assert_string_equal(p.how, "autotuned");
    assert_int_equal(p.zmq_value, -1);
    assert_int_equal(p.force_value, 0);
    assert_int_equal(p.effective, 32 * MIB);
    emlio__netpath_plan_recv(&root, EMLIO_NETPATH_LONG_RTT_US - 1, &p);
    assert_string_equal(p.how, "autotuned");

    emlio__netpath_plan_recv(&root, 100000, &p);
    assert_string_equal(p.how, "explicit");
    assert_int_equal(p.zmq_value, 4 * MIB);
    assert_int_equal(p.force_value, 0);
    assert_int_equal(p.effective, 8 * MIB);
    emlio__netpath_plan_recv(&user, EMLIO_NETPATH_LONG_RTT_US, &p);
    assert_string_equal(p.how, "explicit");
    assert_int_equal(p.effective, 8 * MIB);

    emlio__netpath_plan_recv(&small_root, 100000, &p);
    assert_string_equal(p.how, "forced");
    assert_int_equal(p.zmq_value, -1);
    assert_int_equal(p.force_value, EMLIO_NETPATH_AUTO_FORCE);
    assert_int_equal(p.effective, 2 * EMLIO_NETPATH_AUTO_FORCE);

    emlio__netpath_plan_recv(&small, 100000, &p);
    assert_string_equal(p.how, "autotuned");
    assert_int_equal(p.zmq_value, -1);
    assert_int_equal(p.effective, 6 * MIB);
}

/* Daemons on this host, by endpoint: a client whose daemons all are uses
 * every I/O thread at once (iolanes.h); any other address starts on one. */
static void
test_netpath_local_endpoint(void **state)
{
    (void)state;
    assert_true(emlio__netpath_local_endpoint("tcp://127.0.0.1:5555"));
    assert_true(emlio__netpath_local_endpoint("tcp://127.8.9.1:5555"));
    assert_true(emlio__netpath_local_endpoint("tcp://[::1]:5555"));
    assert_true(emlio__netpath_local_endpoint("tcp://localhost:5555"));
    assert_true(emlio__netpath_local_endpoint("ipc:///tmp/emliod.sock"));
    assert_false(emlio__netpath_local_endpoint("tcp://10.77.10.1:5555"));
    assert_false(emlio__netpath_local_endpoint("tcp://[2001:db8::1]:5555"));
    assert_false(emlio__netpath_local_endpoint("tcp://storage1:5555"));
    assert_false(emlio__netpath_local_endpoint("tcp://128.0.0.1:5555"));
    assert_false(emlio__netpath_local_endpoint("tcp://127.0.0.1"));
    assert_true(emlio__netpath_local_endpoint("tcp://[::ffff:127.0.0.1]:5555"));
}

/* A daemon that says its readers wait for its device half the time or
 * more is the disk's limit, not the daemon's or the path's (a loopback
 * path whose ACKs a starved reader delays looks queued); below half it
 * is the daemon's again, and it never opens streams. */
static void
test_tuner_names_the_disk(void **state)
{
    (void)state;
    emlio__tuner_t t;
    emlio__tuner_input_t in = {
        .now_ns = 1000 * MS,
        .bytes = 1000 * MIB,
        .wait_ns = 500 * MS,
        .streams = 2,
        .daemons = 1,
        .window = 4 * MIB,
        .queued = 8 * MIB,
        .rtt_ns = MS / 20,
        .srtt_ns = 30 * MS, /* "queued": what a busy loopback looks like */
        .host_idle = 0.5,
        .disk = 80,
    };
    emlio__tuner_init(&t, 2, 64, false, 0);
    assert_int_equal(emlio__tuner_step(&t, &in), 2);
    assert_int_equal(t.limit, EMLIO_LIMIT_DISK);
    assert_string_equal(emlio_limit_name(t.limit), "disk");
    in.disk = EMLIO_TUNER_DISK_SHARE - 1;
    emlio__tuner_init(&t, 2, 64, false, 0);
    assert_int_equal(emlio__tuner_step(&t, &in), 2);
    assert_int_equal(t.limit, EMLIO_LIMIT_NETWORK);
    in.srtt_ns = MS / 20;
    emlio__tuner_init(&t, 2, 64, false, 0);
    emlio__tuner_step(&t, &in);
    assert_int_equal(t.limit, EMLIO_LIMIT_DAEMON);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tuner_grows_on_a_window_limited_path),
        cmocka_unit_test(test_tuner_busy_cpus_open_streams_only_while_full),
        cmocka_unit_test(test_tuner_counts_every_daemons_streams),
        cmocka_unit_test(test_tuner_names_the_disk),
        cmocka_unit_test(test_tuner_grows_further_at_100ms),
        cmocka_unit_test(test_tuner_stays_few_on_a_fast_path),
        cmocka_unit_test(test_tuner_leaves_a_slow_consumer_alone),
        cmocka_unit_test(test_tuner_pinned_and_unmeasured),
        cmocka_unit_test(test_tuner_start_streams),
        cmocka_unit_test(test_netpath_plan_recv),
        cmocka_unit_test(test_netpath_local_endpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
