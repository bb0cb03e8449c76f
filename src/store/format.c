/* format.c - the table of formats and what every format shares: views,
 * the read wrapper, name lists.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "crc32c.h"
#include "format.h"
#include "iobuf.h"
#include "shardset.h"

/* Adding a format: its adapter file, and its line here (with its extern).
 * File formats come first; a tree format is tried only when no shard file
 * is found. */
extern const emlio__format_ops_t emlio__format_tfrecord;
extern const emlio__format_ops_t emlio__format_tar;
extern const emlio__format_ops_t emlio__format_imagefolder;

const emlio__format_ops_t *const emlio__formats[] = {
    &emlio__format_tfrecord,
    &emlio__format_tar,
    &emlio__format_imagefolder,
    NULL,
};

const emlio__format_ops_t *
emlio__format_find(const char *name)
{
    for (size_t i = 0; emlio__formats[i]; i++)
        if (strcmp(emlio__formats[i]->name, name) == 0)
            return emlio__formats[i];
    return NULL;
}

int
emlio__format_read(emlio__shard_t *shard, uint64_t record,
                   const emlio__read_opts_t *o, emlio__view_t *views,
                   const char **missing)
{
    /* A mapped shard that changed on disk is never touched again, since its
     * mapping may now lie past the end of the file; while it is read, this
     * read is one of its users. */
    bool mapped = shard->ops->mapped;
    int rc = mapped ? emlio__shard_acquire(shard) : 0;
    if (rc < 0)
        return rc;
    rc = shard->ops->read(shard, record, o, views, missing);
    if (mapped)
        emlio__shard_release(shard); /* the views hold their own uses */
    if (rc < 0 || !o->n_fields)
        return rc;
    /* Multi-field samples: one CRC over the frames in field order. */
    uint32_t crc = 0;
    for (size_t f = 0; f < o->n_fields; f++)
        crc = emlio_crc32c(crc, views[f].data, views[f].len);
    views[0].crc = crc;
    return 0;
}

void
emlio__view_map(emlio__view_t *view, emlio__shard_t *shard, const uint8_t *data,
                size_t len)
{
    view->data = data;
    view->len = len;
    view->held = true;
    emlio__shard_hold(shard);
}

int
emlio__view_copy(emlio__view_t *view, const void *data, size_t len)
{
    view->owned = emlio__iobuf_alloc(len);
    if (!view->owned)
        return EMLIO_ENOMEM;
    memcpy(view->owned, data, len);
    view->data = view->owned;
    view->len = len;
    return 0;
}

int
emlio__view_int64(emlio__view_t *view, int64_t v)
{
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)((uint64_t)v >> (8 * k));
    return emlio__view_copy(view, le, sizeof(le));
}

void
emlio__view_release(emlio__view_t *view, emlio__shard_t *shard)
{
    if (view->held)
        emlio__shard_release(shard);
    emlio__iobuf_free(view->owned);
    view->held = false;
    view->owned = NULL;
}

int
emlio__names_push(emlio__names_t *names, const char *name)
{
    if (names->n == names->cap) {
        size_t cap = names->cap ? names->cap * 2 : 64;
        char **v = emlio_reallocarray(names->v, cap, sizeof(*v));
        if (!v)
            return EMLIO_ENOMEM;
        names->v = v;
        names->cap = cap;
    }
    names->v[names->n] = emlio_strdup(name);
    if (!names->v[names->n])
        return EMLIO_ENOMEM;
    names->n++;
    return 0;
}

void
emlio__names_release(emlio__names_t *names)
{
    for (size_t i = 0; i < names->n; i++)
        emlio_free(names->v[i]);
    emlio_free(names->v);
    memset(names, 0, sizeof(*names));
}

static int
s_cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void
emlio__names_sort(emlio__names_t *names)
{
    if (names->n > 1) /* qsort(NULL, 0) is undefined */
        qsort(names->v, names->n, sizeof(*names->v), s_cmp_names);
}

void
emlio__format_describe_offset(const emlio__shard_t *shard, uint64_t record,
                              char *buf, size_t len)
{
    snprintf(buf, len, "record %" PRIu64 " in shard '%s' at offset %" PRIu64,
             record, shard->name, emlio__shard_offset(shard, (size_t)record));
}
