/* test_server.c - emlio_server_t in process: misuse and errors reported
 * with a message, slots freed as soon as a connection closes, and frames
 * that ZeroMQ still holds when the server is destroyed.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <zmq.h>

#include "crc32c.h"
#include "server_internal.h"
#include "wire.h"

/* A HELLO without a session. */
static int
s_encode_hello(emlio_buf_t *buf, const char *name)
{
    emlio__wire_hello_t h = { .name = name };
    return emlio__wire_encode_hello(buf, &h);
}

#define RECORDS 16

/* RECORDS Examples of `bytes`-byte images; with flips, byte flips[r] of
 * record r's data is flipped when it is not SIZE_MAX (a corrupt record). */
static void
s_write_records(const char *dir, size_t bytes, const size_t *flips)
{
    emlio_buf_t file = EMLIO_BUF_INIT;
    emlio_buf_t ex = EMLIO_BUF_INIT;
    uint8_t *payload = malloc(bytes ? bytes : 1);
    assert_non_null(payload);
    for (int r = 0; r < RECORDS; r++) {
        memset(payload, r, bytes);
        emlio_buf_clear(&ex);
        assert_int_equal(emlio_example_build(&ex, "image/encoded", payload,
                                             bytes, "image/class/label", r),
                         0);
        size_t data = file.len + 12; /* u64 length, u32 its CRC */
        assert_int_equal(emlio_tfrecord_append(&file, ex.data, ex.len), 0);
        if (flips && flips[r] != SIZE_MAX)
            file.data[data + flips[r] % ex.len] ^= 0x10;
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/part-0.tfrecord", dir);
    test_write_file(path, file.data, file.len);
    if (flips) {
        /* An index, so that loading (which verifies every record when it
         * has to scan the shard) does not find the corruption first. */
        char idx[160];
        snprintf(idx, sizeof(idx), "%s.idx", path);
        emlio_tfrecord_t *tf = emlio_tfrecord_new(path);
        assert_int_equal(emlio_tfrecord_open(tf), 0);
        assert_int_equal(emlio_tfrecord_scan(tf, false), RECORDS);
        assert_int_equal(emlio_tfrecord_write_index(tf, idx), 0);
        emlio_tfrecord_destroy(&tf);
    }
    free(payload);
    emlio_buf_release(&file);
    emlio_buf_release(&ex);
}

static void
s_write_dataset(const char *dir)
{
    s_write_records(dir, 8192, NULL);
}

/* A started server on dir; sndbuf as in emlio_server_config_t (0: the
 * default). */
static emlio_server_t *
s_server_sized(emlio_ctx_t *ctx, const char *dir, uint32_t max_clients,
               int64_t sndbuf)
{
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.max_clients = max_clients;
    cfg.sndbuf = sndbuf;
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    assert_non_null(srv);
    assert_int_equal(emlio_server_load(srv), 1);
    assert_int_equal(emlio_server_bind(srv, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(emlio_server_start(srv), 0);
    return srv;
}

static emlio_server_t *
s_server(emlio_ctx_t *ctx, const char *dir, uint32_t max_clients)
{
    return s_server_sized(ctx, dir, max_clients, 0);
}

static void
test_server_misuse_and_errors_say_why(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_start(srv), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_server_errmsg(srv), "before start"));
    assert_int_equal(emlio_server_load(srv), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_server_errmsg(srv), dir));
    int rc = emlio_server_bind(srv, "tcp://127.0.0.1:notaport");
    assert_true(rc < 0);
    assert_non_null(strstr(emlio_server_errmsg(srv), "notaport"));
    assert_int_equal(emlio_server_bind(srv, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(emlio_server_bind(srv, "tcp://127.0.0.1:*"), EMLIO_EINVAL);
    emlio_server_destroy(&srv);
    assert_null(srv);
    emlio_server_destroy(&srv);
    emlio_server_destroy(NULL);
    /* An empty dataset is an error, not an empty epoch. */
    char path[128];
    snprintf(path, sizeof(path), "%s/zero.tfrecord", dir);
    test_write_file(path, "", 0);
    srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_server_errmsg(srv), "empty"));
    emlio_server_destroy(&srv);
    /* Modes outside their enums are refused, naming the field. */
    cfg.coalesce = 7;
    srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_server_errmsg(srv), "coalesce mode 7"));
    emlio_server_destroy(&srv);
    cfg.coalesce = EMLIO_COALESCE_AUTO;
    cfg.pack = -1;
    srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_server_errmsg(srv), "pack mode -1"));
    emlio_server_destroy(&srv);
    cfg.pack = EMLIO_PACK_AUTO;
    cfg.on_corrupt = 5;
    srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_server_errmsg(srv), "on_corrupt mode 5"));
    emlio_server_destroy(&srv);
    cfg.on_corrupt = EMLIO_ON_CORRUPT_FAIL;
    /* Decode threads beyond the bound: refused before any is started. */
    cfg.transform_threads = EMLIO_SERVER_MAX_TRANSFORM_THREADS + 1;
    srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), EMLIO_EINVAL);
    assert_non_null(strstr(emlio_server_errmsg(srv), "limit of 1024"));
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    test_rmtree(dir);
}

/* A client that goes away frees its slot at once: with max_clients 1, one
 * client after another is admitted without waiting for an idle timeout. */
static void
test_server_slot_freed_when_connection_closes(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    s_write_dataset(dir);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_t *srv = s_server(ctx, dir, 1);
    for (int i = 0; i < 10; i++) {
        emlio_client_config_t cfg;
        emlio_client_config_init(&cfg);
        cfg.streams = 1;
        cfg.connect_timeout_ms = 2000;
        emlio_client_t *c = emlio_client_new(ctx, &cfg);
        int rc = emlio_client_connect(c, emlio_server_endpoint(srv));
        for (int k = 0; rc == EMLIO_ELIMIT && k < 10; k++) {
            /* The close of the previous one may race this HELLO by
             * microseconds; it must not take an idle timeout. */
            usleep(20000);
            rc = emlio_client_connect(c, emlio_server_endpoint(srv));
        }
        assert_int_equal(rc, 1);
        emlio_server_stats_t st;
        emlio_server_stats(srv, &st);
        emlio_client_destroy(&c);
    }
    emlio_server_stats_t st;
    uint64_t deadline = emlio__now_ns() + 3000000000ull;
    do {
        usleep(10000);
        emlio_server_stats(srv, &st);
    } while (st.active_clients && emlio__now_ns() < deadline);
    assert_int_equal(st.active_clients, 0);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    test_rmtree(dir);
}

