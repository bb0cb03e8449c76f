/* cmd_index.c - `emlio index`: scans TFRecord and WebDataset tar shards
 * through emlio/dataset.h, checks every CRC and writes their DALI-format
 * index files.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <sys/stat.h>

#include "cli.h"
#include "commands.h"
#include "dataset_util.h"
#include "emlio/buf.h"
#include "formats.h"

#define CMD "index"

static void
s_usage(FILE *out, const opt_t *const *tables)
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
        "options:\n");
    opt_usage(out, tables);
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
    bool verify = true;
    bool quiet = false;
    const opt_t table[] = {
        OPT("no-verify", 0, OPT_UNSET, &verify, NULL,
            "check only the framing and length CRCs\n(faster; does not read "
            "the record data)"),
        OPT("quiet", 'q', OPT_FLAG, &quiet, NULL, "print only errors"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "show this help"),
        OPT_END,
    };
    const opt_t *tables[] = { table, NULL };
    int npos = 0;
    int status = cli_parse_args(CMD, tables, argc, argv, 0, &npos, s_usage);
    if (status >= 0)
        return status;
    if (npos == 0) {
        dataset_error(CMD, "missing DIR or FILE");
        s_usage(stderr, tables);
        return 2;
    }

    char ebuf[128];
    size_t failed = 0;
    size_t done = 0;
    uint64_t records = 0;
    double t0 = dataset_now();
    for (int a = 1; a <= npos; a++) {
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
