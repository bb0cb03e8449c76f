/* test_dsindex.c - the dataset index: a cached start reads no dataset
 * byte; stale shards (size, mtime, inode) are rescanned; a corrupt,
 * truncated or foreign index is refused with a log line and rebuilt; a
 * corrupt record table is caught when the shard is first read; an index
 * that cannot be written leaves the load working.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <sys/mman.h>
#include <time.h>

#include "dsindex.h"
#include "shardset.h"

#define SHARDS  200
#define RECORDS 1000
#define PAYLOAD 128
#define SMALL   8 /* shards of the small tests */

typedef struct s_log {
    int n;
    char all[4096];
} s_log_t;

static void
s_log(void *userdata, const char *msg)
{
    s_log_t *log = userdata;
    size_t used = strlen(log->all);
    log->n++;
    snprintf(log->all + used, sizeof(log->all) - used, "%s\n", msg);
}

/* An hour ago: an index written now trusts the file's mtime (a shard
 * written within two seconds of its index is always rescanned). */
static void
s_age(const char *path)
{
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= 3600;
    t[1] = t[0];
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static void
s_write_shard(const char *path, int records, char fill)
{
    emlio_buf_t file = EMLIO_BUF_INIT;
    uint8_t payload[PAYLOAD];
    for (int r = 0; r < records; r++) {
        memset(payload, fill + r % 7, sizeof(payload));
        assert_int_equal(emlio_tfrecord_append(&file, payload, PAYLOAD), 0);
    }
    test_write_file(path, file.data, file.len);
    emlio_buf_release(&file);
    s_age(path);
}

/* The path of shard i of dir: a TFRecord of s_make or a tar of
 * s_make_tars. */
typedef void s_path_fn(char *out, size_t len, const char *dir, int i);

static void
s_shard_path(char *out, size_t len, const char *dir, int i)
{
    snprintf(out, len, "%s/s%05d.tfrecord", dir, i);
}

static void
s_tar_path(char *out, size_t len, const char *dir, int i)
{
    snprintf(out, len, "%s/t%03d.tar", dir, i);
}

static void
s_make(char *dir, size_t len, int shards, int records)
{
    char path[PATH_MAX];
    test_mkdtemp(dir, len);
    for (int i = 0; i < shards; i++) {
        s_shard_path(path, sizeof(path), dir, i);
        s_write_shard(path, records, (char)('a' + i % 20));
    }
}

/* Loads as the daemon does (leases, index written); returns the shards
 * whose records did not come from the dataset index (rescanned or read
 * from their .idx files). */
static size_t
s_load(emlio__shardset_t *set, const char *dir, const char *index_dir,
       s_log_t *log)
{
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_opts_t opts = { .write_index = true,
                                    .lease = true,
                                    .index_dir = index_dir };
    int rc =
        emlio__shardset_load(set, dir, &opts, log ? s_log : NULL, log, err);
    if (rc < 0)
        fail_msg("load of '%s' failed: %s", dir, err);
    return set->rescanned;
}

static size_t
s_load_count(const char *dir, const char *index_dir, s_log_t *log)
{
    emlio__shardset_t set;
    size_t n = s_load(&set, dir, index_dir, log);
    emlio__shardset_release(&set);
    return n;
}

/* Writes path's pages to disk and drops them from the page cache. */
static void
s_evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* Pages of path in the page cache. */
static size_t
s_resident(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    assert_true(fd >= 0 && fstat(fd, &st) == 0);
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(map != MAP_FAILED);
    size_t pages = ((size_t)st.st_size + 4095) / 4096, n = 0;
    unsigned char *vec = malloc(pages);
    assert_int_equal(mincore(map, (size_t)st.st_size, vec), 0);
    for (size_t i = 0; i < pages; i++)
        n += vec[i] & 1;
    free(vec);
    munmap(map, (size_t)st.st_size);
    return n;
}

/* Drops shards [0, n) of dir, named by path_of, from the page cache. */
static void
s_evict_shards(const char *dir, int n, s_path_fn *path_of)
{
    char path[PATH_MAX];
    for (int i = 0; i < n; i++) {
        path_of(path, sizeof(path), dir, i);
        s_evict(path);
    }
}

/* Pages of shards [0, n) of dir, named by path_of, in the page cache. */
static size_t
s_resident_shards(const char *dir, int n, s_path_fn *path_of)
{
    char path[PATH_MAX];
    size_t pages = 0;
    for (int i = 0; i < n; i++) {
        path_of(path, sizeof(path), dir, i);
        pages += s_resident(path);
    }
    return pages;
}

/* Reads record r of shard i with o into view, which the caller releases. */
static void
s_read(emlio__shardset_t *set, size_t i, uint64_t r,
       const emlio__read_opts_t *o, emlio__view_t *view)
{
    const char *missing = "";
    memset(view, 0, sizeof(*view));
    assert_int_equal(emlio__shard_read(&set->shards[i], r, o, view, &missing),
                     0);
}

/* Reads record r of shard i (its CRC checked) and compares a byte. */
static void
s_check_record(emlio__shardset_t *set, size_t i, uint64_t r, char fill)
{
    emlio__read_opts_t o = { .raw = true, .verify = true };
    emlio__view_t view;
    s_read(set, i, r, &o, &view);
    assert_int_equal(view.len, PAYLOAD);
    assert_int_equal(view.data[0], (uint8_t)(fill + r % 7));
    emlio__view_release(&view, &set->shards[i]);
}

/* 200 shards, 200k records: the second load takes every table from the
 * index, and with the shards evicted from the page cache a third load
 * brings none of their pages back. */
static void
test_dsindex_cached_start_reads_no_data(void **state)
{
    (void)state;
    char dir[64], path[PATH_MAX];
    emlio__shardset_t set;
    s_make(dir, sizeof(dir), SHARDS, RECORDS);
    assert_int_equal(s_load_count(dir, NULL, NULL), SHARDS); /* builds */
    snprintf(path, sizeof(path), "%s/%s", dir, EMLIO__DSINDEX_NAME);
    assert_int_equal(access(path, R_OK), 0);
    s_evict_shards(dir, SHARDS, s_shard_path);
    s_log_t log = { 0 };
    assert_int_equal(s_load(&set, dir, NULL, &log), 0);
    assert_int_equal(set.indexed, SHARDS);
    assert_int_equal(log.n, 0);
    assert_int_equal(set.records, (uint64_t)SHARDS * RECORDS);
    assert_int_equal(s_resident_shards(dir, SHARDS, s_shard_path), 0);
    s_check_record(&set, 3, 999, 'a' + 3); /* served, CRC checked */
    s_shard_path(path, sizeof(path), dir, 3);
    assert_true(s_resident(path) > 0); /* what a read brings in is seen */
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A shard whose mtime, size or inode changed is rescanned, the others
 * are not, and the rewritten index serves all of them next time. */
static void
test_dsindex_stale_shards_are_rescanned(void **state)
{
    (void)state;
    char dir[64], path[PATH_MAX], tmp[PATH_MAX];
    emlio__shardset_t set;
    s_make(dir, sizeof(dir), SMALL, 50);
    assert_int_equal(s_load_count(dir, NULL, NULL), SMALL);
    assert_int_equal(s_load_count(dir, NULL, NULL), 0);
    snprintf(path, sizeof(path), "%s/s00000.tfrecord.idx", dir); /* lost */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(s_load_count(dir, NULL, NULL), 0);
    assert_int_equal(access(path, R_OK), 0);
    s_shard_path(path, sizeof(path), dir, 1); /* mtime */
    struct timespec t[2] = { { 1000, 0 }, { 1000, 0 } };
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
    assert_int_equal(s_load_count(dir, NULL, NULL), 1);
    assert_int_equal(s_load_count(dir, NULL, NULL), 0);
    s_shard_path(path, sizeof(path), dir, 2); /* size */
    s_write_shard(path, 60, 'c');
    assert_int_equal(s_load(&set, dir, NULL, NULL), 1);
    assert_int_equal(set.records, (uint64_t)SMALL * 50 + 10);
    emlio__shardset_release(&set);
    assert_int_equal(s_load_count(dir, NULL, NULL), 0);
    /* inode: the same bytes and mtime in a new file renamed over it */
    s_shard_path(path, sizeof(path), dir, 3);
    snprintf(tmp, sizeof(tmp), "%s/new.tmp", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    s_write_shard(tmp, 50, 'x');
    struct timespec same[2] = { st.st_mtim, st.st_mtim };
    assert_int_equal(utimensat(AT_FDCWD, tmp, same, 0), 0);
    assert_int_equal(rename(tmp, path), 0);
    assert_int_equal(s_load(&set, dir, NULL, NULL), 1);
    s_check_record(&set, 3, 4, 'x');
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* Overwrites len bytes at off of path. */
static void
s_poke(const char *path, off_t off, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, len, off), (ssize_t)len);
    close(fd);
}

/* Loads a broken index: refused with a log line naming why, rebuilt. */
static void
s_expect_refused(const char *dir, const char *why)
{
    s_log_t log = { 0 };
    assert_int_equal(s_load_count(dir, NULL, &log), SMALL);
    if (!strstr(log.all, why) || !strstr(log.all, "rebuilding"))
        fail_msg("expected '%s' in the log, got: %s", why, log.all);
    assert_int_equal(s_load_count(dir, NULL, NULL), 0);
}

static void
test_dsindex_broken_index_is_rebuilt(void **state)
{
    (void)state;
    char dir[64], other[64], path[PATH_MAX], cmd[PATH_MAX * 2];
    s_make(dir, sizeof(dir), SMALL, 50);
    assert_int_equal(s_load_count(dir, NULL, NULL), SMALL);
    snprintf(path, sizeof(path), "%s/%s", dir, EMLIO__DSINDEX_NAME);
    s_poke(path, 0, "XMLIO", 5);
    s_expect_refused(dir, "bad magic");
    s_poke(path, 64 + 80 + 20, "\x7f", 1); /* the second entry's size */
    s_expect_refused(dir, "checksum mismatch");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    s_expect_refused(dir, "truncated");
    assert_int_equal(truncate(path, 10), 0);
    s_expect_refused(dir, "truncated");
    s_make(other, sizeof(other), SMALL, 50); /* same names, other files */
    snprintf(cmd, sizeof(cmd), "cp %s %s/", path, other);
    assert_int_equal(system(cmd), 0);
    s_expect_refused(other, "another data directory");
    test_rmtree(other);
    test_rmtree(dir);
}

/* A flipped byte in a record table passes the header check; the shard's
 * first read finds the table's CRC wrong and rescans the mapping. */
static void
test_dsindex_corrupt_table_is_caught_when_read(void **state)
{
    (void)state;
    char dir[64], path[PATH_MAX];
    emlio__shardset_t set;
    s_make(dir, sizeof(dir), SMALL, 50);
    assert_int_equal(s_load_count(dir, NULL, NULL), SMALL);
    assert_int_equal(s_load(&set, dir, NULL, NULL), 0);
    const emlio__dsindex_entry_t *e =
        emlio__dsindex_find(&set.index, "s00002.tfrecord");
    assert_non_null(e);
    off_t at = (off_t)e->table_off + 16 * 7; /* record 7's offset */
    emlio__shardset_release(&set);
    snprintf(path, sizeof(path), "%s/%s", dir, EMLIO__DSINDEX_NAME);
    s_poke(path, at, "\x55", 1);
    assert_int_equal(s_load(&set, dir, NULL, NULL), 0);
    /* Asked about before its shard is open (a copy budget's estimate, a
     * message's offset): the check waits for a mapping to rebuild from,
     * instead of failing the shard for the daemon's life. */
    (void)emlio__shard_offset(&set.shards[2], 7);
    s_check_record(&set, 2, 7, 'a' + 2);
    s_check_record(&set, 2, 49, 'a' + 2);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A forged table whose CRC is right (whoever can write the index): record
 * 1 described as record 0. Both would pass their data CRC, so the table's
 * order is checked too, and the shard is rescanned: record 1 is record 1. */
static void
test_dsindex_forged_table_with_valid_crc(void **state)
{
    (void)state;
    char dir[64], path[PATH_MAX];
    emlio__shardset_t set;
    s_make(dir, sizeof(dir), SMALL, 50);
    assert_int_equal(s_load_count(dir, NULL, NULL), SMALL);
    assert_int_equal(s_load(&set, dir, NULL, NULL), 0);
    emlio__dsindex_item_t items[SMALL];
    struct stat st[SMALL], root;
    emlio_tfrecord_loc_t *forged = NULL;
    assert_int_equal(stat(dir, &root), 0);
    for (size_t i = 0; i < set.n; i++) {
        const emlio__dsindex_entry_t *e =
            emlio__dsindex_find(&set.index, set.shards[i].name);
        assert_non_null(e);
        snprintf(path, sizeof(path), "%s/%s", dir, set.shards[i].name);
        assert_int_equal(stat(path, &st[i]), 0);
        const void *table = emlio__dsindex_table(&set.index, e);
        if (i == 2) { /* record 1 := record 0 */
            forged = malloc((size_t)e->table_len);
            memcpy(forged, table, (size_t)e->table_len);
            forged[1] = forged[0];
            table = forged;
        }
        items[i] = (emlio__dsindex_item_t){ .name = set.shards[i].name,
                                            .format = "tfrecord",
                                            .st = &st[i],
                                            .records = e->records,
                                            .table = table,
                                            .table_len = (size_t)e->table_len };
    }
    snprintf(path, sizeof(path), "%s/%s", dir, EMLIO__DSINDEX_NAME);
    assert_int_equal(emlio__dsindex_write(path, &root, items, set.n), 0);
    emlio__shardset_release(&set);
    free(forged);
    assert_int_equal(s_load(&set, dir, NULL, NULL), 0); /* taken as current */
    s_check_record(&set, 2, 1, 'a' + 2);
    s_check_record(&set, 2, 0, 'a' + 2);
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

/* A write cut by a crash leaves "<index>.tmpXXXXXX"; the next write
 * removes such leftovers once they are a minute old, and leaves a younger
 * one (another daemon's write in progress) alone. */
static void
test_dsindex_crashed_write_leftovers_removed(void **state)
{
    (void)state;
    char dir[64], stale[PATH_MAX], young[PATH_MAX];
    s_make(dir, sizeof(dir), SMALL, 50);
    snprintf(stale, sizeof(stale), "%s/%s.tmpAbC123", dir, EMLIO__DSINDEX_NAME);
    snprintf(young, sizeof(young), "%s/%s.tmpXyZ789", dir, EMLIO__DSINDEX_NAME);
    for (int k = 0; k < 2; k++) {
        int fd = open(k ? young : stale, O_WRONLY | O_CREAT | O_EXCL, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "cut", 3), 3);
        close(fd);
    }
    struct timespec old[2] = { { time(NULL) - 3600, 0 },
                               { time(NULL) - 3600, 0 } };
    assert_int_equal(utimensat(AT_FDCWD, stale, old, 0), 0);
    assert_int_equal(s_load_count(dir, NULL, NULL), SMALL); /* writes it */
    assert_int_equal(access(stale, F_OK), -1);
    assert_int_equal(access(young, F_OK), 0);
    test_rmtree(dir);
}

/* Data that cannot take the index: the load works and says so; with an
 * index directory the index lives there, one per data directory. */
static void
test_dsindex_unwritable_and_index_dir(void **state)
{
    (void)state;
    char dir[64], ixdir[64], missing[128];
    s_make(dir, sizeof(dir), SMALL, 50);
    snprintf(missing, sizeof(missing), "%s/no/such/dir", dir);
    s_log_t log = { 0 };
    assert_int_equal(s_load_count(dir, missing, &log), SMALL);
    assert_non_null(strstr(log.all, "cannot write dataset index"));
    assert_non_null(strstr(log.all, "--index-dir"));
    assert_int_equal(s_load_count(dir, missing, NULL), SMALL);
    test_mkdtemp(ixdir, sizeof(ixdir));
    assert_int_equal(s_load_count(dir, ixdir, NULL), SMALL);
    assert_int_equal(s_load_count(dir, ixdir, NULL), 0);
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, EMLIO__DSINDEX_NAME);
    assert_int_equal(access(path, F_OK), -1); /* nothing in the data */
    test_rmtree(ixdir);
    test_rmtree(dir);
}

#define TARS        20
#define TAR_SAMPLES 50

/* TARS WebDataset shards of TAR_SAMPLES samples (a 300-byte .jpg and a
 * .cls each); the first also holds a stray README.txt, which a daemon
 * without --fields leaves out. */
static void
s_make_tars(char *dir, size_t len)
{
    char path[PATH_MAX], name[64];
    test_mkdtemp(dir, len);
    for (int i = 0; i < TARS; i++) {
        emlio_buf_t tar = EMLIO_BUF_INIT;
        if (i == 0)
            test_tar_member(&tar, "README.txt", 20, 'r');
        for (int j = 0; j < TAR_SAMPLES; j++) {
            snprintf(name, sizeof(name), "k%03d.jpg", j);
            test_tar_member(&tar, name, 300, (char)('a' + j % 26));
            snprintf(name, sizeof(name), "k%03d.cls", j);
            test_tar_member(&tar, name, 1, (char)('0' + j % 10));
        }
        assert_int_equal(emlio_buf_add(&tar, (uint8_t[1024]){ 0 }, 1024), 0);
        s_tar_path(path, sizeof(path), dir, i);
        test_write_file(path, tar.data, tar.len);
        emlio_buf_release(&tar);
        s_age(path);
    }
}

/* Loads tar shards as a daemon without --fields: pruned to samples with
 * an image (or to prune_field); returns the shards rescanned. */
static size_t
s_load_tars(emlio__shardset_t *set, const char *dir, const char *prune_field,
            s_log_t *log)
{
    char err[EMLIO_ERRMSG_LEN];
    emlio__shardset_opts_t opts = { .write_index = true,
                                    .lease = true,
                                    .prune = true,
                                    .prune_field = prune_field };
    if (emlio__shardset_load(set, dir, &opts, log ? s_log : NULL, log, err) < 0)
        fail_msg("load of '%s' failed: %s", dir, err);
    return set->rescanned;
}

/* Sample r of tar shard i: its .jpg, 300 bytes of 'a' + r % 26. */
static void
s_check_tar_sample(emlio__shardset_t *set, size_t i, uint64_t r)
{
    emlio__read_opts_t o = { .label_field = "cls" };
    emlio__view_t view;
    s_read(set, i, r, &o, &view);
    assert_int_equal(view.len, 300);
    assert_int_equal(view.data[0], (uint8_t)('a' + r % 26));
    assert_int_equal(view.label, (int64_t)(r % 10));
    emlio__view_release(&view, &set->shards[i]);
}

/* Tar shards: the pruned tables are kept, so a cached start reads no
 * shard byte and still says what was left out; an index pruned for
 * another field is not used; a corrupt table is caught when read. */
static void
test_dsindex_tar_shards(void **state)
{
    (void)state;
    char dir[64], path[PATH_MAX];
    emlio__shardset_t set;
    s_make_tars(dir, sizeof(dir));
    s_log_t log = { 0 };
    assert_int_equal(s_load_tars(&set, dir, NULL, &log), TARS);
    assert_non_null(strstr(log.all, "left out 1 of 1001 samples"));
    emlio__shardset_release(&set);
    s_evict_shards(dir, TARS, s_tar_path);
    memset(&log, 0, sizeof(log));
    assert_int_equal(s_load_tars(&set, dir, NULL, &log), 0);
    assert_non_null(strstr(log.all, "left out 1 of 1001 samples"));
    assert_non_null(strstr(log.all, "README.txt"));
    assert_int_equal(set.records, TARS * TAR_SAMPLES);
    assert_int_equal(s_resident_shards(dir, TARS, s_tar_path), 0);
    s_check_tar_sample(&set, 0, 0); /* after the dropped README */
    s_check_tar_sample(&set, 7, 49);
    const emlio__dsindex_entry_t *e =
        emlio__dsindex_find(&set.index, "t003.tar");
    assert_non_null(e);
    off_t at = (off_t)e->table_off + (off_t)e->table_len - 8;
    emlio__shardset_release(&set);
    assert_int_equal(s_load_tars(&set, dir, "cls", NULL), TARS);
    emlio__shardset_release(&set);
    assert_int_equal(s_load_tars(&set, dir, NULL, NULL), TARS);
    emlio__shardset_release(&set);
    snprintf(path, sizeof(path), "%s/%s", dir, EMLIO__DSINDEX_NAME);
    e = NULL;
    s_poke(path, at, "\x55\x55", 2); /* sample starts of t003.tar */
    assert_int_equal(s_load_tars(&set, dir, NULL, NULL), 0);
    s_check_tar_sample(&set, 3, 48);
    s_check_tar_sample(&set, 3, 49);
    /* the check found it: the shard's table is its own now, not the
     * mapped one */
    size_t len;
    e = emlio__dsindex_find(&set.index, "t003.tar");
    assert_ptr_not_equal(
        set.shards[3].ops->index_table(set.shards[3].impl, &len),
        emlio__dsindex_table(&set.index, e));
    e = emlio__dsindex_find(&set.index, "t004.tar");
    s_check_tar_sample(&set, 4, 0);
    assert_ptr_equal(set.shards[4].ops->index_table(set.shards[4].impl, &len),
                     emlio__dsindex_table(&set.index, e));
    emlio__shardset_release(&set);
    test_rmtree(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dsindex_cached_start_reads_no_data),
        cmocka_unit_test(test_dsindex_stale_shards_are_rescanned),
        cmocka_unit_test(test_dsindex_broken_index_is_rebuilt),
        cmocka_unit_test(test_dsindex_corrupt_table_is_caught_when_read),
        cmocka_unit_test(test_dsindex_forged_table_with_valid_crc),
        cmocka_unit_test(test_dsindex_crashed_write_leftovers_removed),
        cmocka_unit_test(test_dsindex_unwritable_and_index_dir),
        cmocka_unit_test(test_dsindex_tar_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