/* Destroying the server while ZeroMQ still holds zero-copy frames of sent
 * batches (a peer that does not read) must not leave their free callback
 * pointing at freed memory (ASan checks this under make check). */
static void
test_server_destroy_with_frames_in_flight(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    s_write_dataset(dir);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_t *srv = s_server(ctx, dir, 16);
    void *zctx = zmq_ctx_new();
    void *dealer = zmq_socket(zctx, ZMQ_DEALER);
    int one = 1;
    int zero = 0;
    assert_int_equal(zmq_setsockopt(dealer, ZMQ_RCVHWM, &one, sizeof(one)), 0);
    assert_int_equal(zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof(zero)),
                     0);
    assert_int_equal(zmq_connect(dealer, emlio_server_endpoint(srv)), 0);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(s_encode_hello(&buf, "test"), 0);
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    emlio__wire_item_t items[RECORDS];
    for (uint32_t r = 0; r < RECORDS; r++)
        items[r] = (emlio__wire_item_t){ 0, r };
    for (uint64_t id = 1; id <= 64; id++) {
        assert_int_equal(emlio__wire_encode_get(&buf, id,
                                                emlio_server_dataset(srv),
                                                items, RECORDS, NULL),
                         0);
        assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    }
    emlio_buf_release(&buf);
    /* Let the daemon answer into the queues, then pull the rug. */
    uint64_t deadline = emlio__now_ns() + 3000000000ull;
    emlio_server_stats_t st;
    do {
        usleep(10000);
        emlio_server_stats(srv, &st);
    } while (st.requests < 8 && emlio__now_ns() < deadline);
    assert_true(st.requests >= 8);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    zmq_close(dealer);
    zmq_ctx_term(zctx);
    test_rmtree(dir);
}

/* Receives one reply on dealer (waiting up to 10 s) and decodes its
 * header; the frames after it are dropped. Returns its type. */
static int
s_reply(void *dealer, emlio__wire_msg_t *msg, zmq_msg_t *header)
{
    zmq_pollitem_t item = { dealer, 0, ZMQ_POLLIN, 0 };
    assert_int_equal(zmq_poll(&item, 1, 10000), 1);
    zmq_msg_init(header);
    assert_true(zmq_msg_recv(header, dealer, 0) >= 0);
    char err[EMLIO_ERRMSG_LEN];
    assert_true(emlio__wire_decode(msg, zmq_msg_data(header),
                                   zmq_msg_size(header), 1u << 20, err) >= 0);
    int more = zmq_msg_more(header);
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        assert_true(zmq_msg_recv(&part, dealer, 0) >= 0);
        more = zmq_msg_more(&part);
        zmq_msg_close(&part);
    }
    return msg->type;
}

/* Sends a GET of n copies of record 0 of shard 0. */
static void
s_get_same(void *dealer, emlio_server_t *srv, uint64_t id, size_t n)
{
    emlio__wire_item_t *items = calloc(n, sizeof(*items));
    assert_non_null(items);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(emlio__wire_encode_get(&buf, id, emlio_server_dataset(srv),
                                            items, n, NULL),
                     0);
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    emlio_buf_release(&buf);
    free(items);
}

/* Creates, loads (expecting one shard), binds and starts a server. */
static emlio_server_t *
s_start_cfg(emlio_ctx_t *ctx, const emlio_server_config_t *cfg)
{
    emlio_server_t *srv = emlio_server_new(ctx, cfg);
    assert_non_null(srv);
    assert_int_equal(emlio_server_load(srv), 1);
    assert_int_equal(emlio_server_bind(srv, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(emlio_server_start(srv), 0);
    return srv;
}

/* A DEALER connected to srv, closing at once when closed. */
static void *
s_dealer(void *zctx, emlio_server_t *srv)
{
    void *dealer = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof(zero)),
                     0);
    assert_int_equal(zmq_connect(dealer, emlio_server_endpoint(srv)), 0);
    return dealer;
}

/* Closes what s_start_cfg and s_dealer opened and removes dir. */
static void
s_teardown(void *dealer, void *zctx, emlio_server_t **srv, emlio_ctx_t **ctx,
           const char *dir)
{
    zmq_close(dealer);
    zmq_ctx_term(zctx);
    emlio_server_destroy(srv);
    emlio_ctx_destroy(ctx);
    test_rmtree(dir);
}

/* The copy budget: one GET naming a 200 KB ImageFolder file 4,096 times
 * (800 MB of copies for an 8 KB request) is refused with EMLIO_ELIMIT
 * before anything is read; GETs within the budget are served, those that
 * do not fit yet wait for earlier replies instead of adding memory. */
static void
test_server_copy_budget(void **state)
{
    (void)state;
    char dir[64], path[128];
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/cat", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/cat/a.jpg", dir);
    uint8_t *big = calloc(1, 200 * 1024);
    assert_non_null(big);
    test_write_file(path, big, 200 * 1024);
    free(big);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.max_copy_bytes = 500 * 1024; /* two of these files, not three */
    emlio_server_t *srv = s_start_cfg(ctx, &cfg);
    void *zctx = zmq_ctx_new();
    void *dealer = s_dealer(zctx, srv);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(s_encode_hello(&buf, "test"), 0);
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    emlio_buf_release(&buf);
    emlio__wire_msg_t msg;
    zmq_msg_t header;
    assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_WELCOME);
    assert_int_equal(msg.welcome.max_copy_bytes, 500 * 1024);
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);

    s_get_same(dealer, srv, 1, 4096);
    assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_ERROR);
    assert_int_equal(msg.error.code, EMLIO_ELIMIT);
    assert_non_null(strstr(msg.error.text, "--max-copy-bytes"));
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    /* Eight GETs of two copies each: 3.2 MB asked at once, at most two
     * in memory; all are answered. */
    for (uint64_t id = 2; id < 10; id++)
        s_get_same(dealer, srv, id, 2);
    for (int k = 0; k < 8; k++) {
        assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_BATCH);
        assert_int_equal(msg.batch.n_samples, 2);
        emlio__wire_msg_release(&msg);
        zmq_msg_close(&header);
    }
    s_teardown(dealer, zctx, &srv, &ctx, dir);
}

typedef struct s_lines {
    char all[4096];
} s_lines_t;

static void
s_collect(void *userdata, int level, const char *module, const char *msg)
{
    (void)level;
    (void)module;
    s_lines_t *lines = userdata;
    size_t used = strlen(lines->all);
    snprintf(lines->all + used, sizeof(lines->all) - used, "%s\n", msg);
}

