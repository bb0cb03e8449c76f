/* test_sharecache.c - chunks read once for every job that shares reads
 * (src/store/sharecache.c): the bytes, who read what, the bound, eviction,
 * a file replaced under the cache, and readers on several threads.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "iobuf.h"
#include "sharecache.h"

#define S_CHUNK EMLIO__SHARE_CHUNK

static uint8_t
s_byte(uint64_t i, unsigned salt)
{
    return (uint8_t)(i * 7 + i / 251 + salt);
}

/* A temporary file of len bytes, byte i = s_byte(i, salt). */
static int
s_make_file(size_t len, unsigned salt)
{
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    for (size_t i = 0; i < len; i++)
        buf[i] = s_byte(i, salt);
    int fd = test_temp_fd(buf, len);
    free(buf);
    return fd;
}

static bool
s_matches(const uint8_t *p, uint64_t offset, size_t len, unsigned salt)
{
    for (size_t k = 0; k < len; k++)
        if (p[k] != s_byte(offset + k, salt))
            return false;
    return true;
}

/* Reads [offset, offset + len) through the cache for reader and checks
 * the bytes; returns the read's result. */
static int
s_read(emlio__share_cache_t *c, const void *owner, uint64_t ident, int fd,
       uint64_t size, uint64_t offset, size_t len, uint64_t reader,
       unsigned salt, emlio__share_tally_t *t)
{
    uint8_t *buf = NULL;
    const uint8_t *data = NULL;
    int rc = emlio__share_cache_read(c, owner, ident, fd, 0, size, offset, len,
                                     reader, &buf, &data, t);
    if (rc == 1) {
        assert_true(s_matches(data, offset, len, salt));
        emlio__iobuf_free(buf);
    }
    return rc;
}

/* The first job reads the chunks a record spans; a second job's read of
 * it is copied from them: shared, nothing read again. */
static void
test_share_once(void **state)
{
    (void)state;
    size_t size = 3 * S_CHUNK + 12345;
    int fd = s_make_file(size, 0);
    emlio__share_cache_t *c;
    assert_int_equal(emlio__share_cache_new(&c, 64 << 20), 0);
    int owner;
    emlio__share_tally_t a = { 0 }, b = { 0 };
    /* A record across the first chunk boundary. */
    uint64_t off = S_CHUNK - 1000;
    assert_int_equal(s_read(c, &owner, 1, fd, size, off, 5000, 1, 0, &a), 1);
    assert_int_equal(a.loaded, 2 * S_CHUNK);
    assert_int_equal(a.own, 5000);
    assert_int_equal(a.shared, 0);
    assert_int_equal(s_read(c, &owner, 1, fd, size, off, 5000, 2, 0, &b), 1);
    assert_int_equal(b.loaded, 0);
    assert_int_equal(b.shared, 5000);
    /* The short last chunk, up to the file's end. */
    assert_int_equal(s_read(c, &owner, 1, fd, size, size - 300, 300, 2, 0, &b),
                     1);
    assert_int_equal(b.loaded, 12345);
    emlio__share_stats_t st;
    emlio__share_cache_stats(c, &st);
    assert_int_equal(st.held, 2 * S_CHUNK + 12345);
    assert_int_equal(st.total.shared, 5000);
    assert_int_equal(st.total.own, 5300);
    /* Past the end of the file as the caller knows it: refused, and a
     * file shorter than the caller thinks is a stale read. */
    assert_int_equal(s_read(c, &owner, 1, fd, size, size - 10, 11, 1, 0, &a),
                     -ESTALE);
    assert_int_equal(
        s_read(c, &owner, 1, fd, size + S_CHUNK, size + 10, 10, 1, 0, &a),
        -ESTALE);
    emlio__share_cache_destroy(&c);
    assert_null(c);
    close(fd);
}

/* The cache never holds more than its capacity: a job far behind finds
 * its chunks gone and reads them again, as its own read. */
