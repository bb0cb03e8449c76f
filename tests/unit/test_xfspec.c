/* test_xfspec.c - the daemon's cache of transform specs: parsed once,
 * at most EMLIO__XFSPEC_MAX, the least recently used unused one
 * makes room, a new spec refused only while all are in use.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "server_xfspec.h"

static int
s_lookup(emlio__xfspecs_t *xf, int side, const emlio_transform_t **t,
         atomic_uint **users)
{
    char spec[64], err[EMLIO_ERRMSG_LEN];
    snprintf(spec, sizeof(spec), "center_crop(%d)", side);
    return emlio__xfspec_lookup(xf, spec, strlen(spec), t, users, err);
}

static void
test_xfspec_specs_are_evicted_only_when_unused(void **state)
{
    (void)state;
    emlio__xfspecs_t xf;
    memset(&xf, 0, sizeof(xf));
    char err[EMLIO_ERRMSG_LEN];
    assert_int_equal(emlio__xfspec_start(&xf, 1, 0, 0, err), 0);
    const emlio_transform_t *t[EMLIO__XFSPEC_MAX + 1];
    atomic_uint *users[EMLIO__XFSPEC_MAX + 1];
    for (int i = 0; i < EMLIO__XFSPEC_MAX; i++)
        assert_int_equal(s_lookup(&xf, 8 + i, &t[i], &users[i]), 0);
    /* The same text again: the same pipeline, one more user. */
    const emlio_transform_t *again;
    atomic_uint *u;
    assert_int_equal(s_lookup(&xf, 8, &again, &u), 0);
    assert_ptr_equal(again, t[0]);
    assert_int_equal(atomic_load(u), 2);
    atomic_fetch_sub(u, 1);
    /* All in use: a new spec is refused, the cache unchanged. */
    int n = EMLIO__XFSPEC_MAX;
    assert_int_equal(s_lookup(&xf, 8 + n, &t[n], &users[n]), EMLIO_ELIMIT);
    /* Two specs end their uses; the less recently used one makes room. */
    atomic_fetch_sub(users[3], 1);
    atomic_fetch_sub(users[5], 1);
    assert_int_equal(s_lookup(&xf, 8 + n, &t[n], &users[n]), 0);
    assert_int_equal(emlio_transform_height(t[n]), 8 + n);
    assert_int_equal(s_lookup(&xf, 8 + 5, &again, &u), 0); /* still there */
    assert_ptr_equal(again, t[5]);
    /* A bad spec is refused without touching the cache. */
    assert_int_equal(emlio__xfspec_lookup(&xf, "rotate(3)", 9, &again, &u, err),
                     EMLIO_EINVAL);
    assert_non_null(strstr(err, "rotate"));
    emlio__xfspec_stop(&xf);
}

/* Spellings of one spec are one entry (issue 34: sixteen whitespace
 * spellings held by one client took every slot). */
static void
test_xfspec_spellings_of_one_spec_share_an_entry(void **state)
{
    (void)state;
    emlio__xfspecs_t xf;
    memset(&xf, 0, sizeof(xf));
    char err[EMLIO_ERRMSG_LEN];
    assert_int_equal(emlio__xfspec_start(&xf, 1, 0, 0, err), 0);
    const emlio_transform_t *t0, *t;
    atomic_uint *u0, *u;
    const char *canon = "center_crop(12)";
    assert_int_equal(
        emlio__xfspec_lookup(&xf, canon, strlen(canon), &t0, &u0, err), 0);
    char spelled[64];
    for (int i = 1; i <= 2 * EMLIO__XFSPEC_MAX; i++) {
        /* i spaces after the comma-free name: each a new text */
        int n = snprintf(spelled, sizeof(spelled), "center_crop(%*s12)", i, "");
        int rc = emlio__xfspec_lookup(&xf, spelled, (size_t)n, &t, &u, err);
        if (rc != 0)
            fail_msg("spelling %d refused: %s", i, err);
        assert_ptr_equal(t, t0);
        assert_ptr_equal(u, u0);
    }
    assert_int_equal(atomic_load(u0), 2 * EMLIO__XFSPEC_MAX + 1);
    assert_int_equal(xf.n_specs, 1);
    emlio__xfspec_stop(&xf);
}

/* Each decode thread's memory cap follows what the daemon may use, and
 * outlives the start (issue 34: the start cleared it, so every thread
 * held up to the 512 MiB default whatever the cgroup). */
static void
test_xfspec_decode_cap_follows_the_memory(void **state)
{
    (void)state;

    static const struct {
        uint64_t limit;
        size_t threads;
        uint64_t cap;
    } cases[] = {
        { (uint64_t)1 << 30, 2, (uint64_t)128 << 20 }, /* 1 GiB / 4 / 2 */
        { (uint64_t)100 << 30, 1, EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT },
        { (uint64_t)64 << 20, 4, EMLIO__XF_WS_MIN_BYTES }, /* the floor */
        { 0, 4, EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT },    /* unknown */
    };

    char err[EMLIO_ERRMSG_LEN];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        emlio__xfspecs_t xf;
        memset(&xf, 0, sizeof(xf));
        assert_int_equal(emlio__xf_ws_cap(cases[i].limit, cases[i].threads),
                         cases[i].cap);
        assert_int_equal(
            emlio__xfspec_start(&xf, cases[i].threads, 0, cases[i].limit, err),
            0);
        assert_int_equal(xf.ws_max_bytes, cases[i].cap);
        emlio__xfspec_stop(&xf);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfspec_specs_are_evicted_only_when_unused),
        cmocka_unit_test(test_xfspec_spellings_of_one_spec_share_an_entry),
        cmocka_unit_test(test_xfspec_decode_cap_follows_the_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
