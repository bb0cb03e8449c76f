/* test_paths.c - the one rule for paths (beneath.h): nothing outside the
 * data root is listed or served, symlinks inside it only when followed,
 * FIFOs in place of images, shards, indexes and file lists never block,
 * and a file list (.emlio-files) is a hint checked against the tree.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "beneath.h"
#include "imagefolder.h"
#include "shardset.h"

typedef struct s_log {
    int n;
    char all[8192];
} s_log_t;

static void
s_log(void *userdata, const char *msg)
{
    s_log_t *log = userdata;
    log->n++;
    size_t used = strlen(log->all);
    snprintf(log->all + used, sizeof(log->all) - used, "%s\n", msg);
}

typedef struct s_tree {
    char tmp[64];
    char root[128];
    char secret[128];
} s_tree_t;

/* Writes the path of rel in the tree to out (PATH_MAX bytes); returns out,
 * so that the call can stand where the path is used. */
static char *
s_path(char *out, const s_tree_t *t, const char *rel)
{
    snprintf(out, PATH_MAX, "%s/%s", t->root, rel);
    return out;
}

/* tmp/secret (outside the root) and tmp/data/cat/{a,b}.jpg. */
static void
s_tree(s_tree_t *t)
{
    test_mkdtemp(t->tmp, sizeof(t->tmp));
    snprintf(t->root, sizeof(t->root), "%s/data", t->tmp);
    snprintf(t->secret, sizeof(t->secret), "%s/secret", t->tmp);
    assert_int_equal(mkdir(t->root, 0755), 0);
    test_write_file(t->secret, "SECRET-SECRET", 13);
    char p[PATH_MAX];
    assert_int_equal(mkdir(s_path(p, t, "cat"), 0755), 0);
    test_write_file(s_path(p, t, "cat/a.jpg"), "aaaa", 4);
    test_write_file(s_path(p, t, "cat/b.jpg"), "bbbbbb", 6);
}

static int
s_load(emlio__shardset_t *set, const s_tree_t *t, bool follow, s_log_t *log,
       char *err)
{
    emlio__shardset_opts_t opts = { .write_index = true,
                                    .lease = true,
                                    .follow_symlinks = follow };
    return emlio__shardset_load(set, t->root, &opts, s_log, log, err);
}

/* Reads every record of the set; fails the test if any holds the secret. */
static size_t
s_read_all(emlio__shardset_t *set)
{
    size_t ok = 0;
    for (size_t s = 0; s < set->n; s++)
        for (size_t r = 0; r < emlio__shard_count(&set->shards[s]); r++) {
            emlio__view_t view = { 0 };
            emlio__read_opts_t o = { 0 };
            const char *missing = NULL;
            int rc = emlio__shard_read(&set->shards[s], r, &o, &view, &missing);
            if (rc == 0) {
                assert_false(view.len == 13 &&
                             memcmp(view.data, "SECRET", 6) == 0);
                ok++;
            }
            emlio__view_release(&view, &set->shards[s]);
        }
    return ok;
}