static void
test_share_bound(void **state)
{
    (void)state;
    size_t size = 10 * S_CHUNK;
    int fd = s_make_file(size, 3);
    emlio__share_cache_t *c;
    assert_int_equal(emlio__share_cache_new(&c, 1), 0); /* raised to MIN */
    emlio__share_stats_t st;
    emlio__share_cache_stats(c, &st);
    assert_int_equal(st.capacity, EMLIO__SHARE_MIN);
    int owner;
    emlio__share_tally_t lead = { 0 }, late = { 0 };
    for (size_t k = 0; k < 10; k++) {
        assert_int_equal(
            s_read(c, &owner, 7, fd, size, k * S_CHUNK + 10, 100, 1, 3, &lead),
            1);
        emlio__share_cache_stats(c, &st);
        assert_true(st.held <= st.capacity);
    }
    assert_int_equal(lead.loaded, 10 * S_CHUNK);
    emlio__share_cache_stats(c, &st);
    assert_int_equal(st.evicted, 10 - EMLIO__SHARE_MIN / S_CHUNK);
    /* The first chunk was let go: the late job reads it itself. */
    assert_int_equal(s_read(c, &owner, 7, fd, size, 10, 100, 2, 3, &late), 1);
    assert_int_equal(late.loaded, S_CHUNK);
    assert_int_equal(late.own, 100);
    assert_int_equal(late.shared, 0);
    /* The last one is still there: shared. */
    assert_int_equal(
        s_read(c, &owner, 7, fd, size, 9 * S_CHUNK + 10, 100, 2, 3, &late), 1);
    assert_int_equal(late.shared, 100);
    /* A record over more than half the cache is not cached. */
    emlio__share_tally_t t = { 0 };
    uint8_t *buf = NULL;
    const uint8_t *data;
    assert_int_equal(emlio__share_cache_read(c, &owner, 7, fd, 0, size, 0,
                                             5 * S_CHUNK, 1, &buf, &data, &t),
                     0);
    assert_null(buf);
    assert_int_equal(t.bypass, 5 * S_CHUNK);
    assert_int_equal(t.loaded, 0);
    emlio__share_cache_destroy(&c);
    close(fd);
}

/* Room is made first from chunks every active job has read all of: a job
 * a little behind the others keeps what it is about to read, though a
 * finished chunk was used more recently. */
static void
test_share_evicts_finished_first(void **state)
{
    (void)state;
    size_t size = 10 * S_CHUNK;
    int fd = s_make_file(size, 5);
    emlio__share_cache_t *c;
    assert_int_equal(emlio__share_cache_new(&c, EMLIO__SHARE_MIN), 0);
    int owner;
    emlio__share_tally_t t = { 0 };
    /* Chunks 1..7: the leader (1) has read a record of each. */
    for (size_t k = 1; k <= 7; k++)
        assert_int_equal(
            s_read(c, &owner, 9, fd, size, k * S_CHUNK, 100, 1, 5, &t), 1);
    /* Chunk 0, last: both jobs read all of it. */
    assert_int_equal(s_read(c, &owner, 9, fd, size, 0, S_CHUNK, 1, 5, &t), 1);
    assert_int_equal(s_read(c, &owner, 9, fd, size, 0, S_CHUNK, 2, 5, &t), 1);
    /* The leader moves on to chunk 8: the cache is full (8 chunks). */
    assert_int_equal(s_read(c, &owner, 9, fd, size, 8 * S_CHUNK, 100, 1, 5, &t),
                     1);
    emlio__share_stats_t st;
    emlio__share_cache_stats(c, &st);
    assert_int_equal(st.evicted, 1);
    /* Chunk 1, the least recent, is still there for the second job; chunk
     * 0, finished by both, went. */
    emlio__share_tally_t late = { 0 };
    assert_int_equal(
        s_read(c, &owner, 9, fd, size, S_CHUNK + 100, 100, 2, 5, &late), 1);
    assert_int_equal(late.loaded, 0);
    assert_int_equal(late.shared, 100);
    assert_int_equal(s_read(c, &owner, 9, fd, size, 10, 10, 2, 5, &late), 1);
    assert_int_equal(late.loaded, S_CHUNK);
    emlio__share_cache_destroy(&c);
    close(fd);
}

/* A shard whose file was replaced (another identity) never gets its
 * predecessor's bytes. */
