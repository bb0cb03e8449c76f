/* emlio_test.h - shared includes and helpers for the cmocka unit tests.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TEST_H
#define EMLIO_TEST_H

#include "emlio_internal.h"

#include <fcntl.h>
#include <setjmp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* Makes a fresh temporary directory; the caller removes it with
 * test_rmtree. The returned string is static storage of the caller. */
static inline void
test_mkdtemp(char *out, size_t len)
{
    snprintf(out, len, "/tmp/emlio-test-XXXXXX");
    assert_non_null(mkdtemp(out));
}

static inline void
test_rmtree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* An open temporary file holding len bytes of data, already unlinked: it
 * goes with its last descriptor. */
static inline int
test_temp_fd(const void *data, size_t len)
{
    char path[] = "/tmp/emlio-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    if (len)
        assert_int_equal(write(fd, data, len), (ssize_t)len);
    return fd;
}

/* Writes len bytes to path, replacing it. */
static inline void
test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len)
        assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* The whole file at path (malloc'd; free it), its length in *len. */
static inline uint8_t *
test_read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long size = ftell(fp);
    assert_true(size >= 0);
    rewind(fp);
    uint8_t *data = malloc((size_t)size + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    *len = (size_t)size;
    return data;
}

/* Appends a ustar member name of len bytes of c (padded to 512). */
static inline void
test_tar_member(emlio_buf_t *tar, const char *name, size_t len, char c)
{
    uint8_t h[512] = { 0 };
    snprintf((char *)h, 100, "%s", name);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    snprintf((char *)h + 124, 12, "%011o", (unsigned)len);
    memcpy(h + 136, "00000000000", 12);
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof(h); i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    assert_int_equal(emlio_buf_add(tar, h, sizeof(h)), 0);
    uint8_t block[512];
    for (size_t off = 0; off < len; off += sizeof(block)) {
        size_t n = len - off < sizeof(block) ? len - off : sizeof(block);
        memset(block, 0, sizeof(block));
        memset(block, c, n);
        assert_int_equal(emlio_buf_add(tar, block, sizeof(block)), 0);
    }
}

/* A daemon of cfg, loaded (with `shards` shards), bound to a loopback port
 * chosen at run time and started. */
static inline emlio_server_t *
test_server_up(emlio_ctx_t *ctx, const emlio_server_config_t *cfg, int shards)
{
    emlio_server_t *srv = emlio_server_new(ctx, cfg);
    assert_non_null(srv);
    assert_int_equal(emlio_server_load(srv), shards);
    assert_int_equal(emlio_server_bind(srv, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(emlio_server_start(srv), 0);
    return srv;
}

#endif /* EMLIO_TEST_H */
