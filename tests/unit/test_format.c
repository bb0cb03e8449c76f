/* test_format.c - the table of formats: every entry fills the operations
 * its shape needs, so the shard set, the server and the tools can call
 * them without asking which format a shard has.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "format.h"
#include "shardset.h"

static void
test_format_every_entry_is_complete(void **state)
{
    (void)state;
    size_t n = 0, trees = 0;
    for (size_t k = 0; emlio__formats[k]; k++, n++) {
        const emlio__format_ops_t *ops = emlio__formats[k];
        assert_non_null(ops->name);
        assert_non_null(ops->what);
        assert_ptr_equal(emlio__format_find(ops->name), ops);
        /* Every format: what the server and the tools call. */
        assert_non_null(ops->destroy);
        assert_non_null(ops->count);
        assert_non_null(ops->size);
        assert_non_null(ops->offset);
        assert_non_null(ops->has_field);
        assert_non_null(ops->read);
        assert_non_null(ops->record);
        if (ops->suffix) {
            /* A file format: loaded, indexed and watched by the shard set;
             * tree formats come after every file format. */
            assert_int_equal(trees, 0);
            assert_true(ops->suffix[0] == '.');
            assert_null(ops->load_tree);
            assert_true(ops->mapped);
            assert_non_null(ops->create);
            assert_non_null(ops->open);
            assert_non_null(ops->load_index);
            assert_non_null(ops->scan);
            assert_non_null(ops->write_index);
            assert_non_null(ops->file);
            assert_non_null(ops->read_copy);
        } else {
            trees++;
            assert_non_null(ops->load_tree);
            assert_false(ops->mapped);
        }
    }
    assert_int_equal(n, 3);
    assert_int_equal(trees, 1);
    assert_null(emlio__format_find("auto"));
    assert_null(emlio__format_find("no-such"));
}

static void
test_format_views_own_or_hold(void **state)
{
    (void)state;
    emlio__view_t v = { 0 };
    assert_int_equal(emlio__view_int64(&v, -2), 0);
    assert_int_equal(v.len, 8);
    assert_ptr_equal(v.data, v.owned);
    assert_int_equal(v.data[0], 0xfe);
    assert_int_equal(v.data[7], 0xff);
    assert_false(v.held);
    emlio__view_release(&v, NULL); /* a copy needs no shard */
    assert_null(v.owned);
    /* A view into a mapping is only marked: the shard set, not the
     * format, takes the shard's use for it. */
    static const uint8_t bytes[4] = { 1, 2, 3, 4 };
    emlio__view_map(&v, bytes, sizeof(bytes));
    assert_true(v.held);
    assert_ptr_equal(v.data, bytes);
    assert_null(v.owned);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_every_entry_is_complete),
        cmocka_unit_test(test_format_views_own_or_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