static void
test_share_identity(void **state)
{
    (void)state;
    size_t size = S_CHUNK;
    int old_fd = s_make_file(size, 1);
    int new_fd = s_make_file(size, 2);
    emlio__share_cache_t *c;
    assert_int_equal(emlio__share_cache_new(&c, 64 << 20), 0);
    int owner;
    emlio__share_tally_t t = { 0 };
    assert_int_equal(s_read(c, &owner, 100, old_fd, size, 50, 500, 1, 1, &t),
                     1);
    assert_int_equal(s_read(c, &owner, 101, new_fd, size, 50, 500, 2, 2, &t),
                     1);
    assert_int_equal(t.loaded, 2 * S_CHUNK);
    emlio__share_cache_destroy(&c);
    close(old_fd);
    close(new_fd);
}

typedef struct s_worker {
    emlio__share_cache_t *cache;
    int fd;
    size_t size;
    uint64_t reader;
    emlio__share_tally_t tally;
    bool ok;
} s_worker_t;

static void *
s_work(void *arg)
{
    s_worker_t *w = arg;
    static int owner;
    w->ok = true;
    uint64_t x = w->reader * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 2000 && w->ok; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t off = (x >> 11) % (w->size - 70000);
        size_t len = 1 + (size_t)((x >> 40) % 70000);
        uint8_t *buf;
        const uint8_t *data;
        int rc =
            emlio__share_cache_read(w->cache, &owner, 5, w->fd, 0, w->size, off,
                                    len, w->reader, &buf, &data, &w->tally);
        w->ok = rc == 1 && s_matches(data, off, len, 4);
        if (rc == 1)
            emlio__iobuf_free(buf);
    }
    return NULL;
}

/* Four jobs on four threads over a file the cache holds: every byte
 * right, and each chunk read once whoever asked first. */
static void
test_share_threads(void **state)
{
    (void)state;
    size_t size = 6 * S_CHUNK + 777;
    int fd = s_make_file(size, 4);
    emlio__share_cache_t *c;
    assert_int_equal(emlio__share_cache_new(&c, 64 << 20), 0);
    s_worker_t w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (s_worker_t){
            .cache = c, .fd = fd, .size = size, .reader = (uint64_t)i + 1
        };
        assert_int_equal(pthread_create(&th[i], NULL, s_work, &w[i]), 0);
    }
    uint64_t loaded = 0, shared = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(w[i].ok);
        loaded += w[i].tally.loaded;
        shared += w[i].tally.shared;
    }
    /* Reads start below size - 70000: the 777-byte last chunk may be
     * left unread; every other is read once. */
    assert_true(loaded == size || loaded == 6 * S_CHUNK);
    assert_true(shared > 0);
    emlio__share_stats_t st;
    emlio__share_cache_stats(c, &st);
    assert_int_equal(st.evicted, 0);
    assert_int_equal(st.chunks, loaded == size ? 7 : 6);
    assert_int_equal(st.total.loaded, loaded);
    emlio__share_cache_destroy(&c);
    close(fd);
}

/* The thread's scope is its own: set on one thread, unseen on another. */
static void *
s_scope_elsewhere(void *arg)
{
    uint64_t reader;
    emlio__share_tally_t *t;
    *(bool *)arg = emlio__share_scope(&reader, &t) == NULL;
    return NULL;
}

static void
test_share_scope(void **state)
{
    (void)state;
    emlio__share_cache_t *c;
    assert_int_equal(emlio__share_cache_new(&c, 0), 0);
    emlio__share_tally_t tally;
    emlio__share_scope_set(c, 42, &tally);
    uint64_t reader = 0;
    emlio__share_tally_t *t = NULL;
    assert_ptr_equal(emlio__share_scope(&reader, &t), c);
    assert_int_equal(reader, 42);
    assert_ptr_equal(t, &tally);
    bool unseen = false;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_scope_elsewhere, &unseen), 0);
    pthread_join(th, NULL);
    assert_true(unseen);
    emlio__share_scope_set(NULL, 0, NULL);
    assert_null(emlio__share_scope(&reader, &t));
    emlio__share_cache_destroy(&c);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share_once),
        cmocka_unit_test(test_share_bound),
        cmocka_unit_test(test_share_identity),
        cmocka_unit_test(test_share_evicts_finished_first),
        cmocka_unit_test(test_share_threads),
        cmocka_unit_test(test_share_scope),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    emlio__iobuf_trim(); /* the pool's idle buffers are not leaks */
    return failed;
}
