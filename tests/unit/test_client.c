/* test_client.c - the client API against an in-process server: epochs,
 * in-order delivery, resume state and its validation, misuse errors.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buf.h"
#include "client_internal.h"
#include "crc32c.h"
#include "emlio/example.h"
#include "tfrecord.h"

#define SHARDS  3
#define RECORDS 20 /* per shard */

typedef struct fixture {
    char dir[64];
    emlio_ctx_t *ctx;
    emlio_server_t *srv;
} fixture_t;

/* Writes SHARDS shards of RECORDS Examples; record r of shard s holds the
 * bytes "s:r" and label s * 100 + r. */
static void
s_write_dataset(const char *dir)
{
    for (int s = 0; s < SHARDS; s++) {
        emlio_buf_t file = EMLIO_BUF_INIT;
        emlio_buf_t ex = EMLIO_BUF_INIT;
        for (int r = 0; r < RECORDS; r++) {
            char payload[32];
            int n = snprintf(payload, sizeof(payload), "%d:%d", s, r);
            emlio_buf_clear(&ex);
            assert_int_equal(emlio_example_build(
                                 &ex, "image/encoded", (const uint8_t *)payload,
                                 (size_t)n, "image/class/label", s * 100 + r),
                             0);
            assert_int_equal(emlio_tfrecord_append(&file, ex.data, ex.len), 0);
        }
        char path[128];
        snprintf(path, sizeof(path), "%s/part-%d.tfrecord", dir, s);
        test_write_file(path, file.data, file.len);
        emlio_buf_release(&file);
        emlio_buf_release(&ex);
    }
}

static int
s_setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    test_mkdtemp(f->dir, sizeof(f->dir));
    s_write_dataset(f->dir);
    f->ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = f->dir;
    f->srv = test_server_up(f->ctx, &cfg, SHARDS);
    *state = f;
    return 0;
}

/* A case that failed left its clients open (cmocka jumps out of it), and
 * destroying the context waits for every socket: rather than hang until
 * the suite's timeout, give up after 30 s, saying why (the failure itself
 * is already reported). */
static void
s_teardown_stuck(int sig)
{
    (void)sig;
    static const char msg[] = "test_client: a failed case left its sockets "
                              "open; not waiting for them\n";
    if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0)
        _exit(2);
    _exit(1);
}

static int
s_teardown(void **state)
{
    fixture_t *f = *state;
    signal(SIGALRM, s_teardown_stuck);
    alarm(30);
    emlio_server_destroy(&f->srv);
    emlio_ctx_destroy(&f->ctx);
    alarm(0);
    test_rmtree(f->dir);
    free(f);
    return 0;
}

/* A client of cfg connected to srv, the one daemon. */
static emlio_client_t *
s_connect(fixture_t *f, emlio_server_t *srv, const emlio_client_config_t *cfg)
{
    emlio_client_t *c = emlio_client_new(f->ctx, cfg);
    assert_non_null(c);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(srv)), 1);
    return c;
}

/* A client of cfg whose connect to ep returns rc (a failure); kept for
 * what the caller checks next. */
static emlio_client_t *
s_connect_fails(fixture_t *f, const emlio_client_config_t *cfg, const char *ep,
                int rc)
{
    emlio_client_t *c = emlio_client_new(f->ctx, cfg);
    assert_non_null(c);
    assert_int_equal(emlio_client_connect(c, ep), rc);
    return c;
}

/* Rank `rank` of `world`: batch, order and shuffle as given, seed 3, four
 * batches in flight, connected to the fixture's daemon. */
static emlio_client_t *
s_job(fixture_t *f, uint32_t world, uint32_t rank, uint32_t batch,
      bool in_order, int shuffle)
{
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = batch;
    cfg.world = world;
    cfg.rank = rank;
    cfg.in_order = in_order;
    cfg.shuffle = shuffle;
    cfg.seed = 3;
    cfg.inflight = 4;
    return s_connect(f, f->srv, &cfg);
}

static emlio_client_t *
s_client(fixture_t *f, uint32_t batch, bool in_order, int shuffle)
{
    return s_job(f, 1, 0, batch, in_order, shuffle);
}

/* Checks a sample's bytes and label against what s_write_dataset wrote. */
static void
s_check_sample(emlio_client_t *c, const emlio_sample_t *s)
{
    int shard = -1;
    assert_int_equal(sscanf(emlio_client_shard_name(c, s->shard),
                            "part-%d.tfrecord", &shard),
                     1);
    char want[32];
    int n = snprintf(want, sizeof(want), "%d:%" PRIu64, shard, s->record);
    assert_int_equal(s->len, (size_t)n);
    assert_memory_equal(s->data, want, (size_t)n);
    assert_int_equal(s->label, shard * 100 + (int64_t)s->record);
}