static void
test_paths_open_beneath_refuses_what_is_outside(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    assert_int_equal(symlink(t.secret, s_path(p, &t, "cat/out.jpg")), 0);
    assert_int_equal(symlink("a.jpg", s_path(p, &t, "cat/in.jpg")), 0);
    assert_int_equal(symlink("../../secret", s_path(p, &t, "cat/up.jpg")), 0);
    assert_int_equal(mkfifo(s_path(p, &t, "cat/fifo.jpg"), 0644), 0);
    for (int follow = 0; follow < 2; follow++)
        for (unsigned how = 0; how <= EMLIO__OPEN_NOOPENAT2;
             how += EMLIO__OPEN_NOOPENAT2) {
            emlio__root_t root;
            assert_int_equal(emlio__root_open(&root, t.root, follow), 0);
            struct stat st;
            int fd = emlio__open_beneath(&root, "cat/a.jpg", how, &st);
            assert_true(fd >= 0);
            assert_int_equal(st.st_size, 4);
            close(fd);
            assert_int_equal(
                emlio__open_beneath(&root, "cat/out.jpg", how, &st),
                follow ? -EXDEV : -ELOOP);
            assert_int_equal(emlio__open_beneath(&root, "cat/up.jpg", how, &st),
                             follow ? -EXDEV : -ELOOP);
            fd = emlio__open_beneath(&root, "cat/in.jpg", how, &st);
            if (follow) {
                assert_true(fd >= 0);
                close(fd);
            } else {
                assert_int_equal(fd, -ELOOP);
            }
            assert_int_equal(emlio__open_beneath(&root, "../secret", how, &st),
                             -EXDEV);
            assert_int_equal(emlio__open_beneath(&root, t.secret, how, &st),
                             -EXDEV);
            /* A FIFO is refused at once, not waited on. */
            assert_int_equal(
                emlio__open_beneath(&root, "cat/fifo.jpg", how, &st),
                EMLIO_EFORMAT);
            assert_int_equal(emlio__open_beneath(&root, "cat", how, &st),
                             -EISDIR);
            fd = emlio__open_beneath(&root, "cat", how | EMLIO__OPEN_DIR, &st);
            assert_true(fd >= 0);
            close(fd);
            emlio__root_close(&root);
        }
    assert_true(emlio__rel_ok("a/b.jpg", 7));
    assert_false(emlio__rel_ok("../b.jpg", 8));
    assert_false(emlio__rel_ok("a/../../b", 9));
    assert_false(emlio__rel_ok("/etc/shadow", 11));
    assert_false(emlio__rel_ok("a//b", 4));
    assert_false(emlio__rel_ok("a/.hidden", 9));
    test_rmtree(t.tmp);
}

static void
test_paths_imagefolder_links_out_of_the_root_are_never_served(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    assert_int_equal(symlink(t.secret, s_path(p, &t, "cat/shadow.jpg")), 0);
    assert_int_equal(symlink("a.jpg", s_path(p, &t, "cat/c.jpg")), 0);
    /* A class directory that is a link out of the root. */
    char outside[256];
    snprintf(outside, sizeof(outside), "%s/elsewhere", t.tmp);
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(p, sizeof(p), "%s/x.jpg", outside);
    test_write_file(p, "SECRET-SECRET", 13);
    assert_int_equal(symlink(outside, s_path(p, &t, "dog")), 0);

    for (int follow = 0; follow < 2; follow++) {
        emlio__shardset_t set;
        s_log_t log = { 0 };
        char err[EMLIO_ERRMSG_LEN] = "";
        assert_int_equal(s_load(&set, &t, follow, &log, err), 1);
        assert_string_equal(set.shards[0].name, "cat");
        /* a, b; c (a link inside the root) only when following. */
        assert_int_equal(emlio__shard_count(&set.shards[0]), follow ? 3 : 2);
        assert_non_null(strstr(log.all, "symbolic link"));
        assert_int_equal(s_read_all(&set), follow ? 3 : 2);
        emlio__shardset_release(&set);
        /* The file list written by that load is used, and still right. */
        memset(&log, 0, sizeof(log));
        assert_int_equal(s_load(&set, &t, follow, &log, err), 1);
        assert_null(strstr(log.all, "does not describe"));
        assert_int_equal(s_read_all(&set), follow ? 3 : 2);
        emlio__shardset_release(&set);
        char cache[PATH_MAX];
        s_path(cache, &t, ".emlio-files");
        unlink(cache);
    }
    test_rmtree(t.tmp);
}

