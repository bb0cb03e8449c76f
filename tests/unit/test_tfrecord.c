/* test_tfrecord.c - unit tests of memory-mapped TFRecord shards and indexes.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "crc32c.h"
#include "emlio/example.h"
#include "tfrecord.h"

#define NREC 7

/* Per-test scratch: a temporary directory and paths inside it. */
typedef struct {
    char dir[64];
    char shard[128];
    char idx[128];
    emlio_buf_t file; /* the shard's bytes as written */
} fixture_t;

static size_t
s_rec_len(int i)
{
    /* Sizes around 0, a word, a page and a record spanning pages. */
    static const size_t lens[NREC] = { 0, 1, 7, 8, 100, 4096, 10000 };
    return lens[i];
}

static uint8_t
s_rec_byte(int i, size_t j)
{
    return (uint8_t)(i * 31 + j * 7 + (j >> 8));
}

static uint64_t
s_rec_offset(int i)
{
    uint64_t off = 0;
    for (int k = 0; k < i; k++)
        off += s_rec_len(k) + EMLIO_TFRECORD_OVERHEAD;
    return off;
}

static void
s_build(emlio_buf_t *out)
{
    for (int i = 0; i < NREC; i++) {
        size_t len = s_rec_len(i);
        uint8_t *data = malloc(len ? len : 1);
        assert_non_null(data);
        for (size_t j = 0; j < len; j++)
            data[j] = s_rec_byte(i, j);
        assert_int_equal(emlio_tfrecord_append(out, data, len), 0);
        free(data);
    }
}

static int
s_setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    test_mkdtemp(fx->dir, sizeof(fx->dir));
    snprintf(fx->shard, sizeof(fx->shard), "%s/a.tfrecord", fx->dir);
    snprintf(fx->idx, sizeof(fx->idx), "%s/a.idx", fx->dir);
    s_build(&fx->file);
    test_write_file(fx->shard, fx->file.data, fx->file.len);
    *state = fx;
    return 0;
}

static int
s_teardown(void **state)
{
    fixture_t *fx = *state;
    test_rmtree(fx->dir);
    emlio_buf_release(&fx->file);
    free(fx);
    return 0;
}

static emlio_tfrecord_t *
s_open(const char *path)
{
    emlio_tfrecord_t *tf = emlio_tfrecord_new(path);
    assert_non_null(tf);
    assert_int_equal(emlio_tfrecord_open(tf), 0);
    return tf;
}

/* Asserts the last message names the file and the offset. */
static void
s_assert_msg(const emlio_tfrecord_t *tf, const char *path, uint64_t offset)
{
    const char *msg = emlio_tfrecord_errmsg(tf);
    char want[64];
    snprintf(want, sizeof(want), "at offset %" PRIu64, offset);
    if (!strstr(msg, path) || !strstr(msg, want))
        fail_msg("message '%s' lacks '%s' or '%s'", msg, path, want);
}

/* Rewrites the shard with byte at off xor-ed with mask. */
static void
s_corrupt(fixture_t *fx, uint64_t off, uint8_t mask)
{
    fx->file.data[off] ^= mask;
    test_write_file(fx->shard, fx->file.data, fx->file.len);
}

static void
test_tfrecord_roundtrip(void **state)
{
    fixture_t *fx = *state;
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_string_equal(emlio_tfrecord_path(tf), fx->shard);
    assert_int_equal(emlio_tfrecord_size(tf), fx->file.len);
    assert_int_equal(emlio_tfrecord_count(tf), 0);
    assert_int_equal(emlio_tfrecord_scan(tf, true), NREC);
    assert_int_equal(emlio_tfrecord_count(tf), NREC);
    for (int i = 0; i < NREC; i++) {
        const emlio_tfrecord_loc_t *loc = emlio_tfrecord_loc(tf, (size_t)i);
        assert_int_equal(loc->offset, s_rec_offset(i));
        assert_int_equal(loc->len, s_rec_len(i));
        const uint8_t *data;
        size_t len;
        uint32_t crc;
        assert_int_equal(
            emlio_tfrecord_record(tf, (size_t)i, &data, &len, &crc), 0);
        assert_int_equal(len, s_rec_len(i));
        for (size_t j = 0; j < len; j++)
            assert_int_equal(data[j], s_rec_byte(i, j));
        assert_int_equal(crc, emlio_crc32c(0, data, len));
        assert_int_equal(
            emlio_tfrecord_record(tf, (size_t)i, &data, &len, NULL), 0);
        assert_int_equal(emlio_tfrecord_verify(tf, (size_t)i), 0);
    }
    /* Scanning twice replaces the index rather than appending to it. */
    assert_int_equal(emlio_tfrecord_scan(tf, false), NREC);
    emlio_tfrecord_destroy(&tf);
    assert_null(tf);
    emlio_tfrecord_destroy(&tf);
    emlio_tfrecord_destroy(NULL);
}

