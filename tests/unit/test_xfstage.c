/* test_xfstage.c - the transform stage runs each distinct sample of a
 * batch once: a record named many times in one GET costs one decode, and
 * every copy's output is the same bytes (issue 34).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <jpeglib.h>
#include <png.h>
#include <pthread.h>
#include <stdatomic.h>

#include "emlio/transform.h"
#include "test_images.h"
#include "xfstage.h"

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
} s_wait_t;

static void
s_done(emlio__xf_job_t *job)
{
    s_wait_t *w = job->userdata;
    pthread_mutex_lock(&w->lock);
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Runs samples[0, n) through spec on pool; returns the job's distinct
 * count; the block in *block (free it). */
static size_t
s_run(emlio__workpool_t *pool, const emlio_transform_t *t,
      emlio__xf_sample_t *samples, size_t n, uint8_t **block)
{
    s_wait_t w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false };
    emlio__xf_job_t job;
    memset(&job, 0, sizeof(job));
    job.transform = t;
    job.seed = 7;
    job.epoch = 1;
    job.samples = samples;
    job.n = n;
    job.block = calloc(n, emlio_transform_output_bytes(t));
    job.want_crc = true;
    job.done = s_done;
    job.userdata = &w;
    assert_non_null(job.block);
    assert_int_equal(emlio__xf_job_start(&job, pool), 0);
    pthread_mutex_lock(&w.lock);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.lock);
    pthread_mutex_unlock(&w.lock);
    emlio__xf_job_cleanup(&job);
    *block = job.block;
    return job.transformed;
}

static void
test_xfstage_a_record_named_twice_is_decoded_once(void **state)
{
    (void)state;
    size_t len_a = 0, len_b = 0;
    uint8_t *a = s_rgb_jpeg(48, 40, false, &len_a);
    uint8_t *b = s_rgb_jpeg(48, 40, true, &len_b);
    char err[EMLIO_ERRBUF_SIZE];
    emlio_transform_t *t = NULL;
    assert_int_equal(emlio_transform_parse("random_resized_crop(16),"
                                           "horizontal_flip",
                                           &t, err, sizeof(err)),
                     0);
    int rc = 0;
    emlio__workpool_t *pool = emlio__xf_pool_new(2, 0, "test-xf", &rc);
    assert_non_null(pool);
    size_t out = emlio_transform_output_bytes(t);

    /* The reference: each record alone. */
    emlio__xf_sample_t one[2] = {
        { .data = a, .len = len_a, .key = 11 },
        { .data = b, .len = len_b, .key = 12 },
    };
    uint8_t *ref;
    assert_int_equal(s_run(pool, t, one, 2, &ref), 2);

    /* 64 samples: record 11 named 40 times (from two copies of its
     * bytes, as a copying read makes), record 12 24 times. */
    enum { N = 64 };

    emlio__xf_sample_t many[N];
    uint8_t *a2 = malloc(len_a);
    assert_non_null(a2);
    memcpy(a2, a, len_a);
    for (size_t i = 0; i < N; i++) {
        bool is_a = i % 8 < 5;
        many[i] = (emlio__xf_sample_t){ .data = is_a ? (i & 1 ? a2 : a) : b,
                                        .len = is_a ? len_a : len_b,
                                        .key = is_a ? 11 : 12 };
    }
    uint8_t *got;
    assert_int_equal(s_run(pool, t, many, N, &got), 2);
    for (size_t i = 0; i < N; i++) {
        bool is_a = i % 8 < 5;
        assert_int_equal(many[i].rc, 0);
        assert_int_equal(many[i].crc, one[is_a ? 0 : 1].crc);
        assert_memory_equal(got + i * out, ref + (is_a ? 0 : out), out);
    }
    free(got);

    /* Same key, other bytes: not the same sample (a hash collision must
     * not hand one image's output to another). */
    emlio__xf_sample_t clash[2] = {
        { .data = a, .len = len_a, .key = 11 },
        { .data = b, .len = len_b, .key = 11 },
    };
    assert_int_equal(s_run(pool, t, clash, 2, &got), 2);
    free(got);

    /* A broken record named three times fails three times. */
    static const uint8_t junk[] = "not a jpeg";
    emlio__xf_sample_t bad[3];
    for (size_t i = 0; i < 3; i++)
        bad[i] = (emlio__xf_sample_t){ .data = junk,
                                       .len = sizeof(junk),
                                       .key = 99 };
    assert_int_equal(s_run(pool, t, bad, 3, &got), 1);
    for (size_t i = 0; i < 3; i++)
        assert_int_not_equal(bad[i].rc, 0);
    free(got);

    free(ref);
    free(a);
    free(a2);
    free(b);
    emlio__workpool_destroy(&pool);
    emlio_transform_destroy(&t);
}

/* A done() that frees its job, as the daemon's does (its serializer frees
 * the GET that holds the job): start must not read the job after queuing
 * its last unit. Before the fix it read job->n there, a use-after-free
 * ASan saw in CI with one-sample GETs. A race, so it is run 100,000 times:
 * under make check's ASan the old start failed 3 runs in 4 (an optimized
 * build keeps job->n in a register and passes). The job is scribbled
 * before it is freed, so a read of it is garbage, not a stale value. */
static void
s_done_and_free(emlio__xf_job_t *job)
{
    s_wait_t *w = job->userdata;
    emlio__xf_job_cleanup(job);
    free(job->block);
    memset(job, 0xff, sizeof(*job));
    free(job);
    pthread_mutex_lock(&w->lock);
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static void
test_xfstage_start_leaves_a_job_its_done_frees(void **state)
{
    (void)state;
    char err[EMLIO_ERRBUF_SIZE];
    emlio_transform_t *t = NULL;
    assert_int_equal(
        emlio_transform_parse("center_crop(8)", &t, err, sizeof(err)), 0);
    int rc = 0;
    emlio__workpool_t *pool = emlio__xf_pool_new(2, 0, "test-xf", &rc);
    assert_non_null(pool);
    /* Junk fails at once, so the worker's done() races start's return. */
    static const uint8_t junk[] = "not a jpeg";
    for (int round = 0; round < 100000; round++) {
        emlio__xf_sample_t sample = { .data = junk,
                                      .len = sizeof(junk),
                                      .key = (uint64_t)round };
        s_wait_t w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                       false };
        emlio__xf_job_t *job = calloc(1, sizeof(*job));
        assert_non_null(job);
        job->transform = t;
        job->samples = &sample;
        job->n = 1;
        job->block = calloc(1, emlio_transform_output_bytes(t));
        job->done = s_done_and_free;
        job->userdata = &w;
        assert_int_equal(emlio__xf_job_start(job, pool), 0);
        pthread_mutex_lock(&w.lock);
        while (!w.done)
            pthread_cond_wait(&w.cond, &w.lock);
        pthread_mutex_unlock(&w.lock);
        assert_int_not_equal(sample.rc, 0);
    }
    emlio__workpool_destroy(&pool);
    emlio_transform_destroy(&t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfstage_a_record_named_twice_is_decoded_once),
        cmocka_unit_test(test_xfstage_start_leaves_a_job_its_done_frees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
