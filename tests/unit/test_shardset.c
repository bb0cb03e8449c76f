/* test_shardset.c - finding, leasing and watching the shards of a data
 * directory: the empty dataset, leases that writers wait on, shards that
 * shrink under copying reads, and shards replaced by rename.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "iobuf.h"
#include "shard_cache.h"
#include "shardset.h"
#include "tar.h"

#define RECORDS 8

static void
s_write_shard(const char *path, int records)
{
    emlio_buf_t file = EMLIO_BUF_INIT;
    for (int r = 0; r < records; r++) {
        char payload[512];
        memset(payload, 'a' + r % 26, sizeof(payload));
        assert_int_equal(emlio_tfrecord_append(&file, (const uint8_t *)payload,
                                               sizeof(payload)),
                         0);
    }
    test_write_file(path, file.data, file.len);
    emlio_buf_release(&file);
}

/* Log lines come from the loading thread and from the shard cache's
 * watcher thread. */
typedef struct s_log {
    pthread_mutex_t lock;
    int n;
    char last[1024];
} s_log_t;

#define S_LOG_INIT                       \
    {                                    \
        PTHREAD_MUTEX_INITIALIZER, 0, "" \
    }

static void
s_log(void *userdata, const char *msg)
{
    s_log_t *log = userdata;
    pthread_mutex_lock(&log->lock);
    log->n++;
    snprintf(log->last, sizeof(log->last), "%s", msg);
    pthread_mutex_unlock(&log->lock);
}

static int
s_log_count(s_log_t *log)
{
    pthread_mutex_lock(&log->lock);
    int n = log->n;
    pthread_mutex_unlock(&log->lock);
    return n;
}

/* Whether the last line logged holds text (read under the lock). */
static bool
s_logged(s_log_t *log, const char *text)
{
    pthread_mutex_lock(&log->lock);
    bool found = strstr(log->last, text) != NULL;
    pthread_mutex_unlock(&log->lock);
    return found;
}

/* Waits (10 s at most) until *flag is set by the watcher thread. */
static bool
s_wait_flag(const atomic_bool *flag)
{
    uint64_t deadline = emlio__now_ns() + 10000000000ull;
    while (!atomic_load(flag) && emlio__now_ns() < deadline)
        usleep(2000);
    return atomic_load(flag);
}

/* Waits (10 s at most) until log has n lines. */
static bool
s_wait_log(s_log_t *log, int n)
{
    uint64_t deadline = emlio__now_ns() + 10000000000ull;
    while (s_log_count(log) < n && emlio__now_ns() < deadline)
        usleep(2000);
    return s_log_count(log) >= n;
}

static size_t
s_open_now(emlio__shardset_t *set)
{
    emlio__shard_cache_stats_t st;
    emlio__shard_cache_stats(set->cache, &st);
    return st.open;
}

/* Loads dir as the daemon does: leases, data CRCs checked, at most
 * max_open shards open at once (0: from the open-file limit). */
static int
s_load_budget(emlio__shardset_t *set, const char *dir, size_t max_open,
              emlio__shardset_log_fn *log, void *userdata, char *err)
{
    emlio__shardset_opts_t opts = { .verify_data = true,
                                    .lease = true,
                                    .max_open_shards = max_open,
                                    .grace_ms = 60000 };
    return emlio__shardset_load(set, dir, &opts, log, userdata, err);
}

static int
s_load(emlio__shardset_t *set, const char *dir, emlio__shardset_log_fn *log,
       void *userdata, char *err)
{
    return s_load_budget(set, dir, 0, log, userdata, err);
}

