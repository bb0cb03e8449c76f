/* cmd_index.c - `emlio index`: scans TFRecord shards, checks every CRC and
 * writes their DALI-format index files.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <getopt.h>
#include <sys/stat.h>

#include "commands.h"
#include "dataset_util.h"
#include "emlio/buf.h"
#include "formats.h"

#define CMD "index"

static void
s_usage(FILE *out)
{
    fprintf(
        out,
        "usage: emlio index [options] DIR|FILE...\n"
        "\n"
        "Scans every *.tfrecord file under each DIR (recursively) and each\n"
        "FILE named, checking the framing and every data CRC, and writes\n"
        "the DALI-format index <file>.idx next to it (atomically). WebDataset\n"
        "*.tar shards get DALI's wds2idx v1.2 index <file>.idx the same way. A bad\n"
        "file is reported with its byte offset and skipped; the others are\n"
        "still indexed, and the exit status is 1 if any failed.\n"
        "\n"
        "options:\n"
        "      --no-verify   check only the framing and length CRCs\n"
        "                    (faster; does not read the record data)\n"
        "  -q, --quiet       print only errors\n"
        "  -h, --help        show this help\n");
}

static bool
s_is_tfrecord_name(const char *name)
{
    size_t len = strlen(name);
    return len > 9 && !strcmp(name + len - 9, ".tfrecord");
}

/* Appends every *.tfrecord file under dir to out, sorted per directory.
 * Returns 0 or a negative code; *bad_path gets the path that failed. */
static int
s_collect(const char *dir, dataset_strv_t *out, int depth, char **bad_path)
{
    if (depth > 64)
        return -ELOOP;
    dataset_strv_t names = DATASET_STRV_INIT;
    int rc = dataset_list_dir(dir, 0, &names);
    if (rc < 0)
        *bad_path = strdup(dir);
    for (size_t i = 0; i < names.n && rc == 0; i++) {
        char *path = dataset_path_join(dir, names.items[i]);
        struct stat st;
        if (!path)
            rc = EMLIO_ENOMEM;
        else if (stat(path, &st) < 0)
            ; /* a dangling link: nothing to index */
        else if (S_ISDIR(st.st_mode))
            rc = s_collect(path, out, depth + 1, bad_path);
        else if (S_ISREG(st.st_mode) && s_is_tfrecord_name(names.items[i]))
            rc = dataset_strv_push(out, path);
        free(path);
    }
    dataset_strv_release(&names);
    return rc;
}

/* Whether dir holds a *.tar shard anywhere below it. */
static bool
s_has_tar(const char *dir)
{
    dataset_strv_t names = DATASET_STRV_INIT;
    bool found = false;
    if (dataset_list_dir(dir, 0, &names) == 0)
        for (size_t i = 0; i < names.n && !found; i++) {
            char *path = dataset_path_join(dir, names.items[i]);
            struct stat st;
            if (path && stat(path, &st) == 0)
                found = S_ISDIR(st.st_mode) ? s_has_tar(path)
                                            : formats_is_tar(path);
            free(path);
        }
    dataset_strv_release(&names);
    return found;
}

/* Indexes one file. Returns its record count, or -1 after printing the
 * error. */
static long
s_index_file(const char *path, bool verify)
{
    char ebuf[128];
    emlio_buf_t idx = EMLIO_BUF_INIT;
    emlio_tfrecord_t *tf = emlio_tfrecord_new(path);
    long result = -1;
    if (!tf || emlio_buf_addf(&idx, "%s.idx", path) < 0) {
        dataset_error(CMD, "cannot index '%s': out of memory", path);
        goto out;
    }
    int rc = emlio_tfrecord_open(tf);
    if (rc < 0) {
        dataset_error(CMD, "cannot open '%s': %s", path,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        goto out;
    }
    rc = emlio_tfrecord_scan(tf, verify);
    if (rc < 0) {
        /* The library's message names the file and the byte offset. */
        dataset_error(CMD, "cannot index '%s': %s", path,
                      emlio_tfrecord_errmsg(tf));
        goto out;
    }
    result = rc;
    rc = emlio_tfrecord_write_index(tf, (const char *)idx.data);
    if (rc < 0) {
        dataset_error(CMD, "cannot write '%s': %s", (const char *)idx.data,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        result = -1;
    }
out:
    emlio_tfrecord_destroy(&tf);
    emlio_buf_release(&idx);
    return result;
}

int
cmd_index(int argc, char **argv)
{
    enum { OPT_NO_VERIFY = 256 };
    static const struct option opts[] = {
        { "no-verify", no_argument, NULL, OPT_NO_VERIFY },
        { "quiet", no_argument, NULL, 'q' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    bool verify = true;
    bool quiet = false;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":qh", opts, NULL)) != -1) {
        switch (opt) {
        case OPT_NO_VERIFY:
            verify = false;
            break;
        case 'q':
            quiet = true;
            break;
        case 'h':
            s_usage(stdout);
            return 0;
        default:
            dataset_error(CMD, "unknown option '%s'", argv[optind - 1]);
            s_usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        dataset_error(CMD, "missing DIR or FILE");
        s_usage(stderr);
        return 2;
    }

    char ebuf[128];
    size_t failed = 0;
    size_t done = 0;
    uint64_t records = 0;
    double t0 = dataset_now();
    for (int a = optind; a < argc; a++) {
        const char *arg = argv[a];
        struct stat st;
        dataset_strv_t files = DATASET_STRV_INIT;
        if (stat(arg, &st) < 0) {
            dataset_error(CMD, "cannot read '%s': %s", arg,
                          dataset_strerror(-errno, ebuf, sizeof(ebuf)));
            failed++;
            continue;
        }
        if (formats_is_tar(arg) || (S_ISDIR(st.st_mode) && s_has_tar(arg))) {
            long n = formats_index_tars(CMD, arg, quiet, &records);
            if (n < 0)
                failed++;
            else
                done += (size_t)n;
            if (!S_ISDIR(st.st_mode))
                continue;
        }
        if (S_ISDIR(st.st_mode)) {
            char *bad = NULL;
            int rc = s_collect(arg, &files, 0, &bad);
            if (rc < 0) {
                dataset_error(CMD, "cannot read '%s': %s", bad ? bad : arg,
                              dataset_strerror(rc, ebuf, sizeof(ebuf)));
                free(bad);
                dataset_strv_release(&files);
                failed++;
                continue;
            }
            if (files.n == 0 && !s_has_tar(arg)) {
                dataset_error(CMD,
                              "cannot index '%s': no *.tfrecord files "
                              "in it",
                              arg);
                failed++;
            }
        } else if (dataset_strv_push(&files, arg) < 0) {
            dataset_error(CMD, "out of memory");
            return 1;
        }
        for (size_t i = 0; i < files.n; i++) {
            long n = s_index_file(files.items[i], verify);
            if (n < 0) {
                failed++;
                continue;
            }
            done++;
            records += (uint64_t)n;
            if (!quiet)
                printf("%s: %ld records\n", files.items[i], n);
        }
        dataset_strv_release(&files);
    }
    if (!quiet || failed)
        printf("indexed %zu files (%" PRIu64 " records) in %.2f s; %zu "
               "failed\n",
               done, records, dataset_now() - t0, failed);
    if (failed) {
        dataset_error(CMD, "%zu of %zu inputs failed", failed, failed + done);
        return 1;
    }
    return 0;
}
