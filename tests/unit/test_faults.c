/* test_faults.c - out-of-memory fault injection, SQLite style: a short run
 * of a server and a client in one process, repeated with the Nth
 * allocation failing for every N until a run makes no more allocations
 * than N. Nothing may crash or hang, every failing call must say why, and
 * under `make check` (ASan) nothing may leak.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#define RECORDS 6

/* One shard of RECORDS Examples. */
static void
s_write_dataset(const char *dir)
{
    emlio_buf_t file = EMLIO_BUF_INIT;
    emlio_buf_t ex = EMLIO_BUF_INIT;
    for (int r = 0; r < RECORDS; r++) {
        char payload[32];
        int n = snprintf(payload, sizeof(payload), "sample %d", r);
        emlio_buf_clear(&ex);
        assert_int_equal(emlio_example_build(&ex, "image/encoded",
                                             (const uint8_t *)payload,
                                             (size_t)n, "image/class/label", r),
                         0);
        assert_int_equal(emlio_tfrecord_append(&file, ex.data, ex.len), 0);
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/part-0.tfrecord", dir);
    test_write_file(path, file.data, file.len);
    emlio_buf_release(&file);
    emlio_buf_release(&ex);
}

/* A failing call must leave a message that is not the default. */
static void
s_said_why(const char *msg)
{
    assert_non_null(msg);
    assert_true(msg[0] != 0);
}

/* The run: server up, a client fetches one epoch and saves its state, all
 * torn down. Returns the samples delivered (RECORDS when nothing failed). */
static int
s_run(const char *dir)
{
    int delivered = 0;
    emlio_ctx_t *ctx = emlio_ctx_new();
    if (!ctx)
        return 0;
    emlio_server_config_t scfg;
    emlio_server_config_init(&scfg);
    scfg.data_dir = dir;
    scfg.write_index = false;
    emlio_server_t *srv = emlio_server_new(ctx, &scfg);
    emlio_client_t *c = NULL;
    if (!srv)
        goto out;
    if (emlio_server_load(srv) < 0 ||
        emlio_server_bind(srv, "tcp://127.0.0.1:*") < 0 ||
        emlio_server_start(srv) < 0) {
        s_said_why(emlio_server_errmsg(srv));
        goto out;
    }
    emlio_client_config_t ccfg;
    emlio_client_config_init(&ccfg);
    ccfg.batch_size = 2;
    ccfg.streams = 1;
    ccfg.inflight = 2;
    ccfg.connect_timeout_ms = 2000;
    ccfg.timeout_ms = 300; /* a request lost to a failed allocation */
    c = emlio_client_new(ctx, &ccfg);
    if (!c)
        goto out;
    if (emlio_client_connect(c, emlio_server_endpoint(srv)) < 0 ||
        emlio_client_begin_epoch(c, 0) < 0) {
        s_said_why(emlio_client_errmsg(c));
        goto out;
    }
    emlio_batch_t *b;
    int rc;
    while ((rc = emlio_client_next(c, &b)) > 0) {
        size_t n;
        emlio_batch_samples(b, &n);
        delivered += (int)n;
        emlio_batch_release(&b);
    }
    if (rc < 0) {
        s_said_why(emlio_client_errmsg(c));
        /* The failure is sticky or retryable, never a crash. */
        assert_true(emlio_client_next(c, &b) <= 0);
        assert_null(b);
    }
    uint8_t *blob = NULL;
    size_t len = 0;
    if (emlio_client_save_state(c, &blob, &len) < 0)
        s_said_why(emlio_client_errmsg(c));
    emlio_client_free_blob(blob);
out:
    emlio_client_destroy(&c);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    return delivered;
}

static void
test_faults_every_allocation_of_a_short_run(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    s_write_dataset(dir);
    /* The clean run, and how many allocations it makes. */
    emlio__alloc_fail_at(0);
    assert_int_equal(s_run(dir), RECORDS);
    long total = emlio__alloc_count();
    assert_true(total > 10);
    long step =
        getenv("EMLIO_FAULT_STEP") ? atol(getenv("EMLIO_FAULT_STEP")) : 1;
    long failed_runs = 0;
    for (long n = 1; n <= total; n += step > 0 ? step : 1) {
        emlio__alloc_fail_at(n);
        int got = s_run(dir);
        long made = emlio__alloc_count();
        emlio__alloc_fail_at(0);
        assert_true(got >= 0 && got <= RECORDS);
        failed_runs += got < RECORDS;
        if (made < n)
            break; /* the run ended before the Nth allocation */
    }
    printf("# %ld allocations per run, %ld runs fell short\n", total,
           failed_runs);
    assert_true(failed_runs > 0);
    /* And it all still works afterwards. */
    assert_int_equal(s_run(dir), RECORDS);
    test_rmtree(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_faults_every_allocation_of_a_short_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
