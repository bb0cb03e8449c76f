/* test_example.c - unit tests of tf.train.Example parsing and building.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "emlio/example.h"

#define FIELD(k)                             \
    {                                        \
        .key = (k), .key_len = sizeof(k) - 1 \
    }

/* A hand-assembled protobuf writer, independent of emlio_example_build,
 * so the parser is not only tested against its own writer. */
static void
s_varint(emlio_buf_t *b, uint64_t v)
{
    while (v >= 0x80) {
        uint8_t c = (uint8_t)(v | 0x80);
        assert_int_equal(emlio_buf_add(b, &c, 1), 0);
        v >>= 7;
    }
    uint8_t c = (uint8_t)v;
    assert_int_equal(emlio_buf_add(b, &c, 1), 0);
}

static void
s_tag(emlio_buf_t *b, uint32_t field, int wt)
{
    s_varint(b, (uint64_t)field << 3 | (uint64_t)wt);
}

/* Appends field as length-delimited with the content of inner. */
static void
s_sub(emlio_buf_t *b, uint32_t field, const emlio_buf_t *inner)
{
    s_tag(b, field, 2);
    s_varint(b, inner->len);
    if (inner->len)
        assert_int_equal(emlio_buf_add(b, inner->data, inner->len), 0);
}

static void
s_raw(emlio_buf_t *b, const void *data, size_t len)
{
    assert_int_equal(emlio_buf_add(b, data, len), 0);
}

/* Appends a map entry {key, value = Feature{kind = list}} to features. */
static void
s_entry(emlio_buf_t *features, const char *key, int kind,
        const emlio_buf_t *list)
{
    emlio_buf_t feature = EMLIO_BUF_INIT;
    emlio_buf_t entry = EMLIO_BUF_INIT;
    s_sub(&feature, (uint32_t)kind, list);
    s_tag(&entry, 1, 2);
    s_varint(&entry, strlen(key));
    s_raw(&entry, key, strlen(key));
    s_sub(&entry, 2, &feature);
    s_sub(features, 1, &entry);
    emlio_buf_release(&feature);
    emlio_buf_release(&entry);
}

/* Unknown fields of every wire type, as a newer schema might add. */
static void
s_unknown_fields(emlio_buf_t *b)
{
    s_tag(b, 9, 0); /* varint */
    s_varint(b, 300);
    s_tag(b, 10, 1); /* fixed64 */
    s_raw(b, "12345678", 8);
    s_tag(b, 11, 5); /* fixed32 */
    s_raw(b, "1234", 4);
    s_tag(b, 12, 2); /* bytes */
    s_varint(b, 3);
    s_raw(b, "xyz", 3);
    s_tag(b, 13, 3); /* group holding a nested group and a varint */
    s_tag(b, 14, 3);
    s_tag(b, 15, 0);
    s_varint(b, 1);
    s_tag(b, 14, 4);
    s_tag(b, 13, 4);
}

/* Builds an Example with packed and unpacked int64 lists, a packed and an
 * unpacked float list, a bytes list of two values and unknown fields at
 * every level. */
static void
s_hand_example(emlio_buf_t *out)
{
    emlio_buf_t features = EMLIO_BUF_INIT;
    emlio_buf_t list = EMLIO_BUF_INIT;

    /* "packed": Int64List{ value: [5, -3, 1<<40] } packed. */
    emlio_buf_t packed = EMLIO_BUF_INIT;
    s_varint(&packed, 5);
    s_varint(&packed, (uint64_t)(int64_t)-3);
    s_varint(&packed, (uint64_t)1 << 40);
    s_sub(&list, 1, &packed);
    s_unknown_fields(&list);
    s_entry(&features, "packed", 3, &list);
    emlio_buf_clear(&list);

    /* "unpacked": Int64List{ value: 7, value: 8 } one tag each. */
    s_tag(&list, 1, 0);
    s_varint(&list, 7);
    s_tag(&list, 1, 0);
    s_varint(&list, 8);
    s_entry(&features, "unpacked", 3, &list);
    emlio_buf_clear(&list);

    /* "floats": FloatList packed [1.5, 2.5], then one unpacked 3.5. */
    float fv[3] = { 1.5f, 2.5f, 3.5f };
    emlio_buf_clear(&packed);
    s_raw(&packed, fv, 8);
    s_sub(&list, 1, &packed);
    s_tag(&list, 1, 5);
    s_raw(&list, &fv[2], 4);
    s_entry(&features, "floats", 2, &list);
    emlio_buf_clear(&list);

    /* "bytes": BytesList{ "hello", "" }. */
    s_tag(&list, 1, 2);
    s_varint(&list, 5);
    s_raw(&list, "hello", 5);
    s_tag(&list, 1, 2);
    s_varint(&list, 0);
    s_entry(&features, "bytes", 1, &list);
    emlio_buf_clear(&list);

    s_unknown_fields(&features);
    s_sub(out, 1, &features);
    s_unknown_fields(out);
    emlio_buf_release(&features);
    emlio_buf_release(&list);
    emlio_buf_release(&packed);
}

