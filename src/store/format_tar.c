/* format_tar.c - tar (WebDataset) shards behind the format interface: a
 * sample is the run of members sharing a basename; a field is a member's
 * extension ("jpg", "cls").
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "crc32c.h"
#include "format.h"
#include "iobuf.h"
#include "tar.h"

static void *
s_create(const char *path)
{
    return emlio__tar_new(path);
}

/* The mapped file, for the shard set to confine, map, unmap and blank. */
static emlio__mapfile_t *
s_file(void *impl)
{
    return emlio__tar_file(impl);
}

static int
s_open(void *impl)
{
    return emlio__tar_open(impl);
}

static int
s_load_index(void *impl, const char *idx)
{
    return emlio__tar_load_index(impl, idx);
}

static int
s_scan(void *impl, bool verify_data)
{
    (void)verify_data; /* tar has no checksum of the data */
    return emlio__tar_scan(impl);
}

/* An empty tar gets no index; nor does one taken from the dataset index,
 * which keeps no member names (its .idx cannot be written without a
 * scan). */
static int
s_write_index(const void *impl, const char *idx)
{
    if (emlio__tar_count(impl) == 0 || !emlio__tar_index(impl)->names)
        return 0;
    return emlio__tar_write_index(impl, idx);
}

static const void *
s_index_table(void *impl, size_t *len)
{
    return emlio__tar_table(impl, len);
}

static int
s_adopt_table(void *impl, const void *table, size_t len, uint64_t records,
              uint64_t size, uint32_t crc, const char *prune)
{
    return emlio__tar_adopt(impl, table, len, records, size, crc, prune);
}

static void
s_destroy(void *impl)
{
    emlio__tar_t *tar = impl;
    emlio__tar_destroy(&tar);
}

static size_t
s_count(const void *impl)
{
    return emlio__tar_count(impl);
}

static uint64_t
s_size(const void *impl)
{
    return emlio__tar_size(impl);
}

static uint64_t
s_offset(const void *impl, size_t i)
{
    return emlio__tar_offset(impl, i);
}

static void
s_advise(const void *impl, size_t first, size_t n, int advice)
{
    (void)emlio__tar_advise(impl, first, n, advice);
}

/* Member i with the header block before it, which must still describe it:
 * a rewritten archive whose members moved is refused, not served. */
static int
s_read_copy(const void *impl, emlio__read_ctx_t *ctx, size_t i,
            uint8_t **buf_out, const uint8_t **data, size_t *len,
            uint32_t *stored)
{
    const emlio__tar_index_t *idx = emlio__tar_index(impl);
    *buf_out = NULL;
    *stored = 0;
    if (i >= idx->n_members)
        return EMLIO_ENOTFOUND;
    const emlio__tar_member_t *m = &idx->members[i];
    if (m->offset < 512 || m->len > SIZE_MAX - 512)
        return EMLIO_EFORMAT;
    uint8_t *buf;
    const uint8_t *head;
    int rc =
        ctx->pread(ctx, m->offset - 512, (size_t)m->len + 512, &buf, &head);
    if (rc < 0)
        return rc;
    if (!emlio__tar_header_ok(head, m->len)) {
        emlio__iobuf_free(buf);
        ctx->changed = "a member's header no longer matches";
        return -ESTALE;
    }
    *buf_out = buf;
    *data = head + 512;
    *len = (size_t)m->len;
    return 0;
}

/* Sample i's members with their headers: one range, since a sample's
 * members are consecutive in the archive. */
static int
s_extent(const void *impl, size_t i, uint64_t *offset, size_t *len)
{
    const emlio__tar_index_t *idx = emlio__tar_index(impl);
    if (i >= idx->n_samples || idx->first[i] >= idx->first[i + 1] ||
        idx->first[i + 1] > idx->n_members)
        return EMLIO_ENOTFOUND;
    const emlio__tar_member_t *m = &idx->members[idx->first[i]];
    if (m->offset < 512)
        return EMLIO_EFORMAT;
    uint64_t from = m->offset - 512, to = from;
    for (uint32_t k = idx->first[i]; k < idx->first[i + 1]; k++) {
        const emlio__tar_member_t *mk = &idx->members[k];
        if (mk->offset < from + 512 || mk->len > UINT64_MAX - mk->offset)
            return EMLIO_EFORMAT;
        to = EMLIO_MAX(to, mk->offset + mk->len);
    }
    if (to - from > SIZE_MAX)
        return EMLIO_EFORMAT;
    *offset = from;
    *len = (size_t)(to - from);
    return 0;
}

static int
s_has_field(const void *impl, const char *field)
{
    const emlio__tar_index_t *idx = emlio__tar_index(impl);
    for (size_t k = 0; k < idx->n_fields; k++)
        if (strcmp(idx->fields[k], field) == 0)
            return 1;
    return 0;
}

/* Points view at member m of a shard the caller has acquired: into the
 * mapping (held: the view keeps a use of the shard) when ctx says so,
 * else into a private copy read with ctx->pread. */