static void
test_tfrecord_record_out_of_range(void **state)
{
    fixture_t *fx = *state;
    emlio_tfrecord_t *tf = s_open(fx->shard);
    const uint8_t *data;
    size_t len;
    assert_int_equal(emlio_tfrecord_record(tf, 0, &data, &len, NULL),
                     EMLIO_ENOTFOUND);
    assert_int_equal(emlio_tfrecord_scan(tf, false), NREC);
    assert_int_equal(emlio_tfrecord_record(tf, NREC, &data, &len, NULL),
                     EMLIO_ENOTFOUND);
    assert_int_equal(emlio_tfrecord_verify(tf, NREC), EMLIO_ENOTFOUND);
    emlio_tfrecord_destroy(&tf);
}

static void
test_tfrecord_open_errors(void **state)
{
    fixture_t *fx = *state;
    char path[160];
    snprintf(path, sizeof(path), "%s/missing.tfrecord", fx->dir);
    emlio_tfrecord_t *tf = emlio_tfrecord_new(path);
    assert_non_null(tf);
    assert_int_equal(emlio_tfrecord_open(tf), -ENOENT);
    assert_non_null(strstr(emlio_tfrecord_errmsg(tf), path));
    emlio_tfrecord_destroy(&tf);

    tf = emlio_tfrecord_new(fx->dir);
    assert_int_equal(emlio_tfrecord_open(tf), -EISDIR);
    emlio_tfrecord_destroy(&tf);

    tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_open(tf), EMLIO_EINVAL);
    emlio_tfrecord_destroy(&tf);
}

static void
test_tfrecord_index_roundtrip(void **state)
{
    fixture_t *fx = *state;
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_scan(tf, false), NREC);
    assert_int_equal(emlio_tfrecord_write_index(tf, fx->idx), 0);

    /* The text is exactly what DALI's tfrecord2idx writes. */
    emlio_buf_t want = EMLIO_BUF_INIT;
    for (int i = 0; i < NREC; i++)
        assert_int_equal(emlio_buf_addf(&want, "%" PRIu64 " %zu\n",
                                        s_rec_offset(i), s_rec_len(i) + 16),
                         0);
    FILE *f = fopen(fx->idx, "rb");
    assert_non_null(f);
    char got[1024];
    size_t n = fread(got, 1, sizeof(got), f);
    fclose(f);
    assert_int_equal(n, want.len);
    assert_memory_equal(got, want.data, n);
    emlio_buf_release(&want);

    emlio_tfrecord_t *other = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_load_index(other, fx->idx), NREC);
    assert_int_equal(emlio_tfrecord_count(other), NREC);
    for (size_t i = 0; i < NREC; i++) {
        assert_int_equal(emlio_tfrecord_loc(other, i)->offset,
                         emlio_tfrecord_loc(tf, i)->offset);
        assert_int_equal(emlio_tfrecord_loc(other, i)->len,
                         emlio_tfrecord_loc(tf, i)->len);
        assert_int_equal(emlio_tfrecord_verify(other, i), 0);
    }
    /* Overwriting an existing index is atomic and leaves no temp file. */
    assert_int_equal(emlio_tfrecord_write_index(other, fx->idx), 0);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "test $(ls '%s' | wc -l) -eq 2", fx->dir);
    assert_int_equal(system(cmd), 0);
    emlio_tfrecord_destroy(&other);
    emlio_tfrecord_destroy(&tf);
}

/* Writes text as the index and expects load_index to fail with a message
 * containing each of the given words. */
static void
s_expect_bad_index(fixture_t *fx, const char *text, const char *word)
{
    test_write_file(fx->idx, text, strlen(text));
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_load_index(tf, fx->idx), EMLIO_EFORMAT);
    assert_int_equal(emlio_tfrecord_count(tf), 0);
    const char *msg = emlio_tfrecord_errmsg(tf);
    if (!strstr(msg, fx->idx) || !strstr(msg, word))
        fail_msg("message '%s' lacks '%s' or '%s'", msg, fx->idx, word);
    emlio_tfrecord_destroy(&tf);
}

