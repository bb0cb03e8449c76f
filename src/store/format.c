/* format.c - the table of formats and what every format shares: views
 * and name lists.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "format.h"
#include "imagefolder.h"
#include "iobuf.h"
#include "tar.h"
#include "tfrecord.h"

/* Adding a format: its reader, which defines its table and declares it in
 * its header, and its line here. File formats come first; a tree format is
 * tried only when no shard file is found. */

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

void
emlio__view_map(emlio__view_t *view, const uint8_t *data, size_t len)
{
    view->data = data;
    view->len = len;
    view->held = true;
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

int
emlio__names_push(emlio__names_t *names, const char *name)
{
    if (emlio__grow(&names->v, &names->cap, names->n, sizeof(*names->v), 64) <
        0)
        return EMLIO_ENOMEM;
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