static int
s_member_view(const void *impl, emlio__read_ctx_t *ctx, size_t m,
              emlio__view_t *view)
{
    if (ctx->maps) {
        emlio__view_map(view, emlio__tar_data(impl, m),
                        (size_t)emlio__tar_index(impl)->members[m].len);
        return 0;
    }
    uint32_t stored;
    return s_read_copy(impl, ctx, m, &view->owned, &view->data, &view->len,
                       &stored);
}

/* A label member that is not an integer is an error, not a silent -1
 * (every label -1 is what a --label-field typo looked like). */
static int
s_parse(const uint8_t *data, size_t len, const emlio__read_opts_t *o,
        int64_t *label, const char **missing)
{
    *label = emlio__tar_parse_label(data, len);
    if (*label != -1)
        return 0;
    size_t k = 0; /* "-1" itself, white space around it allowed */
    while (k < len && (data[k] == ' ' || data[k] == '\t'))
        k++;
    if (len - k >= 2 && data[k] == '-' && data[k + 1] == '1')
        return 0;
    *missing = o->label_field;
    return EMLIO__FORMAT_EBADLABEL;
}

/* The label of sample `record` from its label member (-1 when it has
 * none; EMLIO__FORMAT_EBADLABEL when it is not a number), read as the
 * sample's data is. */
static int
s_label(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
        const emlio__read_opts_t *o, int64_t *label, const char **missing)
{
    size_t m;
    *label = -1;
    if (emlio__tar_find(impl, (size_t)record, o->label_field, &m) < 0)
        return 0;
    if (ctx->maps) {
        const emlio__tar_member_t *mem = &emlio__tar_index(impl)->members[m];
        return s_parse(emlio__tar_data(impl, m), (size_t)mem->len, o, label,
                       missing);
    }
    uint8_t *copy;
    const uint8_t *data;
    size_t len;
    uint32_t stored;
    int rc = s_read_copy(impl, ctx, m, &copy, &data, &len, &stored);
    if (rc < 0)
        return rc;
    rc = s_parse(data, len, o, label, missing);
    emlio__iobuf_free(copy);
    return rc;
}

/* One frame per field named in o->fields, or the configured member (the
 * first image member by default) alone; the label from the label member.
 * A sample without a member asked for is EMLIO__FORMAT_EMISSING. */
static int
s_read(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
       const emlio__read_opts_t *o, emlio__view_t *views, const char **missing)
{
    size_t nf = o->n_fields ? o->n_fields : 1;
    int rc = 0;
    for (size_t f = 0; f < nf && rc == 0; f++) {
        const char *field = o->n_fields ? o->fields[f] : o->field;
        size_t m;
        rc = emlio__tar_find(impl, (size_t)record, field, &m);
        if (rc == -ENOENT && o->n_fields)
            *missing = field;
        if (rc == -ENOENT)
            rc = EMLIO__FORMAT_EMISSING;
        else if (rc == 0)
            rc = s_member_view(impl, ctx, m, &views[f]);
    }
    if (rc == 0)
        rc = s_label(impl, ctx, record, o, &views[0].label, missing);
    if (rc == 0 && !o->n_fields)
        views[0].crc = emlio_crc32c(0, views[0].data, views[0].len);
    return rc;
}

/* Every member of the sample, in order; the label from "cls". */
static int
s_record(const void *impl, size_t r, emlio_dataset_field_fn *fn, void *userdata,
         int64_t *label)
{
    const emlio__tar_index_t *idx = emlio__tar_index(impl);
    int rc = 0;
    *label = emlio__tar_label(impl, r, "cls");
    for (uint32_t m = idx->first[r]; m < idx->first[r + 1] && rc == 0; m++) {
        const char *field = idx->fields[idx->members[m].field];
        const uint8_t *data;
        size_t len;
        rc = emlio__tar_field(impl, r, field, &data, &len);
        if (rc == 0)
            rc = fn(userdata, field, data, len);
    }
    return rc;
}

static size_t
s_prune(void *impl, const char *field, char *example, size_t len)
{
    return emlio__tar_prune(impl, field, example, len);
}

/* Every member of the sample, with their headers. */
static uint64_t
s_record_bytes(const void *impl, size_t i)
{
    const emlio__tar_index_t *idx = emlio__tar_index(impl);
    uint64_t n = 0;
    if (i >= idx->n_samples)
        return 0;
    for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++)
        n += idx->members[m].len + 512;
    return n;
}

const emlio__format_ops_t emlio__format_tar = {
    .name = "tar",
    .suffix = ".tar",
    .what = "*.tar shards",
    .mapped = true,
    .create = s_create,
    .file = s_file,
    .open = s_open,
    .load_index = s_load_index,
    .scan = s_scan,
    .write_index = s_write_index,
    .index_table = s_index_table,
    .adopt_table = s_adopt_table,
    .read_copy = s_read_copy,
    .extent = s_extent,
    .destroy = s_destroy,
    .count = s_count,
    .size = s_size,
    .record_bytes = s_record_bytes,
    .prune = s_prune,
    .offset = s_offset,
    .advise = s_advise,
    .has_field = s_has_field,
    .read = s_read,
    .record = s_record,
};
