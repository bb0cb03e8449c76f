/* test_buf.c - emlio_buf_t: the git-style byte buffer every encoder uses.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

static void
test_buf_add_addf_detach(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    assert_null(b.data);
    assert_int_equal(emlio_buf_add(&b, "abc", 3), 0);
    assert_int_equal(emlio_buf_addf(&b, "-%d-%s", 42, "x"), 0);
    assert_int_equal(b.len, 8);
    assert_memory_equal(b.data, "abc-42-x", 8);
    assert_int_equal(b.data[b.len], 0); /* a NUL follows, uncounted */
    size_t len = 0;
    uint8_t *p = emlio_buf_detach(&b, &len);
    assert_int_equal(len, 8);
    assert_memory_equal(p, "abc-42-x", 8);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    emlio_free(p);
    emlio_free(NULL);
}

static void
test_buf_clear_keeps_memory_release_frees(void **state)
{
    (void)state;
    emlio_buf_t b;
    emlio_buf_init(&b);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(emlio_buf_addf(&b, "%d,", i), 0);
    size_t cap = b.cap;
    uint8_t *data = b.data;
    emlio_buf_clear(&b);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, cap);
    assert_ptr_equal(b.data, data);
    emlio_buf_release(&b);
    assert_null(b.data);
    assert_int_equal(b.cap, 0);
    emlio_buf_release(&b); /* idempotent */
}

static void
test_buf_refuses_impossible_sizes(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    assert_int_equal(emlio_buf_add(&b, "x", 1), 0);
    assert_int_equal(emlio_buf_grow(&b, SIZE_MAX - 1), EMLIO_ENOMEM);
    assert_int_equal(emlio_buf_grow(&b, SIZE_MAX), EMLIO_ENOMEM);
    assert_int_equal(b.len, 1); /* unchanged */
    assert_int_equal(b.data[0], 'x');
    emlio_buf_release(&b);
}

static void
test_buf_survives_failed_allocations(void **state)
{
    (void)state;
    emlio_buf_t b = EMLIO_BUF_INIT;
    emlio__alloc_fail_at(1);
    assert_int_equal(emlio_buf_add(&b, "abc", 3), EMLIO_ENOMEM);
    assert_null(b.data);
    assert_int_equal(emlio_buf_add(&b, "abc", 3), 0);
    emlio__alloc_fail_at(1);
    char big[4096];
    memset(big, 'y', sizeof(big));
    assert_int_equal(emlio_buf_add(&b, big, sizeof(big)), EMLIO_ENOMEM);
    assert_int_equal(b.len, 3); /* what was there is kept */
    assert_memory_equal(b.data, "abc", 3);
    emlio__alloc_fail_at(0);
    emlio_buf_release(&b);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf_add_addf_detach),
        cmocka_unit_test(test_buf_clear_keeps_memory_release_frees),
        cmocka_unit_test(test_buf_refuses_impossible_sizes),
        cmocka_unit_test(test_buf_survives_failed_allocations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
