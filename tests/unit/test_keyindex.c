/* test_keyindex.c - the index from byte keys to array slots
 * (src/base/keyindex.c): every key is found at the slot its owner last
 * gave it, through growth, replacement and thousands of deletions that
 * shift runs back, with keys that share long prefixes as routing ids do.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <string.h>

#include "keyindex.h"

#define S_MAX 6000

/* The owner: a compact array of keys, entries moved on removal as the
 * server's peers are. */
typedef struct s_owner {
    uint8_t key[S_MAX][8];
    size_t len[S_MAX];
    size_t n;
} s_owner_t;

static s_owner_t s_own;

static bool
s_same(const void *owner, uint32_t value, const void *key, size_t len)
{
    const s_owner_t *o = owner;
    assert_true(value < o->n);
    return o->len[value] == len && !memcmp(o->key[value], key, len);
}

/* A key like a routing id: a fixed prefix, then the number. */
static size_t
s_key(uint8_t *out, uint32_t k)
{
    out[0] = 0;
    out[1] = 0x80;
    memcpy(out + 2, &k, sizeof(k));
    return 2 + (k % 3 == 0 ? 2 : 4); /* some keys are prefixes of others */
}

static void
s_check_all(const emlio__keyindex_t *ix)
{
    assert_int_equal(ix->n, s_own.n);
    for (size_t i = 0; i < s_own.n; i++) {
        uint32_t v = UINT32_MAX;
        assert_true(emlio__keyindex_get(ix, s_own.key[i], s_own.len[i], &v));
        assert_int_equal(v, i);
    }
}

static void
test_keyindex_follows_a_compact_array(void **state)
{
    (void)state;
    emlio__keyindex_t ix;
    emlio__keyindex_init(&ix, &s_own, s_same);
    uint32_t v;
    assert_false(emlio__keyindex_get(&ix, "x", 1, &v)); /* empty */
    emlio__keyindex_del(&ix, "x", 1);                   /* harmless */
    uint64_t rng = 88172645463325252ull;
    uint32_t next = 0;
    for (int step = 0; step < 40000; step++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        bool add = s_own.n < 50 || (rng % 100 < 55 && s_own.n < S_MAX);
        if (add) {
            size_t i = s_own.n++;
            s_own.len[i] = s_key(s_own.key[i], next++);
            assert_int_equal(emlio__keyindex_put(&ix, s_own.key[i],
                                                 s_own.len[i], (uint32_t)i),
                             0);
        } else {
            /* Remove entry i as keyindex.h says: forget its key, point
             * the last entry's key at i while the last is still there,
             * then move it. */
            size_t i = (size_t)(rng >> 20) % s_own.n, last = s_own.n - 1;
            uint8_t gone[8];
            size_t gone_len = s_own.len[i];
            memcpy(gone, s_own.key[i], gone_len);
            emlio__keyindex_del(&ix, gone, gone_len);
            if (i != last) {
                assert_int_equal(emlio__keyindex_put(&ix, s_own.key[last],
                                                     s_own.len[last],
                                                     (uint32_t)i),
                                 0);
                memcpy(s_own.key[i], s_own.key[last], sizeof(s_own.key[i]));
                s_own.len[i] = s_own.len[last];
            }
            s_own.n--;
            assert_false(emlio__keyindex_get(&ix, gone, gone_len, &v));
        }
        if (step % 4000 == 0)
            s_check_all(&ix);
    }
    s_check_all(&ix);
    assert_true(ix.cap >= 2 * ix.n); /* at most half full */
    /* A put of a present key adds nothing (removals above replaced
     * values: the last entry's key pointed at its new slot). */
    size_t n = ix.n;
    assert_int_equal(emlio__keyindex_put(&ix, s_own.key[0], s_own.len[0], 0),
                     0);
    assert_int_equal(ix.n, n);
    s_check_all(&ix);
    emlio__keyindex_release(&ix);
    assert_int_equal(ix.n, 0);
    assert_false(emlio__keyindex_get(&ix, s_own.key[0], s_own.len[0], &v));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyindex_follows_a_compact_array),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
