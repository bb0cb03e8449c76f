/* test_shardset.c - finding, leasing and watching the shards of a data
 * directory: the empty dataset, leases that writers wait on, shards that
 * shrink under copying reads, and shards replaced by rename.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <sys/wait.h>

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

typedef struct s_log {
    int n;
    char last[1024];
} s_log_t;

static void
s_log(void *userdata, const char *msg)
{
    s_log_t *log = userdata;
    log->n++;
    snprintf(log->last, sizeof(log->last), "%s", msg);
}

/* Loads dir as the daemon does: leases, data CRCs checked. */
static int
s_load(emlio__shardset_t *set, const char *dir, emlio__shardset_log_fn *log,
       void *userdata, char *err)
{
    emlio__shardset_opts_t opts = { .verify_data = true, .lease = true };
    return emlio__shardset_load(set, dir, &opts, log, userdata, err);
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
    s_log_t log = { 0 };
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
    s_write_shard(path, RECORDS);
    assert_int_equal(s_load(&set, dir, s_log, &log, err), 1);
    emlio__shard_t *shard = &set.shards[0];
    assert_true(shard->leased);
    assert_true(emlio__shard_acquire(shard)); /* a frame in flight */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(truncate(path, 100) == 0 ? 0 : 1);
    uint64_t deadline = emlio__now_ns() + 10000000000ull;
    while (!atomic_load(&shard->changed) && emlio__now_ns() < deadline) {
        emlio__shardset_watch(&set, false, 60000, s_log, &log);
        usleep(10000);
    }
    assert_true(atomic_load(&shard->changed));
    assert_false(emlio__shard_acquire(shard)); /* no new reader */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 100); /* the writer still waits */
    const uint8_t *data;
    size_t len;
    assert_int_equal(
        emlio_tfrecord_record(shard->impl, RECORDS - 1, &data, &len, NULL), 0);
    assert_int_equal(data[len - 1], 'a' + (RECORDS - 1) % 26); /* intact */
    emlio__shard_release(shard);
    emlio__shardset_watch(&set, false, 60000, s_log, &log);
    assert_true(shard->released);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 100);
    assert_int_equal(log.n, 1); /* logged once, naming the file */
    assert_non_null(strstr(log.last, "'a.tfrecord' changed on disk"));
    emlio__shardset_watch(&set, true, 60000, s_log, &log);
    assert_int_equal(log.n, 1);
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
    s_log_t log = { 0 };
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
    emlio_free(copy);
    assert_int_equal(ftruncate(wfd, 700), 0);
    assert_int_equal(emlio__shard_read_copy(shard, RECORDS - 1, &copy, &data,
                                            &len, &stored, s_log, &log),
                     -ESTALE);
    assert_null(copy);
    assert_true(atomic_load(&shard->changed));
    assert_false(emlio__shard_acquire(shard));
    emlio__shardset_watch(&set, true, 60000, s_log, &log);
    assert_int_equal(log.n, 1);
    assert_non_null(strstr(log.last, "'a.tfrecord' changed on disk"));
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
    s_log_t log = { 0 };
    test_mkdtemp(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.tfrecord", dir);
    snprintf(tmp, sizeof(tmp), "%s/a.new", dir);
    s_write_shard(path, RECORDS);
    assert_int_equal(s_load(&set, dir, s_log, &log, err), 1);
    s_write_shard(tmp, 2);
    assert_int_equal(rename(tmp, path), 0);
    emlio__shardset_watch(&set, true, 60000, s_log, &log);
    assert_int_equal(log.n, 1);
    assert_non_null(strstr(log.last, "'a.tfrecord' was replaced"));
    /* The file we opened is intact and still served. */
    assert_false(atomic_load(&set.shards[0].changed));
    assert_int_equal(emlio_tfrecord_verify(set.shards[0].impl, RECORDS - 1), 0);
    emlio__shardset_watch(&set, true, 60000, s_log, &log);
    assert_int_equal(log.n, 1);
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
    s_log_t log = { 0 };
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
    emlio_free(copy);
    /* Another member's header rewritten in place (its checksum breaks). */
    assert_int_equal(pwrite(wfd, "Z", 1, 0), 1);
    assert_int_equal(emlio__tar_find(shard->impl, 0, "cls", &m), 0);
    assert_int_equal(emlio__shard_read_copy(shard, m, &copy, &data, &len,
                                            &stored, s_log, &log),
                     0); /* its own header is intact */
    emlio_free(copy);
    assert_int_equal(emlio__tar_find(shard->impl, 0, "jpg", &m), 0);
    assert_int_equal(emlio__shard_read_copy(shard, m, &copy, &data, &len,
                                            &stored, s_log, &log),
                     -ESTALE);
    assert_null(copy);
    assert_true(atomic_load(&shard->changed));
    assert_false(emlio__shard_acquire(shard));
    assert_int_equal(log.n, 1);
    assert_non_null(strstr(log.last, "'a.tar' changed on disk"));
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
    emlio__shardset_watch(&set, true, 60000, NULL, NULL); /* a no-op */
    emlio__shardset_release(&set);
    test_rmtree(dir);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
