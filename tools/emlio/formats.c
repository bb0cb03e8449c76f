/* formats.c - inspect, index and pack over every format emliod serves.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset_util.h"
#include "emlio/buf.h"
#include "emlio/example.h"
#include "formats.h"

#define FORMATS_MAX_FIELDS 64

bool
formats_is_tar(const char *path)
{
    size_t n = strlen(path);
    return n > 4 && !strcmp(path + n - 4, ".tar");
}

/* Opens path: a directory as it is, a tar file as the tar shards of its
 * directory (*only names that one). */
static emlio_dataset_t *
s_open(const char *cmd, const char *path, int flags, char **only)
{
    struct stat st;
    char ebuf[128];
    *only = NULL;
    if (stat(path, &st) < 0) {
        dataset_error(cmd, "cannot read '%s': %s", path,
                      dataset_strerror(-errno, ebuf, sizeof(ebuf)));
        return NULL;
    }
    emlio_dataset_t *ds = emlio_dataset_new();
    if (!ds) {
        dataset_error(cmd, "out of memory");
        return NULL;
    }
    emlio_dataset_set_log(ds, dataset_warn, (void *)cmd);
    char *copy = strdup(path);
    char *copy2 = strdup(path);
    int rc;
    if (!copy || !copy2) {
        rc = EMLIO_ENOMEM;
    } else if (S_ISDIR(st.st_mode)) {
        rc = emlio_dataset_open(ds, path, NULL, flags);
    } else {
        *only = strdup(basename(copy));
        rc = emlio_dataset_open(ds, dirname(copy2), "tar",
                                flags | EMLIO_DATASET_MIXED);
    }
    free(copy);
    free(copy2);
    if (rc < 0) {
        dataset_error(cmd, "cannot open '%s': %s", path,
                      emlio_dataset_errmsg(ds));
        emlio_dataset_destroy(&ds);
        free(*only);
        *only = NULL;
    }
    return ds;
}

typedef struct {
    char *name[FORMATS_MAX_FIELDS];
    uint64_t count[FORMATS_MAX_FIELDS];
    uint64_t bytes[FORMATS_MAX_FIELDS];
    size_t n;
} s_fields_t;

static int
s_count_field(void *userdata, const char *field, const uint8_t *data,
              size_t len)
{
    (void)data;
    s_fields_t *f = userdata;
    size_t i = 0;
    while (i < f->n && strcmp(f->name[i], field))
        i++;
    if (i == f->n) {
        if (f->n == FORMATS_MAX_FIELDS)
            return 0;
        f->name[f->n] = strdup(field);
        if (!f->name[f->n])
            return EMLIO_ENOMEM;
        f->n++;
    }
    f->count[i]++;
    f->bytes[i] += len;
    return 0;
}

int
formats_inspect(const char *cmd, const char *path, bool json, uint64_t sample)
{
    char *only;
    emlio_dataset_t *ds = s_open(cmd, path, EMLIO_DATASET_MIXED, &only);
    if (!ds)
        return 1;
    s_fields_t fields = { 0 };
    uint64_t records = 0, bytes = 0, sampled = 0;
    int64_t lab_min = INT64_MAX, lab_max = INT64_MIN;
    size_t shards = 0;
    const char *format = NULL;
    bool mixed = false;
    int status = 0;
    for (size_t s = 0; s < emlio_dataset_shard_count(ds) && !status; s++) {
        if (only && strcmp(only, emlio_dataset_shard_name(ds, s)))
            continue;
        const char *f = emlio_dataset_shard_format(ds, s);
        mixed |= format && strcmp(format, f);
        format = f;
        shards++;
        size_t n = emlio_dataset_shard_records(ds, s);
        records += n;
        bytes += emlio_dataset_shard_bytes(ds, s);
        size_t take = sample == 0 || sample > n ? n : (size_t)sample;
        for (size_t r = 0; r < take; r++) {
            int64_t label;
            int rc =
                emlio_dataset_record(ds, s, r, s_count_field, &fields, &label);
            if (rc < 0) {
                char ebuf[128];
                dataset_error(cmd, "cannot read record %zu of '%s': %s", r,
                              emlio_dataset_shard_name(ds, s),
                              dataset_strerror(rc, ebuf, sizeof(ebuf)));
                status = 1;
                break;
            }
            sampled++;
            if (label >= 0) {
                lab_min = TOOL_MIN(lab_min, label);
                lab_max = TOOL_MAX(lab_max, label);
            }
        }
    }
    if (only && shards == 0) {
        dataset_error(cmd, "cannot inspect '%s': not a tar shard", path);
        status = 1;
    }
    if (!status) {
        const char *fmt = mixed ? "mixed" : format ? format : "none";
        if (json) {
            printf("{\"path\": \"%s\", \"format\": \"%s\", \"shards\": %zu, "
                   "\"records\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"sampled\": %" PRIu64 ", \"dataset\": \"%s\", "
                   "\"fields\": {",
                   path, fmt, shards, records, bytes, sampled,
                   emlio_dataset_fingerprint(ds));
            for (size_t i = 0; i < fields.n; i++)
                printf("%s\"%s\": {\"records\": %" PRIu64
                       ", \"mean_bytes\": %.1f}",
                       i ? ", " : "", fields.name[i], fields.count[i],
                       (double)fields.bytes[i] / (double)fields.count[i]);
            printf("}, \"label_min\": %" PRId64 ", \"label_max\": %" PRId64
                   "}\n",
                   lab_min == INT64_MAX ? -1 : lab_min,
                   lab_max == INT64_MIN ? -1 : lab_max);
        } else {
            printf("path:     %s\nformat:   %s\nshards:   %zu\n"
                   "records:  %" PRIu64 "\nbytes:    %" PRIu64 "\n"
                   "dataset:  %s\n",
                   path, fmt, shards, records, bytes,
                   emlio_dataset_fingerprint(ds));
            if (lab_min != INT64_MAX)
                printf("labels:   %" PRId64 "..%" PRId64 "\n", lab_min,
                       lab_max);
            printf("fields (over %" PRIu64 " records):\n", sampled);
            for (size_t i = 0; i < fields.n; i++)
                printf("  %-20s %10" PRIu64 " records, %.1f bytes mean\n",
                       fields.name[i][0] ? fields.name[i] : "(record)",
                       fields.count[i],
                       (double)fields.bytes[i] / (double)fields.count[i]);
        }
    }
    for (size_t i = 0; i < fields.n; i++)
        free(fields.name[i]);
    free(only);
    emlio_dataset_destroy(&ds);
    return status;
}