/* Loads dir with cfg's field and label field; the load's result. */
static int
s_load_tar(const char *dir, const char *field, const char *label_field,
           s_lines_t *lines, char *err)
{
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_ctx_set_log(ctx, s_collect, lines, EMLIO_LOG_INFO);
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.field = field;
    cfg.label_field = label_field;
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    assert_non_null(srv);
    int rc = emlio_server_load(srv);
    snprintf(err, EMLIO_ERRMSG_LEN, "%s", emlio_server_errmsg(srv));
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    return rc;
}

/* Operator mistakes fail at start-up, or are left out with one line,
 * instead of every label -1 or every request failing: a stray README.txt
 * and a sample of only .cls are not served as images; --field and
 * --label-field that no sample has, and a label member that is not a
 * number, stop the load naming what is wrong. */
static void
test_server_operator_mistakes_fail_at_start(void **state)
{
    (void)state;
    char dir[64], path[128];
    test_mkdtemp(dir, sizeof(dir));
    emlio_buf_t tar = EMLIO_BUF_INIT;
    test_tar_member(&tar, "README.txt", 20, 'r');
    test_tar_member(&tar, "k0.jpg", 600, 'x');
    test_tar_member(&tar, "k0.cls", 1, '3');
    test_tar_member(&tar, "k1.cls", 1, '4');
    test_tar_member(&tar, "k2.jpg", 700, 'y');
    test_tar_member(&tar, "k2.cls", 1, '5');
    assert_int_equal(emlio_buf_add(&tar, (uint8_t[1024]){ 0 }, 1024), 0);
    snprintf(path, sizeof(path), "%s/a.tar", dir);
    test_write_file(path, tar.data, tar.len);
    emlio_buf_release(&tar);
    s_lines_t lines = { "" };
    char err[EMLIO_ERRMSG_LEN];
    assert_int_equal(s_load_tar(dir, NULL, NULL, &lines, err), 1);
    assert_non_null(strstr(lines.all, "left out 2 of 4 samples without an "
                                      "image member (e.g. 'README.txt'"));
    assert_non_null(strstr(lines.all, "2 records"));
    assert_true(s_load_tar(dir, "png", NULL, &lines, err) < 0);
    assert_non_null(strstr(err, "has a 'png' member"));
    assert_true(s_load_tar(dir, NULL, "lbl", &lines, err) < 0);
    assert_non_null(strstr(err, "label member 'lbl'"));
    assert_true(s_load_tar(dir, NULL, "jpg", &lines, err) < 0);
    assert_non_null(strstr(err, "is not an integer"));
    test_rmtree(dir);

    /* TFRecord: a --label-key no record has (a typo) stops the load. */
    test_mkdtemp(dir, sizeof(dir));
    s_write_dataset(dir);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.label_key = "image/label";
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    assert_true(emlio_server_load(srv) < 0);
    assert_non_null(strstr(emlio_server_errmsg(srv), "'image/label'"));
    emlio_server_destroy(&srv);
    cfg.label_key = "image/class/label"; /* given, and right */
    srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), 1);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    test_rmtree(dir);
}

/* On a --fields daemon a GET before any HELLO is served in the one
 * layout: its BATCH's offset table has a span per field of each sample,
 * as after HELLO. */
static void
test_server_fields_get_before_hello_is_served(void **state)
{
    (void)state;
    char dir[64], path[128];
    test_mkdtemp(dir, sizeof(dir));
    emlio_buf_t tar = EMLIO_BUF_INIT;
    test_tar_member(&tar, "k0.jpg", 600, 'x');
    test_tar_member(&tar, "k0.cls", 1, '3');
    snprintf(path, sizeof(path), "%s/a.tar", dir);
    test_write_file(path, tar.data, tar.len);
    emlio_buf_release(&tar);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.fields = "jpg,cls";
    emlio_server_t *srv = s_start_cfg(ctx, &cfg);
    void *zctx = zmq_ctx_new();
    void *dealer = s_dealer(zctx, srv);
    emlio__wire_msg_t msg;
    zmq_msg_t header;
    s_get_same(dealer, srv, 1, 1);
    assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_BATCH);
    assert_true(msg.batch.packed);
    assert_int_equal(msg.batch.n_samples, 1);
    assert_int_equal(msg.batch.n_spans, 2);
    assert_int_equal(msg.batch.spans[0].len, 600);
    assert_int_equal(msg.batch.spans[1].len, 1);
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    /* A HELLO of another version is refused, naming the one spoken. */
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(s_encode_hello(&buf, "test"), 0);
    uint8_t *v = memmem(buf.data, buf.len, "\xa1v\x04", 3);
    assert_non_null(v);
    v[2] = 3; /* "v": 3 */
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_ERROR);
    assert_int_equal(msg.error.code, EMLIO_EVERSION);
    assert_non_null(strstr(msg.error.text, "speaks version 4 only"));
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    assert_int_equal(s_encode_hello(&buf, "test"), 0);
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    emlio_buf_release(&buf);
    assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_WELCOME);
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    s_get_same(dealer, srv, 2, 1);
    assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_BATCH);
    assert_int_equal(msg.batch.n_spans, 2);
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    s_teardown(dealer, zctx, &srv, &ctx, dir);
}

/* An ImageFolder file deleted while served: skipped under --on-corrupt
 * skip (every epoch would fail otherwise), and without it an error that
 * names the file and says why (the errno's text). */
