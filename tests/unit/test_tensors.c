/* test_tensors.c - decoded tensors end to end, against an in-process
 * daemon: the same bytes whichever side decodes (server, client, auto, any
 * thread count, one rank or two), a different crop each epoch, the batch's
 * one block, and what a bad image, a daemon that does not decode and a bad
 * spec do. SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <sys/stat.h>
#include <unistd.h>

#include "test_images.h"

#define CLASSES   2
#define PER_CLASS 12
#define N         (CLASSES * PER_CLASS)
#define SIDE      48
#define OUT       ((size_t)SIDE * SIDE * 3)
#define SPEC      "random_resized_crop(48),horizontal_flip"

typedef struct fixture {
    char dir[64];
    emlio_ctx_t *ctx;
    emlio_server_t *srv;
    uint8_t *want[CLASSES][PER_CLASS]; /* epoch 0's tensors, decoded here */
} fixture_t;

/* Writes an ImageFolder tree of JPEGs of assorted sizes; with `bad`, the
 * fourth file of class 1 is not a JPEG. */
static void
s_write_tree(const char *dir, bool bad)
{
    for (int c = 0; c < CLASSES; c++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/class%d", dir, c);
        assert_int_equal(mkdir(path, 0755), 0);
        for (int i = 0; i < PER_CLASS; i++) {
            size_t len;
            uint8_t *jpeg =
                s_rgb_jpeg(60 + 7 * (uint32_t)i, 50 + 5 * (uint32_t)(i + c),
                           i % 5 == 4, &len);
            snprintf(path, sizeof(path), "%s/class%d/img%02d.jpg", dir, c, i);
            if (bad && c == 1 && i == 3)
                memset(jpeg + 2, 0x55, len - 2); /* the header survives */
            test_write_file(path, jpeg, len);
            free(jpeg);
        }
    }
}

/* A started daemon on f's tree; core_mw 0: the energy model's. */
static emlio_server_t *
s_server_mw(fixture_t *f, uint32_t threads, int on_corrupt, uint32_t core_mw)
{
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = f->dir;
    cfg.transform_threads = threads;
    cfg.on_corrupt = on_corrupt;
    cfg.core_mw = core_mw;
    return test_server_up(f->ctx, &cfg, CLASSES);
}

static emlio_server_t *
s_server(fixture_t *f, uint32_t threads, int on_corrupt)
{
    return s_server_mw(f, threads, on_corrupt, 0);
}

typedef struct run {
    const char *spec;
    int decode_at;
    uint32_t threads; /* client transform threads */
    uint32_t world, rank;
    uint64_t epoch;
    uint32_t batch;
    int on_corrupt; /* the client's */
} run_t;

static emlio_client_t *
s_client(fixture_t *f, const run_t *r)
{
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = r->batch ? r->batch : 5;
    cfg.seed = 11;
    cfg.world = r->world ? r->world : 1;
    cfg.rank = r->rank;
    cfg.transform = r->spec;
    cfg.decode_at = r->decode_at;
    cfg.transform_threads = r->threads;
    cfg.on_corrupt = (uint8_t)r->on_corrupt;
    emlio_client_t *c = emlio_client_new(f->ctx, &cfg);
    assert_non_null(c);
    return c;
}

/* A client of r, connected to f's daemon, in epoch 0. */
static emlio_client_t *
s_client_in_epoch0(fixture_t *f, const run_t *r)
{
    emlio_client_t *c = s_client(f, r);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(f->srv)), 1);
    assert_true(emlio_client_begin_epoch(c, 0) > 0);
    return c;
}

/* Class and file index of a sample (ImageFolder: shard = class dir). */
static void
s_where(emlio_client_t *c, const emlio_sample_t *s, int *cls, int *idx)
{
    assert_int_equal(
        sscanf(emlio_client_shard_name(c, s->shard), "class%d", cls), 1);
    *idx = (int)s->record;
}

/* Runs one epoch; stores each sample's tensor in got (copies). Returns the
 * samples delivered, or the failing code of next(). */
static int
s_epoch(fixture_t *f, const run_t *r, uint8_t *got[CLASSES][PER_CLASS])
{
    emlio_client_t *c = s_client(f, r);
    int rc = emlio_client_connect(c, emlio_server_endpoint(f->srv));
    if (rc < 0) {
        emlio_client_destroy(&c);
        return rc;
    }
    assert_true(emlio_client_begin_epoch(c, r->epoch) > 0);
    emlio_batch_t *b;
    int n = 0;
    while ((rc = emlio_client_next(c, &b)) == 1) {
        size_t k;
        uint32_t h, w;
        const uint8_t *block = emlio_batch_images(b, &k, &h, &w);
        const emlio_sample_t *s = emlio_batch_samples(b, &k);
        assert_int_equal(h, SIDE);
        assert_int_equal(w, SIDE);
        for (size_t i = 0; i < k; i++) {
            /* One contiguous block, sample i at i x H x W x 3. */
            assert_ptr_equal(s[i].data, block + i * OUT);
            assert_int_equal(s[i].len, OUT);
            int cls, idx;
            s_where(c, &s[i], &cls, &idx);
            assert_int_equal(s[i].label, cls);
            if (s[i].pad)
                continue;
            assert_null(got[cls][idx]); /* exactly once */
            got[cls][idx] = malloc(OUT);
            memcpy(got[cls][idx], s[i].data, OUT);
            n++;
        }
        emlio_batch_release(&b);
    }
    emlio_client_destroy(&c);
    return rc < 0 ? rc : n;
}