long
formats_index_file(const char *cmd, const char *path, bool verify, bool quiet)
{
    emlio_dataset_t *ds = emlio_dataset_new();
    if (!ds) {
        dataset_error(cmd, "cannot index '%s': out of memory", path);
        return -1;
    }
    int flags = EMLIO_DATASET_REINDEX | EMLIO_DATASET_WRITE_INDEX |
                (verify ? EMLIO_DATASET_VERIFY : 0);
    int rc = emlio_dataset_open_file(ds, path, flags);
    if (rc < 0) {
        /* The library's message names the file and the byte offset. */
        dataset_error(cmd, "cannot index '%s': %s", path,
                      emlio_dataset_errmsg(ds));
    } else if (!quiet && formats_is_tar(path)) {
        printf("%s: %d samples (wds2idx v1.2 index)\n", path, rc);
    } else if (!quiet) {
        printf("%s: %d records\n", path, rc);
    }
    emlio_dataset_destroy(&ds);
    return rc < 0 ? -1 : rc;
}

/* ---- pack --to tar ------------------------------------------------------ */

typedef struct {
    emlio_buf_t out; /* the shard being written */
    char key[32];
    int rc;
} s_tarw_t;

static int
s_octal(char *dst, size_t width, uint64_t v)
{
    /* width - 1 digits and a NUL, as ustar writers do. */
    int n = snprintf(dst, width, "%0*" PRIo64, (int)width - 1, v);
    return n == (int)width - 1 ? 0 : -1;
}

static int
s_tar_header(emlio_buf_t *out, const char *name, uint64_t size, char type)
{
    uint8_t h[512];
    memset(h, 0, sizeof(h));
    size_t len = strlen(name);
    if (len > 100)
        return -1;
    memcpy(h, name, len);
    if (s_octal((char *)h + 100, 8, 0644) || s_octal((char *)h + 108, 8, 0) ||
        s_octal((char *)h + 116, 8, 0) || s_octal((char *)h + 124, 12, size) ||
        s_octal((char *)h + 136, 12, 0))
        return -1;
    h[156] = (uint8_t)type;
    memcpy(h + 257, "ustar", 6); /* POSIX magic and NUL */
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof(h); i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
    return emlio_buf_add(out, h, sizeof(h));
}

static int
s_tar_member(emlio_buf_t *out, const char *name, const uint8_t *data,
             size_t len)
{
    static const uint8_t zeros[512];
    if (strlen(name) > 100) { /* GNU long name */
        size_t n = strlen(name) + 1;
        if (s_tar_header(out, "././@LongLink", n, 'L') < 0 ||
            emlio_buf_add(out, name, n) < 0 ||
            emlio_buf_add(out, zeros, (512 - n % 512) % 512) < 0)
            return -1;
        char cut[101];
        memcpy(cut, name, 100);
        cut[100] = '\0';
        if (s_tar_header(out, cut, len, '0') < 0)
            return -1;
    } else if (s_tar_header(out, name, len, '0') < 0) {
        return -1;
    }
    if (emlio_buf_add(out, data, len) < 0 ||
        emlio_buf_add(out, zeros, (512 - len % 512) % 512) < 0)
        return -1;
    return 0;
}

