/* cmd_index.c - `emlio index`: scans TFRecord and WebDataset tar shards
 * through emlio/dataset.h, checks every CRC and writes their DALI-format
 * index files.
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
        "Scans every *.tfrecord file and WebDataset *.tar shard under each\n"
        "DIR (recursively) and each FILE named, checking the framing and\n"
        "every data CRC, and writes the DALI-format index <file>.idx next\n"
        "to it (atomically; wds2idx v1.2 for a tar). A bad file, or an\n"
        "index that cannot be written, is reported with its path (and byte\n"
        "offset) and skipped; the others are still indexed, and the exit\n"
        "status is 1 if any failed.\n"
        "\n"
        "options:\n"
        "      --no-verify   check only the framing and length CRCs\n"
        "                    (faster; does not read the record data)\n"
        "  -q, --quiet       print only errors\n"
        "  -h, --help        show this help\n");
}

static bool
s_is_shard_name(const char *name)
{
    size_t len = strlen(name);
    return (len > 9 && !strcmp(name + len - 9, ".tfrecord")) ||
           formats_is_tar(name);
}

/* Appends every *.tfrecord and *.tar file under dir to out, sorted per
 * directory. Returns 0 or a negative code; *bad_path gets the path that
 * failed. */
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
        else if (S_ISREG(st.st_mode) && s_is_shard_name(names.items[i]))
            rc = dataset_strv_push(out, path);
        free(path);
    }
    dataset_strv_release(&names);
    return rc;
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
            if (files.n == 0) {
                dataset_error(CMD,
                              "cannot index '%s': no *.tfrecord or *.tar "
                              "files in it",
                              arg);
                failed++;
            }
        } else if (dataset_strv_push(&files, arg) < 0) {
            dataset_error(CMD, "out of memory");
            return 1;
        }
        for (size_t i = 0; i < files.n; i++) {
            long n = formats_index_file(CMD, files.items[i], verify, quiet);
            if (n < 0) {
                failed++;
                continue;
            }
            done++;
            records += (uint64_t)n;
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