static void
s_free_all(uint8_t *got[CLASSES][PER_CLASS])
{
    for (int c = 0; c < CLASSES; c++)
        for (int i = 0; i < PER_CLASS; i++) {
            free(got[c][i]);
            got[c][i] = NULL;
        }
}

/* The reference: each file decoded here by the library directly, with the
 * key the wire uses (shard name = class directory, record = file index). */
static void
s_reference(fixture_t *f, uint64_t epoch)
{
    emlio_transform_t *t = NULL;
    char err[256];
    assert_int_equal(emlio_transform_parse(SPEC, &t, err, sizeof(err)), 0);
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    for (int c = 0; c < CLASSES; c++) {
        for (int i = 0; i < PER_CLASS; i++) {
            char path[256], name[32];
            snprintf(path, sizeof(path), "%s/class%d/img%02d.jpg", f->dir, c,
                     i);
            snprintf(name, sizeof(name), "class%d", c);
            size_t len;
            uint8_t *data = test_read_file(path, &len);
            f->want[c][i] = malloc(OUT);
            assert_int_equal(emlio_transform_apply(
                                 t, ws, data, len, 11, epoch,
                                 emlio_transform_sample_key(name, (uint64_t)i),
                                 f->want[c][i], err, sizeof(err)),
                             0);
            free(data);
        }
    }
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&t);
}

static int
s_setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    test_mkdtemp(f->dir, sizeof(f->dir));
    s_write_tree(f->dir, false);
    f->ctx = emlio_ctx_new();
    f->srv = s_server(f, 2, EMLIO_ON_CORRUPT_FAIL);
    s_reference(f, 0);
    *state = f;
    return 0;
}

static int
s_teardown(void **state)
{
    fixture_t *f = *state;
    s_free_all(f->want);
    emlio_server_destroy(&f->srv);
    emlio_ctx_destroy(&f->ctx);
    test_rmtree(f->dir);
    free(f);
    return 0;
}

static void
s_expect_reference(fixture_t *f, uint8_t *got[CLASSES][PER_CLASS])
{
    for (int c = 0; c < CLASSES; c++)
        for (int i = 0; i < PER_CLASS; i++) {
            assert_non_null(got[c][i]);
            assert_memory_equal(got[c][i], f->want[c][i], OUT);
        }
}

/* The same bytes whichever side decodes, with any thread count. */
static void
test_tensors_same_bytes_wherever_decoded(void **state)
{
    fixture_t *f = *state;
    const int places[] = { EMLIO_DECODE_SERVER, EMLIO_DECODE_CLIENT,
                           EMLIO_DECODE_AUTO };
    const uint32_t threads[] = { 1, 4 };
    for (size_t p = 0; p < 3; p++) {
        for (size_t t = 0; t < 2; t++) {
            uint8_t *got[CLASSES][PER_CLASS] = { { NULL } };
            run_t r = { SPEC, places[p], threads[t], 1,
                        0,    0,         0,          EMLIO_ON_CORRUPT_FAIL };
            assert_int_equal(s_epoch(f, &r, got), N);
            s_expect_reference(f, got);
            s_free_all(got);
        }
    }
}

/* Two ranks' union is the one rank's epoch, byte for byte. */
static void
test_tensors_two_ranks_union(void **state)
{
    fixture_t *f = *state;
    uint8_t *got[CLASSES][PER_CLASS] = { { NULL } };
    int total = 0;
    for (uint32_t rank = 0; rank < 2; rank++) {
        run_t r = { SPEC, rank ? EMLIO_DECODE_CLIENT : EMLIO_DECODE_SERVER,
                    2,    2,
                    rank, 0,
                    4,    EMLIO_ON_CORRUPT_FAIL };
        int n = s_epoch(f, &r, got);
        assert_true(n > 0);
        total += n;
    }
    assert_int_equal(total, N);
    s_expect_reference(f, got);
    s_free_all(got);
}