static void
test_shardset_loads_and_refuses_an_empty_dataset(void **state)
{
    (void)state;
    char dir[64];
    char path[128];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    test_mkdtemp(dir, sizeof(dir));
    assert_int_equal(s_load(&set, dir, NULL, NULL, err), EMLIO_ENOTFOUND);
    snprintf(path, sizeof(path), "%s/empty.tfrecord", dir);
    test_write_file(path, "", 0);
    assert_int_equal(s_load(&set, dir, NULL, NULL, err), EMLIO_ENOTFOUND);
    assert_non_null(strstr(err, "empty"));
    snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
    s_write_shard(path, RECORDS);
    assert_int_equal(s_load(&set, dir, NULL, NULL, err), 2);
    assert_int_equal(set.records, RECORDS);
    assert_int_equal(strlen(set.fingerprint), 16);
    assert_int_equal(set.leased, 2); /* a local file system, our files */
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A writer (truncate(2) in a child) waits on the lease until the watcher has
 * seen the break, refused new readers and given the lease back once the
 * last user was gone. */
static void
test_shardset_lease_makes_writers_wait(void **state)
{
    (void)state;
    char dir[64];
    char path[128];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
    s_write_shard(path, RECORDS);
    assert_int_equal(s_load(&set, dir, s_log, &log, err), 1);
    emlio__shard_t *shard = &set.shards[0];
    assert_true(shard->leased);
    assert_int_equal(emlio__shard_acquire(shard), 0); /* a frame in flight */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(truncate(path, 100) == 0 ? 0 : 1);
    /* The break arrives as a signal on the cache's watcher thread. */
    assert_true(s_wait_flag(&shard->changed));
    assert_int_equal(emlio__shard_acquire(shard), -ESTALE); /* no new one */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 100); /* the writer still waits */
    const uint8_t *data;
    size_t len;
    assert_int_equal(
        emlio_tfrecord_record(shard->impl, RECORDS - 1, &data, &len, NULL), 0);
    assert_int_equal(data[len - 1], 'a' + (RECORDS - 1) % 26); /* intact */
    emlio__shard_release(shard);
    /* The watcher closes it once its last user is gone. */
    uint64_t deadline = emlio__now_ns() + 10000000000ull;
    while (s_open_now(&set) && emlio__now_ns() < deadline)
        usleep(2000);
    assert_int_equal(s_open_now(&set), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 100);
    assert_int_equal(s_log_count(&log), 1); /* once, naming the file */
    assert_true(s_logged(&log, "'a.tfrecord' changed on disk"));
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* Without a lease (the file is open for writing elsewhere), records are
 * copied with pread: a shrink is an error, never a SIGBUS. */
static void
test_shardset_copying_reads_survive_a_shrink(void **state)
{
    (void)state;
    char dir[64];
    char path[128];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
    s_write_shard(path, RECORDS);
    int wfd = open(path, O_RDWR);
    assert_true(wfd >= 0);
    assert_int_equal(s_load(&set, dir, s_log, &log, err), 1);
    emlio__shard_t *shard = &set.shards[0];
    assert_false(shard->leased);
    uint8_t *copy;
    const uint8_t *data;
    size_t len;
    uint32_t stored;
    assert_int_equal(emlio__shard_read_copy(shard, 0, &copy, &data, &len,
                                            &stored, s_log, &log),
                     0);
    assert_int_equal(len, 512);
    assert_int_equal(data[0], 'a');
    emlio__iobuf_free(copy);
    assert_int_equal(ftruncate(wfd, 700), 0);
    assert_int_equal(emlio__shard_read_copy(shard, RECORDS - 1, &copy, &data,
                                            &len, &stored, s_log, &log),
                     -ESTALE);
    assert_null(copy);
    assert_true(atomic_load(&shard->changed));
    assert_int_equal(emlio__shard_acquire(shard), -ESTALE);
    assert_int_equal(s_log_count(&log), 1);
    assert_true(s_logged(&log, "'a.tfrecord' changed on disk"));
    close(wfd);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

static void
test_shardset_notices_a_replaced_shard(void **state)
{
    (void)state;
    char dir[64];
    char path[128];
    char tmp[128];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
    snprintf(tmp, sizeof(tmp), "%s/a.new", dir);
    s_write_shard(path, RECORDS);
    assert_int_equal(s_load(&set, dir, s_log, &log, err), 1);
    s_write_shard(tmp, 2);
    assert_int_equal(rename(tmp, path), 0);
    /* The watcher's slow sweep (once a second) stats the open shards. */
    assert_true(s_wait_log(&log, 1));
    assert_true(s_logged(&log, "'a.tfrecord' was replaced"));
    /* The file we opened is intact and still served while it is open. */
    assert_false(atomic_load(&set.shards[0].changed));
    assert_int_equal(emlio__shard_acquire(&set.shards[0]), 0);
    assert_int_equal(emlio_tfrecord_verify(set.shards[0].impl, RECORDS - 1), 0);
    emlio__shard_release(&set.shards[0]);
    usleep(1200000); /* another sweep: not logged twice */
    assert_int_equal(s_log_count(&log), 1);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A tar shard without a lease is read by copying too: each member with its
 * header, which must still describe it; a shrink or a rewritten header is
 * -ESTALE and marks the shard changed, never a SIGBUS. */
static void
test_shardset_copying_reads_of_tar_members(void **state)
{
    (void)state;
    char dir[64];
    char path[128];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.tar", dir);
    emlio_buf_t tar = EMLIO_BUF_INIT;
    test_tar_member(&tar, "000.jpg", 600, 'x');
    test_tar_member(&tar, "000.cls", 1, '3');
    test_tar_member(&tar, "001.jpg", 700, 'y');
    test_tar_member(&tar, "001.cls", 1, '4');
    uint8_t zeros[1024] = { 0 };
    assert_int_equal(emlio_buf_add(&tar, zeros, sizeof(zeros)), 0);
    test_write_file(path, tar.data, tar.len);
    emlio_buf_release(&tar);
    int wfd = open(path, O_RDWR);
    assert_true(wfd >= 0);
    assert_int_equal(s_load(&set, dir, s_log, &log, err), 1);
    emlio__shard_t *shard = &set.shards[0];
    assert_string_equal(shard->ops->name, "tar");
    assert_false(shard->leased);
    assert_int_equal(set.mapped, 1);
    size_t m;
    assert_int_equal(emlio__tar_find(shard->impl, 1, NULL, &m), 0);
    uint8_t *copy;
    const uint8_t *data;
    size_t len;
    uint32_t stored;
    assert_int_equal(emlio__shard_read_copy(shard, m, &copy, &data, &len,
                                            &stored, s_log, &log),
                     0);
    assert_int_equal(len, 700);
    assert_int_equal(data[0], 'y');
    assert_int_equal(data[699], 'y');
    emlio__iobuf_free(copy);
    /* Another member's header rewritten in place (its checksum breaks). */
    assert_int_equal(pwrite(wfd, "Z", 1, 0), 1);
    assert_int_equal(emlio__tar_find(shard->impl, 0, "cls", &m), 0);
    assert_int_equal(emlio__shard_read_copy(shard, m, &copy, &data, &len,
                                            &stored, s_log, &log),
                     0); /* its own header is intact */
    emlio__iobuf_free(copy);
    assert_int_equal(emlio__tar_find(shard->impl, 0, "jpg", &m), 0);
    assert_int_equal(emlio__shard_read_copy(shard, m, &copy, &data, &len,
                                            &stored, s_log, &log),
                     -ESTALE);
    assert_null(copy);
    assert_true(atomic_load(&shard->changed));
    assert_int_equal(emlio__shard_acquire(shard), -ESTALE);
    assert_int_equal(s_log_count(&log), 1);
    assert_true(s_logged(&log, "'a.tar' changed on disk"));
    close(wfd);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* An ImageFolder class is never leased: its files are read by copies. */
static void
test_shardset_imagefolder_is_not_leased(void **state)
{
    (void)state;
    char dir[64];
    char path[160];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/cat", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/cat/x.jpg", dir);
    test_write_file(path, "jpeg", 4);
    assert_int_equal(s_load(&set, dir, NULL, NULL, err), 1);
    assert_string_equal(set.shards[0].ops->name, "imagefolder");
    assert_int_equal(set.shards[0].fd, -1);
    assert_false(set.shards[0].leased);
    assert_int_equal(set.mapped, 0);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* Writes n two-record shards s00.tfrecord, s01.tfrecord, ... into a
 * fresh dir. */
static void
s_many_shards(char *dir, size_t len, int n)
{
    test_mkdtemp(dir, len);
    for (int i = 0; i < n; i++) {
        char path[160];
        snprintf(path, sizeof(path), "%s/s%02d.tfrecord", dir, i);
        s_write_shard(path, 2);
    }
}

/* Ten shards under a budget of three: never more than three open, every
 * record still readable, shards reopened on demand. */
static void
test_shardset_cache_honours_the_budget(void **state)
{
    (void)state;
    char dir[64];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_many_shards(dir, sizeof(dir), 10);
    assert_int_equal(s_load_budget(&set, dir, 3, NULL, NULL, err), 10);
    assert_true(s_open_now(&set) <= 3);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < set.n; i++) {
            emlio__shard_t *shard = &set.shards[i];
            assert_int_equal(emlio__shard_acquire(shard), 0);
            assert_true(shard->fd >= 0 && shard->leased);
            assert_int_equal(emlio_tfrecord_verify(shard->impl, 1), 0);
            emlio__shard_release(shard);
            assert_true(s_open_now(&set) <= 3);
        }
    }
    emlio__shard_cache_stats_t st;
    emlio__shard_cache_stats(set.cache, &st);
    assert_int_equal(st.budget, 3);
    assert_true(st.peak <= 3);
    assert_true(st.opens >= 30); /* 10 at load, then misses */
    assert_int_equal(st.opens - st.closes, st.open);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A shard in use (a frame in flight) is never closed. With the budget
 * spent and every open shard in use, the reader does not wait: the next
 * shard is opened for copying reads only (no lease, no mapping), so the
 * mappings stay within the budget; the excess goes at the next miss. */
static void
test_shardset_cache_never_closes_a_busy_shard(void **state)
{
    (void)state;
    char dir[64];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_many_shards(dir, sizeof(dir), 6);
    assert_int_equal(s_load_budget(&set, dir, 2, NULL, NULL, err), 6);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(emlio__shard_acquire(&set.shards[i]), 0);
    assert_int_equal(s_open_now(&set), 4); /* none waited */
    for (size_t i = 0; i < 4; i++) {
        emlio__shard_t *shard = &set.shards[i];
        assert_true(atomic_load(&shard->is_open));
        assert_int_equal(shard->leased, i < 2);
        if (shard->leased) {
            assert_int_equal(emlio_tfrecord_verify(shard->impl, 0), 0);
            continue;
        }
        uint8_t *copy;
        const uint8_t *data;
        size_t len;
        uint32_t stored;
        assert_int_equal(emlio__shard_read_copy(shard, 1, &copy, &data, &len,
                                                &stored, NULL, NULL),
                         0);
        assert_int_equal(len, 512);
        emlio__iobuf_free(copy);
    }
    emlio__shard_cache_stats_t st;
    emlio__shard_cache_stats(set.cache, &st);
    assert_int_equal(st.copy_opens, 2);
    for (size_t i = 0; i < 4; i++)
        emlio__shard_release(&set.shards[i]);
    /* The next miss closes idle shards down to the budget. */
    assert_int_equal(emlio__shard_acquire(&set.shards[5]), 0);
    assert_true(set.shards[5].leased);
    assert_true(s_open_now(&set) <= 2);
    emlio__shard_release(&set.shards[5]);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A closed shard whose path now names another file (renamed over) or
 * whose file changed (size, mtime) is refused at reopen, logged once. */
static void
test_shardset_cache_reopen_checks_the_file(void **state)
{
    (void)state;
    char dir[64];
    char path[160];
    char tmp[160];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    s_many_shards(dir, sizeof(dir), 4);
    assert_int_equal(s_load_budget(&set, dir, 1, s_log, &log, err), 4);
    assert_int_equal(emlio__shard_acquire(&set.shards[3]), 0); /* the one */
    emlio__shard_release(&set.shards[3]);
    assert_false(atomic_load(&set.shards[0].is_open));
    /* s00: replaced by an identical copy (same bytes, another inode). */
    snprintf(path, sizeof(path), "%s/s00.tfrecord", dir);
    snprintf(tmp, sizeof(tmp), "%s/new.tmp", dir);
    s_write_shard(tmp, 2);
    assert_int_equal(rename(tmp, path), 0);
    assert_int_equal(emlio__shard_acquire(&set.shards[0]), -ESTALE);
    assert_true(atomic_load(&set.shards[0].changed));
    assert_true(s_logged(&log, "'s00.tfrecord' changed on disk (the "
                               "path now names another file)"));
    /* s01: grown in place. */
    snprintf(path, sizeof(path), "%s/s01.tfrecord", dir);
    int fd = open(path, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "xx", 2), 2);
    close(fd);
    assert_int_equal(emlio__shard_acquire(&set.shards[1]), -ESTALE);
    assert_true(s_logged(&log, "'s01.tfrecord' changed on disk (its "
                               "size went from"));
    /* s02: rewritten in place, same size: the mtime tells. */
    snprintf(path, sizeof(path), "%s/s02.tfrecord", dir);
    struct timespec times[2] = { { 0, UTIME_OMIT }, { 12345, 0 } };
    assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
    assert_int_equal(emlio__shard_acquire(&set.shards[2]), -ESTALE);
    assert_true(s_logged(&log, "'s02.tfrecord' changed on disk (it was "
                               "modified"));
    assert_int_equal(emlio__shard_acquire(&set.shards[2]), -ESTALE);
    assert_int_equal(s_log_count(&log), 3); /* once each */
    /* s03, untouched, is still served. */
    assert_int_equal(emlio__shard_acquire(&set.shards[3]), 0);
    emlio__shard_release(&set.shards[3]);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A load that reads an index instead of the shard (emlio__shard_cache_adopt)
 * leaves the shard closed with the identity it stat'ed: the first open
 * checks it like any reopen. */
static void
test_shardset_cache_adopted_shard_is_checked_at_first_open(void **state)
{
    (void)state;
    char dir[64];
    char path[160];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    struct stat st;
    s_many_shards(dir, sizeof(dir), 3);
    assert_int_equal(s_load_budget(&set, dir, 1, s_log, &log, err), 3);
    assert_int_equal(emlio__shard_acquire(&set.shards[2]), 0); /* the one */
    emlio__shard_release(&set.shards[2]);
    assert_false(atomic_load(&set.shards[0].is_open));
    assert_false(atomic_load(&set.shards[1].is_open));
    snprintf(path, sizeof(path), "%s/s01.tfrecord", dir);
    assert_int_equal(stat(path, &st), 0);
    emlio__shard_cache_adopt(set.cache, &set.shards[0], &st); /* wrong */
    emlio__shard_cache_adopt(set.cache, &set.shards[1], &st); /* its own */
    assert_int_equal(emlio__shard_acquire(&set.shards[0]), -ESTALE);
    assert_true(s_logged(&log, "'s00.tfrecord' changed on disk (the path "
                               "now names another file)"));
    assert_int_equal(emlio__shard_acquire(&set.shards[1]), 0);
    assert_int_equal(emlio_tfrecord_verify(set.shards[1].impl, 1), 0);
    emlio__shard_release(&set.shards[1]);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A shard the cache reopened (closed since load) gets its lease breaks
 * too: a writer's open is signalled, the idle shard closed, and the
 * writer goes on. */
static void
test_shardset_cache_reopened_shard_lease_breaks(void **state)
{
    (void)state;
    char dir[64];
    char path[160];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_log_t log = S_LOG_INIT;
    s_many_shards(dir, sizeof(dir), 3);
    assert_int_equal(s_load_budget(&set, dir, 1, s_log, &log, err), 3);
    assert_int_equal(emlio__shard_acquire(&set.shards[2]), 0); /* the one */
    emlio__shard_release(&set.shards[2]);
    emlio__shard_t *shard = &set.shards[0];
    assert_false(atomic_load(&shard->is_open));
    assert_int_equal(emlio__shard_acquire(shard), 0); /* reopened */
    assert_true(shard->leased);
    emlio__shard_release(shard);
    snprintf(path, sizeof(path), "%s/s00.tfrecord", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(truncate(path, 10) == 0 ? 0 : 1);
    assert_true(s_wait_flag(&shard->changed));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid); /* not stuck 45 s */
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(emlio__shard_acquire(shard), -ESTALE);
    assert_true(s_logged(&log, "'s00.tfrecord' changed on disk (a "
                               "writer opened it"));
    assert_int_equal(emlio__shard_acquire(&set.shards[1]), 0);
    emlio__shard_release(&set.shards[1]);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* Counts this process's open descriptors. */
static int
s_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The tools' load (no lease): shards keep only their mappings, at most the
 * budget of them, and no descriptor; every record is still readable. */
static void
test_shardset_cache_tools_keep_no_descriptors(void **state)
{
    (void)state;
    char dir[64];
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_t set;
    s_many_shards(dir, sizeof(dir), 8);
    int before = s_fds();
    emlio__shardset_opts_t opts = { .max_open_shards = 2 };
    assert_int_equal(emlio__shardset_load(&set, dir, &opts, NULL, NULL, err),
                     8);
    assert_int_equal(s_fds(), before + 1); /* the data root only */
    for (size_t i = 0; i < set.n; i++) {
        assert_int_equal(emlio__shard_acquire(&set.shards[i]), 0);
        assert_int_equal(set.shards[i].fd, -1);
        assert_false(set.shards[i].leased);
        assert_int_equal(emlio_tfrecord_verify(set.shards[i].impl, 1), 0);
        emlio__shard_release(&set.shards[i]);
        assert_true(s_open_now(&set) <= 2);
    }
    assert_int_equal(s_fds(), before + 1);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A limit too small for any shard budget fails at load, saying what to
 * raise; so does a budget that does not fit under the limit. */
static void
test_shardset_cache_budget_must_fit_the_limit(void **state)
{
    (void)state;
    char err[EMLIO_ERRMSG_LEN];
    size_t budget = 0;
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    struct rlimit low = { 80, old.rlim_max };
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    int rc = emlio__shard_cache_budget(0, true, 1000, &budget, err);
    char low_err[EMLIO_ERRMSG_LEN];
    snprintf(low_err, sizeof(low_err), "%s", err);
    int rc_asked = emlio__shard_cache_budget(100, true, 1000, &budget, err);
    struct rlimit mid = { 96, old.rlim_max };
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &mid), 0);
    int rc_few = emlio__shard_cache_budget(0, true, 2, &budget, err);
    size_t few = budget;
    struct rlimit big = { 256, old.rlim_max };
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &big), 0);
    int rc_big = emlio__shard_cache_budget(0, true, 1000, &budget, err);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, EMLIO_EINVAL);
    assert_non_null(strstr(low_err, "open-file limit of 80 leaves room"));
    assert_non_null(strstr(low_err, "raise it to at least 95"));
    assert_int_equal(rc_asked, EMLIO_EINVAL);
    assert_non_null(strstr(err, "--max-open-shards 100"));
    assert_int_equal(rc_few, 0); /* two shards fit where eight would */
    assert_int_equal(few, 96 - 64 - 24);
    assert_int_equal(rc_big, 0);
    assert_int_equal(budget, 256 - 64 - 64);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shardset_loads_and_refuses_an_empty_dataset),
        cmocka_unit_test(test_shardset_lease_makes_writers_wait),
        cmocka_unit_test(test_shardset_copying_reads_survive_a_shrink),
        cmocka_unit_test(test_shardset_notices_a_replaced_shard),
        cmocka_unit_test(test_shardset_copying_reads_of_tar_members),
        cmocka_unit_test(test_shardset_imagefolder_is_not_leased),
        cmocka_unit_test(test_shardset_cache_honours_the_budget),
        cmocka_unit_test(test_shardset_cache_never_closes_a_busy_shard),
        cmocka_unit_test(test_shardset_cache_reopen_checks_the_file),
        cmocka_unit_test(test_shardset_cache_reopened_shard_lease_breaks),
        cmocka_unit_test(
            test_shardset_cache_adopted_shard_is_checked_at_first_open),
        cmocka_unit_test(test_shardset_cache_tools_keep_no_descriptors),
        cmocka_unit_test(test_shardset_cache_budget_must_fit_the_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