/* Drains the current epoch; checks every sample once and that every batch
 * belongs to `epoch` (in plan order when in_order). Returns the batches. */
static int
s_drain_epoch(emlio_client_t *c, uint64_t epoch, bool in_order)
{
    uint8_t seen[SHARDS][RECORDS] = { { 0 } };
    emlio_batch_t *b;
    int rc, got = 0;
    while ((rc = emlio_client_next(c, &b)) == 1) {
        assert_int_equal(emlio_batch_epoch(b), epoch);
        if (in_order)
            assert_int_equal(emlio_batch_index(b), (uint64_t)got);
        size_t n;
        const emlio_sample_t *s = emlio_batch_samples(b, &n);
        for (size_t i = 0; i < n; i++) {
            s_check_sample(c, &s[i]);
            seen[s[i].shard][s[i].record]++;
        }
        emlio_batch_release(&b);
        assert_null(b);
        got++;
    }
    assert_int_equal(rc, 0);
    for (int s = 0; s < SHARDS; s++)
        for (int r = 0; r < RECORDS; r++)
            assert_int_equal(seen[s][r], 1);
    return got;
}

static void
test_client_epoch_delivers_every_sample_once(void **state)
{
    fixture_t *f = *state;
    emlio_client_t *c = s_client(f, 7, false, EMLIO_SHUFFLE_WINDOW);
    assert_int_equal(emlio_client_shard_count(c), SHARDS);
    int batches = emlio_client_begin_epoch(c, 0);
    assert_int_equal(batches, (SHARDS * RECORDS + 6) / 7);
    assert_int_equal(s_drain_epoch(c, 0, false), batches);
    emlio_batch_t *b;
    emlio_client_stats_t st;
    emlio_client_stats(c, &st);
    assert_int_equal(st.samples, SHARDS * RECORDS);
    assert_int_equal(st.batches, (uint64_t)batches);
    /* After the end, next keeps saying so. */
    assert_true(emlio_client_next(c, &b) < 0);
    emlio_client_destroy(&c);
    assert_null(c);
}

/* A client of batch 4 with 6 requests in flight, which asks ahead for
 * the next epoch up to end_epoch. */
static emlio_client_t *
s_ahead(fixture_t *f, bool in_order, uint64_t end_epoch)
{
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = 4;
    cfg.in_order = in_order;
    cfg.inflight = 6;
    cfg.end_epoch = end_epoch;
    return s_connect(f, f->srv, &cfg);
}

/* With end_epoch set, epoch e + 1 is requested while e's last batches
 * arrive (the daemon has answered more than epoch e's requests when e
 * ends), handed over only after begin_epoch(e + 1), and every epoch stays
 * exactly once, out of order and in order; a skipped epoch drops what was
 * requested ahead; nothing is requested past end_epoch. */
static void
test_client_epochs_overlap_exactly_once(void **state)
{
    fixture_t *f = *state;
    for (int in_order = 0; in_order < 2; in_order++) {
        emlio_client_t *c = s_ahead(f, in_order, 3);
        emlio_server_stats_t before, after;
        emlio_server_stats(f->srv, &before);
        int n0 = emlio_client_begin_epoch(c, 0);
        assert_int_equal(s_drain_epoch(c, 0, in_order), n0);
        /* Let the requests sent ahead be answered. */
        for (int i = 0; i < 200; i++) {
            emlio_server_stats(f->srv, &after);
            if (after.requests - before.requests > (uint64_t)n0)
                break;
            usleep(5000);
        }
        assert_true(after.requests - before.requests > (uint64_t)n0);
        int n1 = emlio_client_begin_epoch(c, 1);
        assert_int_equal(s_drain_epoch(c, 1, in_order), n1);
        /* Epoch 2 was requested ahead; the caller jumps to 5 instead. */
        int n5 = emlio_client_begin_epoch(c, 5);
        assert_int_equal(s_drain_epoch(c, 5, in_order), n5);
        emlio_client_destroy(&c);
    }
    /* end_epoch 1: after epoch 0 nothing more is asked. */
    emlio_client_t *c = s_ahead(f, false, 1);
    emlio_server_stats_t before, after;
    emlio_server_stats(f->srv, &before);
    int n0 = emlio_client_begin_epoch(c, 0);
    assert_int_equal(s_drain_epoch(c, 0, false), n0);
    usleep(50000);
    emlio_server_stats(f->srv, &after);
    assert_int_equal(after.requests - before.requests, (uint64_t)n0);
    emlio_client_destroy(&c);
}

