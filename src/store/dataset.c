/* dataset.c - a data directory opened as emliod opens it, for the tools.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "shardset.h"

struct emlio_dataset {
    emlio__shardset_t set;
    bool open;
    emlio_dataset_log_fn *log; /* what a load left out; NULL: nothing */
    void *log_userdata;
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

void
emlio_dataset_set_log(emlio_dataset_t *self, emlio_dataset_log_fn *fn,
                      void *userdata)
{
    assert(self);
    self->log = fn;
    self->log_userdata = userdata;
}

int
emlio_dataset_open(emlio_dataset_t *self, const char *dir, const char *format,
                   int flags)
{
    assert(self && dir && !self->open);
    emlio__shardset_opts_t opts = {
        .format = format,
        .mixed_formats = flags & EMLIO_DATASET_MIXED,
        .verify_data = flags & EMLIO_DATASET_VERIFY,
        .write_index = flags & EMLIO_DATASET_WRITE_INDEX,
        .rescan = flags & EMLIO_DATASET_REINDEX,
        .follow_symlinks = flags & EMLIO_DATASET_FOLLOW_SYMLINKS,
    };
    int rc = emlio__shardset_load(&self->set, dir, &opts, self->log,
                                  self->log_userdata, self->err);
    self->open = rc >= 0;
    return rc;
}

/* Scans (or loads the index of) the one mapped shard of a single-file
 * dataset and writes its index when asked: unlike a daemon's start, a
 * failed write is an error (the tool was asked to write it). Returns the
 * record count. */
static int
s_index_file(emlio_dataset_t *self, emlio__shard_t *shard, const char *path,
             int flags)
{
    const emlio__format_ops_t *ops = shard->ops;
    char idx[PATH_MAX];
    if (snprintf(idx, sizeof(idx), "%s.idx", path) >= (int)sizeof(idx))
        return emlio__seterr(self->err, -ENAMETOOLONG, "path too long: '%s'",
                             path);
    int rc = ops->open(shard->impl);
    bool verify = flags & EMLIO_DATASET_VERIFY;
    /* An index says nothing of the data CRCs; a stale one is rebuilt. */
    bool scan = (flags & EMLIO_DATASET_REINDEX) || verify;
    if (rc == 0 && !scan)
        scan = ops->load_index(shard->impl, idx) < 0;
    if (rc == 0 && scan) {
        rc = ops->scan(shard->impl, verify);
        if (rc >= 0 && (flags & EMLIO_DATASET_WRITE_INDEX)) {
            int wrc = ops->write_index(shard->impl, idx);
            if (wrc < 0)
                return emlio__seterr(self->err, wrc,
                                     "cannot write index '%s': %s", idx,
                                     emlio_strerror(wrc));
        }
    }
    if (rc < 0)
        return emlio__seterr(self->err, rc, "%s",
                             emlio__shard_file(shard)->err);
    return rc;
}

/* The file format whose suffix path ends in, or NULL. */
static const emlio__format_ops_t *
s_format_of(const char *path)
{
    size_t len = strlen(path);
    for (size_t k = 0; emlio__formats[k]; k++) {
        const char *suffix = emlio__formats[k]->suffix;
        size_t n = suffix ? strlen(suffix) : 0;
        if (suffix && len > n && strcmp(path + len - n, suffix) == 0)
            return emlio__formats[k];
    }
    return NULL;
}

int
emlio_dataset_open_file(emlio_dataset_t *self, const char *path, int flags)
{
    assert(self && path && !self->open);
    const emlio__format_ops_t *ops = s_format_of(path);
    if (!ops)
        return emlio__seterr(self->err, EMLIO_EFORMAT,
                             "'%s': not a shard file of a known format", path);
    const char *slash = strrchr(path, '/');
    emlio__shardset_t *set = &self->set;
    if (emlio__shardset_grow(set, 1) < 0)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    emlio__shard_t *shard = &set->shards[0];
    memset(shard, 0, sizeof(*shard));
    set->n = 1; /* from here on release frees what the shard holds */
    shard->fd = -1;
    shard->ops = ops;
    shard->name = emlio_strdup(slash ? slash + 1 : path);
    shard->impl = ops->create(path);
    int rc = !shard->name || !shard->impl
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
    return i < self->set.n ? self->set.shards[i].ops->name : NULL;
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
    const emlio__shard_t *shard = &self->set.shards[s];
    const char *member = shard->ops->member_name
                             ? shard->ops->member_name(shard->impl, r)
                             : NULL;
    if (!member)
        return NULL;
    snprintf(self->name, sizeof(self->name), "%s/%s", shard->name, member);
    return self->name;
}

int
emlio_dataset_record(const emlio_dataset_t *self, size_t s, size_t r,
                     emlio_dataset_field_fn *fn, void *userdata, int64_t *label)
{
    assert(self && fn);
    if (s >= self->set.n)
        return EMLIO_ENOTFOUND;
    const emlio__shard_t *shard = &self->set.shards[s];
    if (r >= emlio__shard_count(shard))
        return EMLIO_ENOTFOUND;
    int64_t lab = -1;
    /* A mapped shard is mapped (again) for the read: the shard set keeps
     * at most a budget of them mapped (shard_cache.h). */
    emlio__shard_t *use = (emlio__shard_t *)shard;
    int rc = shard->ops->mapped ? emlio__shard_acquire(use) : 0;
    if (rc < 0)
        return rc;
    rc = shard->ops->record(shard->impl, r, fn, userdata, &lab);
    if (shard->ops->mapped)
        emlio__shard_release(use);
    if (label)
        *label = lab;
    return rc;
}