static void
test_server_deleted_file_is_skipped_or_named(void **state)
{
    (void)state;
    for (int skip = 0; skip < 2; skip++) {
        char dir[64], path[128];
        test_mkdtemp(dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/cat", dir);
        assert_int_equal(mkdir(path, 0755), 0);
        snprintf(path, sizeof(path), "%s/cat/a.jpg", dir);
        test_write_file(path, "aaaa", 4);
        snprintf(path, sizeof(path), "%s/cat/b.jpg", dir);
        test_write_file(path, "bbbb", 4);
        emlio_ctx_t *ctx = emlio_ctx_new();
        emlio_server_config_t cfg;
        emlio_server_config_init(&cfg);
        cfg.data_dir = dir;
        cfg.on_corrupt = skip ? EMLIO_ON_CORRUPT_SKIP : EMLIO_ON_CORRUPT_FAIL;
        emlio_server_t *srv = s_start_cfg(ctx, &cfg);
        assert_int_equal(unlink(path), 0); /* b.jpg, record 1 */
        void *zctx = zmq_ctx_new();
        void *dealer = s_dealer(zctx, srv);
        emlio__wire_item_t items[2] = { { 0, 0 }, { 0, 1 } };
        emlio_buf_t buf = EMLIO_BUF_INIT;
        assert_int_equal(emlio__wire_encode_get(&buf, 7,
                                                emlio_server_dataset(srv),
                                                items, 2, NULL),
                         0);
        assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
        emlio_buf_release(&buf);
        emlio__wire_msg_t msg;
        zmq_msg_t header;
        if (skip) {
            assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_BATCH);
            assert_int_equal(msg.batch.n_samples, 1);
        } else {
            assert_int_equal(s_reply(dealer, &msg, &header), EMLIO_MSG_ERROR);
            assert_non_null(strstr(msg.error.text, "cat/b.jpg"));
            assert_non_null(strstr(msg.error.text, strerror(ENOENT)));
        }
        emlio__wire_msg_release(&msg);
        zmq_msg_close(&header);
        s_teardown(dealer, zctx, &srv, &ctx, dir);
    }
}

/* A DEALER on zctx that reads at most one reply ahead (RCVHWM 1), with a
 * receive buffer of rcvbuf bytes (0: the kernel's) and a 5 s receive
 * timeout, connected to srv, that said HELLO. */
static void *
s_dealer_hello(void *zctx, emlio_server_t *srv, int rcvbuf)
{
    void *dealer = zmq_socket(zctx, ZMQ_DEALER);
    int one = 1;
    int zero = 0;
    int timeout = 5000;
    assert_int_equal(zmq_setsockopt(dealer, ZMQ_RCVHWM, &one, sizeof(one)), 0);
    assert_int_equal(zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof(zero)),
                     0);
    assert_int_equal(
        zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)), 0);
    if (rcvbuf)
        assert_int_equal(
            zmq_setsockopt(dealer, ZMQ_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    assert_int_equal(zmq_connect(dealer, emlio_server_endpoint(srv)), 0);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(s_encode_hello(&buf, "test"), 0);
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    emlio_buf_release(&buf);
    return dealer;
}

/* Receives one whole reply on dealer (header and frames); the header's
 * decoded type, or -1 after the receive timeout. */
static int
s_recv_reply(void *dealer)
{
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, dealer, 0) < 0) {
        zmq_msg_close(&frame);
        return -1;
    }
    emlio__wire_msg_t msg;
    char why[EMLIO_ERRMSG_LEN];
    int type = -1;
    if (emlio__wire_decode(&msg, zmq_msg_data(&frame), zmq_msg_size(&frame),
                           RECORDS, why) >= 0) {
        type = (int)msg.type;
        emlio__wire_msg_release(&msg);
    }
    while (zmq_msg_more(&frame)) {
        zmq_msg_close(&frame);
        zmq_msg_init(&frame);
        if (zmq_msg_recv(&frame, dealer, 0) < 0)
            break;
    }
    zmq_msg_close(&frame);
    return type;
}

/* A client that keeps within its credits is never taken for one that
 * sends without reading (issue 18): round after round it sends max_credit
 * GETs and reads the replies only once the daemon has answered them all,
 * so they wait in the daemon's send queue. libzmq's writer sees that queue
 * shrink only in steps of half its high-water mark; with a mark of
 * credits + 64 the second round looked full and the daemon closed the
 * connection, losing the replies. Small TCP buffers on both sides keep the
 * replies in the queue rather than in the kernel. */
static void
test_server_client_within_credits_is_never_closed(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    s_write_dataset(dir);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_t *srv = s_server_sized(ctx, dir, 16, 65536);
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg); /* the default credits */
    void *zctx = zmq_ctx_new();
    void *dealer = s_dealer_hello(zctx, srv, 65536);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
    emlio__wire_item_t items[RECORDS];
    for (uint32_t r = 0; r < RECORDS; r++)
        items[r] = (emlio__wire_item_t){ 0, r };
    uint64_t credits = cfg.max_credit;
    for (uint64_t round = 0; round < 4; round++) {
        for (uint64_t i = 1; i <= credits; i++) {
            assert_int_equal(emlio__wire_encode_get(&buf, round * credits + i,
                                                    emlio_server_dataset(srv),
                                                    items, RECORDS, NULL),
                             0);
            assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0),
                             (int)buf.len);
        }
        emlio_server_stats_t st;
        uint64_t deadline = emlio__now_ns() + 10000000000ull;
        do {
            usleep(10000);
            emlio_server_stats(srv, &st);
        } while (st.requests < (round + 1) * credits &&
                 emlio__now_ns() < deadline);
        assert_int_equal(st.requests, (round + 1) * credits);
        for (uint64_t i = 0; i < credits; i++)
            assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_BATCH);
        assert_int_equal(st.errors, 0);
    }
    emlio_buf_release(&buf);
    s_teardown(dealer, zctx, &srv, &ctx, dir);
}

/* A record whose stored CRC does not match is never served, whether the
 * flipped byte is in the image or after it, and whatever the image's size:
 * small images are checked over the whole record, large ones by combining
 * the CRCs of its parts (tfrecord.c, S_COMBINE_MIN). */
static void
test_server_corrupt_records_of_any_size_are_refused(void **state)
{
    (void)state;
    static const size_t sizes[] = { 100, 512, 8192 };
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        char dir[64];
        test_mkdtemp(dir, sizeof(dir));
        size_t flips[RECORDS];
        for (int r = 0; r < RECORDS; r++)
            flips[r] = SIZE_MAX;
        flips[3] = 40 + sizes[k] / 2; /* inside the image */
        flips[5] = SIZE_MAX - 1;      /* the last byte: the label */
        s_write_records(dir, sizes[k], flips);
        emlio_ctx_t *ctx = emlio_ctx_new();
        emlio_server_t *srv = s_server(ctx, dir, 16);
        void *zctx = zmq_ctx_new();
        void *dealer = s_dealer_hello(zctx, srv, 0);
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
        emlio_buf_t buf = EMLIO_BUF_INIT;
        for (uint32_t r = 0; r < RECORDS; r++) {
            emlio__wire_item_t item = { 0, r };
            assert_int_equal(emlio__wire_encode_get(&buf, r + 1,
                                                    emlio_server_dataset(srv),
                                                    &item, 1, NULL),
                             0);
            assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0),
                             (int)buf.len);
            assert_int_equal(s_recv_reply(dealer), r == 3 || r == 5
                                                       ? EMLIO_MSG_ERROR
                                                       : EMLIO_MSG_BATCH);
        }
        emlio_buf_release(&buf);
        s_teardown(dealer, zctx, &srv, &ctx, dir);
    }
}