static void
test_tfrecord_index_mismatch_rejected(void **state)
{
    fixture_t *fx = *state;
    char good[512] = "";
    size_t used = 0;
    for (int i = 0; i < NREC; i++)
        used += (size_t)snprintf(good + used, sizeof(good) - used,
                                 "%" PRIu64 " %zu\n", s_rec_offset(i),
                                 s_rec_len(i) + 16);
    /* DALI-style whitespace and a CRLF are accepted. */
    char lenient[600];
    snprintf(lenient, sizeof(lenient), "0  16\r\n\n%s", strchr(good, '\n') + 1);
    test_write_file(fx->idx, lenient, strlen(lenient));
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_load_index(tf, fx->idx), NREC);
    emlio_tfrecord_destroy(&tf);

    /* One record short: the index does not cover the whole file. */
    char text[600];
    snprintf(text, sizeof(text), "%s", good);
    text[strlen(text) - 1] = 0;
    strrchr(text, '\n')[1] = 0;
    s_expect_bad_index(fx, text, "covers");
    /* A size that disagrees with the record's length field. */
    snprintf(text, sizeof(text), "0 17\n%s", strchr(good, '\n') + 1);
    s_expect_bad_index(fx, text, "line 1");
    /* Offsets out of order. */
    s_expect_bad_index(fx, "16 17\n0 16\n", "line 1");
    /* Garbage, a missing field, a negative number, an overflow. */
    s_expect_bad_index(fx, "hello world\n", "malformed line 1");
    s_expect_bad_index(fx, "0 16\n17\n", "malformed line 2");
    s_expect_bad_index(fx, "0 -16\n", "malformed line 1");
    s_expect_bad_index(fx, "0 99999999999999999999999\n", "malformed");
    s_expect_bad_index(fx, "0 16 3\n", "malformed line 1");
    /* An index of some other, larger file. */
    s_expect_bad_index(fx, "0 16\n16 1000016\n", "line 2");
    /* An empty index describes an empty file only. */
    s_expect_bad_index(fx, "", "covers 0");

    /* A missing index file is a system error. */
    tf = s_open(fx->shard);
    char path[160];
    snprintf(path, sizeof(path), "%s/none.idx", fx->dir);
    assert_int_equal(emlio_tfrecord_load_index(tf, path), -ENOENT);
    assert_non_null(strstr(emlio_tfrecord_errmsg(tf), path));
    emlio_tfrecord_destroy(&tf);
}

static void
test_tfrecord_truncated_record(void **state)
{
    fixture_t *fx = *state;
    /* Cut inside the header, inside the data and inside the trailing CRC
     * of the last record. */
    uint64_t last = s_rec_offset(NREC - 1);
    uint64_t cuts[] = { last + 5, last + 12 + 100, fx->file.len - 1 };
    for (size_t c = 0; c < EMLIO_ARRAY_SIZE(cuts); c++) {
        test_write_file(fx->shard, fx->file.data, (size_t)cuts[c]);
        emlio_tfrecord_t *tf = s_open(fx->shard);
        assert_int_equal(emlio_tfrecord_scan(tf, c % 2 == 0), EMLIO_EFORMAT);
        assert_int_equal(emlio_tfrecord_count(tf), 0);
        s_assert_msg(tf, fx->shard, last);
        assert_non_null(strstr(emlio_tfrecord_errmsg(tf), "truncated"));
        emlio_tfrecord_destroy(&tf);
    }
}

static void
test_tfrecord_bad_length_crc(void **state)
{
    fixture_t *fx = *state;
    uint64_t off = s_rec_offset(3);
    s_corrupt(fx, off + 9, 0x01);
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_scan(tf, false), EMLIO_EFORMAT);
    assert_int_equal(emlio_tfrecord_count(tf), 0);
    s_assert_msg(tf, fx->shard, off);
    char want[256];
    snprintf(want, sizeof(want), "bad length crc in '%s' at offset %" PRIu64,
             fx->shard, off);
    assert_string_equal(emlio_tfrecord_errmsg(tf), want);
    emlio_tfrecord_destroy(&tf);

    /* A flipped length bit is caught the same way. */
    s_corrupt(fx, off + 9, 0x01);
    s_corrupt(fx, off + 2, 0x10);
    tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_scan(tf, false), EMLIO_EFORMAT);
    s_assert_msg(tf, fx->shard, off);
    emlio_tfrecord_destroy(&tf);
}