/* Another epoch, other crops: nearly every sample changes. */
static void
test_tensors_epoch_changes_the_crops(void **state)
{
    fixture_t *f = *state;
    uint8_t *got[CLASSES][PER_CLASS] = { { NULL } };
    run_t r = {
        SPEC, EMLIO_DECODE_SERVER, 1, 1, 0, 1, 0, EMLIO_ON_CORRUPT_FAIL
    };
    assert_int_equal(s_epoch(f, &r, got), N);
    int same = 0;
    for (int c = 0; c < CLASSES; c++)
        for (int i = 0; i < PER_CLASS; i++)
            same += memcmp(got[c][i], f->want[c][i], OUT) == 0;
    assert_true(same <= N / 20); /* > 95% differ */
    s_free_all(got);
}

/* A daemon that does not decode: decode_at server is refused at connect,
 * naming it; auto decodes everything here. A bad spec fails connect. */
static void
test_tensors_daemon_without_threads_and_bad_spec(void **state)
{
    fixture_t *f = *state;
    emlio_server_t *keep = f->srv;
    f->srv = s_server(f, 0, EMLIO_ON_CORRUPT_FAIL);
    uint8_t *got[CLASSES][PER_CLASS] = { { NULL } };
    run_t r = {
        SPEC, EMLIO_DECODE_SERVER, 1, 1, 0, 0, 0, EMLIO_ON_CORRUPT_FAIL
    };
    emlio_client_t *c = s_client(f, &r);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(f->srv)),
                     EMLIO_EINVAL);
    assert_non_null(strstr(emlio_client_errmsg(c), "does not decode"));
    emlio_client_destroy(&c);
    r.decode_at = EMLIO_DECODE_AUTO;
    assert_int_equal(s_epoch(f, &r, got), N);
    s_expect_reference(f, got);
    s_free_all(got);
    emlio_server_destroy(&f->srv);
    f->srv = keep;
    r.spec = "random_resized_crop(48),rotate(5)";
    c = s_client(f, &r);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(f->srv)),
                     EMLIO_EINVAL);
    assert_non_null(strstr(emlio_client_errmsg(c), "rotate"));
    emlio_client_destroy(&c);
}

/* A file that is not a JPEG fails the epoch naming shard and record,
 * whichever side decodes; a daemon with --on-corrupt skip leaves it out. */
static void
test_tensors_bad_image(void **state)
{
    fixture_t *f = *state;
    emlio_server_t *keep = f->srv;
    char keep_dir[64];
    memcpy(keep_dir, f->dir, sizeof(keep_dir));
    test_mkdtemp(f->dir, sizeof(f->dir));
    s_write_tree(f->dir, true);
    f->srv = s_server(f, 2, EMLIO_ON_CORRUPT_FAIL);
    const int places[] = { EMLIO_DECODE_SERVER, EMLIO_DECODE_CLIENT };
    for (size_t p = 0; p < 2; p++) {
        uint8_t *got[CLASSES][PER_CLASS] = { { NULL } };
        run_t r = { SPEC, places[p], 2, 1, 0, 0, 0, EMLIO_ON_CORRUPT_FAIL };
        emlio_client_t *c = s_client_in_epoch0(f, &r);
        emlio_batch_t *b;
        int rc;
        while ((rc = emlio_client_next(c, &b)) == 1)
            emlio_batch_release(&b);
        assert_int_equal(rc, EMLIO_EFORMAT);
        /* Both name the file (the format's description): the client
         * from the daemon's BATCH "where", which it asked for. */
        const char *msg = emlio_client_errmsg(c);
        assert_non_null(strstr(msg, "file 'class1/"));
        assert_non_null(strstr(msg, "(record 3)"));
        if (places[p] == EMLIO_DECODE_CLIENT)
            assert_non_null(strstr(msg, "cannot decode file 'class1/"));
        emlio_client_destroy(&c);
        s_free_all(got);
    }
    /* Skipped by whichever side decodes, under the same policy: the
     * daemon's for its batches, the client's for its own. */
    emlio_server_destroy(&f->srv);
    f->srv = s_server(f, 2, EMLIO_ON_CORRUPT_SKIP);
    for (size_t p = 0; p < 3; p++) {
        const int at[] = { EMLIO_DECODE_SERVER, EMLIO_DECODE_CLIENT,
                           EMLIO_DECODE_AUTO };
        run_t r = { SPEC, at[p], 2, 1, 0, 0, 0, EMLIO_ON_CORRUPT_SKIP };
        emlio_client_t *c = s_client_in_epoch0(f, &r);
        emlio_batch_t *b;
        int rc, n = 0;
        while ((rc = emlio_client_next(c, &b)) == 1) {
            size_t k;
            const emlio_sample_t *s = emlio_batch_samples(b, &k);
            uint32_t h, w;
            size_t k_images;
            const uint8_t *block = emlio_batch_images(b, &k_images, &h, &w);
            assert_int_equal(k_images, k);
            for (size_t i = 0; i < k; i++) {
                int cls, idx;
                s_where(c, &s[i], &cls, &idx);
                /* The holes are closed: sample i is at slot i, and it is
                 * the same tensor as a clean decode gives. */
                assert_ptr_equal(s[i].data, block + i * OUT);
                assert_false(cls == 1 && idx == 3);
                if (!s[i].pad && cls == 0) {
                    assert_memory_equal(s[i].data, f->want[0][idx], OUT);
                }
                n += !s[i].pad;
            }
            emlio_batch_release(&b);
        }
        assert_int_equal(rc, 0);
        assert_int_equal(n, N - 1);
        size_t n_skipped;
        const emlio_sample_t *sk = emlio_client_skipped(c, &n_skipped);
        assert_int_equal(n_skipped, 1);
        assert_string_equal(emlio_client_shard_name(c, sk[0].shard), "class1");
        assert_int_equal(sk[0].record, 3);
        emlio_client_destroy(&c);
    }
    emlio_server_destroy(&f->srv);
    test_rmtree(f->dir);
    memcpy(f->dir, keep_dir, sizeof(keep_dir));
    f->srv = keep;
}