static void
test_paths_a_fifo_never_blocks(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    /* The file list is a FIFO: ignored (one line), the tree is listed. */
    assert_int_equal(mkfifo(s_path(p, &t, ".emlio-files"), 0644), 0);
    emlio__shardset_t set;
    s_log_t log = { 0 };
    char err[EMLIO_ERRMSG_LEN] = "";
    emlio__shardset_opts_t opts = { .lease = true };
    assert_int_equal(
        emlio__shardset_load(&set, t.root, &opts, s_log, &log, err), 1);
    assert_non_null(strstr(log.all, "not a regular file"));
    /* An image replaced by a FIFO after listing: refused as changed. */
    s_path(p, &t, "cat/a.jpg");
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0644), 0);
    emlio__view_t view = { 0 };
    emlio__read_opts_t o = { 0 };
    const char *missing = NULL;
    assert_int_equal(emlio__shard_read(&set.shards[0], 0, &o, &view, &missing),
                     EMLIO_EFORMAT);
    emlio__view_release(&view, &set.shards[0]);
    emlio__shardset_release(&set);

    /* A shard that is a FIFO is not a shard; an index that is one is
     * ignored and rebuilt. */
    assert_int_equal(mkfifo(s_path(p, &t, "x.tar"), 0644), 0);
    s_path(p, &t, "y.tfrecord");
    emlio_buf_t file = EMLIO_BUF_INIT;
    assert_int_equal(emlio_tfrecord_append(&file, (const uint8_t *)"abc", 3),
                     0);
    test_write_file(p, file.data, file.len);
    emlio_buf_release(&file);
    assert_int_equal(mkfifo(s_path(p, &t, "y.tfrecord.idx"), 0644), 0);
    memset(&log, 0, sizeof(log));
    opts.format = "tfrecord";
    assert_int_equal(
        emlio__shardset_load(&set, t.root, &opts, s_log, &log, err), 1);
    assert_int_equal(set.records, 1);
    assert_non_null(strstr(log.all, "not a regular file"));
    emlio__shardset_release(&set);
    test_rmtree(t.tmp);
}

static void
test_paths_shard_links_follow_the_rule(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    emlio_buf_t file = EMLIO_BUF_INIT;
    assert_int_equal(emlio_tfrecord_append(&file, (const uint8_t *)"abc", 3),
                     0);
    test_write_file(s_path(p, &t, "a.tfrecord"), file.data, file.len);
    char out[PATH_MAX];
    snprintf(out, sizeof(out), "%s/out.tfrecord", t.tmp);
    test_write_file(out, file.data, file.len);
    emlio_buf_release(&file);
    assert_int_equal(symlink("a.tfrecord", s_path(p, &t, "b.tfrecord")), 0);
    assert_int_equal(symlink(out, s_path(p, &t, "c.tfrecord")), 0);
    for (int follow = 0; follow < 2; follow++) {
        emlio__shardset_t set;
        s_log_t log = { 0 };
        char err[EMLIO_ERRMSG_LEN] = "";
        assert_int_equal(s_load(&set, &t, follow, &log, err), follow ? 2 : 1);
        assert_non_null(strstr(log.all, "symbolic link"));
        emlio__shardset_release(&set);
    }
    test_rmtree(t.tmp);
}

/* Rewrites a name in ROOT/.emlio-files (same length, so the tables
 * still add up) and seals the checksum again: a deliberate lie, not a
 * damaged file. */
static void
s_edit_cache(const s_tree_t *t, const char *from, const char *to)
{
    char p[PATH_MAX];
    s_path(p, t, ".emlio-files");
    size_t len;
    uint8_t *data = test_read_file(p, &len);
    size_t n = strlen(from);
    assert_int_equal(strlen(to), n);
    uint8_t *at = NULL;
    for (size_t i = 0; i + n + 1 <= len && !at; i++)
        if (memcmp(data + i, from, n + 1) == 0 && (i == 0 || !data[i - 1]))
            at = data + i;
    assert_non_null(at);
    memcpy(at, to, n);
    assert_int_equal(emlio__folder_cache_seal(data, len), 0);
    test_write_file(p, data, len);
    free(data);
}

/* Sets the mtime of ROOT/rel an hour back: a class listed now is then not
 * "racy" (changed as it was listed) at the next load. */
static void
s_age(const s_tree_t *t, const char *rel)
{
    char p[PATH_MAX];
    s_path(p, t, rel);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 3600;
    ts[1] = ts[0];
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
}

/* Classes the load took from the file list (no file stat'ed) and classes
 * it walked (a stat per file). */
static void
s_how(const emlio__shardset_t *set, size_t *cached, size_t *listed)
{
    *cached = *listed = 0;
    for (size_t s = 0; s < set->n; s++) {
        *cached += emlio__folder_cached(set->shards[s].impl);
        *listed += emlio__folder_listed(set->shards[s].impl);
    }
}