static void
test_example_build_parse_roundtrip(void **state)
{
    (void)state;
    static const int64_t labels[] = {
        0, 1, 127, 128, -1, INT64_MIN, INT64_MAX
    };
    static const size_t sizes[] = { 0, 1, 127, 128, 20000 };
    for (size_t s = 0; s < EMLIO_ARRAY_SIZE(sizes); s++)
        for (size_t l = 0; l < EMLIO_ARRAY_SIZE(labels); l++) {
            uint8_t *img = malloc(sizes[s] + 1);
            assert_non_null(img);
            for (size_t j = 0; j < sizes[s]; j++)
                img[j] = (uint8_t)(j * 3);
            emlio_buf_t b = EMLIO_BUF_INIT;
            assert_int_equal(emlio_example_build(&b, "image/encoded", img,
                                                 sizes[s], "image/class/label",
                                                 labels[l]),
                             0);
            emlio_example_field_t f[3] = { FIELD("image/class/label"),
                                           FIELD("image/encoded"),
                                           FIELD("missing") };
            assert_int_equal(emlio_example_parse(b.data, b.len, f, 3), 2);
            assert_int_equal(f[0].kind, EMLIO_FEATURE_INT64);
            assert_int_equal(f[0].count, 1);
            assert_true(f[0].int64 == labels[l]);
            assert_int_equal(f[1].kind, EMLIO_FEATURE_BYTES);
            assert_int_equal(f[1].count, 1);
            assert_int_equal(f[1].bytes_len, sizes[s]);
            if (sizes[s])
                assert_memory_equal(f[1].bytes, img, sizes[s]);
            /* Zero-copy: the value points into the buffer. */
            assert_true(f[1].bytes >= b.data &&
                        f[1].bytes + f[1].bytes_len <= b.data + b.len);
            assert_int_equal(f[2].kind, EMLIO_FEATURE_NONE);
            emlio_buf_release(&b);
            free(img);
        }
}

/* The bytes python3-protobuf 3.21 serializes (deterministic, so map keys
 * sorted) for an Example with "a": bytes_list ["x"] and "b": int64_list
 * [0xfffffff], from tensorflow's feature.proto (proto3, so the int64 list
 * is packed, as emlio_example_build writes it). */
static void
test_example_build_matches_protobuf(void **state)
{
    (void)state;
    static const uint8_t want[] = { 0x0a, 0x1b, 0x0a, 0x0a, 0x0a, 0x01,
                                    'a',  0x12, 0x05, 0x0a, 0x03, 0x0a,
                                    0x01, 'x',  0x0a, 0x0d, 0x0a, 0x01,
                                    'b',  0x12, 0x08, 0x1a, 0x06, 0x0a,
                                    0x04, 0xff, 0xff, 0xff, 0x7f };
    emlio_buf_t b = EMLIO_BUF_INIT;
    assert_int_equal(
        emlio_example_build(&b, "a", (const uint8_t *)"x", 1, "b", 0xfffffff),
        0);
    assert_int_equal(b.len, sizeof(want));
    assert_memory_equal(b.data, want, sizeof(want));
    emlio_buf_release(&b);
}