/* Receives a one-sample reply (protocol v1: header, then the sample's
 * frame): its type; for a BATCH, *n its samples and *intact whether the
 * frame's CRC-32C is the quadruple's crc. */
static int
s_recv_one(void *dealer, size_t *n, bool *intact)
{
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    assert_true(zmq_msg_recv(&frame, dealer, 0) >= 0);
    emlio__wire_msg_t msg;
    char why[EMLIO_ERRMSG_LEN];
    assert_true(emlio__wire_decode(&msg, zmq_msg_data(&frame),
                                   zmq_msg_size(&frame), RECORDS, why) >= 0);
    int type = (int)msg.type;
    *n = type == EMLIO_MSG_BATCH ? msg.batch.n_samples : 0;
    uint32_t want = *n ? msg.batch.samples[0].crc : 0;
    emlio__wire_msg_release(&msg);
    *intact = false;
    if (*n) {
        assert_true(zmq_msg_more(&frame));
        zmq_msg_close(&frame);
        zmq_msg_init(&frame);
        assert_true(zmq_msg_recv(&frame, dealer, 0) >= 0);
        *intact =
            emlio_crc32c(0, zmq_msg_data(&frame), zmq_msg_size(&frame)) == want;
    }
    assert_false(zmq_msg_more(&frame));
    zmq_msg_close(&frame);
    return type;
}

/* Images too large to pack (served zero-copy) are sent, under --on-corrupt
 * fail, with the CRC their record's stored CRC says they must have, their
 * bytes unread by the daemon: an intact one's CRC is its bytes', a flipped
 * byte in the image or after it (the label) makes the client's check fail.
 * Under skip the daemon still checks them itself and leaves them out. */
static void
test_server_large_samples_carry_the_stored_crc(void **state)
{
    (void)state;
    static const size_t sizes[] = { 20000, 70000 };
    for (size_t k = 0; k < 2 * EMLIO_ARRAY_SIZE(sizes); k++) {
        bool skip = k % 2;
        size_t bytes = sizes[k / 2];
        char dir[64];
        test_mkdtemp(dir, sizeof(dir));
        size_t flips[RECORDS];
        for (int r = 0; r < RECORDS; r++)
            flips[r] = SIZE_MAX;
        flips[3] = 40 + bytes / 2; /* inside the image */
        flips[5] = SIZE_MAX - 1;   /* the last byte: the label */
        s_write_records(dir, bytes, flips);
        emlio_ctx_t *ctx = emlio_ctx_new();
        emlio_server_config_t cfg;
        emlio_server_config_init(&cfg);
        cfg.data_dir = dir;
        cfg.on_corrupt = skip ? EMLIO_ON_CORRUPT_SKIP : EMLIO_ON_CORRUPT_FAIL;
        emlio_server_t *srv = emlio_server_new(ctx, &cfg);
        assert_int_equal(emlio_server_load(srv), 1);
        assert_int_equal(emlio_server_bind(srv, "tcp://127.0.0.1:*"), 0);
        assert_int_equal(emlio_server_start(srv), 0);
        void *zctx = zmq_ctx_new();
        void *dealer = s_dealer_hello(zctx, srv, 0);
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
        emlio_buf_t buf = EMLIO_BUF_INIT;
        for (uint32_t r = 0; r < RECORDS; r++) {
            emlio__wire_item_t item = { 0, r };
            assert_int_equal(emlio__wire_encode_get(&buf, r + 1,
                                                    emlio_server_dataset(srv),
                                                    &item, 1, NULL),
                             0);
            assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0),
                             (int)buf.len);
            size_t n;
            bool intact;
            bool bad = r == 3 || r == 5;
            assert_int_equal(s_recv_one(dealer, &n, &intact), EMLIO_MSG_BATCH);
            assert_int_equal(n, skip && bad ? 0 : 1);
            if (n)
                assert_int_equal(intact, !bad);
        }
        emlio_server_stats_t st;
        emlio_server_stats(srv, &st);
        assert_int_equal(st.corrupt_skipped, skip ? 2 : 0);
        emlio_buf_release(&buf);
        s_teardown(dealer, zctx, &srv, &ctx, dir);
    }
}

/* Sends n GETs of all records (ids first_id on), each saying "pipelined"
 * or not. */
static void
s_send_gets(void *dealer, emlio_server_t *srv, uint64_t first_id, int n,
            bool pipelined)
{
    emlio__wire_item_t items[RECORDS];
    for (uint32_t r = 0; r < RECORDS; r++)
        items[r] = (emlio__wire_item_t){ 0, r };
    emlio__wire_xf_t xf = { .pipelined = pipelined };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    for (int i = 0; i < n; i++) {
        assert_int_equal(emlio__wire_encode_get(&buf, first_id + i,
                                                emlio_server_dataset(srv),
                                                items, RECORDS, &xf),
                         0);
        assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    }
    emlio_buf_release(&buf);
}

/* A job of the RECORDS records of shard `shard`, packed as for a client
 * on another host. */
static emlio__job_t
s_packed_job(emlio__wire_item_t *items, uint32_t shard)
{
    for (uint32_t r = 0; r < RECORDS; r++)
        items[r] = (emlio__wire_item_t){ shard, r };
    emlio__job_t job = { .pack = { .on = true,
                                   .max = EMLIO_SERVER_PACK_LARGE } };
    job.msg.get.items = items;
    job.msg.get.n_items = RECORDS;
    return job;
}

/* Which frames a protocol 4 client gets packed (cfg.pack): 70 KB images go
 * as frames of their own under auto over loopback (client and daemon share
 * the host) and under small, packed into the one frame under large; in
 * every mode each sample's CRC is the one its stored CRC says, so the
 * client's check catches a flipped byte in the daemon's copy as well. */