/* Runs an epoch of auto with a caller that takes 20 ms a batch (a
 * GPU-bound loop), then begins the next: returns the share chosen. */
static double
s_auto_share_for_slow_caller(fixture_t *f, uint32_t core_mw)
{
    emlio_server_t *keep = f->srv;
    f->srv = s_server_mw(f, 2, EMLIO_ON_CORRUPT_FAIL, core_mw);
    run_t r = { SPEC, EMLIO_DECODE_AUTO, 2, 1, 0, 0, 4, EMLIO_ON_CORRUPT_FAIL };
    emlio_client_t *c = s_client(f, &r);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(f->srv)), 1);
    emlio_batch_t *b;
    for (uint64_t e = 0; e < 2; e++) {
        assert_true(emlio_client_begin_epoch(c, e) > 0);
        while (emlio_client_next(c, &b) == 1) {
            usleep(20000);
            emlio_batch_release(&b);
        }
    }
    assert_true(emlio_client_begin_epoch(c, 2) > 0);
    emlio_client_xf_stats_t st;
    emlio_client_xf_stats(c, &st);
    assert_true(st.decided);
    assert_string_equal(st.bound, "consumer");
    emlio_client_destroy(&c);
    emlio_server_destroy(&f->srv);
    f->srv = keep;
    return st.server_share;
}

/* auto with a caller slower than either side can decode: any share is
 * fast enough, so the one with the cheapest cores wins. */
static void
test_tensors_auto_takes_the_cheapest_for_a_slow_caller(void **state)
{
    fixture_t *f = *state;
    assert_true(s_auto_share_for_slow_caller(f, 10000) == 0);
    assert_true(s_auto_share_for_slow_caller(f, 1000) == 1);
}

/* An epoch abandoned while the decode pool holds its batches, and a
 * client destroyed with batches in the pool: nothing leaks or is touched
 * after it is freed (the sanitizer build checks), and the next epoch is
 * still exactly once. */
static void
test_tensors_abandon_while_decoding(void **state)
{
    fixture_t *f = *state;
    run_t r = {
        SPEC, EMLIO_DECODE_CLIENT, 1, 1, 0, 0, 2, EMLIO_ON_CORRUPT_FAIL
    };
    emlio_client_t *c = s_client(f, &r);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(f->srv)), 1);
    assert_true(emlio_client_begin_epoch(c, 0) > 0);
    emlio_batch_t *b;
    assert_int_equal(emlio_client_next(c, &b), 1);
    emlio_batch_release(&b);
    assert_true(emlio_client_begin_epoch(c, 1) > 0); /* abandons epoch 0 */
    int n = 0, rc;
    while ((rc = emlio_client_next(c, &b)) == 1) {
        size_t k;
        emlio_batch_samples(b, &k);
        n += (int)k;
        emlio_batch_release(&b);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, N);
    assert_true(emlio_client_begin_epoch(c, 2) > 0);
    assert_int_equal(emlio_client_next(c, &b), 1);
    emlio_batch_release(&b);
    emlio_client_destroy(&c); /* batches still in the pool */
    assert_null(c);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensors_same_bytes_wherever_decoded),
        cmocka_unit_test(test_tensors_two_ranks_union),
        cmocka_unit_test(test_tensors_epoch_changes_the_crops),
        cmocka_unit_test(test_tensors_daemon_without_threads_and_bad_spec),
        cmocka_unit_test(test_tensors_bad_image),
        cmocka_unit_test(test_tensors_abandon_while_decoding),
        cmocka_unit_test(
            test_tensors_auto_takes_the_cheapest_for_a_slow_caller),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