static void
test_example_packed_unpacked_unknown(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    s_hand_example(&b);
    emlio_example_field_t f[5] = { FIELD("packed"), FIELD("unpacked"),
                                   FIELD("floats"), FIELD("bytes"), FIELD("") };
    assert_int_equal(emlio_example_parse(b.data, b.len, f, 5), 4);
    assert_int_equal(f[0].kind, EMLIO_FEATURE_INT64);
    assert_int_equal(f[0].count, 3);
    assert_true(f[0].int64 == 5);
    assert_int_equal(f[1].kind, EMLIO_FEATURE_INT64);
    assert_int_equal(f[1].count, 2);
    assert_true(f[1].int64 == 7);
    assert_int_equal(f[2].kind, EMLIO_FEATURE_FLOAT);
    assert_int_equal(f[2].count, 3);
    assert_true(f[2].f32 == 1.5f);
    assert_int_equal(f[3].kind, EMLIO_FEATURE_BYTES);
    assert_int_equal(f[3].count, 2);
    assert_int_equal(f[3].bytes_len, 5);
    assert_memory_equal(f[3].bytes, "hello", 5);
    assert_int_equal(f[4].kind, EMLIO_FEATURE_NONE);
    emlio_buf_release(&b);
}

/* Map semantics: a key seen twice takes the last entry's value. */
static void
test_example_last_entry_wins(void **state)
{
    (void)state;
    emlio_buf_t features = EMLIO_BUF_INIT;
    emlio_buf_t list = EMLIO_BUF_INIT;
    s_tag(&list, 1, 0);
    s_varint(&list, 1);
    s_entry(&features, "k", 3, &list);
    emlio_buf_clear(&list);
    s_tag(&list, 1, 2);
    s_varint(&list, 2);
    s_raw(&list, "hi", 2);
    s_entry(&features, "k", 1, &list);
    emlio_buf_t b = EMLIO_BUF_INIT;
    s_sub(&b, 1, &features);
    emlio_example_field_t f[1] = { FIELD("k") };
    assert_int_equal(emlio_example_parse(b.data, b.len, f, 1), 1);
    assert_int_equal(f[0].kind, EMLIO_FEATURE_BYTES);
    assert_int_equal(f[0].bytes_len, 2);
    emlio_buf_release(&features);
    emlio_buf_release(&list);
    emlio_buf_release(&b);
}

static void
test_example_empty_and_malformed(void **state)
{
    (void)state;
    emlio_example_field_t f[1] = { FIELD("k") };
    /* An empty message is a valid Example with no features. */
    assert_int_equal(emlio_example_parse(NULL, 0, f, 1), 0);
    assert_int_equal(emlio_example_parse((const uint8_t *)"", 0, f, 1), 0);

    static const struct {
        const char *bytes;
        size_t len;
    } bad[] = {
        { "\x0a", 1 },         /* tag without length */
        { "\x0a\x05\x0a", 3 }, /* length past the end */
        { "\x0e\x00", 2 },     /* wire type 6 */
        { "\x0f\x00", 2 },     /* wire type 7 */
        { "\x00\x00", 2 },     /* field number 0 */
        { "\x0c", 1 },         /* end group nobody opened */
        { "\x0b\x0a\x00", 3 }, /* group never closed */
        { "\x0b\x14", 2 },     /* group closed by another field */
        { "\x08\x80\x80", 3 }, /* truncated varint */
        { "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12 }, /* 11 */
        { "\x0d\x01\x02", 3 },     /* truncated fixed32 */
        { "\x09\x01\x02\x03", 4 }, /* truncated fixed64 */
        /* a packed FloatList of 3 bytes */
        { "\x0a\x0c\x0a\x0a\x0a\x01k\x12\x05\x12\x03\x0a\x01\x00", 14 },
        /* a packed Int64List ending inside a varint */
        { "\x0a\x0c\x0a\x0a\x0a\x01k\x12\x05\x1a\x03\x0a\x01\x80", 14 },
    };

    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(bad); i++) {
        f[0].kind = 42;
        if (emlio_example_parse((const uint8_t *)bad[i].bytes, bad[i].len, f,
                                1) != EMLIO_EPROTO)
            fail_msg("malformed input %zu was accepted", i);
        assert_int_equal(f[0].kind, EMLIO_FEATURE_NONE);
    }
    /* Groups nested deeper than any real message are refused. */
    uint8_t deep[200];
    for (size_t i = 0; i < 100; i++)
        deep[i] = 0x0b; /* start group 1 */
    for (size_t i = 100; i < 200; i++)
        deep[i] = 0x0c; /* end group 1 */
    assert_int_equal(emlio_example_parse(deep, sizeof(deep), f, 1),
                     EMLIO_EPROTO);
    assert_int_equal(emlio_example_parse(deep + 90, 20, f, 1), 0);
}