static void
test_server_pack_mode_decides_large_frames(void **state)
{
    (void)state;
    static const int modes[] = { EMLIO_PACK_AUTO, EMLIO_PACK_LARGE,
                                 EMLIO_PACK_SMALL };
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    size_t flips[RECORDS];
    for (int r = 0; r < RECORDS; r++)
        flips[r] = SIZE_MAX;
    flips[3] = 40 + 35000; /* inside record 3's image */
    s_write_records(dir, 70000, flips);
    for (size_t m = 0; m < EMLIO_ARRAY_SIZE(modes); m++) {
        emlio_ctx_t *ctx = emlio_ctx_new();
        emlio_server_config_t cfg;
        emlio_server_config_init(&cfg);
        assert_int_equal(cfg.pack, EMLIO_PACK_AUTO); /* default */
        cfg.data_dir = dir;
        cfg.pack = modes[m];
        emlio_server_t *srv = s_start_cfg(ctx, &cfg);
        void *zctx = zmq_ctx_new();
        void *dealer = s_dealer_hello(zctx, srv, 0);
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
        s_send_gets(dealer, srv, 1, 1, false);

        zmq_msg_t head, packed, own;
        zmq_msg_init(&head);
        zmq_msg_init(&packed);
        assert_true(zmq_msg_recv(&head, dealer, 0) >= 0);
        emlio__wire_msg_t msg;
        char why[EMLIO_ERRMSG_LEN];
        assert_true(emlio__wire_decode(&msg, zmq_msg_data(&head),
                                       zmq_msg_size(&head), RECORDS, why) >= 0);
        assert_int_equal(msg.type, EMLIO_MSG_BATCH);
        assert_int_equal(msg.batch.n_samples, RECORDS);
        assert_int_equal(msg.batch.n_spans, RECORDS);
        bool large = modes[m] == EMLIO_PACK_LARGE;
        if (large) {
            assert_true(zmq_msg_recv(&packed, dealer, 0) >= 0);
            assert_int_equal(emlio__wire_pack_check(
                                 msg.batch.spans, msg.batch.n_spans, RECORDS,
                                 true, zmq_msg_size(&packed), why),
                             0);
        }
        for (size_t j = 0; j < RECORDS; j++) {
            const emlio__wire_span_t *span = &msg.batch.spans[j];
            assert_int_equal(span->len, 70000);
            assert_int_equal(span->off == EMLIO_WIRE_PACK_OWN, !large);
            uint32_t crc;
            if (large) {
                crc = emlio_crc32c(
                    0, (const uint8_t *)zmq_msg_data(&packed) + span->off,
                    (size_t)span->len);
            } else {
                zmq_msg_init(&own);
                assert_true(zmq_msg_recv(&own, dealer, 0) >= 0);
                assert_int_equal(zmq_msg_size(&own), 70000);
                crc = emlio_crc32c(0, zmq_msg_data(&own), zmq_msg_size(&own));
                zmq_msg_close(&own);
            }
            assert_int_equal(crc == msg.batch.samples[j].crc, j != 3);
        }
        emlio__wire_msg_release(&msg);
        zmq_msg_close(&packed);
        zmq_msg_close(&head);
        emlio_server_stats_t st;
        emlio_server_stats(srv, &st);
        assert_int_equal(st.bytes, RECORDS * 70000);
        assert_int_equal(st.packed_bytes, large ? RECORDS * 70000 : 0);
        zmq_close(dealer);
        zmq_ctx_term(zctx);
        emlio_server_destroy(&srv);
        emlio_ctx_destroy(&ctx);
    }
    test_rmtree(dir);
}

/* Packing is an optimisation: a packed GET that the copy budget cannot
 * take now packs what fits (nothing, at worst) and goes at once, its other
 * frames zero-copy from the mapping, rather than wait for earlier replies
 * to free the budget (256 KiB frames made every GET of a connection under
 * a budget of a few batches wait for one). */
static void
test_server_packing_never_waits_for_the_budget(void **state)
{
    (void)state;
    char dir[64], text[EMLIO_ERRMSG_LEN];
    test_mkdtemp(dir, sizeof(dir));
    s_write_records(dir, 70000, NULL);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.pack = EMLIO_PACK_LARGE;
    cfg.max_copy_bytes = (1u << 20) + 200000;
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), 1);
    emlio__wire_item_t items[RECORDS];
    emlio__peer_t peer = { .copy = emlio__srv_copy_acct_new() };
    assert_non_null(peer.copy);
    emlio__job_t jobs[4];
    uint64_t half = cfg.max_copy_bytes / 2;
    uint64_t want[4] = { half, half, cfg.max_copy_bytes - 2 * half, 0 };
    for (int k = 0; k < 4; k++) {
        jobs[k] = s_packed_job(items, 0);
        /* Admitted at once (0), none parked to wait (1). */
        assert_int_equal(emlio__srv_copy_admit(srv, &jobs[k], &peer, false,
                                               text, sizeof(text)),
                         0);
        assert_int_equal(jobs[k].pack.cap, want[k]);
        assert_int_equal(jobs[k].copy.charge.bytes, want[k]);
    }
    for (int k = 0; k < 4; k++)
        emlio__srv_copy_release(&jobs[k].copy.charge);
    assert_int_equal(atomic_load(&peer.copy->bytes), 0);
    emlio__srv_copy_acct_unref(&peer.copy);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    test_rmtree(dir);
}

/* Packing takes none of the budget that a parked GET waits for: shard 1,
 * open for writing here, cannot be leased, so its GETs copy their records
 * and the third waits; a GET of the leased shard 0 then goes without
 * packing instead of taking the budget that the first's release freed
 * (under steady packed traffic the parked GET would never fit). */
