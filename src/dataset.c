/* dataset.c - a data directory opened as emliod opens it, for the tools.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "shardset.h"

struct emlio_dataset {
    emlio_shardset_t set;
    bool open;
    char err[EMLIO_ERRMSG_LEN];
    char name[PATH_MAX]; /* emlio_dataset_record_name's answer */
};

emlio_dataset_t *
emlio_dataset_new(void)
{
    emlio_dataset_t *self = emlio_calloc(1, sizeof(*self));
    if (self)
        snprintf(self->err, sizeof(self->err), "no error");
    return self;
}

void
emlio_dataset_destroy(emlio_dataset_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__shardset_release(&(*self_p)->set);
    emlio_free(*self_p);
    *self_p = NULL;
}

int
emlio_dataset_open(emlio_dataset_t *self, const char *dir, const char *format,
                   int flags)
{
    assert(self && dir && !self->open);
    emlio_shardset_opts_t opts = {
        .format = format,
        .mixed_formats = flags & EMLIO_DATASET_MIXED,
        .verify_data = flags & EMLIO_DATASET_VERIFY,
        .write_index = flags & EMLIO_DATASET_WRITE_INDEX,
        .rescan = flags & EMLIO_DATASET_REINDEX,
    };
    int rc =
        emlio__shardset_load(&self->set, dir, &opts, NULL, NULL, self->err);
    self->open = rc >= 0;
    return rc;
}

/* Scans (or loads the index of) the one mapped shard of a single-file
 * dataset and writes its index when asked. Returns the record count. */
static int
s_index_file(emlio_dataset_t *self, emlio_shard_t *shard, const char *path,
             int flags)
{
    bool tar = shard->kind == EMLIO_SHARD_TAR;
    char idx[PATH_MAX];
    if (snprintf(idx, sizeof(idx), "%s.idx", path) >= (int)sizeof(idx))
        return emlio__seterr(self->err, -ENAMETOOLONG, "path too long: '%s'",
                             path);
    int rc =
        tar ? emlio__tar_open(shard->tar) : emlio_tfrecord_open(shard->file);
    /* An index says nothing of the data CRCs; a stale one is rebuilt. */
    bool scan = (flags & EMLIO_DATASET_REINDEX) ||
                (!tar && (flags & EMLIO_DATASET_VERIFY));
    if (rc == 0 && !scan)
        scan = (tar ? emlio__tar_load_index(shard->tar, idx)
                    : emlio_tfrecord_load_index(shard->file, idx)) < 0;
    if (rc == 0 && scan) {
        rc = tar ? emlio__tar_scan(shard->tar)
                 : emlio_tfrecord_scan(shard->file,
                                       flags & EMLIO_DATASET_VERIFY);
        if (rc >= 0 && (flags & EMLIO_DATASET_WRITE_INDEX) && (!tar || rc)) {
            int wrc = tar ? emlio__tar_write_index(shard->tar, idx)
                          : emlio_tfrecord_write_index(shard->file, idx);
            if (wrc < 0)
                return emlio__seterr(self->err, wrc,
                                     "cannot write index '%s': %s", idx,
                                     emlio_strerror(wrc));
        }
    }
    if (rc < 0)
        return emlio__seterr(self->err, rc, "%s",
                             tar ? emlio__tar_errmsg(shard->tar)
                                 : emlio_tfrecord_errmsg(shard->file));
    return rc;
}

int
emlio_dataset_open_file(emlio_dataset_t *self, const char *path, int flags)
{
    assert(self && path && !self->open);
    size_t len = strlen(path);
    bool tar = len > 4 && !strcmp(path + len - 4, ".tar");
    const char *slash = strrchr(path, '/');
    emlio_shardset_t *set = &self->set;
    set->shards = emlio_calloc(1, sizeof(*set->shards));
    if (!set->shards)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    emlio_shard_t *shard = &set->shards[0];
    set->n = 1; /* from here on release frees what the shard holds */
    shard->fd = -1;
    shard->kind = tar ? EMLIO_SHARD_TAR : EMLIO_SHARD_TFRECORD;
    shard->name = emlio_strdup(slash ? slash + 1 : path);
    if (tar)
        shard->tar = emlio__tar_new(path);
    else
        shard->file = emlio_tfrecord_new(path);
    int rc = !shard->name || (tar ? !shard->tar : !shard->file)
                 ? emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory")
                 : s_index_file(self, shard, path, flags);
    if (rc < 0) {
        emlio__shardset_release(set);
        return rc;
    }
    set->mapped = 1;
    set->records = emlio__shard_count(shard);
    set->bytes = emlio__shard_size(shard);
    self->open = true;
    return rc;
}