/* One field of a source record into the tar: tar members and ImageFolder
 * files as they are; a TFRecord record as its image bytes (jpg). */
static int
s_pack_field(void *userdata, const char *field, const uint8_t *data, size_t len)
{
    s_tarw_t *w = userdata;
    char name[4200];
    if (!field[0]) {
        emlio_example_field_t f = { .key = "image/encoded", .key_len = 13 };
        if (emlio_example_parse(data, len, &f, 1) > 0 &&
            f.kind == EMLIO_FEATURE_BYTES && f.count) {
            data = f.bytes;
            len = f.bytes_len;
        }
        field = "jpg";
    }
    if (!strcmp(field, "cls"))
        return 0; /* written from the label */
    snprintf(name, sizeof(name), "%s.%s", w->key, field);
    return s_tar_member(&w->out, name, data, len) < 0 ? EMLIO_ENOMEM : 0;
}

static int
s_flush_shard(const char *cmd, s_tarw_t *w, const char *dst, const char *prefix,
              size_t shard_no)
{
    static const uint8_t zeros[1024];
    char path[4096];
    char ebuf[128];
    if (emlio_buf_add(&w->out, zeros, sizeof(zeros)) < 0)
        return EMLIO_ENOMEM;
    snprintf(path, sizeof(path), "%s/%s-%05zu.tar", dst, prefix, shard_no);
    int rc = dataset_write_file_atomic(path, w->out.data, w->out.len);
    if (rc < 0)
        dataset_error(cmd, "cannot write '%s': %s", path,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
    else if (formats_index_file(cmd, path, false, true) < 0)
        rc = EMLIO_EFORMAT;
    emlio_buf_clear(&w->out);
    return rc;
}

int
formats_pack_tar(const char *cmd, const char *src, const char *dst,
                 const char *prefix, uint64_t shard_bytes, bool quiet,
                 bool follow)
{
    char *only;
    char ebuf[128];
    emlio_dataset_t *ds = s_open(
        cmd, src,
        EMLIO_DATASET_MIXED | (follow ? EMLIO_DATASET_FOLLOW_SYMLINKS : 0),
        &only);
    if (!ds)
        return 1;
    int rc = dataset_mkdir_p(dst);
    if (rc < 0) {
        dataset_error(cmd, "cannot create '%s': %s", dst,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        emlio_dataset_destroy(&ds);
        free(only);
        return 1;
    }
    s_tarw_t w = { .out = EMLIO_BUF_INIT };
    size_t shard_no = 0;
    uint64_t key = 0;
    double t0 = dataset_now();
    for (size_t s = 0; s < emlio_dataset_shard_count(ds) && rc >= 0; s++) {
        if (only && strcmp(only, emlio_dataset_shard_name(ds, s)))
            continue;
        size_t n = emlio_dataset_shard_records(ds, s);
        for (size_t r = 0; r < n && rc >= 0; r++) {
            int64_t label;
            snprintf(w.key, sizeof(w.key), "%09" PRIu64, key++);
            rc = emlio_dataset_record(ds, s, r, s_pack_field, &w, &label);
            if (rc < 0) {
                dataset_error(cmd, "cannot read record %zu of '%s': %s", r,
                              emlio_dataset_shard_name(ds, s),
                              dataset_strerror(rc, ebuf, sizeof(ebuf)));
                break;
            }
            if (label >= 0) {
                char name[64], text[32];
                int tl = snprintf(text, sizeof(text), "%" PRId64, label);
                snprintf(name, sizeof(name), "%s.cls", w.key);
                if (s_tar_member(&w.out, name, (const uint8_t *)text,
                                 (size_t)tl) < 0)
                    rc = EMLIO_ENOMEM;
            }
            if (rc >= 0 && w.out.len >= shard_bytes)
                rc = s_flush_shard(cmd, &w, dst, prefix, shard_no++);
        }
    }
    if (rc >= 0 && w.out.len)
        rc = s_flush_shard(cmd, &w, dst, prefix, shard_no++);
    emlio_buf_release(&w.out);
    emlio_dataset_destroy(&ds);
    free(only);
    if (rc < 0)
        return 1;
    if (!quiet)
        printf("packed %" PRIu64 " samples into %zu tar shards in '%s' "
               "(%.2f s)\n",
               key, shard_no, dst, dataset_now() - t0);
    return 0;
}
