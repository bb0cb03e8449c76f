/* dataset.c - a data directory opened as emliod opens it, for the tools.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "shardset.h"

struct emlio_dataset {
    emlio_shardset_t set;
    bool open;
    char err[EMLIO_ERRMSG_LEN];
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
    int rc = shard->ops->record(shard, r, fn, userdata, &lab);
    if (label)
        *label = lab;
    return rc;
}