static void
test_tfrecord_bad_data_crc(void **state)
{
    fixture_t *fx = *state;
    uint64_t off = s_rec_offset(5);
    s_corrupt(fx, off + 12 + 2000, 0x80);
    emlio_tfrecord_t *tf = s_open(fx->shard);
    /* Without verify only the framing is checked, so the scan succeeds and
     * verify finds the one bad record. */
    assert_int_equal(emlio_tfrecord_scan(tf, false), NREC);
    for (size_t i = 0; i < NREC; i++)
        assert_int_equal(emlio_tfrecord_verify(tf, i),
                         i == 5 ? EMLIO_ECORRUPT : 0);
    assert_int_equal(emlio_tfrecord_scan(tf, true), EMLIO_ECORRUPT);
    assert_int_equal(emlio_tfrecord_count(tf), 0);
    s_assert_msg(tf, fx->shard, off);
    assert_non_null(strstr(emlio_tfrecord_errmsg(tf), "bad data crc"));
    emlio_tfrecord_destroy(&tf);

    /* A damaged stored CRC is a data CRC mismatch too. */
    s_corrupt(fx, off + 12 + 2000, 0x80);
    s_corrupt(fx, off + 12 + s_rec_len(5) + 3, 0x04);
    tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_scan(tf, true), EMLIO_ECORRUPT);
    s_assert_msg(tf, fx->shard, off);
    emlio_tfrecord_destroy(&tf);
}

static void
test_tfrecord_empty_file(void **state)
{
    fixture_t *fx = *state;
    test_write_file(fx->shard, "", 0);
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_size(tf), 0);
    assert_int_equal(emlio_tfrecord_scan(tf, true), 0);
    assert_int_equal(emlio_tfrecord_count(tf), 0);
    assert_int_equal(emlio_tfrecord_advise(tf, 0, 0, EMLIO_ADVISE_WILLNEED), 0);
    assert_int_equal(emlio_tfrecord_write_index(tf, fx->idx), 0);
    struct stat st;
    assert_int_equal(stat(fx->idx, &st), 0);
    assert_int_equal(st.st_size, 0);
    assert_int_equal(emlio_tfrecord_load_index(tf, fx->idx), 0);
    emlio_tfrecord_destroy(&tf);
}

/* Files that are not TFRecord at all: the first header fails its CRC. */
static void
test_tfrecord_not_a_tfrecord(void **state)
{
    fixture_t *fx = *state;
    static const uint8_t jpeg[] = { 0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10,
                                    'J',  'F',  'I',  'F',  0x00, 0x01,
                                    0x01, 0x00, 0x00, 0x01, 0x00, 0x01,
                                    0x00, 0x00, 0xff, 0xd9 };
    static const char text[] = "this is a plain text file, not a shard\n";

    static const struct {
        const void *data;
        size_t len;
    } inputs[] = { { jpeg, sizeof(jpeg) },
                   { text, sizeof(text) - 1 },
                   { "short", 5 } };

    for (size_t k = 0; k < EMLIO_ARRAY_SIZE(inputs); k++) {
        test_write_file(fx->shard, inputs[k].data, inputs[k].len);
        emlio_tfrecord_t *tf = s_open(fx->shard);
        assert_int_equal(emlio_tfrecord_scan(tf, true), EMLIO_EFORMAT);
        s_assert_msg(tf, fx->shard, 0);
        assert_int_equal(emlio_tfrecord_count(tf), 0);
        emlio_tfrecord_destroy(&tf);
    }
}

/* A header with a valid CRC whose length runs past the end of the file,
 * and one beyond EMLIO_TFRECORD_MAX_RECORD. */
static void
test_tfrecord_length_past_end(void **state)
{
    fixture_t *fx = *state;
    static const uint64_t lens[] = { 1u << 20, (uint64_t)1 << 40, UINT64_MAX };
    for (size_t k = 0; k < EMLIO_ARRAY_SIZE(lens); k++) {
        emlio_buf_t b = EMLIO_BUF_INIT;
        assert_int_equal(emlio_tfrecord_append(&b, (const uint8_t *)"ab", 2),
                         0);
        uint8_t hdr[12];
        for (int i = 0; i < 8; i++)
            hdr[i] = (uint8_t)(lens[k] >> (8 * i));
        uint32_t m = emlio_crc32c_mask(emlio_crc32c(0, hdr, 8));
        for (int i = 0; i < 4; i++)
            hdr[8 + i] = (uint8_t)(m >> (8 * i));
        assert_int_equal(emlio_buf_add(&b, hdr, sizeof(hdr)), 0);
        assert_int_equal(emlio_buf_add(&b, "some bytes", 10), 0);
        test_write_file(fx->shard, b.data, b.len);
        emlio_buf_release(&b);
        emlio_tfrecord_t *tf = s_open(fx->shard);
        assert_int_equal(emlio_tfrecord_scan(tf, false), EMLIO_EFORMAT);
        s_assert_msg(tf, fx->shard, 18);
        emlio_tfrecord_destroy(&tf);
    }
}

