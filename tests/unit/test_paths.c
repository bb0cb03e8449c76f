/* test_paths.c - the one rule for paths (beneath.h): nothing outside the
 * data root is listed or served, symlinks inside it only when followed,
 * FIFOs in place of images, shards, indexes and file lists never block,
 * and a file list (.emlio-files) is a hint checked against the tree.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "beneath.h"
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

static void
s_path(char *out, const s_tree_t *t, const char *rel)
{
    snprintf(out, PATH_MAX, "%s/%s", t->root, rel);
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
    s_path(p, t, "cat");
    assert_int_equal(mkdir(p, 0755), 0);
    s_path(p, t, "cat/a.jpg");
    test_write_file(p, "aaaa", 4);
    s_path(p, t, "cat/b.jpg");
    test_write_file(p, "bbbbbb", 6);
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
            int rc =
                emlio__format_read(&set->shards[s], r, &o, &view, &missing);
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
    s_path(p, &t, "cat/out.jpg");
    assert_int_equal(symlink(t.secret, p), 0);
    s_path(p, &t, "cat/in.jpg");
    assert_int_equal(symlink("a.jpg", p), 0);
    s_path(p, &t, "cat/up.jpg");
    assert_int_equal(symlink("../../secret", p), 0);
    s_path(p, &t, "cat/fifo.jpg");
    assert_int_equal(mkfifo(p, 0644), 0);
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
    s_path(p, &t, "cat/shadow.jpg");
    assert_int_equal(symlink(t.secret, p), 0);
    s_path(p, &t, "cat/c.jpg");
    assert_int_equal(symlink("a.jpg", p), 0);
    /* A class directory that is a link out of the root. */
    char outside[256];
    snprintf(outside, sizeof(outside), "%s/elsewhere", t.tmp);
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(p, sizeof(p), "%s/x.jpg", outside);
    test_write_file(p, "SECRET-SECRET", 13);
    s_path(p, &t, "dog");
    assert_int_equal(symlink(outside, p), 0);

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
    s_path(p, &t, ".emlio-files");
    assert_int_equal(mkfifo(p, 0644), 0);
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
    assert_int_equal(emlio__format_read(&set.shards[0], 0, &o, &view, &missing),
                     EMLIO_EFORMAT);
    emlio__view_release(&view, &set.shards[0]);
    emlio__shardset_release(&set);

    /* A shard that is a FIFO is not a shard; an index that is one is
     * ignored and rebuilt. */
    s_path(p, &t, "x.tar");
    assert_int_equal(mkfifo(p, 0644), 0);
    s_path(p, &t, "y.tfrecord");
    emlio_buf_t file = EMLIO_BUF_INIT;
    assert_int_equal(emlio_tfrecord_append(&file, (const uint8_t *)"abc", 3),
                     0);
    test_write_file(p, file.data, file.len);
    emlio_buf_release(&file);
    s_path(p, &t, "y.tfrecord.idx");
    assert_int_equal(mkfifo(p, 0644), 0);
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
    s_path(p, &t, "a.tfrecord");
    test_write_file(p, file.data, file.len);
    char out[PATH_MAX];
    snprintf(out, sizeof(out), "%s/out.tfrecord", t.tmp);
    test_write_file(out, file.data, file.len);
    emlio_buf_release(&file);
    s_path(p, &t, "b.tfrecord");
    assert_int_equal(symlink("a.tfrecord", p), 0);
    s_path(p, &t, "c.tfrecord");
    assert_int_equal(symlink(out, p), 0);
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

/* Rewrites ROOT/.emlio-files through sed-like line edits. */
static void
s_edit_cache(const s_tree_t *t, const char *from, const char *to)
{
    char p[PATH_MAX];
    s_path(p, t, ".emlio-files");
    size_t len;
    char *text = (char *)test_read_file(p, &len);
    text[len] = '\0';
    char *at = strstr(text, from);
    assert_non_null(at);
    emlio_buf_t out = EMLIO_BUF_INIT;
    char *cut = at;
    if (!to) /* drop the whole line */
        while (cut > text && cut[-1] != '\n')
            cut--;
    assert_int_equal(emlio_buf_add(&out, text, (size_t)(cut - text)), 0);
    assert_int_equal(emlio_buf_addf(&out, "%s", to ? to : ""), 0);
    assert_int_equal(emlio_buf_addf(&out, "%s", at + strlen(from)), 0);
    test_write_file(p, out.data, out.len);
    emlio_buf_release(&out);
    free(text);
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
    emlio__shardset_t set;
    s_log_t log = { 0 };
    char err[EMLIO_ERRMSG_LEN] = "";
    assert_int_equal(s_load(&set, &t, false, &log, err), 1);
    assert_int_equal(set.records, 8);
    emlio__shardset_release(&set);
    s_path(p, &t, ".emlio-files");
    size_t len;
    uint8_t *orig = test_read_file(p, &len);

    /* Each lie: a name out of the root, a file dropped, a file repeated,
     * an absolute name. Every one is rebuilt from the tree, with one log
     * line, and nothing but the tree's files is served. */
    struct {
        const char *from, *to;
    } lies[] = {
        { "\ta.jpg\n", "\t../../secret\n" },
        { "\tf2.jpg\n", "\tf1.jpg\n" },
        { "\ta.jpg\n", "\ta.jpg\nF\t4\t0\t0\ta.jpg\n" },
        { "\tf5.jpg\n", "\t/etc/hostname\n" },
        { "\tb.jpg\n", "\tb.jpg\nF\t13\t0\t0\tz.jpg\n" },
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
    /* A dropped line (24 of 40 files) is caught as well. */
    test_write_file(p, orig, len);
    s_edit_cache(&t, "\tf3.jpg\n", NULL);
    memset(&log, 0, sizeof(log));
    assert_int_equal(s_load(&set, &t, false, &log, err), 1);
    assert_int_equal(set.records, 8);
    assert_non_null(strstr(log.all, "7 files"));
    emlio__shardset_release(&set);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