static void
test_paths_file_list_is_a_hint(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    for (int i = 0; i < 6; i++) {
        char name[32];
        snprintf(name, sizeof(name), "cat/f%d.jpg", i);
        s_path(p, &t, name);
        test_write_file(p, "ffff", 4);
    }
    s_age(&t, "cat");
    emlio__shardset_t set;
    s_log_t log = { 0 };
    char err[EMLIO_ERRMSG_LEN] = "";
    assert_int_equal(s_load(&set, &t, false, &log, err), 1);
    assert_int_equal(set.records, 8);
    emlio__shardset_release(&set);
    s_path(p, &t, ".emlio-files");
    size_t len;
    uint8_t *orig = test_read_file(p, &len);

    /* Each lie, checksum and all: a name out of the root, a repeat, an
     * absolute name, a hidden file, a file that is no image. Every one is
     * rebuilt from the tree, with one log line, and nothing but the
     * tree's files is served. */
    struct {
        const char *from, *to;
    } lies[] = {
        { "a.jpg", "../aa" }, { "f2.jpg", "f1.jpg" }, { "f5.jpg", "/etc/h" },
        { "b.jpg", ".b.jp" }, { "f4.jpg", "f4.txt" }, { "cat", "../" },
    };

    for (size_t k = 0; k < EMLIO_ARRAY_SIZE(lies); k++) {
        test_write_file(p, orig, len);
        s_edit_cache(&t, lies[k].from, lies[k].to);
        memset(&log, 0, sizeof(log));
        assert_int_equal(s_load(&set, &t, false, &log, err), 1);
        assert_int_equal(set.records, 8);
        assert_int_equal(log.n, 1);
        assert_non_null(strstr(log.all, "does not describe the tree"));
        assert_int_equal(s_read_all(&set), 8);
        emlio__shardset_release(&set);
    }
    /* Damage: a flipped byte (checksum), a cut file, the text list of
     * version 1. */
    const char *damage[] = { "checksum", "truncated", "version 2" };
    for (size_t k = 0; k < EMLIO_ARRAY_SIZE(damage); k++) {
        uint8_t *copy = test_read_file(p, &len); /* written by the last load */
        if (k == 0)
            copy[len - 3] ^= 1;
        if (k == 2)
            memcpy(copy, "emlio-imagefolder 1\n", 20);
        test_write_file(p, copy, k == 1 ? len - 8 : len);
        free(copy);
        memset(&log, 0, sizeof(log));
        assert_int_equal(s_load(&set, &t, false, &log, err), 1);
        assert_int_equal(set.records, 8);
        assert_non_null(strstr(log.all, damage[k]));
        emlio__shardset_release(&set);
    }
    free(orig);
    test_rmtree(t.tmp);
}

/* A start stats directories, not files: an unchanged class comes from the
 * list; adding a file lists its class again, and only it. */
