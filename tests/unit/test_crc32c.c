/* test_crc32c.c - unit tests of the CRC-32C module.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "crc32c.h"

/* A deterministic byte pattern (xorshift) so failures reproduce. */
static void
s_fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
}

static void
test_crc32c_check_value(void **state)
{
    (void)state;
    assert_int_equal(emlio_crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(emlio__crc32c_sw(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(emlio_crc32c(0, "", 0), 0);
    assert_int_equal(emlio_crc32c(0, NULL, 0), 0);
}

/* RFC 3720 appendix B.4. */
static void
test_crc32c_rfc3720_vectors(void **state)
{
    (void)state;
    uint8_t buf[32];
    memset(buf, 0x00, sizeof(buf));
    assert_int_equal(emlio_crc32c(0, buf, 32), 0x8a9136aau);
    assert_int_equal(emlio__crc32c_sw(0, buf, 32), 0x8a9136aau);
    memset(buf, 0xff, sizeof(buf));
    assert_int_equal(emlio_crc32c(0, buf, 32), 0x62a8ab43u);
    assert_int_equal(emlio__crc32c_sw(0, buf, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(emlio_crc32c(0, buf, 32), 0x46dd794eu);
    assert_int_equal(emlio__crc32c_sw(0, buf, 32), 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    assert_int_equal(emlio_crc32c(0, buf, 32), 0x113fdb5cu);
    assert_int_equal(emlio__crc32c_sw(0, buf, 32), 0x113fdb5cu);
}

static void
test_crc32c_incremental_equals_whole(void **state)
{
    (void)state;
    static const char text[] = "123456789";
    for (size_t cut = 0; cut <= 9; cut++) {
        uint32_t crc = emlio_crc32c(0, text, cut);
        assert_int_equal(emlio_crc32c(crc, text + cut, 9 - cut), 0xe3069283u);
        crc = emlio__crc32c_sw(0, text, cut);
        assert_int_equal(emlio__crc32c_sw(crc, text + cut, 9 - cut),
                         0xe3069283u);
    }
}

/* The hardware path splits long inputs into interleaved blocks of 3 * 8192,
 * 3 * 256 and 3 * 64 bytes after aligning; lengths around those edges, at every
 * alignment, are where a wrong shift constant would show. On CPUs with
 * 512-bit carry-less multiplies (this project's VMs have them) inputs of
 * 8 KiB and more are folded 256 bytes at a time, then the last 64 and 16,
 * and the tail goes the three-way path: the edges around 8 KiB, 256 * k
 * and 256 * k + 16 pin those constants. */
static void
test_crc32c_hw_matches_sw(void **state)
{
    (void)state;
    size_t cap = 3 * 8192 * 3 + 64;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    s_fill(buf, cap, 42);
    static const size_t edges[] = { 0,
                                    1,
                                    7,
                                    8,
                                    9,
                                    191,
                                    192,
                                    193,
                                    3 * 64 + 768 + 3,
                                    767,
                                    768,
                                    769,
                                    3 * 8192 - 1,
                                    3 * 8192,
                                    3 * 8192 + 1,
                                    3 * 8192 + 768 + 7,
                                    2 * 3 * 8192 + 5,
                                    8191,
                                    8192,
                                    8193,
                                    8192 + 15,
                                    8192 + 16,
                                    8192 + 63,
                                    8192 + 64,
                                    8192 + 255,
                                    256 * 97,
                                    256 * 97 + 16,
                                    256 * 97 + 63,
                                    256 * 97 + 255 };
    for (size_t e = 0; e < EMLIO_ARRAY_SIZE(edges); e++)
        for (size_t align = 0; align < 16; align++) {
            size_t len = edges[e];
            assert_int_equal(emlio_crc32c(0, buf + align, len),
                             emlio__crc32c_sw(0, buf + align, len));
            assert_int_equal(emlio_crc32c(0x12345678, buf + align, len),
                             emlio__crc32c_sw(0x12345678, buf + align, len));
        }
    uint64_t x = 7;
    for (int i = 0; i < 500; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t align = (size_t)(x >> 60);
        size_t len = (size_t)(x >> 20) % (cap - 16);
        assert_int_equal(emlio_crc32c(0, buf + align, len),
                         emlio__crc32c_sw(0, buf + align, len));
    }
    free(buf);
}

/* Every length of the folded path's first kilobyte (8 KiB + 0..1024: each
 * tail after the 256-byte steps, 0..255, reached four times) at four
 * alignments, from a zero and a running CRC, and with all bytes 0xff (every
 * carry-less product's bits set); then one bit flipped at every 61st
 * position of a folded buffer, which each constant's lane must see. */
static void
test_crc32c_fold_sweep(void **state)
{
    (void)state;
    size_t cap = 8192 + 1024 + 64;
    uint8_t *buf = malloc(cap);
    uint8_t *ones = malloc(cap);
    assert_non_null(buf);
    assert_non_null(ones);
    s_fill(buf, cap, 8192);
    memset(ones, 0xff, cap);
    static const size_t aligns[] = { 0, 1, 8, 63 };
    for (size_t len = 8192 - 16; len <= 8192 + 1024; len++)
        for (size_t a = 0; a < EMLIO_ARRAY_SIZE(aligns); a++) {
            const uint8_t *p = buf + aligns[a];
            uint32_t run = (uint32_t)(len * 2654435761u);
            assert_int_equal(emlio_crc32c(0, p, len),
                             emlio__crc32c_sw(0, p, len));
            assert_int_equal(emlio_crc32c(run, p, len),
                             emlio__crc32c_sw(run, p, len));
            assert_int_equal(emlio_crc32c(run, ones + aligns[a], len),
                             emlio__crc32c_sw(run, ones + aligns[a], len));
        }
    size_t len = 8192 + 512 + 17;
    uint32_t clean = emlio_crc32c(0, buf, len);
    for (size_t i = 0; i < len * 8; i += 61) {
        buf[i / 8] ^= (uint8_t)(1u << (i % 8));
        uint32_t flipped = emlio_crc32c(0, buf, len);
        assert_int_not_equal(flipped, clean);
        assert_int_equal(flipped, emlio__crc32c_sw(0, buf, len));
        buf[i / 8] ^= (uint8_t)(1u << (i % 8));
    }
    free(ones);
    free(buf);
}

static void
test_crc32c_combine(void **state)
{
    (void)state;
    size_t cap = 100000;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    s_fill(buf, cap, 9);
    static const size_t cuts[] = { 0, 1, 9, 100, 4096, 65537, 99999, 100000 };
    uint32_t whole = emlio_crc32c(0, buf, cap);
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(cuts); i++) {
        size_t cut = cuts[i];
        uint32_t a = emlio_crc32c(0, buf, cut);
        uint32_t b = emlio_crc32c(0, buf + cut, cap - cut);
        assert_int_equal(emlio_crc32c_combine(a, b, cap - cut), whole);
    }
    /* Every short length: each bit of the length is one multiply of the
     * hardware combine, the low ones by negative powers of x. */
    for (size_t len = 0; len < 600; len++)
        assert_int_equal(emlio_crc32c_combine(emlio_crc32c(0, buf, 7),
                                              emlio_crc32c(0, buf + 7, len),
                                              len),
                         emlio_crc32c(0, buf, 7 + len));
    /* Three pieces, combined left to right. */
    uint32_t ab = emlio_crc32c_combine(emlio_crc32c(0, buf, 10),
                                       emlio_crc32c(0, buf + 10, 20), 20);
    uint32_t abc = emlio_crc32c_combine(ab, emlio_crc32c(0, buf + 30, 70), 70);
    assert_int_equal(abc, emlio_crc32c(0, buf, 100));
    /* Appending nothing changes nothing. */
    assert_int_equal(emlio_crc32c_combine(whole, 0, 0), whole);
    free(buf);
}

/* Checks that the middle of buf[0, len) cut at h and len - t has the CRC
 * emlio_crc32c_middle derives from the whole's, the head's and the
 * tail's, on both multiply paths. */
static void
s_check_middle(const uint8_t *buf, size_t len, uint32_t whole, size_t h,
               size_t t)
{
    size_t m = len - h - t;
    uint32_t head = emlio_crc32c(0, buf, h);
    uint32_t tail = emlio_crc32c(0, buf + h + m, t);
    uint32_t mid = emlio_crc32c(0, buf + h, m);
    assert_int_equal(emlio_crc32c_middle(whole, head, tail, m, t), mid);
    assert_int_equal(emlio__crc32c_middle_sw(whole, head, tail, m, t), mid);
}

/* Every split of short buffers into head, middle and tail (each possibly
 * empty). */
static void
test_crc32c_middle_all_splits(void **state)
{
    (void)state;
    uint8_t buf[40];
    for (size_t len = 0; len <= sizeof(buf); len++) {
        s_fill(buf, len, 100 + len);
        uint32_t whole = emlio_crc32c(0, buf, len);
        for (size_t h = 0; h <= len; h++)
            for (size_t t = 0; h + t <= len; t++)
                s_check_middle(buf, len, whole, h, t);
    }
}

/* Random splits of buffers up to 4 MiB, and the edges: empty head, tail,
 * middle, or all three. */
static void
test_crc32c_middle_long(void **state)
{
    (void)state;
    size_t cap = 4u << 20;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    s_fill(buf, cap, 77);
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 200; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        /* Lengths spread over the scales: up to 2^(6..22) bytes. */
        size_t len = (size_t)(x % (cap >> (i % 17))) + 1;
        size_t h = (size_t)((x >> 20) % (len + 1));
        size_t t = (size_t)((x >> 40) % (len - h + 1));
        uint32_t whole = emlio_crc32c(0, buf, len);
        s_check_middle(buf, len, whole, h, t);
        s_check_middle(buf, len, whole, 0, t);
        s_check_middle(buf, len, whole, h, 0);
        s_check_middle(buf, len, whole, h, len - h);
        s_check_middle(buf, len, whole, 0, 0);
    }
    /* Tails longer than the order of x in bytes do not occur (records are
     * below 2^31 bytes), but the exponent arithmetic must still hold: a
     * tail of zero CRC and 2^31 - 1 bytes shifts by x^(8 (2^31 - 1)) = 1. */
    uint32_t whole = emlio_crc32c(0, buf, 1000);
    assert_int_equal(emlio_crc32c_middle(whole, 0, 0, 0, (1u << 31) - 1),
                     whole);
    assert_int_equal(emlio__crc32c_middle_sw(whole, 0, 0, 0, (1u << 31) - 1),
                     whole);
    free(buf);
}

/* A sample corrupted on disk: the derived CRC no longer matches the bytes. */
static void
test_crc32c_middle_detects_flip(void **state)
{
    (void)state;
    uint8_t buf[5000];
    s_fill(buf, sizeof(buf), 5);
    uint32_t whole = emlio_crc32c(0, buf, sizeof(buf));
    uint32_t head = emlio_crc32c(0, buf, 100);
    uint32_t tail = emlio_crc32c(0, buf + 4900, 100);
    uint32_t derived = emlio_crc32c_middle(whole, head, tail, 4800, 100);
    buf[2500] ^= 0x10;
    assert_int_not_equal(emlio_crc32c(0, buf + 100, 4800), derived);
}

static void
test_crc32c_mask_roundtrip(void **state)
{
    (void)state;
    static const uint32_t values[] = { 0,           1,           0xe3069283u,
                                       0xffffffffu, 0xa282ead8u, 0x80000000u };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(values); i++)
        assert_int_equal(emlio_crc32c_unmask(emlio_crc32c_mask(values[i])),
                         values[i]);
    /* TensorFlow's masking of 0 is the delta itself; of the check value,
     * ((0xe3069283 >> 15) | (0xe3069283 << 17)) + 0xa282ead8. */
    assert_int_equal(emlio_crc32c_mask(0), 0xa282ead8u);
    assert_int_equal(emlio_crc32c_mask(0xe3069283u), 0xc78ab0e5u);
}

/* The header TensorFlow writes for an empty record: 8 zero length bytes,
 * then their masked CRC, stored as the bytes 29 03 98 07 (value checked
 * against python3-crcmod, an independent implementation). */
static void
test_crc32c_tfrecord_masked_length(void **state)
{
    (void)state;
    uint8_t zero_len[8] = { 0 };
    uint32_t masked = emlio_crc32c_mask(emlio_crc32c(0, zero_len, 8));
    assert_int_equal(masked, 0x07980329u);
    /* The data CRC of an empty record is mask(crc("")) = mask(0). */
    assert_int_equal(emlio_crc32c_mask(emlio_crc32c(0, "", 0)), 0xa282ead8u);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_check_value),
        cmocka_unit_test(test_crc32c_rfc3720_vectors),
        cmocka_unit_test(test_crc32c_incremental_equals_whole),
        cmocka_unit_test(test_crc32c_hw_matches_sw),
        cmocka_unit_test(test_crc32c_fold_sweep),
        cmocka_unit_test(test_crc32c_combine),
        cmocka_unit_test(test_crc32c_middle_all_splits),
        cmocka_unit_test(test_crc32c_middle_long),
        cmocka_unit_test(test_crc32c_middle_detects_flip),
        cmocka_unit_test(test_crc32c_mask_roundtrip),
        cmocka_unit_test(test_crc32c_tfrecord_masked_length),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
