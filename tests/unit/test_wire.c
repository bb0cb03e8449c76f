/* test_wire.c - the protocol encoder and the bounded decoder.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <msgpack.h>

#include "wire.h"

/* The encoders take a struct per message; these fill the usual fields. */
static int
s_hello(emlio_buf_t *buf, const char *name, uint64_t session, uint32_t stream,
        uint64_t id)
{
    emlio__wire_hello_t h = {
        .name = name, .session = session, .stream = stream, .id = id
    };
    return emlio__wire_encode_hello(buf, &h);
}

static int
s_welcome(emlio_buf_t *buf, const char *name, const char *dataset,
          uint64_t max_batch, uint64_t max_credit, uint64_t max_streams,
          uint64_t sndbuf, const emlio__wire_shard_t *shards, size_t n)
{
    emlio__wire_welcome_t w = { .name = name,
                                .dataset = dataset,
                                .max_batch = max_batch,
                                .max_credit = max_credit,
                                .max_streams = max_streams,
                                .sndbuf = sndbuf,
                                .shards = shards,
                                .n_shards = n };
    return emlio__wire_encode_welcome(buf, &w);
}

static void
test_wire_get_round_trip(void **state)
{
    (void)state;
    emlio__wire_item_t items[3] = { { 0, 5 }, { 7, 1ull << 40 }, { 2, 0 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(emlio__wire_encode_get(&buf, 99, "abcd", items, 3, NULL),
                     0);
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    assert_int_equal(emlio__wire_decode(&msg, buf.data, buf.len, 0, err),
                     (int)buf.len);
    assert_int_equal(msg.type, EMLIO_MSG_GET);
    assert_int_equal(msg.id, 99);
    assert_int_equal(msg.get.dataset_len, 4);
    assert_memory_equal(msg.get.dataset, "abcd", 4);
    assert_int_equal(msg.get.n_items, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(msg.get.items[i].shard, items[i].shard);
        assert_int_equal(msg.get.items[i].record, items[i].record);
    }
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);
}

static void
test_wire_batch_round_trip(void **state)
{
    (void)state;
    emlio__wire_sample_t s[2] = { { 1, 2, -1, 0xdeadbeef },
                                  { 3, 4, 1000000, 7 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(emlio__wire_encode_batch(&buf, 1ull << 50, s, 2, NULL, 0,
                                              EMLIO_WIRE_NO_IO),
                     0);
    emlio__wire_msg_t msg;
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_BATCH);
    assert_int_equal(msg.id, 1ull << 50);
    assert_int_equal(msg.batch.n_samples, 2);
    assert_int_equal(msg.batch.samples[0].label, -1);
    assert_int_equal(msg.batch.samples[0].crc, 0xdeadbeef);
    assert_int_equal(msg.batch.samples[1].label, 1000000);
    assert_int_equal(msg.batch.samples[1].record, 4);
    assert_false(
        msg.batch.has_disk); /* left out: a daemon that does not read */
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);
}

/* The shard entry's 4th element, the content digest: sent when known,
 * absent (three elements, decoded as 0) when not. */
static void
test_wire_shard_digest_round_trip(void **state)
{
    (void)state;
    emlio__wire_shard_t shards[2] = { { "cat", 3, 64, 200000,
                                        (UINT64_C(1) << 32) | 0x89822376u },
                                      { "dog", 3, 64, 200000, 0 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    emlio__wire_msg_t msg;
    assert_int_equal(
        s_welcome(&buf, "emliod/x", "ff00", 64, 8, 64, 1 << 22, shards, 2), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.welcome.n_shards, 2);
    assert_true(msg.welcome.shards[0].digest ==
                ((UINT64_C(1) << 32) | 0x89822376u));
    assert_int_equal(msg.welcome.shards[1].digest, 0);
    assert_int_equal(msg.welcome.shards[1].records, 64);
    emlio__wire_msg_release(&msg);
    /* Without any digest the entries are the three elements of before. */
    shards[0].digest = 0;
    emlio_buf_t plain = EMLIO_BUF_INIT;
    assert_int_equal(
        s_welcome(&plain, "emliod/x", "ff00", 64, 8, 64, 1 << 22, shards, 2),
        0);
    assert_int_equal(plain.len + 9, buf.len); /* 0xcf + 8 bytes, 1 entry */
    emlio_buf_release(&plain);
    emlio_buf_release(&buf);
}

static void
test_wire_welcome_hello_error_round_trip(void **state)
{
    (void)state;
    emlio__wire_shard_t shards[2] = { { "a.tfrecord", 10, 5, 100, 0 },
                                      { "sub/b.tfrecord", 14, 0, 16, 0 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    emlio__wire_msg_t msg;
    assert_int_equal(
        s_welcome(&buf, "emliod/x", "ff00", 64, 8, 64, 1 << 22, shards, 2), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_WELCOME);
    assert_int_equal(msg.welcome.version, EMLIO_WIRE_VERSION);
    assert_int_equal(msg.welcome.max_batch, 64);
    assert_int_equal(msg.welcome.max_credit, 8);
    assert_int_equal(msg.welcome.max_streams, 64);
    assert_int_equal(msg.welcome.sndbuf, 1 << 22);
    assert_false(msg.welcome.joined);
    assert_int_equal(msg.welcome.n_shards, 2);
    assert_int_equal(msg.welcome.shards[1].name_len, 14);
    assert_memory_equal(msg.welcome.shards[1].name, "sub/b.tfrecord", 14);
    assert_int_equal(msg.welcome.shards[1].bytes, 16);
    emlio__wire_msg_release(&msg);

    assert_int_equal(s_hello(&buf, "me", 0, 0, 0), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_HELLO);
    assert_int_equal(msg.hello.name_len, 2);
    assert_int_equal(msg.hello.session, 0);
    emlio__wire_msg_release(&msg);

    /* A session HELLO joining stream 5, and the short reply to a join. */
    assert_int_equal(s_hello(&buf, "me", 0xfeedbeefcafeull, 5, 77), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_HELLO);
    assert_int_equal(msg.hello.session, 0xfeedbeefcafeull);
    assert_int_equal(msg.hello.stream, 5);
    assert_int_equal(msg.id, 77);
    emlio__wire_msg_release(&msg);
    assert_int_equal(emlio__wire_encode_joined(&buf, 77, "ff00"), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_WELCOME);
    assert_true(msg.welcome.joined);
    assert_int_equal(msg.id, 77);
    assert_int_equal(msg.welcome.n_shards, 0);
    emlio__wire_msg_release(&msg);

    assert_int_equal(emlio__wire_encode_error(&buf, 3, EMLIO_ECORRUPT, "bad"),
                     0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, NULL) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_ERROR);
    assert_int_equal(msg.error.code, EMLIO_ECORRUPT);
    assert_int_equal(msg.error.text_len, 3);
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);
}

/* Every prefix of a valid message is rejected cleanly, never read past. */
static void
test_wire_truncated_prefixes_fail(void **state)
{
    (void)state;
    emlio__wire_item_t items[4] = { { 1, 2 }, { 3, 4 }, { 5, 6 }, { 7, 8 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(emlio__wire_encode_get(&buf, 1, "x", items, 4, NULL), 0);
    for (size_t len = 0; len < buf.len; len++) {
        /* A private copy of exactly len bytes, so ASan sees any overread. */
        uint8_t *copy = emlio_malloc(len);
        memcpy(copy, buf.data, len);
        emlio__wire_msg_t msg;
        char err[EMLIO_ERRMSG_LEN] = "";
        assert_int_equal(emlio__wire_decode(&msg, copy, len, 0, err),
                         EMLIO_EPROTO);
        assert_non_null(strstr(err, "malformed message"));
        emlio_free(copy);
    }
    emlio_buf_release(&buf);
}

static void
test_wire_hostile_lengths_rejected(void **state)
{
    (void)state;
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    /* {"t": 3, "id": 1, "items": array32 claiming 4 billion elements} */
    const uint8_t huge[] = { 0x83, 0xa1, 't',  0x03, 0xa2, 'i',  'd',
                             0x01, 0xa5, 'i',  't',  'e',  'm',  's',
                             0xdd, 0xff, 0xff, 0xff, 0xfe, 0x01, 0x02 };
    assert_int_equal(emlio__wire_decode(&msg, huge, sizeof(huge), 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "longer than the message"));
    /* More items than the caller's limit. */
    emlio__wire_item_t items[8] = { { 0, 0 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(emlio__wire_encode_get(&buf, 1, "x", items, 8, NULL), 0);
    assert_int_equal(emlio__wire_decode(&msg, buf.data, buf.len, 4, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "too many items"));
    emlio_buf_release(&buf);
    /* Odd-length item arrays, unknown types, maps nested too deep. */
    const uint8_t odd[] = { 0x83, 0xa1, 't', 0x03, 0xa2, 'i',  'd', 0x01, 0xa5,
                            'i',  't',  'e', 'm',  's',  0x93, 1,   2,    3 };
    assert_int_equal(emlio__wire_decode(&msg, odd, sizeof(odd), 0, err),
                     EMLIO_EPROTO);
    const uint8_t badtype[] = { 0x81, 0xa1, 't', 0x09 };
    assert_int_equal(emlio__wire_decode(&msg, badtype, sizeof(badtype), 0, err),
                     EMLIO_EPROTO);
    uint8_t deep[64];
    size_t n = 0;
    deep[n++] = 0x82;
    deep[n++] = 0xa1;
    deep[n++] = 't';
    deep[n++] = 0x01;
    deep[n++] = 0xa1;
    deep[n++] = 'x';
    for (int i = 0; i < 20; i++)
        deep[n++] = 0x91; /* [[[[...]]]] */
    deep[n++] = 0x00;
    assert_int_equal(emlio__wire_decode(&msg, deep, n, 0, err), EMLIO_EPROTO);
    assert_non_null(strstr(err, "nested too deeply"));
}

/* Protocol v4: a BATCH whose small sample frames travel in one packed
 * frame, located by the "pack" offset table. */
static void
test_wire_packed_batch_round_trip(void **state)
{
    (void)state;
    emlio__wire_sample_t s[3] = { { 1, 2, -1, 5 },
                                  { 3, 4, 7, 6 },
                                  { 0, 9, 2, 8 } };
    /* Samples 0 and 2 packed (with an alignment gap), sample 1 its own
     * frame. */
    emlio__wire_span_t spans[3] = { { 0, 100 },
                                    { EMLIO_WIRE_PACK_OWN, 1u << 20 },
                                    { 104, 0 } };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(
        emlio__wire_encode_batch(&buf, 77, s, 3, spans, 3, EMLIO_WIRE_NO_IO),
        0);
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    assert_int_equal(emlio__wire_decode(&msg, buf.data, buf.len, 0, err),
                     (int)buf.len);
    assert_int_equal(msg.type, EMLIO_MSG_BATCH);
    assert_true(msg.batch.packed);
    assert_int_equal(msg.batch.n_samples, 3);
    assert_int_equal(msg.batch.n_spans, 3);
    for (int i = 0; i < 3; i++) {
        assert_true(msg.batch.spans[i].off == spans[i].off);
        assert_true(msg.batch.spans[i].len == spans[i].len);
    }
    /* One own frame follows a packed frame of 104 bytes. */
    assert_int_equal(
        emlio__wire_pack_check(msg.batch.spans, 3, 3, true, 104, err), 1);
    emlio__wire_msg_release(&msg);
    /* Every span in its own frame: no packed frame at all. */
    emlio__wire_span_t own[2] = { { EMLIO_WIRE_PACK_OWN, 3 },
                                  { EMLIO_WIRE_PACK_OWN, 4 } };
    assert_int_equal(emlio__wire_pack_check(own, 2, 2, false, 0, err), 2);
    /* An empty batch has an empty table, and says so. */
    assert_int_equal(
        emlio__wire_encode_batch(&buf, 78, NULL, 0, NULL, 0,
                                 (emlio__wire_io_t){ 7, 0, 0, NULL }),
        0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_true(msg.batch.packed);
    assert_true(msg.batch.has_disk);
    assert_int_equal(msg.batch.disk, 7);
    assert_int_equal(msg.batch.read, 0); /* not said */
    assert_int_equal(msg.batch.n_spans, 0);
    assert_int_equal(
        emlio__wire_pack_check(msg.batch.spans, 0, 0, false, 0, err), 0);
    emlio__wire_msg_release(&msg);
    /* The device's figures ride every BATCH. */
    assert_int_equal(
        emlio__wire_encode_batch(&buf, 79, s, 1, spans, 1,
                                 (emlio__wire_io_t){ 250, 1234567, 0, NULL }),
        0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_true(msg.batch.packed);
    assert_int_equal(msg.batch.n_spans, 1);
    assert_true(msg.batch.has_disk); /* a share above 100% is sent as 100 */
    assert_int_equal(msg.batch.disk, 100);
    assert_int_equal(msg.batch.read, 1234567); /* "rd": the bytes read for it */
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);
}

/* Offset tables from the network that do not fit their frames are
 * refused, each with a message that says what is wrong. */
static void
test_wire_bad_pack_tables_rejected(void **state)
{
    (void)state;
    char err[EMLIO_ERRMSG_LEN];
    /* Count mismatch: 2 spans for 3 expected sample frames. */
    emlio__wire_span_t two[2] = { { 0, 10 }, { 10, 10 } };
    assert_int_equal(emlio__wire_pack_check(two, 2, 3, true, 20, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "lists 2 sample frames, the samples have 3"));
    /* Out of range: past the end, an offset beyond it, a length that
     * wraps, and a packed span without a packed frame. */
    emlio__wire_span_t past[2] = { { 0, 10 }, { 10, 11 } };
    assert_int_equal(emlio__wire_pack_check(past, 2, 2, true, 20, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "sample frame 1 (offset 10, 11 bytes) lies "
                                "outside the packed frame (20 bytes)"));
    emlio__wire_span_t far[1] = { { 21, 0 } };
    assert_int_equal(emlio__wire_pack_check(far, 1, 1, true, 20, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "outside the packed frame"));
    emlio__wire_span_t wrap[1] = { { 8, UINT64_MAX - 4 } };
    assert_int_equal(emlio__wire_pack_check(wrap, 1, 1, true, 20, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "outside the packed frame"));
    assert_int_equal(emlio__wire_pack_check(two, 2, 2, false, 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "outside the packed frame (0 bytes)"));
    /* Overlapping, and out of order. */
    emlio__wire_span_t overlap[2] = { { 0, 10 }, { 9, 5 } };
    assert_int_equal(emlio__wire_pack_check(overlap, 2, 2, true, 20, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "sample frame 1 (offset 9) overlaps"));
    emlio__wire_span_t back[3] = { { 10, 5 },
                                   { EMLIO_WIRE_PACK_OWN, 1 },
                                   { 0, 5 } };
    assert_int_equal(emlio__wire_pack_check(back, 3, 3, true, 20, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "sample frame 2 (offset 0) overlaps"));
    /* A packed frame that no span uses. */
    emlio__wire_span_t own[1] = { { EMLIO_WIRE_PACK_OWN, 3 } };
    assert_int_equal(emlio__wire_pack_check(own, 1, 1, true, 8, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "puts no sample frame in it"));
    /* Malformed tables do not decode: an odd count, an offset below -1,
     * a non-integer, a packed tensor batch, more spans than the limit. */
    emlio__wire_msg_t msg;
    /* {"t":4,"id":1,"samples":[],"pack":[0]} */
    const uint8_t odd[] = { 0x84, 0xa1, 't', 0x04, 0xa2, 'i', 'd',  0x01,
                            0xa7, 's',  'a', 'm',  'p',  'l', 'e',  's',
                            0x90, 0xa4, 'p', 'a',  'c',  'k', 0x91, 0x00 };
    assert_int_equal(emlio__wire_decode(&msg, odd, sizeof(odd), 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "offset, length pairs"));
    uint8_t neg[sizeof(odd) + 1];
    memcpy(neg, odd, sizeof(odd));
    neg[sizeof(odd) - 2] = 0x92; /* [-2, 0] */
    neg[sizeof(odd) - 1] = 0xfe;
    neg[sizeof(odd)] = 0x00;
    assert_int_equal(emlio__wire_decode(&msg, neg, sizeof(neg), 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "negative offset"));
    neg[sizeof(odd) - 1] = 0xc0; /* [nil, 0] */
    assert_int_equal(emlio__wire_decode(&msg, neg, sizeof(neg), 0, err),
                     EMLIO_EPROTO);
    emlio__wire_sample_t s[1] = { { 0, 0, 0, 0 } };
    emlio__wire_tensor_t t = { 2, 2, 3, 0 };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    assert_int_equal(
        emlio__wire_encode_batch_tensor(&buf, 5, s, 1, &t, EMLIO_WIRE_NO_IO),
        0);
    /* Append "pack": [] to the tensor BATCH's map (fixmap count + 1). */
    assert_true((buf.data[0] & 0xf0) == 0x80 && (buf.data[0] & 0x0f) < 15);
    buf.data[0]++;
    const uint8_t pack[] = { 0xa4, 'p', 'a', 'c', 'k', 0x90 };
    assert_int_equal(emlio_buf_add(&buf, pack, sizeof(pack)), 0);
    assert_int_equal(emlio__wire_decode(&msg, buf.data, buf.len, 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "tensor batch cannot be packed"));
    emlio__wire_span_t spans[5] = { { 0, 0 } };
    assert_int_equal(
        emlio__wire_encode_batch(&buf, 6, s, 1, spans, 5, EMLIO_WIRE_NO_IO), 0);
    /* max_items 1: at most EMLIO_WIRE_MAX_FIELDS spans, so 5 still fit. */
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 1, err) > 0);
    assert_int_equal(emlio__wire_pack_check(msg.batch.spans, msg.batch.n_spans,
                                            1, true, 0, err),
                     EMLIO_EPROTO);
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);
}

static void
test_wire_unknown_keys_skipped_and_fields_required(void **state)
{
    (void)state;
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    /* HELLO with an extra future key holding a map and a float. */
    const uint8_t fwd[] = { 0x84, 0xa1, 't',  0x01, 0xa1, 'v',  0x01, 0xa3, 'n',
                            'e',  'w',  0x81, 0xa1, 'k',  0xcb, 0,    0,    0,
                            0,    0,    0,    0,    0,    0xa1, 'z',  0xc0 };
    assert_int_equal(emlio__wire_decode(&msg, fwd, sizeof(fwd), 0, err),
                     (int)sizeof(fwd));
    assert_int_equal(msg.type, EMLIO_MSG_HELLO);
    emlio__wire_msg_release(&msg);
    /* A GET without items is incomplete. */
    const uint8_t noitems[] = { 0x82, 0xa1, 't', 0x03, 0xa2, 'i', 'd', 0x05 };
    assert_int_equal(emlio__wire_decode(&msg, noitems, sizeof(noitems), 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "required field"));
    /* Trailing garbage after the map. */
    const uint8_t trailing[] = { 0x82, 0xa1, 't', 0x01, 0xa1, 'v', 0x01, 0x00 };
    assert_int_equal(
        emlio__wire_decode(&msg, trailing, sizeof(trailing), 0, err),
        EMLIO_EPROTO);
    /* A negative record number. */
    const uint8_t neg[] = { 0x83, 0xa1, 't', 0x03, 0xa2, 'i',  'd',  0x01, 0xa5,
                            'i',  't',  'e', 'm',  's',  0x92, 0x00, 0xff };
    assert_int_equal(emlio__wire_decode(&msg, neg, sizeof(neg), 0, err),
                     EMLIO_EPROTO);
}

/* Protocol v3: a GET that asks for a transform, the tensor BATCH that
 * answers it, a WELCOME with the daemon's transform capabilities. */
static void
test_wire_v3_transform_round_trip(void **state)
{
    (void)state;
    emlio_buf_t buf = EMLIO_BUF_INIT;
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    emlio__wire_item_t items[2] = { { 1, 9 }, { 0, 3 } };
    emlio__wire_xf_t xf = { "random_resized_crop(224),horizontal_flip",
                            42,
                            7,
                            false,
                            false,
                            0,
                            0,
                            false };
    assert_int_equal(emlio__wire_encode_get(&buf, 5, "ff", items, 2, &xf), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.type, EMLIO_MSG_GET);
    assert_int_equal(msg.get.xf_spec_len, strlen(xf.spec));
    assert_memory_equal(msg.get.xf_spec, xf.spec, msg.get.xf_spec_len);
    assert_int_equal(msg.get.xf_seed, 42);
    assert_int_equal(msg.get.xf_epoch, 7);
    assert_int_equal(msg.get.n_items, 2);
    emlio__wire_msg_release(&msg);

    /* A plain GET has no transform. */
    assert_int_equal(emlio__wire_encode_get(&buf, 5, "ff", items, 2, NULL), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_null(msg.get.xf_spec);
    assert_false(msg.get.flags.unchecked); /* not sent unless asked */
    assert_false(msg.get.flags.pipelined);
    emlio__wire_msg_release(&msg);

    /* A client that does not check CRCs says so, with or without a
     * transform; the items still decode after the extra key. */
    emlio__wire_xf_t plain = { .unchecked = true };
    assert_int_equal(emlio__wire_encode_get(&buf, 6, "ff", items, 2, &plain),
                     0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_null(msg.get.xf_spec);
    assert_true(msg.get.flags.unchecked);
    assert_false(msg.get.flags.pipelined);
    assert_int_equal(msg.get.n_items, 2);
    emlio__wire_msg_release(&msg);

    /* A client with other GETs in flight on the connection says so, beside
     * a transform and "unchecked"; the items still decode. */
    emlio__wire_xf_t piped = {
        "horizontal_flip", 1, 2, true, true, 0, 0, false
    };
    assert_int_equal(emlio__wire_encode_get(&buf, 7, "ff", items, 2, &piped),
                     0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_true(msg.get.flags.pipelined);
    assert_true(msg.get.flags.unchecked);
    assert_int_equal(msg.get.xf_epoch, 2);
    assert_int_equal(msg.get.n_items, 2);
    assert_int_equal(msg.get.items[1].record, 3);
    emlio__wire_msg_release(&msg);

    emlio__wire_sample_t s[2] = { { 1, 9, 3, 11 }, { 0, 3, -1, 12 } };
    emlio__wire_tensor_t t = { 224, 200, 3, 123456 };
    assert_int_equal(
        emlio__wire_encode_batch_tensor(&buf, 5, s, 2, &t,
                                        (emlio__wire_io_t){ 42, 0, 0, NULL }),
        0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_true(msg.batch.has_shape);
    assert_int_equal(msg.batch.shape[0], 2);
    assert_int_equal(msg.batch.shape[1], 224);
    assert_int_equal(msg.batch.shape[2], 200);
    assert_int_equal(msg.batch.shape[3], 3);
    assert_int_equal(msg.batch.xf_ns, 123456);
    assert_int_equal(msg.batch.samples[1].crc, 12);
    emlio__wire_msg_release(&msg);

    /* A shape that disagrees with the samples is refused. */
    assert_int_equal(
        emlio__wire_encode_batch_tensor(&buf, 5, s, 1, &t, EMLIO_WIRE_NO_IO),
        0);
    {
        /* shape[0] is the first element after "shape" + fixarray(4). */
        uint8_t *p = memmem(buf.data, buf.len, "shape", 5);
        assert_non_null(p);
        assert_int_equal(p[5], 0x94);
        assert_int_equal(p[6], 0x01);
        p[6] = 0x02;
    }
    assert_int_equal(emlio__wire_decode(&msg, buf.data, buf.len, 0, err),
                     EMLIO_EPROTO);
    assert_non_null(strstr(err, "shape"));

    char cat[] = "cat", dog[] = "dog";
    char *const classes[2] = { cat, dog };
    emlio__wire_shard_t shards[1] = { { "a.tar", 5, 3, 10240, 0 } };
    emlio__wire_welcome_t w = { .name = "d",
                                .dataset = "ff",
                                .max_batch = 64,
                                .max_credit = 8,
                                .max_streams = 64,
                                .shards = shards,
                                .n_shards = 1,
                                .xf_threads = 4,
                                .core_mw = 15000,
                                .classes = classes,
                                .n_classes = 2,
                                .format = "tar" };
    assert_int_equal(emlio__wire_encode_welcome(&buf, &w), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.welcome.version, EMLIO_WIRE_VERSION);
    assert_int_equal(msg.welcome.xf_threads, 4);
    assert_int_equal(msg.welcome.core_mw, 15000);
    assert_int_equal(msg.welcome.n_classes, 2);
    assert_int_equal(msg.welcome.format_len, 3);
    assert_memory_equal(msg.welcome.format, "tar", 3);
    assert_int_equal(msg.welcome.classes[1].len, 3);
    assert_memory_equal(msg.welcome.classes[1].s, "dog", 3);
    emlio__wire_msg_release(&msg);

    /* Shared reads: HELLO "share", WELCOME "share_window", BATCH "sh";
     * each absent unless said. */
    emlio__wire_hello_t h = { .name = "c",
                              .session = 9,
                              .id = 1,
                              .job = "sweep",
                              .weight = 2,
                              .share = true };
    assert_int_equal(emlio__wire_encode_hello(&buf, &h), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_true(msg.hello.share);
    assert_int_equal(msg.hello.weight, 2);
    assert_int_equal(msg.hello.job_len, 5);
    emlio__wire_msg_release(&msg);
    h.weight = 0;
    h.share = false;
    assert_int_equal(emlio__wire_encode_hello(&buf, &h), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_false(msg.hello.share);
    emlio__wire_msg_release(&msg);
    /* The fields a client asks for, in its order. */
    char f0[] = "json", f1[] = "jpg";
    char *want[] = { f0, f1 };
    h.job = NULL;
    h.fields = want;
    h.n_fields = 2;
    assert_int_equal(emlio__wire_encode_hello(&buf, &h), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.hello.n_fields, 2);
    assert_int_equal(msg.hello.fields[0].len, 4);
    assert_memory_equal(msg.hello.fields[0].s, "json", 4);
    assert_memory_equal(msg.hello.fields[1].s, "jpg", 3);
    emlio__wire_msg_release(&msg);
    w.share_window = 128u << 20;
    assert_int_equal(emlio__wire_encode_welcome(&buf, &w), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.welcome.share_window, 128u << 20);
    assert_int_equal(msg.welcome.share_segs, 0);
    emlio__wire_msg_release(&msg);
    /* A joiner's WELCOME: the prebuilt one with the cursor added, the
     * rest as it was; a base that is no map is refused. */
    emlio_buf_t joined = EMLIO_BUF_INIT;
    assert_int_equal(
        emlio__wire_welcome_add_cursor(&joined, &buf, 7, UINT64_MAX - 1), 0);
    assert_true(emlio__wire_decode(&msg, joined.data, joined.len, 0, err) > 0);
    assert_int_equal(msg.welcome.share_window, 128u << 20);
    assert_int_equal(msg.welcome.n_shards, 1);
    assert_int_equal(msg.welcome.share_segs, 7);
    assert_true(msg.welcome.share_cursor == UINT64_MAX - 1);
    emlio__wire_msg_release(&msg);
    emlio_buf_t bad = EMLIO_BUF_INIT;
    assert_int_equal(emlio_buf_add(&bad, "\x93", 1), 0);
    assert_int_equal(emlio__wire_welcome_add_cursor(&joined, &bad, 1, 1),
                     EMLIO_EPROTO);
    emlio_buf_release(&bad);
    emlio_buf_release(&joined);
    /* A sharing job's GET says its cursor; others say nothing. */
    emlio__wire_item_t item = { 1, 2 };
    emlio__wire_xf_t at = { .segs = 9, .cursor = 40 };
    assert_int_equal(emlio__wire_encode_get(&buf, 5, "ff", &item, 1, &at), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.get.segs, 9);
    assert_int_equal(msg.get.cursor, 40);
    assert_null(msg.get.xf_spec);
    emlio__wire_msg_release(&msg);
    emlio__wire_sample_t one = { 0 };
    assert_int_equal(
        emlio__wire_encode_batch(&buf, 80, &one, 1, NULL, 0,
                                 (emlio__wire_io_t){ -1, 9, 7, NULL }),
        0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.batch.read, 9);
    assert_int_equal(msg.batch.shared, 7);
    emlio__wire_msg_release(&msg);
    /* Every HELLO says the one version. */
    assert_int_equal(s_hello(&buf, "c", 0, 0, 0), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.welcome.version, EMLIO_WIRE_VERSION);
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);
}

/* A BATCH hand-built with msgpack: id 3, two samples, and a "where" of
 * n_where strings, each of len bytes ('a'). */
static void
s_batch_with_where(msgpack_sbuffer *sb, size_t n_where, size_t len)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    msgpack_pack_str_with_body(&pk, "t", 1);
    msgpack_pack_uint8(&pk, EMLIO_MSG_BATCH);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_uint8(&pk, 3);
    msgpack_pack_str_with_body(&pk, "where", 5);
    msgpack_pack_array(&pk, n_where);
    char text[EMLIO_WIRE_MAX_WHERE + 2];
    memset(text, 'a', sizeof(text));
    for (size_t i = 0; i < n_where; i++)
        msgpack_pack_str_with_body(&pk, text, len);
    msgpack_pack_str_with_body(&pk, "samples", 7);
    msgpack_pack_array(&pk, 8);
    for (int i = 0; i < 8; i++)
        msgpack_pack_uint8(&pk, (uint8_t)i);
}

/* A client that decodes asks each record's description ("describe"); the
 * BATCH names each sample's record ("where", one per quadruple, cut to
 * EMLIO_WIRE_MAX_WHERE bytes); a count that does not match the samples,
 * or an entry too long, is a protocol error. */
static void
test_wire_describe_and_where(void **state)
{
    (void)state;
    emlio_buf_t buf = EMLIO_BUF_INIT;
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    emlio__wire_item_t items[2] = { { 0, 1 }, { 2, 5 } };
    emlio__wire_xf_t ask = { .describe = true, .pipelined = true };
    assert_int_equal(emlio__wire_encode_get(&buf, 5, "ff", items, 2, &ask), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_true(msg.get.flags.describe);
    assert_true(msg.get.flags.pipelined);
    assert_int_equal(msg.get.n_items, 2);
    emlio__wire_msg_release(&msg);
    assert_int_equal(emlio__wire_encode_get(&buf, 5, "ff", items, 2, NULL), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_false(msg.get.flags.describe); /* not sent unless asked */
    emlio__wire_msg_release(&msg);

    char long_name[EMLIO_WIRE_MAX_WHERE + 50];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    char first[] = "file 'cat/0001.jpg' (record 1)";
    char *where[2] = { first, long_name };
    emlio__wire_sample_t s[2] = { { 0, 1, 0, 7 }, { 2, 5, 1, 8 } };
    emlio__wire_io_t io = EMLIO_WIRE_NO_IO;
    io.where = where;
    assert_int_equal(emlio__wire_encode_batch(&buf, 9, s, 2, NULL, 0, io), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.batch.n_where, 2);
    assert_int_equal(msg.batch.where[0].len, strlen(where[0]));
    assert_memory_equal(msg.batch.where[0].s, where[0], msg.batch.where[0].len);
    assert_int_equal(msg.batch.where[1].len, EMLIO_WIRE_MAX_WHERE); /* cut */
    emlio__wire_msg_release(&msg);
    /* Packed, too; and a batch that was not asked carries none. */
    emlio__wire_span_t spans[2] = { { 0, 4 }, { 4, 4 } };
    assert_int_equal(emlio__wire_encode_batch(&buf, 9, s, 2, spans, 2, io), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_int_equal(msg.batch.n_where, 2);
    assert_true(msg.batch.packed);
    emlio__wire_msg_release(&msg);
    assert_int_equal(
        emlio__wire_encode_batch(&buf, 9, s, 2, spans, 2, EMLIO_WIRE_NO_IO), 0);
    assert_true(emlio__wire_decode(&msg, buf.data, buf.len, 0, err) > 0);
    assert_null(msg.batch.where);
    emlio__wire_msg_release(&msg);
    emlio_buf_release(&buf);

    msgpack_sbuffer sb;
    s_batch_with_where(&sb, 2, 10);
    assert_true(emlio__wire_decode(&msg, (const uint8_t *)sb.data, sb.size, 0,
                                   err) > 0);
    assert_int_equal(msg.batch.n_where, 2);
    emlio__wire_msg_release(&msg);
    msgpack_sbuffer_destroy(&sb);
    s_batch_with_where(&sb, 3, 10);
    assert_int_equal(
        emlio__wire_decode(&msg, (const uint8_t *)sb.data, sb.size, 0, err),
        EMLIO_EPROTO);
    assert_non_null(strstr(err, "where does not match the samples"));
    msgpack_sbuffer_destroy(&sb);
    s_batch_with_where(&sb, 2, EMLIO_WIRE_MAX_WHERE + 1);
    assert_int_equal(
        emlio__wire_decode(&msg, (const uint8_t *)sb.data, sb.size, 0, err),
        EMLIO_EPROTO);
    assert_non_null(strstr(err, "too long"));
    msgpack_sbuffer_destroy(&sb);
    /* More entries than the caller's limit fail before any is read. */
    s_batch_with_where(&sb, 2, 1);
    assert_int_equal(
        emlio__wire_decode(&msg, (const uint8_t *)sb.data, sb.size, 1, err),
        EMLIO_EPROTO);
    msgpack_sbuffer_destroy(&sb);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_get_round_trip),
        cmocka_unit_test(test_wire_batch_round_trip),
        cmocka_unit_test(test_wire_welcome_hello_error_round_trip),
        cmocka_unit_test(test_wire_shard_digest_round_trip),
        cmocka_unit_test(test_wire_truncated_prefixes_fail),
        cmocka_unit_test(test_wire_hostile_lengths_rejected),
        cmocka_unit_test(test_wire_unknown_keys_skipped_and_fields_required),
        cmocka_unit_test(test_wire_v3_transform_round_trip),
        cmocka_unit_test(test_wire_packed_batch_round_trip),
        cmocka_unit_test(test_wire_bad_pack_tables_rejected),
        cmocka_unit_test(test_wire_describe_and_where),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
