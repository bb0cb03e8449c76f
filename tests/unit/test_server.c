/* test_server.c - emlio_server_t in process: misuse and errors reported
 * with a message, slots freed as soon as a connection closes, and frames
 * that ZeroMQ still holds when the server is destroyed.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <zmq.h>

#include "wire.h"

#define RECORDS 16

/* RECORDS Examples of `bytes`-byte images; with flips, byte flips[r] of
 * record r's data is flipped when it is not SIZE_MAX (a corrupt record). */
static void
s_write_records(const char *dir, size_t bytes, const size_t *flips)
{
    emlio_buf_t file = EMLIO_BUF_INIT;
    emlio_buf_t ex = EMLIO_BUF_INIT;
    for (int r = 0; r < RECORDS; r++) {
        uint8_t payload[8192];
        assert_true(bytes <= sizeof(payload));
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

/* A DEALER on zctx that reads at most one reply ahead (RCVHWM 1), with a
 * receive buffer of rcvbuf bytes (0: the kernel's) and a 5 s receive
 * timeout, connected to srv, that said HELLO. */
static void *
s_dealer(void *zctx, emlio_server_t *srv, int rcvbuf)
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
    assert_int_equal(emlio__wire_encode_hello(&buf, "test", 0, 0, 0), 0);
    assert_int_equal(zmq_send(dealer, buf.data, buf.len, 0), (int)buf.len);
    emlio_buf_release(&buf);
    return dealer;
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
    void *dealer = s_dealer(zctx, srv, 0);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    emlio_wire_item_t items[RECORDS];
    for (uint32_t r = 0; r < RECORDS; r++)
        items[r] = (emlio_wire_item_t){ 0, r };
    for (uint64_t id = 1; id <= 64; id++) {
        assert_int_equal(emlio__wire_encode_get(&buf, id,
                                                emlio_server_dataset(srv),
                                                items, RECORDS),
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

/* Closes what a raw-client test opened, and removes its directory. */
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
    emlio_wire_msg_t msg;
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
    void *dealer = s_dealer(zctx, srv, 65536);
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
    emlio_wire_item_t items[RECORDS];
    for (uint32_t r = 0; r < RECORDS; r++)
        items[r] = (emlio_wire_item_t){ 0, r };
    uint64_t credits = cfg.max_credit;
    for (uint64_t round = 0; round < 4; round++) {
        for (uint64_t i = 1; i <= credits; i++) {
            assert_int_equal(emlio__wire_encode_get(&buf, round * credits + i,
                                                    emlio_server_dataset(srv),
                                                    items, RECORDS),
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
 * the CRCs of its parts (format_tfrecord.c, S_COMBINE_MIN). */
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
        void *dealer = s_dealer(zctx, srv, 0);
        assert_int_equal(s_recv_reply(dealer), EMLIO_MSG_WELCOME);
        emlio_buf_t buf = EMLIO_BUF_INIT;
        for (uint32_t r = 0; r < RECORDS; r++) {
            emlio_wire_item_t item = { 0, r };
            assert_int_equal(emlio__wire_encode_get(&buf, r + 1,
                                                    emlio_server_dataset(srv),
                                                    &item, 1),
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_misuse_and_errors_say_why),
        cmocka_unit_test(test_server_slot_freed_when_connection_closes),
        cmocka_unit_test(test_server_destroy_with_frames_in_flight),
        cmocka_unit_test(test_server_client_within_credits_is_never_closed),
        cmocka_unit_test(test_server_corrupt_records_of_any_size_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