static void
test_paths_file_list_trusts_directories(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    assert_int_equal(mkdir(s_path(p, &t, "dog"), 0755), 0);
    assert_int_equal(mkdir(s_path(p, &t, "dog/sub"), 0755), 0);
    test_write_file(s_path(p, &t, "dog/sub/d.png"), "dd", 2);
    s_age(&t, "cat");
    s_age(&t, "dog");
    s_age(&t, "dog/sub");
    emlio__shardset_t set;
    s_log_t log = { 0 };
    char err[EMLIO_ERRMSG_LEN] = "";
    size_t cached, listed;
    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    s_how(&set, &cached, &listed);
    assert_int_equal(listed, 2);
    emlio__shardset_release(&set);

    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    s_how(&set, &cached, &listed);
    assert_int_equal(cached, 2);
    assert_int_equal(listed, 0);
    assert_int_equal(log.n, 0);
    assert_int_equal(set.records, 3);
    assert_int_equal(s_read_all(&set), 3);
    emlio__shardset_release(&set);

    /* A new image in a nested directory: dog alone is listed again. */
    test_write_file(s_path(p, &t, "dog/sub/e.png"), "eee", 3);
    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    s_how(&set, &cached, &listed);
    assert_int_equal(cached, 1);
    assert_int_equal(listed, 1);
    assert_true(emlio__folder_listed(set.shards[1].impl));
    assert_int_equal(set.records, 4);
    assert_non_null(strstr(log.all, "1 of 2 classes"));
    emlio__shardset_release(&set);

    /* Changed within the clock's reach of its listing: listed once more;
     * aged, it is trusted again. */
    memset(&log, 0, sizeof(log));
    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    s_how(&set, &cached, &listed);
    assert_int_equal(listed, 1);
    assert_non_null(strstr(log.all, "as it was listed"));
    emlio__shardset_release(&set);
    s_age(&t, "dog/sub");
    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    emlio__shardset_release(&set);
    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    s_how(&set, &cached, &listed);
    assert_int_equal(cached, 2);
    emlio__shardset_release(&set);

    /* A file rewritten in place leaves its directory as it was: the
     * class is trusted, and the read finds the file changed (size and
     * mtime are checked at every read). A new class is listed alone. */
    test_write_file(s_path(p, &t, "cat/a.jpg"), "AAAAA", 5);
    assert_int_equal(mkdir(s_path(p, &t, "eel"), 0755), 0);
    test_write_file(s_path(p, &t, "eel/e.jpg"), "e", 1);
    memset(&log, 0, sizeof(log));
    assert_int_equal(s_load(&set, &t, false, &log, err), 3);
    s_how(&set, &cached, &listed);
    assert_int_equal(cached, 2);
    assert_int_equal(listed, 1);
    assert_non_null(strstr(log.all, "a new class"));
    assert_int_equal(s_read_all(&set), 4); /* all but cat/a.jpg */
    emlio__shardset_release(&set);
    test_rmtree(t.tmp);
}

/* Out of memory anywhere in a load that uses the list, and in one that
 * lists a changed class again and rewrites it: the load fails or serves
 * the tree exactly; nothing crashes or (under make check) leaks. */
static void
test_paths_file_list_out_of_memory(void **state)
{
    (void)state;
    s_tree_t t;
    s_tree(&t);
    char p[PATH_MAX];
    assert_int_equal(mkdir(s_path(p, &t, "dog"), 0755), 0);
    test_write_file(s_path(p, &t, "dog/d.png"), "dd", 2);
    s_age(&t, "cat");
    s_age(&t, "dog");
    emlio__shardset_t set;
    s_log_t log = { 0 };
    char err[EMLIO_ERRMSG_LEN] = "";
    assert_int_equal(s_load(&set, &t, false, &log, err), 2);
    emlio__shardset_release(&set);
    s_path(p, &t, ".emlio-files");
    size_t len;
    uint8_t *orig = test_read_file(p, &len);
    for (int stale = 0; stale < 2; stale++) {
        long ok = 0;
        for (long n = 1;; n++) {
            test_write_file(p, orig, len);
            if (stale) { /* dog changed now: listed again, rewritten */
                char dog[PATH_MAX];
                s_path(dog, &t, "dog");
                assert_int_equal(utimensat(AT_FDCWD, dog, NULL, 0), 0);
            }
            memset(&log, 0, sizeof(log));
            emlio__alloc_fail_at(n);
            int rc = s_load(&set, &t, false, &log, err);
            long made = emlio__alloc_count();
            emlio__alloc_fail_at(0);
            if (rc >= 0) {
                assert_int_equal(rc, 2);
                assert_int_equal(set.records, 3);
                assert_int_equal(s_read_all(&set), 3);
                emlio__shardset_release(&set);
                ok++;
            }
            if (made < n)
                break; /* the load ended before the Nth allocation */
        }
        assert_true(ok > 0);
    }
    free(orig);
    test_rmtree(t.tmp);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_open_beneath_refuses_what_is_outside),
        cmocka_unit_test(
            test_paths_imagefolder_links_out_of_the_root_are_never_served),
        cmocka_unit_test(test_paths_a_fifo_never_blocks),
        cmocka_unit_test(test_paths_shard_links_follow_the_rule),
        cmocka_unit_test(test_paths_file_list_is_a_hint),
        cmocka_unit_test(test_paths_file_list_trusts_directories),
        cmocka_unit_test(test_paths_file_list_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