const char *
emlio_dataset_errmsg(const emlio_dataset_t *self)
{
    return self ? self->err : "out of memory";
}

const char *
emlio_dataset_fingerprint(const emlio_dataset_t *self)
{
    return self->set.fingerprint;
}

size_t
emlio_dataset_shard_count(const emlio_dataset_t *self)
{
    return self->set.n;
}

const char *
emlio_dataset_shard_name(const emlio_dataset_t *self, size_t i)
{
    return i < self->set.n ? self->set.shards[i].name : NULL;
}

const char *
emlio_dataset_shard_format(const emlio_dataset_t *self, size_t i)
{
    return i < self->set.n ? emlio__shard_kind_name(self->set.shards[i].kind)
                           : NULL;
}

size_t
emlio_dataset_shard_records(const emlio_dataset_t *self, size_t i)
{
    return i < self->set.n ? emlio__shard_count(&self->set.shards[i]) : 0;
}

uint64_t
emlio_dataset_shard_bytes(const emlio_dataset_t *self, size_t i)
{
    return i < self->set.n ? emlio__shard_size(&self->set.shards[i]) : 0;
}

const char *
emlio_dataset_record_name(emlio_dataset_t *self, size_t s, size_t r)
{
    if (s >= self->set.n || r >= emlio__shard_count(&self->set.shards[s]))
        return NULL;
    const emlio_shard_t *shard = &self->set.shards[s];
    if (shard->kind == EMLIO_SHARD_IMAGEFOLDER) {
        snprintf(self->name, sizeof(self->name), "%s/%s", shard->name,
                 emlio__folder_file(shard->folder, r));
        return self->name;
    }
    return NULL;
}

/* The TFRecord label as emliod finds it by default. */
static int64_t
s_tfrecord_label(const uint8_t *rec, size_t len)
{
    emlio_example_field_t f = { .key = "image/class/label", .key_len = 17 };
    if (emlio_example_parse(rec, len, &f, 1) > 0 &&
        f.kind == EMLIO_FEATURE_INT64 && f.count)
        return f.int64;
    return -1;
}

int
emlio_dataset_record(const emlio_dataset_t *self, size_t s, size_t r,
                     emlio_dataset_field_fn *fn, void *userdata, int64_t *label)
{
    assert(self && fn);
    if (s >= self->set.n)
        return EMLIO_ENOTFOUND;
    const emlio_shard_t *shard = &self->set.shards[s];
    if (r >= emlio__shard_count(shard))
        return EMLIO_ENOTFOUND;
    int64_t lab = -1;
    int rc = 0;
    if (shard->kind == EMLIO_SHARD_TAR) {
        const emlio__tar_index_t *idx = emlio__tar_index(shard->tar);
        lab = emlio__tar_label(shard->tar, r, "cls");
        for (uint32_t m = idx->first[r]; m < idx->first[r + 1] && rc == 0;
             m++) {
            const char *field = idx->fields[idx->members[m].field];
            const uint8_t *data;
            size_t len;
            rc = emlio__tar_field(shard->tar, r, field, &data, &len);
            if (rc == 0)
                rc = fn(userdata, field, data, len);
        }
    } else if (shard->kind == EMLIO_SHARD_IMAGEFOLDER) {
        uint8_t *data;
        size_t len;
        lab = emlio__folder_label(shard->folder);
        rc = emlio__folder_read(shard->folder, r, &data, &len);
        if (rc == 0) {
            const char *file = emlio__folder_file(shard->folder, r);
            const char *dot = strrchr(file, '.');
            char ext[16] = "image";
            if (dot && strlen(dot + 1) < sizeof(ext)) {
                for (size_t k = 0; dot[1 + k]; k++) {
                    char c = dot[1 + k];
                    ext[k] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
                    ext[k + 1] = '\0';
                }
            }
            rc = fn(userdata, ext, data, len);
            emlio_free(data);
        }
    } else {
        const uint8_t *data;
        size_t len;
        rc = emlio_tfrecord_record(shard->file, r, &data, &len, NULL);
        if (rc == 0) {
            lab = s_tfrecord_label(data, len);
            rc = fn(userdata, "", data, len);
        }
    }
    if (label)
        *label = lab;
    return rc;
}