static void
test_server_packing_leaves_the_budget_to_parked_gets(void **state)
{
    (void)state;
    char dir[64], other[64], from[128], path[128], text[EMLIO_ERRMSG_LEN];
    test_mkdtemp(dir, sizeof(dir));
    test_mkdtemp(other, sizeof(other));
    s_write_records(dir, 70000, NULL);
    s_write_records(other, 70000, NULL);
    snprintf(from, sizeof(from), "%s/part-0.tfrecord", other);
    snprintf(path, sizeof(path), "%s/part-1.tfrecord", dir);
    assert_int_equal(rename(from, path), 0);
    test_rmtree(other);
    int writer = open(path, O_WRONLY);
    assert_true(writer >= 0);
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.max_copy_bytes = 3000000;
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    assert_int_equal(emlio_server_load(srv), 2);
    emlio__peer_t peer = { .copy = emlio__srv_copy_acct_new() };
    emlio__wire_item_t items[4][RECORDS];
    emlio__job_t jobs[4];
    for (int k = 0; k < 3; k++) { /* shard 1: copies, charged 1.5 MB */
        jobs[k] = s_packed_job(items[k], 1);
        /* The third does not fit: the gate would park it (1). */
        assert_int_equal(emlio__srv_copy_admit(srv, &jobs[k], &peer, false,
                                               text, sizeof(text)),
                         k == 2);
    }
    assert_int_equal(jobs[0].copy.charge.bytes, cfg.max_copy_bytes / 2);
    assert_int_equal(jobs[2].pack.cap, 0);
    assert_int_equal(jobs[2].copy.charge.bytes, 0);
    emlio__srv_copy_release(&jobs[0].copy.charge);
    /* With the third parked (queued), a GET of the leased shard 0 packs
     * nothing. */
    jobs[3] = s_packed_job(items[3], 0);
    assert_int_equal(
        emlio__srv_copy_admit(srv, &jobs[3], &peer, true, text, sizeof(text)),
        0);
    assert_int_equal(jobs[3].pack.cap, 0);
    assert_int_equal(jobs[3].copy.charge.bytes, 0);
    /* What the release freed is still there for the parked GET, which the
     * gate's way out then charges. */
    assert_true(atomic_load(&peer.copy->bytes) + jobs[2].copy.want <=
                cfg.max_copy_bytes);
    assert_true(emlio__srv_copy_charge_if_fits(srv, &jobs[2], peer.copy));
    assert_int_equal(jobs[2].copy.charge.bytes, jobs[2].copy.want);
    /* And no more than the budget's rest fits now. */
    jobs[0].copy.want = cfg.max_copy_bytes - atomic_load(&peer.copy->bytes) + 1;
    assert_false(emlio__srv_copy_charge_if_fits(srv, &jobs[0], peer.copy));
    emlio__srv_copy_release(&jobs[2].copy.charge);
    emlio__srv_copy_release(&jobs[1].copy.charge);
    emlio__srv_copy_acct_unref(&peer.copy);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    close(writer);
    test_rmtree(dir);
}

/* The daemon's end of the one TCP connection to srv: the descriptor of this
 * process bound to the server's port with a peer (the listener has none,
 * the client's end has the port as its peer's). */
static int
s_daemon_end(emlio_server_t *srv)
{
    const char *ep = emlio_server_endpoint(srv);
    const char *colon = strrchr(ep, ':');
    assert_non_null(colon);
    int port = atoi(colon + 1);
    for (int fd = 3; fd < 4096; fd++) {
        struct sockaddr_in me, peer;
        socklen_t len = sizeof(me);
        if (getsockname(fd, (struct sockaddr *)&me, &len) != 0 ||
            me.sin_family != AF_INET || ntohs(me.sin_port) != port)
            continue;
        len = sizeof(peer);
        if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0)
            return fd;
    }
    fail_msg("no connection to %s found", ep);
    return -1;
}

static int
s_nodelay(int fd)
{
    int v = -1;
    socklen_t len = sizeof(v);
    assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
    return v;
}

/* TCP_NODELAY on fd once the daemon has let go of the last reply: the
 * reply's last frame sets it when ZeroMQ frees that frame, in an I/O
 * thread, which may be after the client has read the bytes; so this waits
 * (at most 10 s) for a 1 rather than reading it once. */
static int
s_nodelay_settled(int fd)
{
    for (int i = 0; i < 10000 && s_nodelay(fd) != 1; i++)
        usleep(1000);
    return s_nodelay(fd);
}

/* s_send_gets, then waits for the n replies. */
static void
s_gets(void *dealer, emlio_server_t *srv, uint64_t first_id, int n,
       bool pipelined)
{
    s_send_gets(dealer, srv, first_id, n, pipelined);
    for (int i = 0; i < n; i++)
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_BATCH);
}

/* Whatever the mode and whatever the GETs say ("pipelined", docs/protocol.md
 * 5.3), once a reply has been written the connection is back at
 * TCP_NODELAY: its end was pushed, and nothing waits for an ACK (a tail
 * held for the client's next GET, which comes only as replies arrive,
 * would wait a round trip). */
static void
test_server_pushes_the_last_reply_of_a_pipeline(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    s_write_records(dir, 100000, NULL); /* samples above a segment */
    static const int modes[] = { EMLIO_COALESCE_ALWAYS, EMLIO_COALESCE_NEVER,
                                 EMLIO_COALESCE_AUTO };
    for (size_t m = 0; m < EMLIO_ARRAY_SIZE(modes); m++) {
        emlio_ctx_t *ctx = emlio_ctx_new();
        emlio_server_config_t cfg;
        emlio_server_config_init(&cfg);
        assert_int_equal(cfg.coalesce, EMLIO_COALESCE_AUTO); /* default */
        cfg.data_dir = dir;
        cfg.coalesce = modes[m];
        emlio_server_t *srv = s_start_cfg(ctx, &cfg);
        void *zctx = zmq_ctx_new();
        void *dealer = s_dealer_hello(zctx, srv, 0);
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
        int fd = s_daemon_end(srv);
        assert_int_equal(s_nodelay(fd), 1); /* as ZeroMQ set it */

        /* Whatever happened between them, the last reply found no other
         * GET unanswered. */
        s_gets(dealer, srv, 1, 4, true);
        assert_int_equal(s_nodelay_settled(fd), 1);
        s_gets(dealer, srv, 10, 1, false);
        assert_int_equal(s_nodelay_settled(fd), 1);
        /* The second of two GETs, whose first was answered already. */
        s_gets(dealer, srv, 20, 1, true);
        assert_int_equal(s_nodelay_settled(fd), 1);
        s_gets(dealer, srv, 30, 3, true);
        assert_int_equal(s_nodelay_settled(fd), 1);

        zmq_close(dealer);
        zmq_ctx_term(zctx);
        emlio_server_destroy(&srv);
        emlio_ctx_destroy(&ctx);
    }
    test_rmtree(dir);
}

/* A connected loopback TCP socket (the daemon's end); *other is the
 * client's end and *lfd the listener. */
static int
s_tcp_pair(int *other, int *lfd)
{
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    *lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*lfd >= 0);
    assert_int_equal(bind(*lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(*lfd, 1), 0);
    assert_int_equal(getsockname(*lfd, (struct sockaddr *)&a, &len), 0);
    *other = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(*other, (struct sockaddr *)&a, sizeof(a)), 0);
    int fd = accept(*lfd, NULL, NULL);
    assert_true(fd >= 0);
    return fd;
}

/* The decision alone, on a server record with one connection: a peer
 * coalesces once two of its GETs are unanswered, and stays so; never when
 * its descriptor now names another client's socket (even when the
 * connection record, after lost monitor events, is that one's), over
 * loopback in "auto", or on a Unix socket (IPC). The decision itself
 * touches no socket option: the reply's frames do (next test). */