/* Every prefix of a valid Example parses to EMLIO_EPROTO or to a valid
 * result; ASan in `make check` catches any read past the prefix, which is
 * copied to its own allocation for that reason. */
static void
test_example_truncated_every_length(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    s_hand_example(&b);
    uint8_t img[300];
    memset(img, 0xab, sizeof(img));
    assert_int_equal(emlio_example_build(&b, "image/encoded", img, sizeof(img),
                                         "image/class/label", -5),
                     0);
    for (size_t len = 0; len < b.len; len++) {
        uint8_t *copy = malloc(len ? len : 1);
        assert_non_null(copy);
        if (len)
            memcpy(copy, b.data, len);
        emlio_example_field_t f[3] = { FIELD("packed"), FIELD("image/encoded"),
                                       FIELD("floats") };
        int rc = emlio_example_parse(copy, len, f, 3);
        assert_true(rc == EMLIO_EPROTO || (rc >= 0 && rc <= 3));
        for (size_t i = 0; i < 3; i++)
            if (f[i].kind == EMLIO_FEATURE_BYTES)
                assert_true(f[i].bytes + f[i].bytes_len <= copy + len);
        free(copy);
    }
    emlio_example_field_t f[3] = { FIELD("packed"), FIELD("image/encoded"),
                                   FIELD("floats") };
    assert_int_equal(emlio_example_parse(b.data, b.len, f, 3), 3);
    assert_int_equal(f[1].bytes_len, sizeof(img));
    emlio_buf_release(&b);
}

typedef struct {
    int calls;
    char keys[8][16];
    int kinds[8];
    size_t counts[8];
    int stop_after;
} s_seen_t;

static int
s_collect(void *userdata, const uint8_t *key, size_t key_len, int kind,
          size_t count)
{
    s_seen_t *seen = userdata;
    assert_true(seen->calls < 8 && key_len < 16);
    memcpy(seen->keys[seen->calls], key, key_len);
    seen->keys[seen->calls][key_len] = 0;
    seen->kinds[seen->calls] = kind;
    seen->counts[seen->calls] = count;
    seen->calls++;
    return seen->calls == seen->stop_after ? 77 : 0;
}

static void
test_example_foreach(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    s_hand_example(&b);
    s_seen_t seen = { 0 };
    assert_int_equal(emlio_example_foreach(b.data, b.len, s_collect, &seen), 0);
    assert_int_equal(seen.calls, 4);
    static const char *keys[] = { "packed", "unpacked", "floats", "bytes" };
    static const int kinds[] = { EMLIO_FEATURE_INT64, EMLIO_FEATURE_INT64,
                                 EMLIO_FEATURE_FLOAT, EMLIO_FEATURE_BYTES };
    static const size_t counts[] = { 3, 2, 3, 2 };
    for (int i = 0; i < 4; i++) {
        assert_string_equal(seen.keys[i], keys[i]);
        assert_int_equal(seen.kinds[i], kinds[i]);
        assert_int_equal(seen.counts[i], counts[i]);
    }
    /* A non-zero return stops the walk and is passed through. */
    s_seen_t stop = { .stop_after = 2 };
    assert_int_equal(emlio_example_foreach(b.data, b.len, s_collect, &stop),
                     77);
    assert_int_equal(stop.calls, 2);
    /* Malformed input reports EMLIO_EPROTO. */
    s_seen_t none = { 0 };
    assert_int_equal(
        emlio_example_foreach((const uint8_t *)"\x0a\x05", 2, s_collect, &none),
        EMLIO_EPROTO);
    assert_int_equal(none.calls, 0);
    emlio_buf_release(&b);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_build_parse_roundtrip),
        cmocka_unit_test(test_example_build_matches_protobuf),
        cmocka_unit_test(test_example_packed_unpacked_unknown),
        cmocka_unit_test(test_example_last_entry_wins),
        cmocka_unit_test(test_example_empty_and_malformed),
        cmocka_unit_test(test_example_truncated_every_length),
        cmocka_unit_test(test_example_foreach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