static void
test_client_in_order_follows_the_plan(void **state)
{
    fixture_t *f = *state;
    emlio_client_t *c = s_client(f, 5, true, EMLIO_SHUFFLE_NONE);
    int batches = emlio_client_begin_epoch(c, 1);
    emlio_batch_t *b;
    uint64_t expect = 0;
    while (emlio_client_next(c, &b) == 1) {
        assert_int_equal(emlio_batch_index(b), expect);
        assert_int_equal(emlio_batch_epoch(b), 1);
        size_t n;
        const emlio_sample_t *s = emlio_batch_samples(b, &n);
        /* shuffle none: file order, shards by name. */
        for (size_t i = 0; i < n; i++) {
            uint64_t global = expect * 5 + i;
            assert_int_equal(s[i].record, global % RECORDS);
        }
        emlio_batch_release(&b);
        expect++;
    }
    assert_int_equal(expect, (uint64_t)batches);
    emlio_client_destroy(&c);
}

/* Drains epoch 0 from a daemon of its own (granting max_credit) with a
 * client (batch 7, shuffle none, in order, GETs of request_bytes); checks
 * every batch in plan order, sample by sample, and returns the GETs the
 * daemon answered. */
static uint64_t
s_parts_epoch(fixture_t *f, uint32_t max_credit, uint32_t max_batch,
              uint64_t request_bytes)
{
    emlio_server_config_t scfg;
    emlio_server_config_init(&scfg);
    scfg.data_dir = f->dir;
    scfg.max_credit = max_credit;
    scfg.max_batch = max_batch;
    emlio_server_t *srv = test_server_up(f->ctx, &scfg, SHARDS);
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = 7;
    cfg.in_order = true;
    cfg.shuffle = EMLIO_SHUFFLE_NONE;
    cfg.request_bytes = request_bytes;
    cfg.end_epoch = 1; /* nothing of epoch 1 requested ahead */
    emlio_client_t *c = s_connect(f, srv, &cfg);
    int batches = emlio_client_begin_epoch(c, 0);
    assert_int_equal(batches, (SHARDS * RECORDS + 6) / 7);
    emlio_batch_t *b;
    uint64_t expect = 0;
    int rc;
    while ((rc = emlio_client_next(c, &b)) == 1) {
        assert_int_equal(emlio_batch_index(b), expect);
        size_t n;
        const emlio_sample_t *s = emlio_batch_samples(b, &n);
        assert_int_equal(n, EMLIO_MIN(7, SHARDS * RECORDS - expect * 7));
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(s[i].record, (expect * 7 + i) % RECORDS);
            s_check_sample(c, &s[i]);
        }
        emlio_batch_release(&b);
        expect++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(expect, (uint64_t)batches);
    emlio_client_destroy(&c);
    emlio_server_stats_t st;
    emlio_server_stats(srv, &st);
    emlio_server_destroy(&srv);
    return st.requests;
}

/* A daemon's share of a batch goes out as GETs of about request_bytes
 * (here one sample each, or the whole batch), never more GETs of one batch
 * than half the daemon's credits (max_credit 4: two parts of 4 + 3, so a
 * stream holds two batches; max_credit 2 and 3: one GET), and the batch
 * comes back whole, in plan order, whatever the split. */
static void
test_client_parts_reassemble_in_plan_order(void **state)
{
    fixture_t *f = *state;
    /* 60 samples in batches of 7: 8 full ones and one of 4. */
    assert_int_equal(s_parts_epoch(f, 256, 4096, 1), SHARDS * RECORDS);
    assert_int_equal(s_parts_epoch(f, 256, 4096, UINT64_MAX), 9);
    assert_int_equal(s_parts_epoch(f, 4, 4096, 1), 8 * 2 + 1);
    assert_int_equal(s_parts_epoch(f, 3, 4096, 1), 9);
    assert_int_equal(s_parts_epoch(f, 2, 4096, 1), 9);
    /* A batch above the daemon's samples per GET goes in parts within it
     * (3 + 2 + 2; the last batch of 4 as 2 + 2): it used to be refused. */
    assert_int_equal(s_parts_epoch(f, 256, 3, UINT64_MAX), 8 * 3 + 2);
}

/* A batch that even in parts cannot stay within a daemon's samples per GET
 * (max_batch 1, at most 2 GETs a batch with 4 credits) is refused when
 * the epoch begins, naming the daemon and its limit. */
