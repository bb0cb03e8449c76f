/* test_ioengine.c - exact-size staged reads (src/store/ioengine.c), through
 * io_uring and through the pread fallback, and the choice of --io auto.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ioengine.h"

#define S_FILE_LEN (1u << 20)

/* A temporary file of S_FILE_LEN bytes, byte i = (i * 7 + i / 251) & 255. */
static int
s_make_file(char *path, size_t size)
{
    snprintf(path, size, "/tmp/emlio-ioengine.XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    uint8_t *buf = malloc(S_FILE_LEN);
    assert_non_null(buf);
    for (size_t i = 0; i < S_FILE_LEN; i++)
        buf[i] = (uint8_t)(i * 7 + i / 251);
    assert_int_equal(write(fd, buf, S_FILE_LEN), (ssize_t)S_FILE_LEN);
    free(buf);
    return fd;
}

static bool
s_matches(const uint8_t *buf, uint64_t offset, size_t len)
{
    for (size_t k = 0; k < len; k++) {
        uint64_t i = offset + k;
        if (buf[k] != (uint8_t)(i * 7 + i / 251))
            return false;
    }
    return true;
}

/* Stages 300 reads (more than the ring's depth) of odd sizes, one past
 * the end, and takes them back in another order. */
static void
s_exercise(const char *want_kind)
{
    char path[64];
    int fd = s_make_file(path, sizeof(path));
    emlio__ioengine_t *eng = emlio__ioengine_thread(8);
    assert_non_null(eng);
    assert_string_equal(emlio__ioengine_kind(eng), want_kind);
    int owner;

    enum { N = 300 };

    emlio__io_req_t reqs[N + 1];
    for (size_t i = 0; i < N; i++)
        reqs[i] = (emlio__io_req_t){ .owner = &owner,
                                     .fd = fd,
                                     .offset = (i * 3457) % (S_FILE_LEN - 9000),
                                     .len = 1 + (i * 131) % 9000 };
    reqs[N] = (emlio__io_req_t){
        .owner = &owner, .fd = fd, .offset = S_FILE_LEN - 100, .len = 200
    };
    emlio__io_counters_t before, after;
    emlio__io_counters(&before);
    emlio__ioengine_stage(eng, reqs, N + 1);
    uint8_t *buf = NULL;
    /* Another owner's read of the same range is not handed out. */
    assert_int_equal(
        emlio__ioengine_take(eng, &fd, fd, reqs[5].offset, reqs[5].len, &buf),
        0);
    for (size_t k = 0; k < N; k++) {
        size_t i = (k * 37) % N;
        assert_int_equal(emlio__ioengine_take(eng, &owner, fd, reqs[i].offset,
                                              reqs[i].len, &buf),
                         1);
        assert_true(s_matches(buf, reqs[i].offset, reqs[i].len));
        emlio_free(buf);
    }
    /* Taken once only; the read past the end is the file's end, -ESTALE. */
    assert_int_equal(emlio__ioengine_take(eng, &owner, fd, reqs[0].offset,
                                          reqs[0].len, &buf),
                     0);
    assert_int_equal(emlio__ioengine_take(eng, &owner, fd, reqs[N].offset,
                                          reqs[N].len, &buf),
                     -ESTALE);
    emlio__io_counters(&after);
    assert_true(after.reads - before.reads >= N + 1);
    assert_true(after.taken - before.taken >= N);
    assert_true(after.errors - before.errors >= 1);
    /* What was staged and not taken is freed by the next stage. */
    emlio__ioengine_stage(eng, reqs, 4);
    emlio__ioengine_drop(eng);
    close(fd);
    unlink(path);
}

static void *
s_pread_thread(void *arg)
{
    (void)arg;
    s_exercise("pread");
    return NULL;
}

static void
test_ioengine_uring(void **state)
{
    (void)state;
#ifdef EMLIO_HAVE_URING
    /* The kernel may refuse io_uring (sysctl, seccomp): then the engine
     * is pread, which the next test covers; say so rather than pass. */
    emlio__ioengine_t *eng = emlio__ioengine_thread(8);
    if (strcmp(emlio__ioengine_kind(eng), "io_uring") != 0)
        skip();
    s_exercise("io_uring");
#else
    skip();
#endif
}

static void
test_ioengine_pread_fallback(void **state)
{
    (void)state;
    setenv("EMLIO_IO_URING", "0", 1);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_pread_thread, NULL), 0);
    pthread_join(t, NULL);
    unsetenv("EMLIO_IO_URING");
}

static void
test_ioengine_choice(void **state)
{
    (void)state;
    assert_int_equal(emlio__io_mode_parse("auto"), EMLIO__IO_AUTO);
    assert_int_equal(emlio__io_mode_parse(NULL), EMLIO__IO_AUTO);
    assert_int_equal(emlio__io_mode_parse("map"), EMLIO__IO_MAP);
    assert_int_equal(emlio__io_mode_parse("read"), EMLIO__IO_READ);
    assert_int_equal(emlio__io_mode_parse("Read"), -1);
    uint64_t g = UINT64_C(1) << 30;
    assert_int_equal(emlio__io_choose(EMLIO__IO_AUTO, g / 2, g), EMLIO__IO_MAP);
    assert_int_equal(emlio__io_choose(EMLIO__IO_AUTO, g, g), EMLIO__IO_READ);
    assert_int_equal(emlio__io_choose(EMLIO__IO_AUTO, 5 * g, 0), EMLIO__IO_MAP);
    assert_int_equal(emlio__io_choose(EMLIO__IO_MAP, 5 * g, g), EMLIO__IO_MAP);
    assert_int_equal(emlio__io_choose(EMLIO__IO_READ, 1, g), EMLIO__IO_READ);
    const char *why = NULL;
    assert_true(emlio__io_memory_limit(&why) > 0);
    assert_non_null(why);
    unsigned depth = emlio__io_device_depth(-1);
    assert_int_equal(depth, 32);
    int fd = open("/proc/self/exe", O_RDONLY);
    depth = emlio__io_device_depth(fd);
    assert_true(depth >= 4 && depth <= 128);
    close(fd);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ioengine_uring),
        cmocka_unit_test(test_ioengine_pread_fallback),
        cmocka_unit_test(test_ioengine_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
