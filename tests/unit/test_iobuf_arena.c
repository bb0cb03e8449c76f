/* test_iobuf_arena.c - the arena of registered read buffers (iobuf.h):
 * device buffers come from it while it has room and go back to it, reads
 * past it take heap buffers, and io_uring reads into it as fixed buffers
 * with the same bytes as plain reads. A file of its own: the arena is one
 * per process.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "iobuf.h"
#include "ioengine.h"

#define S_ARENA    ((size_t)1 << 20)
#define S_FILE_LEN ((size_t)1 << 20)

static void
test_arena_gives_reuses_and_overflows(void **state)
{
    (void)state;
    void *base;
    size_t len;
    /* None yet: device buffers are heap buffers. */
    assert_false(emlio__iobuf_arena(&base, &len));
    uint8_t *heap = emlio__iobuf_alloc_io(100 << 10);
    assert_non_null(heap);
    assert_false(emlio__iobuf_in_arena(heap, 100 << 10));
    emlio__iobuf_free(heap);

    assert_int_equal(emlio__iobuf_arena_init(0), EMLIO_EINVAL);
    assert_int_equal(emlio__iobuf_arena_init(S_ARENA), 0);
    assert_int_equal(emlio__iobuf_arena_init(S_ARENA), EMLIO_EINVAL);
    assert_true(emlio__iobuf_arena(&base, &len));
    assert_int_equal(len, S_ARENA);
    assert_int_equal((uintptr_t)base % EMLIO__IOBUF_ALIGN, 0);

    /* From the arena, aligned, all of it usable; back to it when freed,
     * and the next of its class is the same buffer. */
    uint8_t *a = emlio__iobuf_alloc_io(100 << 10);
    assert_true(emlio__iobuf_in_arena(a, 100 << 10));
    assert_int_equal((uintptr_t)a % EMLIO__IOBUF_ALIGN, 0);
    memset(a, 0x5a, 100 << 10);
    emlio__iobuf_free(a);
    uint8_t *again = emlio__iobuf_alloc_io(100 << 10);
    assert_ptr_equal(again, a);
    /* A reference keeps it out of the arena's lists until the last free. */
    assert_ptr_equal(emlio__iobuf_ref(again), again);
    emlio__iobuf_free(again);
    uint8_t *other = emlio__iobuf_alloc_io(100 << 10);
    assert_ptr_not_equal(other, again);
    emlio__iobuf_free(other);
    emlio__iobuf_free(again);

    /* Carved until full (112 KiB + a 4 KiB prefix each: 8 fit in 1 MiB),
     * then heap buffers, which work the same. */
    uint8_t *held[16];
    size_t in = 0;
    for (size_t i = 0; i < 16; i++) {
        held[i] = emlio__iobuf_alloc_io(100 << 10);
        assert_non_null(held[i]);
        memset(held[i], (int)i, 100 << 10);
        in += emlio__iobuf_in_arena(held[i], 100 << 10);
    }
    assert_int_equal(in, S_ARENA / ((112 + 4) << 10));
    emlio__iobuf_stats_t st;
    emlio__iobuf_stats(&st);
    assert_int_equal(st.arena_bytes, S_ARENA);
    assert_true(st.arena_misses >= 16 - in);
    for (size_t i = 0; i < 16; i++)
        emlio__iobuf_free(held[i]);
    /* Larger than the arena: the heap. */
    uint8_t *big = emlio__iobuf_alloc_io(2 << 20);
    assert_false(emlio__iobuf_in_arena(big, 2 << 20));
    emlio__iobuf_free(big);
    /* Plain allocations (copies) never take arena room. */
    uint8_t *plain = emlio__iobuf_alloc(100 << 10);
    assert_false(emlio__iobuf_in_arena(plain, 100 << 10));
    emlio__iobuf_free(plain);
}

/* Reads 200 odd-sized ranges through this thread's engine; returns how
 * many went into registered buffers. */
static uint64_t
s_read_all(void)
{
    uint8_t *bytes = malloc(S_FILE_LEN);
    assert_non_null(bytes);
    for (size_t i = 0; i < S_FILE_LEN; i++)
        bytes[i] = (uint8_t)(i * 13 + i / 509);
    int fd = test_temp_fd(bytes, S_FILE_LEN);
    unsigned align = emlio__io_direct(fd); /* 0 where the fs refuses */
    emlio__io_counters_t c0, c1;
    emlio__io_counters(&c0);
    emlio__ioengine_t *eng = emlio__ioengine_thread(16);
    assert_non_null(eng);
    int owner, job;

    enum { N = 200 };

    emlio__io_req_t reqs[N];
    for (size_t i = 0; i < N; i++)
        reqs[i] = (emlio__io_req_t){ .owner = &owner,
                                     .fd = fd,
                                     .offset = (i * 7919) % (S_FILE_LEN / 2),
                                     .len = 1 + (i * 1531) % 60000,
                                     .align = align };
    assert_int_equal(emlio__ioengine_stage(eng, &job, reqs, N), N);
    for (size_t i = 0; i < N; i++) {
        uint8_t *buf;
        const uint8_t *data;
        assert_int_equal(emlio__ioengine_take(eng, &owner, fd, reqs[i].offset,
                                              reqs[i].len, &buf, &data),
                         1);
        assert_memory_equal(data, bytes + reqs[i].offset, reqs[i].len);
        emlio__iobuf_free(buf);
    }
    emlio__ioengine_release(eng, &job);
    emlio__io_counters(&c1);
    free(bytes);
    close(fd);
    return c1.fixed - c0.fixed;
}

static void *
s_unregistered_thread(void *arg)
{
    *(uint64_t *)arg = s_read_all();
    return NULL;
}

static void
test_arena_fixed_reads(void **state)
{
    (void)state;
    void *base;
    size_t len;
    if (!emlio__iobuf_arena(&base, &len))
        assert_int_equal(emlio__iobuf_arena_init(S_ARENA), 0);
    const char *why = emlio__io_fixed_refusal();
    if (emlio__io_uring_refusal() || why) {
        print_message("registered buffers not usable here: %s\n",
                      why ? why : emlio__io_uring_refusal());
        skip();
    }
    /* This thread's ring is made now, after the arena: it registers it,
     * and every read the arena holds goes in as a fixed buffer. */
    uint64_t fixed = s_read_all();
    assert_true(fixed > 0);
    assert_int_equal(emlio__io_fixed_errno(), 0);
    /* Turned off, a new thread's ring reads the same bytes, none fixed. */
    setenv("EMLIO_IO_FIXED", "0", 1);
    assert_non_null(emlio__io_fixed_refusal());
    uint64_t off = 1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_unregistered_thread, &off), 0);
    pthread_join(t, NULL);
    unsetenv("EMLIO_IO_FIXED");
    assert_int_equal(off, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_gives_reuses_and_overflows),
        cmocka_unit_test(test_arena_fixed_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