static void
test_client_batch_beyond_the_daemons_limits_is_refused(void **state)
{
    fixture_t *f = *state;
    emlio_server_config_t scfg;
    emlio_server_config_init(&scfg);
    scfg.data_dir = f->dir;
    scfg.max_credit = 4;
    scfg.max_batch = 1;
    emlio_server_t *srv = test_server_up(f->ctx, &scfg, SHARDS);
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = 7;
    emlio_client_t *c = s_connect(f, srv, &cfg);
    assert_int_equal(emlio_client_begin_epoch(c, 0), EMLIO_ELIMIT);
    assert_non_null(strstr(emlio_client_errmsg(c), emlio_server_endpoint(srv)));
    assert_non_null(strstr(emlio_client_errmsg(c), "limit of 1"));
    /* Batches of 2 fit: two GETs of one sample each. */
    emlio_client_destroy(&c);
    cfg.batch_size = 2;
    cfg.end_epoch = 1;
    c = s_connect(f, srv, &cfg);
    assert_int_equal(emlio_client_begin_epoch(c, 0), SHARDS * RECORDS / 2);
    emlio_batch_t *b;
    int rc, samples = 0;
    while ((rc = emlio_client_next(c, &b)) == 1) {
        size_t n;
        emlio_batch_samples(b, &n);
        assert_int_equal(n, 2);
        samples += (int)n;
        emlio_batch_release(&b);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(samples, SHARDS * RECORDS);
    emlio_client_destroy(&c);
    emlio_server_destroy(&srv);
}

/* Samples of two fields (a --fields daemon: a frame per field), the jpg
 * too large to be packed: a batch asked for in parts holds more frames
 * than samples once its first parts are in, and its last part must still
 * be filed (it was refused as "more samples than asked"). */
static void
test_client_parts_of_multi_field_samples(void **state)
{
    fixture_t *f = *state;

    enum { N = 12, JPG = 20000 };

    char dir[64], path[128];
    test_mkdtemp(dir, sizeof(dir));
    emlio_buf_t tar = EMLIO_BUF_INIT;
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof(name), "k%02d.jpg", i);
        test_tar_member(&tar, name, JPG, (char)('a' + i));
        snprintf(name, sizeof(name), "k%02d.cls", i);
        test_tar_member(&tar, name, 1, (char)('0' + i % 4));
    }
    snprintf(path, sizeof(path), "%s/a.tar", dir);
    test_write_file(path, tar.data, tar.len);
    emlio_buf_release(&tar);
    emlio_server_config_t scfg;
    emlio_server_config_init(&scfg);
    scfg.data_dir = dir;
    scfg.fields = "jpg,cls";
    emlio_server_t *srv = test_server_up(f->ctx, &scfg, 1);
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = N; /* one batch, in parts of 3 samples */
    cfg.shuffle = EMLIO_SHUFFLE_NONE;
    cfg.request_bytes = 3 * (JPG + 2048); /* a member is ~21.5 KB of tar */
    cfg.end_epoch = 1;
    emlio_client_t *c = s_connect(f, srv, &cfg);
    assert_int_equal(emlio_client_begin_epoch(c, 0), 1);
    emlio_batch_t *b;
    assert_int_equal(emlio_client_next(c, &b), 1);
    size_t n;
    const emlio_sample_t *s = emlio_batch_samples(b, &n);
    assert_int_equal(n, N);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *data;
        size_t len;
        assert_int_equal(emlio_batch_field(b, i, 0, &data, &len), 0);
        assert_int_equal(len, JPG);
        assert_int_equal(data[0], 'a' + s[i].record);
        assert_int_equal(emlio_batch_field(b, i, 1, &data, &len), 0);
        assert_int_equal(len, 1);
    }
    emlio_batch_release(&b);
    assert_int_equal(emlio_client_next(c, &b), 0);
    emlio_client_destroy(&c);
    emlio_server_stats_t st;
    emlio_server_stats(srv, &st);
    assert_int_equal(st.requests, 4); /* the batch went in 4 parts */
    emlio_server_destroy(&srv);
    test_rmtree(dir);
}

