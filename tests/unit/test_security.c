/* test_security.c - CURVE key helpers and the ZAP handler's key loading.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "security.h"

static void
test_security_keypair_and_public(void **state)
{
    (void)state;
    char pub[EMLIO_CURVE_KEY_LEN];
    char sec[EMLIO_CURVE_KEY_LEN];
    char derived[EMLIO_CURVE_KEY_LEN];
    assert_int_equal(emlio_curve_keypair(pub, sec), 0);
    assert_int_equal(strlen(pub), 40);
    assert_int_equal(strlen(sec), 40);
    assert_int_equal(emlio_curve_public(derived, sec), 0);
    assert_string_equal(derived, pub);
    assert_int_equal(emlio_curve_public(derived, "too short"), EMLIO_EINVAL);
}

static void
test_security_key_files(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    char pub[EMLIO_CURVE_KEY_LEN];
    char sec[EMLIO_CURVE_KEY_LEN];
    assert_int_equal(emlio_curve_keypair(pub, sec), 0);
    char path[128];
    snprintf(path, sizeof(path), "%s/k.key_secret", dir);
    assert_int_equal(emlio_curve_write_key(path, sec, 0600), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    char got[EMLIO_CURVE_KEY_LEN];
    assert_int_equal(emlio_curve_read_key(path, got), 0);
    assert_string_equal(got, sec);
    snprintf(path, sizeof(path), "%s/bad.key", dir);
    test_write_file(path, "not a key\n", 10);
    assert_int_equal(emlio_curve_read_key(path, got), EMLIO_EFORMAT);
    snprintf(path, sizeof(path), "%s/missing.key", dir);
    assert_int_equal(emlio_curve_read_key(path, got), -ENOENT);
    test_rmtree(dir);
}

static void
test_security_zap_loads_authorized_keys(void **state)
{
    (void)state;
    char dir[64];
    test_mkdtemp(dir, sizeof(dir));
    char pub[EMLIO_CURVE_KEY_LEN];
    char sec[EMLIO_CURVE_KEY_LEN];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(emlio_curve_keypair(pub, sec), 0);
        char path[128];
        snprintf(path, sizeof(path), "%s/client%d.key", dir, i);
        assert_int_equal(emlio_curve_write_key(path, pub, 0644), 0);
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/README", dir);
    test_write_file(path, "not a key\n", 10);
    emlio_ctx_t *ctx = emlio_ctx_new();
    int rc = 0;
    size_t n = 0;
    char err[EMLIO_ERRMSG_LEN] = "";
    emlio__zap_t *zap = emlio__zap_start(ctx, dir, &rc, &n, err);
    assert_non_null(zap);
    assert_int_equal(n, 2);
    assert_int_equal(emlio__zap_admitted(zap), 0);
    assert_int_equal(emlio__zap_refused(zap), 0);
    emlio__zap_stop(&zap);
    assert_null(zap);
    emlio__zap_stop(&zap); /* idempotent */
    zap = emlio__zap_start(ctx, "/nonexistent/emlio-keys", &rc, &n, err);
    assert_null(zap);
    assert_true(rc < 0);
    assert_non_null(strstr(err, "/nonexistent/emlio-keys"));
    emlio_ctx_destroy(&ctx);
    test_rmtree(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_security_keypair_and_public),
        cmocka_unit_test(test_security_key_files),
        cmocka_unit_test(test_security_zap_loads_authorized_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