static void
test_tfrecord_advise(void **state)
{
    fixture_t *fx = *state;
    emlio_tfrecord_t *tf = s_open(fx->shard);
    assert_int_equal(emlio_tfrecord_scan(tf, false), NREC);
    assert_int_equal(emlio_tfrecord_advise(tf, 0, NREC, EMLIO_ADVISE_WILLNEED),
                     0);
    assert_int_equal(emlio_tfrecord_advise(tf, 3, 2, EMLIO_ADVISE_DONTNEED), 0);
    assert_int_equal(emlio_tfrecord_advise(tf, 6, 1, EMLIO_ADVISE_WILLNEED), 0);
    assert_int_equal(emlio_tfrecord_advise(tf, 6, 2, EMLIO_ADVISE_WILLNEED),
                     -EINVAL);
    assert_int_equal(emlio_tfrecord_advise(tf, 0, 1, 99), -EINVAL);
    /* DONTNEED drops our pages, not the data: it reads back the same. */
    assert_int_equal(emlio_tfrecord_advise(tf, 0, NREC, EMLIO_ADVISE_DONTNEED),
                     0);
    for (size_t i = 0; i < NREC; i++)
        assert_int_equal(emlio_tfrecord_verify(tf, i), 0);
    emlio_tfrecord_destroy(&tf);
}

/* tests/data/foreign.tfrecord was written by python3-crcmod and
 * python3-protobuf (see tests/data/foreign.tfrecord.txt), not by us. */
static void
test_tfrecord_reads_foreign_shard(void **state)
{
    (void)state;
    const char *path = "tests/data/foreign.tfrecord";
    emlio_tfrecord_t *tf = s_open(path);
    assert_int_equal(emlio_tfrecord_scan(tf, true), 5);
    const uint8_t *data;
    size_t len;
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(emlio_tfrecord_record(tf, i, &data, &len, NULL), 0);
        emlio_example_field_t f[3] = {
            { .key = "image/encoded", .key_len = 13 },
            { .key = "image/class/label", .key_len = 17 },
            { .key = "image/scores", .key_len = 12 },
        };
        assert_int_equal(emlio_example_parse(data, len, f, 3), 3);
        assert_int_equal(f[0].kind, EMLIO_FEATURE_BYTES);
        assert_int_equal(f[0].count, 1);
        assert_int_equal(f[0].bytes_len, 100 + 1000 * i);
        for (size_t j = 0; j < f[0].bytes_len; j++)
            assert_int_equal(f[0].bytes[j], (i * 7 + j) % 251);
        assert_int_equal(f[1].kind, EMLIO_FEATURE_INT64);
        assert_int_equal(f[1].count, 1);
        assert_true(f[1].int64 == (int64_t)i - 1);
        assert_int_equal(f[2].kind, EMLIO_FEATURE_FLOAT);
        assert_int_equal(f[2].count, 3);
        assert_true(f[2].f32 == 0.5f);
    }
    assert_int_equal(emlio_tfrecord_record(tf, 3, &data, &len, NULL), 0);
    assert_int_equal(len, 0);
    assert_int_equal(emlio_tfrecord_record(tf, 4, &data, &len, NULL), 0);
    assert_int_equal(len, 70000);
    for (size_t j = 0; j < len; j++)
        assert_int_equal(data[j], (j * 13) & 0xff);
    emlio_tfrecord_destroy(&tf);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tfrecord_roundtrip, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_record_out_of_range,
                                        s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_open_errors, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_index_roundtrip, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_index_mismatch_rejected,
                                        s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_truncated_record, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_bad_length_crc, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_bad_data_crc, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_empty_file, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_not_a_tfrecord, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_length_past_end, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tfrecord_advise, s_setup,
                                        s_teardown),
        cmocka_unit_test(test_tfrecord_reads_foreign_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