static void
test_client_resume_state_delivers_the_rest(void **state)
{
    fixture_t *f = *state;
    emlio_client_t *c = s_client(f, 4, false, EMLIO_SHUFFLE_WINDOW);
    int batches = emlio_client_begin_epoch(c, 2);
    uint8_t seen[SHARDS][RECORDS] = { { 0 } };
    emlio_batch_t *b;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(emlio_client_next(c, &b), 1);
        size_t n;
        const emlio_sample_t *s = emlio_batch_samples(b, &n);
        for (size_t k = 0; k < n; k++)
            seen[s[k].shard][s[k].record]++;
        emlio_batch_release(&b);
    }
    uint8_t *blob;
    size_t len;
    assert_int_equal(emlio_client_save_state(c, &blob, &len), 0);
    emlio_client_destroy(&c);

    /* Damaged blobs and other configurations are refused. */
    emlio_client_t *d = s_client(f, 4, false, EMLIO_SHUFFLE_WINDOW);
    blob[len / 2] ^= 1;
    assert_int_equal(emlio_client_load_state(d, blob, len), EMLIO_ESTATE);
    assert_non_null(strstr(emlio_client_errmsg(d), "damaged"));
    blob[len / 2] ^= 1;
    assert_int_equal(emlio_client_load_state(d, blob, len - 1), EMLIO_ESTATE);
    emlio_client_t *other = s_client(f, 5, false, EMLIO_SHUFFLE_WINDOW);
    assert_int_equal(emlio_client_load_state(other, blob, len), EMLIO_ESTATE);
    assert_non_null(strstr(emlio_client_errmsg(other), "another"));
    emlio_client_destroy(&other);
    /* A blob saved against the previous plan order (format 1) names the
     * batches of another order: refused, saying so. */
    uint32_t crc = emlio_crc32c(0, blob, len - 4);
    uint8_t format_now = blob[4];
    blob[4] = 1;
    uint32_t old = emlio_crc32c(0, blob, len - 4);
    for (int i = 0; i < 4; i++)
        blob[len - 4 + i] = (uint8_t)(old >> (8 * i));
    assert_int_equal(emlio_client_load_state(d, blob, len), EMLIO_ESTATE);
    assert_non_null(strstr(emlio_client_errmsg(d), "plan version 1"));
    blob[4] = format_now;
    for (int i = 0; i < 4; i++)
        blob[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    /* Format 2 (before the shared schedule's join cursor, at 72..79) is
     * read with cursor 0, format 3 (before the consumed spans' count at
     * 80..87) with no spans, format 4 (before the blend section, 8 bytes
     * without sources) as one dataset. */
    for (int format = 2; format <= 4; format++) {
        size_t keep = format == 2 ? 72 : format == 3 ? 80 : 88;
        size_t len2 = len - (88 - keep) - 8;
        uint8_t *two = malloc(len2);
        assert_non_null(two);
        memcpy(two, blob, keep);
        memcpy(two + keep, blob + 88, len - 88 - 12);
        two[4] = (uint8_t)format;
        uint32_t c2 = emlio_crc32c(0, two, len2 - 4);
        for (int i = 0; i < 4; i++)
            two[len2 - 4 + i] = (uint8_t)(c2 >> (8 * i));
        emlio_client_t *e = s_client(f, 4, false, EMLIO_SHUFFLE_WINDOW);
        assert_int_equal(emlio_client_load_state(e, two, len2), batches - 6);
        emlio_client_destroy(&e);
        free(two);
    }

    /* The right one resumes: exactly the rest of the epoch. */
    assert_int_equal(emlio_client_load_state(d, blob, len), batches - 6);
    emlio_client_free_blob(blob);
    int rc;
    while ((rc = emlio_client_next(d, &b)) == 1) {
        size_t n;
        const emlio_sample_t *s = emlio_batch_samples(b, &n);
        for (size_t k = 0; k < n; k++)
            seen[s[k].shard][s[k].record]++;
        emlio_batch_release(&b);
    }
    assert_int_equal(rc, 0);
    for (int s = 0; s < SHARDS; s++)
        for (int r = 0; r < RECORDS; r++)
            assert_int_equal(seen[s][r], 1);
    emlio_client_destroy(&d);
}

/* ---- elastic resume ------------------------------------------------------ */

/* Rank `rank` of `world` with batch `batch`, shuffled by windows. */
static emlio_client_t *
s_rank(fixture_t *f, uint32_t world, uint32_t rank, uint32_t batch,
       bool in_order)
{
    return s_job(f, world, rank, batch, in_order, EMLIO_SHUFFLE_WINDOW);
}

/* Takes up to `max` batches (all: SIZE_MAX) from c, counting the samples
 * that are not padding in seen; returns the batches taken. */
static size_t
s_take(emlio_client_t *c, size_t max, uint8_t seen[SHARDS][RECORDS])
{
    size_t got = 0;
    emlio_batch_t *b;
    while (got < max && emlio_client_next(c, &b) == 1) {
        size_t n;
        const emlio_sample_t *s = emlio_batch_samples(b, &n);
        for (size_t k = 0; k < n; k++) {
            s_check_sample(c, &s[k]);
            if (!s[k].pad)
                seen[s[k].shard][s[k].record]++;
        }
        emlio_batch_release(&b);
        got++;
    }
    return got;
}

/* One run of the job: `world` ranks with batch `batch` resume from the
 * n_in states (none: the epoch starts), each takes take[rank] batches
 * (SIZE_MAX: the rest) and saves its state into out[rank]. */
static void
s_run(fixture_t *f, uint32_t world, uint32_t batch, uint8_t **in,
      size_t *in_len, size_t n_in, const size_t *take,
      uint8_t seen[SHARDS][RECORDS], uint8_t **out, size_t *out_len)
{
    for (uint32_t r = 0; r < world; r++) {
        emlio_client_t *c = s_rank(f, world, r, batch, false);
        int n = n_in ? emlio_client_load_states(c, (const uint8_t *const *)in,
                                                in_len, n_in)
                     : emlio_client_begin_epoch(c, 1);
        assert_true(n >= 0);
        size_t got = s_take(c, take[r], seen);
        assert_true(take[r] == SIZE_MAX ? got == (size_t)n : got == take[r]);
        assert_int_equal(emlio_client_save_state(c, &out[r], &out_len[r]), 0);
        emlio_client_destroy(&c);
    }
}