static void
test_server_coalesce_decision(void **state)
{
    (void)state;
    int client, lfd;
    int fd = s_tcp_pair(&client, &lfd);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    emlio_server_t *srv = calloc(1, sizeof(*srv));
    assert_non_null(srv);
    emlio__conn_t conn = { .fd = fd, .ino = st.st_ino };
    srv->adm.conns = &conn;
    srv->adm.n_conns = 1;
    srv->cfg.coalesce = EMLIO_COALESCE_ALWAYS;
    emlio__peer_t peer = { .fd = fd, .ino = st.st_ino, .outstanding = 1 };
    emlio__srv_peer_coalesce(srv, &peer);
    assert_false(peer.coalescing); /* a lone request: not yet */
    peer.outstanding = 2;
    emlio__srv_peer_coalesce(srv, &peer);
    assert_true(peer.coalescing);
    assert_int_equal(s_nodelay(fd), 0); /* untouched: the kernel's default */
    peer.outstanding = 0;
    emlio__srv_peer_coalesce(srv, &peer);
    assert_true(peer.coalescing); /* for good */

    /* A stale peer: the number is another client's socket now. */
    peer = (emlio__peer_t){ .fd = fd, .ino = st.st_ino + 1, .outstanding = 2 };
    emlio__srv_peer_coalesce(srv, &peer);
    assert_false(peer.coalescing);
    assert_true(peer.no_coalesce);

    srv->cfg.coalesce = EMLIO_COALESCE_AUTO; /* loopback: below 1 ms */
    peer = (emlio__peer_t){ .fd = fd, .ino = st.st_ino, .outstanding = 2 };
    emlio__srv_peer_coalesce(srv, &peer);
    assert_false(peer.coalescing);
    assert_true(peer.no_coalesce);

    srv->cfg.coalesce = EMLIO_COALESCE_NEVER;
    peer = (emlio__peer_t){ .fd = fd, .ino = st.st_ino, .outstanding = 2 };
    emlio__srv_peer_coalesce(srv, &peer);
    assert_false(peer.coalescing);

    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(fstat(sv[0], &st), 0);
    conn = (emlio__conn_t){ .fd = sv[0], .ino = st.st_ino };
    peer = (emlio__peer_t){ .fd = sv[0], .ino = st.st_ino, .outstanding = 2 };
    srv->cfg.coalesce = EMLIO_COALESCE_ALWAYS;
    emlio__srv_peer_coalesce(srv, &peer);
    assert_true(peer.no_coalesce);
    assert_false(peer.coalescing);
    close(sv[0]);
    close(sv[1]);
    free(srv);
    close(fd);
    close(client);
    close(lfd);
}

/* One connection of test_server_nagle_spans_a_reply (see there). Returns
 * false when Nagle was never seen on under "always": the daemon decides to
 * coalesce when it has two GETs of the client unanswered at once, and a
 * busy machine can deschedule the client's I/O thread between its two
 * GETs long enough for the first reply to leave first (1 run in 5-10
 * under the sanitizers); the caller then tries a new connection. */
static bool
s_nagle_round(const char *dir, bool always)
{
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    cfg.data_dir = dir;
    cfg.sndbuf = 65536;
    cfg.coalesce = always ? EMLIO_COALESCE_ALWAYS : EMLIO_COALESCE_NEVER;
    emlio_server_t *srv = s_start_cfg(ctx, &cfg);
    void *zctx = zmq_ctx_new();
    void *dealer = s_dealer_hello(zctx, srv, 65536);
    assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
    int fd = s_daemon_end(srv);
    /* Two GETs at once (the second makes the peer a pipeliner), each of
     * all records: 1.6 MB that the buffers cannot hold. */
    s_send_gets(dealer, srv, 1, 2, true);
    /* Up to 5 s for the I/O thread to be stuck in a reply. */
    int seen = -1;
    for (int i = 0; i < 500; i++) {
        seen = s_nodelay(fd);
        if (seen == !always)
            break;
        usleep(10000);
    }
    bool coalesced = seen == !always;
    if (coalesced && !always) {
        usleep(300000); /* and it stays on, while stuck */
        assert_int_equal(s_nodelay(fd), 1);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_BATCH);
    /* The last frame's callback runs once the I/O thread moves on. */
    for (int i = 0; i < 500 && s_nodelay(fd) != 1; i++)
        usleep(10000);
    assert_int_equal(s_nodelay(fd), 1);
    zmq_close(dealer);
    zmq_ctx_term(zctx);
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    return coalesced;
}

/* Nagle is on while a coalescing connection's reply is being written and
 * off again once its last frame is: a client that stops reading holds a
 * 1.6 MB reply in the middle (64 KiB buffers), where TCP_NODELAY reads 0
 * under "always" and 1 under "never"; once the client reads it all, 1.
 * Three connections at most for "always" (s_nagle_round's race). */
static void
test_server_nagle_spans_a_reply(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    s_write_records(dir, 100000, NULL);
    for (int always = 1; always >= 0; always--) {
        bool coalesced = false;
        for (int attempt = 0; attempt < 3 && !coalesced; attempt++)
            coalesced = s_nagle_round(dir, always);
        assert_true(coalesced);
    }
    test_rmtree(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_misuse_and_errors_say_why),
        cmocka_unit_test(test_server_slot_freed_when_connection_closes),
        cmocka_unit_test(test_server_destroy_with_frames_in_flight),
        cmocka_unit_test(test_server_copy_budget),
        cmocka_unit_test(test_server_operator_mistakes_fail_at_start),
        cmocka_unit_test(test_server_fields_get_before_hello_is_served),
        cmocka_unit_test(test_server_deleted_file_is_skipped_or_named),
        cmocka_unit_test(test_server_client_within_credits_is_never_closed),
        cmocka_unit_test(test_server_corrupt_records_of_any_size_are_refused),
        cmocka_unit_test(test_server_large_samples_carry_the_stored_crc),
        cmocka_unit_test(test_server_pushes_the_last_reply_of_a_pipeline),
        cmocka_unit_test(test_server_pack_mode_decides_large_frames),
        cmocka_unit_test(test_server_packing_never_waits_for_the_budget),
        cmocka_unit_test(test_server_packing_leaves_the_budget_to_parked_gets),
        cmocka_unit_test(test_server_coalesce_decision),
        cmocka_unit_test(test_server_nagle_spans_a_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