static void
s_free_states(uint8_t **blobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        emlio_client_free_blob(blobs[i]);
}

/* The scenario at unit scale: an epoch started on 4 ranks,
 * interrupted, resumed on 2, interrupted, finished on 3 (global batch 12
 * throughout); every sample arrives exactly once over the three runs. */
static void
test_client_elastic_resume_delivers_each_sample_once(void **state)
{
    fixture_t *f = *state;
    uint8_t seen[SHARDS][RECORDS] = { { 0 } };
    uint8_t *a[4], *b[2], *c[3];
    size_t a_len[4], b_len[2], c_len[3];
    s_run(f, 4, 3, NULL, NULL, 0, (size_t[]){ 1, 3, 0, 2 }, seen, a, a_len);
    s_run(f, 2, 6, a, a_len, 4, (size_t[]){ 1, 2 }, seen, b, b_len);
    s_free_states(a, 4);
    s_run(f, 3, 4, b, b_len, 2, (size_t[]){ SIZE_MAX, SIZE_MAX, SIZE_MAX },
          seen, c, c_len);
    for (int s = 0; s < SHARDS; s++)
        for (int r = 0; r < RECORDS; r++)
            assert_int_equal(seen[s][r], 1);

    /* The finished run's states resume to nothing left. */
    emlio_client_t *d = s_rank(f, 1, 0, 12, false);
    assert_int_equal(
        emlio_client_load_states(d, (const uint8_t *const *)c, c_len, 3), 0);
    emlio_batch_t *batch;
    assert_int_equal(emlio_client_next(d, &batch), 0);
    emlio_client_destroy(&d);
    s_free_states(b, 2);
    s_free_states(c, 3);
}

/* Expects load_states of the n states to fail naming `why`, on a client
 * of world x batch. */
static void
s_refused(fixture_t *f, uint32_t world, uint32_t batch, uint8_t **blobs,
          size_t *lens, size_t n, const char *why)
{
    emlio_client_t *c = s_rank(f, world, 0, batch, false);
    assert_int_equal(
        emlio_client_load_states(c, (const uint8_t *const *)blobs, lens, n),
        n ? EMLIO_ESTATE : EMLIO_EINVAL);
    if (!strstr(emlio_client_errmsg(c), why))
        fail_msg("load_states said \"%s\", expected \"%s\"",
                 emlio_client_errmsg(c), why);
    emlio_client_destroy(&c);
}

static void
test_client_elastic_resume_refuses_states_of_another_run(void **state)
{
    fixture_t *f = *state;
    uint8_t seen[SHARDS][RECORDS] = { { 0 } };
    uint8_t *a[4], *mixed[4];
    size_t a_len[4], mixed_len[4];
    s_run(f, 4, 3, NULL, NULL, 0, (size_t[]){ 1, 1, 1, 1 }, seen, a, a_len);

    s_refused(f, 2, 6, a, a_len, 0, "no resume state");
    s_refused(f, 2, 6, a, a_len, 3, "no resume state of rank 3 of the 4");
    memcpy(mixed, a, sizeof(mixed));
    memcpy(mixed_len, a_len, sizeof(mixed_len));
    mixed[3] = a[0];
    mixed_len[3] = a_len[0];
    s_refused(f, 2, 6, mixed, mixed_len, 4,
              "resume state 0 of 4 and resume state 3 of 4 are both of rank 0");
    s_refused(f, 2, 5, a, a_len, 4,
              "global batch 4 x 3 = 12, this run's is "
              "2 x 5 = 10");
    s_refused(f, 5, 2, a, a_len, 4, "this world size does not divide it");

    /* Ranks 0..2 began epoch 2 while rank 3 was still in epoch 1: refused
     * while rank 3 had not finished it, resumed once it had (it only ran
     * behind). */
    uint8_t seen2[SHARDS][RECORDS] = { { 0 } };
    uint8_t *late[4], *next[2];
    size_t late_len[4], next_len[2];
    for (uint32_t r = 0; r < 3; r++) {
        emlio_client_t *c = s_rank(f, 4, r, 3, false);
        assert_int_equal(emlio_client_begin_epoch(c, 2), 5);
        assert_int_equal(s_take(c, 1, seen2), 1);
        assert_int_equal(emlio_client_save_state(c, &late[r], &late_len[r]), 0);
        emlio_client_destroy(&c);
    }
    late[3] = a[3];
    late_len[3] = a_len[3];
    s_refused(f, 2, 6, late, late_len, 4,
              "resume state 3 of 4 is in epoch 1 unfinished while another is "
              "in epoch 2");
    emlio_client_t *c = s_rank(f, 4, 3, 3, false);
    assert_int_equal(emlio_client_load_state(c, a[3], a_len[3]), 4);
    assert_int_equal(s_take(c, SIZE_MAX, seen), 4);
    assert_int_equal(emlio_client_save_state(c, &late[3], &late_len[3]), 0);
    emlio_client_destroy(&c);
    s_run(f, 2, 6, late, late_len, 4, (size_t[]){ SIZE_MAX, SIZE_MAX }, seen2,
          next, next_len);
    for (int s = 0; s < SHARDS; s++)
        for (int r = 0; r < RECORDS; r++)
            assert_int_equal(seen2[s][r], 1);
    s_free_states(late, 4);
    s_free_states(next, 2);

    /* Damage and another job's state are named by number. */
    a[2][a_len[2] / 2] ^= 1;
    s_refused(f, 2, 6, a, a_len, 4, "resume state 2 of 4 is damaged");
    a[2][a_len[2] / 2] ^= 1;
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = 6;
    cfg.world = 2;
    cfg.seed = 4;
    cfg.shuffle = EMLIO_SHUFFLE_WINDOW;
    c = s_connect(f, f->srv, &cfg);
    assert_int_equal(
        emlio_client_load_states(c, (const uint8_t *const *)a, a_len, 4),
        EMLIO_ESTATE);
    assert_non_null(
        strstr(emlio_client_errmsg(c), "0 of 4 was made with another seed"));
    emlio_client_destroy(&c);

    /* One rank's state alone on another world size says what to do. */
    c = s_rank(f, 2, 0, 6, false);
    assert_int_equal(emlio_client_load_state(c, a[0], a_len[0]), EMLIO_ESTATE);
    assert_non_null(strstr(emlio_client_errmsg(c), "emlio_client_load_states"));
    emlio_client_destroy(&c);
    s_free_states(a, 4);
}

/* A TCP socket that listens and never says a word: the kernel completes
 * connects (backlog), ZeroMQ's handshake never does. Its endpoint in ep;
 * returns the fd to close. */
static int
s_silent_listener(char *ep, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    snprintf(ep, len, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    return fd;
}

static void
test_client_misuse_and_bad_endpoints(void **state)
{
    fixture_t *f = *state;
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.connect_timeout_ms = 200;
    emlio_client_t *c = emlio_client_new(f->ctx, &cfg);
    emlio_batch_t *b;
    assert_int_equal(emlio_client_begin_epoch(c, 0), EMLIO_EINVAL);
    assert_int_equal(emlio_client_next(c, &b), EMLIO_EINVAL);
    /* Nothing listens: refused at once, naming the endpoint. */
    assert_int_equal(emlio_client_connect(c, "tcp://127.0.0.1:1"),
                     -ECONNREFUSED);
    assert_non_null(strstr(emlio_client_errmsg(c), "tcp://127.0.0.1:1"));
    emlio_client_destroy(&c);
    /* Something listens but never answers: the connect timeout. */
    char silent[64];
    int lfd = s_silent_listener(silent, sizeof(silent));
    c = s_connect_fails(f, &cfg, silent, EMLIO_ETIMEDOUT);
    assert_non_null(strstr(emlio_client_errmsg(c), silent));
    close(lfd);
    emlio_client_destroy(&c);
    c = s_connect_fails(f, &cfg, "tcp://127.0.0.1:1,,x", EMLIO_EINVAL);
    emlio_client_destroy(&c);
    cfg.curve_server_key = "too short";
    c = s_connect_fails(f, &cfg, emlio_server_endpoint(f->srv), EMLIO_EINVAL);
    emlio_client_destroy(&c);
    emlio_client_destroy(NULL);
    emlio_batch_release(NULL);
}

/* A failed connect leaves the client as new: connect may be retried. */
static void
test_client_connect_can_be_retried(void **state)
{
    fixture_t *f = *state;
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.connect_timeout_ms = 200;
    emlio_client_t *c =
        s_connect_fails(f, &cfg, "tcp://127.0.0.1:1", -ECONNREFUSED);
    assert_int_equal(emlio_client_shard_count(c), 0);
    assert_int_equal(emlio_client_daemon_count(c), 0);
    assert_int_equal(emlio_client_connect(c, emlio_server_endpoint(f->srv)), 1);
    assert_int_equal(emlio_client_shard_count(c), SHARDS);
    emlio_client_destroy(&c);
}

/* Which ZeroMQ I/O threads a client's streams use (iolanes.h): with
 * cfg.io_threads = 1 all on one, and the tuner never takes another; with
 * the default, a daemon on this host (these tests' loopback) or fixed
 * streams use both at once (a daemon elsewhere starts on one: that logic
 * is test_iolanes'). */
static void
test_client_io_threads_by_config_and_locality(void **state)
{
    fixture_t *f = *state;

    /* want: the threads that carry streams; one fixed stream is on one
     * thread, whatever lanes it may use. */
    static const struct {
        uint32_t io_threads, streams, want;
    } cases[] = { { 1, 0, 1 }, { 0, 0, 2 }, { 0, 3, 2 }, { 0, 1, 1 } };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        emlio_client_config_t cfg;
        emlio_client_config_init(&cfg);
        cfg.batch_size = 4;
        cfg.io_threads = cases[k].io_threads;
        cfg.streams = cases[k].streams;
        emlio_client_t *c = s_connect(f, f->srv, &cfg);
        emlio_client_stats_t st;
        emlio_client_stats(c, &st);
        emlio_stream_stats_t ss[8];
        size_t n = emlio_client_streams(c, ss, 8);
        assert_true(n >= 1 && n <= 8);
        assert_int_equal(st.io_threads, cases[k].want);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(ss[i].io_thread, cases[k].want == 1 ? 0 : i % 2);
        if (cases[k].streams)
            assert_int_equal(n, cases[k].streams);
        else
            assert_true(n >= 2);
        /* No lane left to take: a tuner tick has nothing to measure the
         * I/O threads for, and reads nothing of /proc. */
        c->conn.tuner.last_tick_ns = 0;
        assert_int_equal(emlio__client_tune(c, 0), 0);
        assert_int_equal(c->conn.lanes.tick_ns, 0);
        int batches = emlio_client_begin_epoch(c, 0);
        assert_int_equal(s_drain_epoch(c, 0, false), batches);
        emlio_client_destroy(&c);
    }
}

/* A lane taken (iolanes.h) gets a share of every daemon's streams, each
 * counted by its own: a daemon that took fewer streams (it refused more,
 * or descriptors ran out) does not keep the others off the new lane. */
static void
test_client_new_lane_takes_each_daemons_share(void **state)
{
    fixture_t *f = *state;
    emlio_server_config_t scfg;
    emlio_server_config_init(&scfg);
    scfg.data_dir = f->dir;
    emlio_server_t *srv2 = test_server_up(f->ctx, &scfg, SHARDS);
    char eps[256];
    snprintf(eps, sizeof(eps), "%s,%s", emlio_server_endpoint(f->srv),
             emlio_server_endpoint(srv2));
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = 4;
    cfg.io_threads = 1; /* loopback would use both at once */
    emlio_client_t *c = emlio_client_new(f->ctx, &cfg);
    assert_non_null(c);
    assert_int_equal(emlio_client_connect(c, eps), 2);
    assert_int_equal(c->conn.n_daemons, 2);
    assert_int_equal(c->conn.lanes.used, 1);
    /* Daemon 1 stays where it is; daemon 0 has 4 streams. */
    emlio__cdaemon_t *d0 = &c->conn.daemons[0], *d1 = &c->conn.daemons[1];
    uint32_t n1 = d1->n_streams;
    assert_true(n1 >= 1 && n1 < 4);
    d1->max_streams = n1;
    assert_int_equal(emlio__client_add_streams(c, 4), 0);
    assert_int_equal(d0->n_streams, 4);
    assert_int_equal(d1->n_streams, n1);

    c->conn.lanes.threads = c->conn.lanes.used = 2; /* as a step takes one */
    assert_int_equal(emlio__client_add_lane_streams(c, 1), 0);
    assert_int_equal(d0->n_streams, 8);
    assert_int_equal(d1->n_streams, n1);
    for (uint32_t s = 4; s < 8; s++)
        assert_int_equal(d0->streams[s].lane, 1);
    emlio_client_stats_t st;
    emlio_client_stats(c, &st);
    assert_int_equal(st.io_threads, 2);
    int batches = emlio_client_begin_epoch(c, 0);
    assert_int_equal(s_drain_epoch(c, 0, false), batches);
    emlio_client_destroy(&c);
    emlio_server_destroy(&srv2);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_epoch_delivers_every_sample_once),
        cmocka_unit_test(test_client_epochs_overlap_exactly_once),
        cmocka_unit_test(test_client_in_order_follows_the_plan),
        cmocka_unit_test(test_client_parts_reassemble_in_plan_order),
        cmocka_unit_test(
            test_client_batch_beyond_the_daemons_limits_is_refused),
        cmocka_unit_test(test_client_parts_of_multi_field_samples),
        cmocka_unit_test(test_client_resume_state_delivers_the_rest),
        cmocka_unit_test(test_client_elastic_resume_delivers_each_sample_once),
        cmocka_unit_test(
            test_client_elastic_resume_refuses_states_of_another_run),
        cmocka_unit_test(test_client_misuse_and_bad_endpoints),
        cmocka_unit_test(test_client_connect_can_be_retried),
        cmocka_unit_test(test_client_io_threads_by_config_and_locality),
        cmocka_unit_test(test_client_new_lane_takes_each_daemons_share),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
