/* format_tfrecord.c - TFRecord shards behind the format interface: one
 * record per sample, the image and label from its tf.train.Example (or the
 * whole record with raw), every record's CRC checked as it is read.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "crc32c.h"
#include "emlio/example.h"
#include "format.h"
#include "iobuf.h"
#include "tfrecord.h"

static void *
s_create(const char *path)
{
    return emlio_tfrecord_new(path);
}

static void
s_confine(void *impl, const emlio__root_t *root, const char *rel)
{
    emlio__tfrecord_confine(impl, root, rel);
}

static int
s_open(void *impl)
{
    return emlio_tfrecord_open(impl);
}

static int
s_map_fd(void *impl, int fd, const struct stat *st)
{
    return emlio__tfrecord_map_fd(impl, fd, st);
}

static void
s_unmap(void *impl)
{
    emlio__tfrecord_unmap(impl);
}

static int
s_load_index(void *impl, const char *idx)
{
    return emlio_tfrecord_load_index(impl, idx);
}

static int
s_scan(void *impl, bool verify_data)
{
    return emlio_tfrecord_scan(impl, verify_data);
}

static int
s_write_index(const void *impl, const char *idx)
{
    return emlio_tfrecord_write_index(impl, idx);
}

static const void *
s_index_table(void *impl, size_t *len)
{
    return emlio__tfrecord_table(impl, len);
}

/* TFRecord has no prune: every table fits. */
static int
s_adopt_table(void *impl, const void *table, size_t len, uint64_t records,
              uint64_t size, uint32_t crc, const char *prune)
{
    (void)prune;
    return emlio__tfrecord_adopt(impl, table, len, records, size, crc);
}

static const char *
s_errmsg(const void *impl)
{
    return emlio_tfrecord_errmsg(impl);
}

static const char *
s_path(const void *impl)
{
    return emlio_tfrecord_path(impl);
}

static int
s_blank(void *impl)
{
    return emlio__tfrecord_blank(impl);
}

static void
s_destroy(void *impl)
{
    emlio_tfrecord_t *file = impl;
    emlio_tfrecord_destroy(&file);
}

static size_t
s_count(const void *impl)
{
    return emlio_tfrecord_count(impl);
}

static uint64_t
s_size(const void *impl)
{
    return emlio_tfrecord_size(impl);
}

static uint64_t
s_offset(const void *impl, size_t i)
{
    return i < emlio_tfrecord_count(impl) ? emlio_tfrecord_loc(impl, i)->offset
                                          : 0;
}

static void
s_prefetch(const void *impl, size_t i, bool data)
{
    emlio__tfrecord_prefetch(impl, i, data);
}

static void
s_advise(const void *impl, size_t first, size_t n, int advice)
{
    (void)emlio_tfrecord_advise(impl, first, n, advice);
}

/* Record i with its framing, read with pread; *stored is its stored CRC
 * (the caller checks it, as for mapped reads). */
static int
s_read_copy(const void *impl, emlio__read_ctx_t *ctx, size_t i,
            uint8_t **buf_out, const uint8_t **data, size_t *len,
            uint32_t *stored)
{
    const emlio_tfrecord_t *file = impl;
    *buf_out = NULL;
    *stored = 0;
    if (i >= emlio_tfrecord_count(file))
        return EMLIO_ENOTFOUND;
    const emlio_tfrecord_loc_t *loc = emlio_tfrecord_loc(file, i);
    if (loc->len > EMLIO_TFRECORD_MAX_RECORD)
        return EMLIO_EFORMAT;
    uint8_t *buf;
    const uint8_t *rec;
    int rc = ctx->pread(ctx, loc->offset,
                        (size_t)loc->len + EMLIO_TFRECORD_OVERHEAD, &buf, &rec);
    if (rc < 0)
        return rc;
    uint32_t masked =
        (uint32_t)rec[12 + loc->len] | (uint32_t)rec[13 + loc->len] << 8 |
        (uint32_t)rec[14 + loc->len] << 16 | (uint32_t)rec[15 + loc->len] << 24;
    *buf_out = buf;
    *data = rec + 12;
    *len = (size_t)loc->len;
    *stored = emlio_crc32c_unmask(masked);
    return 0;
}

/* The range s_read_copy reads: the record with its framing. */
static int
s_extent(const void *impl, size_t i, uint64_t *offset, size_t *len)
{
    if (i >= emlio_tfrecord_count(impl))
        return EMLIO_ENOTFOUND;
    const emlio_tfrecord_loc_t *loc = emlio_tfrecord_loc(impl, i);
    if (loc->len > EMLIO_TFRECORD_MAX_RECORD)
        return EMLIO_EFORMAT;
    *offset = loc->offset;
    *len = (size_t)loc->len + EMLIO_TFRECORD_OVERHEAD;
    return 0;
}

/* Example keys are only known per record. */
static int
s_has_field(const void *impl, const char *field)
{
    (void)impl;
    (void)field;
    return -1;
}

/* Record `record` of a shard the caller has acquired: in the mapping when
 * ctx says so (*copy NULL), else in a private copy (*copy, the caller's to
 * free). */
static int
s_bytes(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
        uint8_t **copy, const uint8_t **rec, size_t *rec_len, uint32_t *stored)
{
    *copy = NULL;
    if (ctx->maps)
        return emlio_tfrecord_record(impl, (size_t)record, rec, rec_len,
                                     stored);
    return s_read_copy(impl, ctx, (size_t)record, copy, rec, rec_len, stored);
}

/* Below this many sample bytes, the record's CRC is computed over the
 * whole record rather than combined from its parts. A combine is one
 * carry-less multiply per set bit of the length (crc32c.c; it was 32
 * shift steps per bit, 13% of the daemon at 512 B samples), cheaper than
 * CRCing a sample's bytes a second time down to a few hundred bytes. */
#define S_COMBINE_MIN 256

/* The sample's CRC in out->crc, and with verify the record's stored CRC
 * checked: by combining the CRCs of the parts before, inside and after the
 * sample bytes, so no byte of a large sample is read twice (a small one
 * is, see S_COMBINE_MIN). A large sample served from the mapping with
 * o->derive_crc_min set is not read at all: its CRC is what the stored CRC
 * says it must be, and the client's check finds any difference. */
static int
s_sample_crc(const emlio__read_opts_t *o, const uint8_t *rec, size_t rec_len,
             uint32_t stored, emlio__view_t *out)
{
    size_t before = (size_t)(out->data - rec);
    size_t after = rec_len - before - out->len;
    if (o->verify && o->derive_crc_min && !out->owned &&
        out->len >= o->derive_crc_min) {
        uint32_t head = emlio_crc32c(0, rec, before);
        uint32_t tail = emlio_crc32c(0, out->data + out->len, after);
        out->crc = emlio_crc32c_middle(stored, head, tail, out->len, after);
        return 0;
    }
    out->crc = emlio_crc32c(0, out->data, out->len);
    if (!o->verify)
        return 0;
    uint32_t whole = out->crc;
    if ((before || after) && out->len < S_COMBINE_MIN) {
        whole = emlio_crc32c(0, rec, rec_len);
    } else if (before || after) {
        uint32_t head = emlio_crc32c(0, rec, before);
        uint32_t tail = emlio_crc32c(0, out->data + out->len, after);
        whole = emlio_crc32c_combine(head, out->crc, out->len);
        whole = emlio_crc32c_combine(whole, tail, after);
    }
    return whole == stored ? 0 : EMLIO_ECORRUPT;
}

/* One sample's bytes (the Example's image, or the whole record) and CRC. */
static int
s_read_one(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
           const emlio__read_opts_t *o, emlio__view_t *out,
           const char **missing)
{
    const uint8_t *rec;
    size_t rec_len;
    uint32_t stored;
    int rc = s_bytes(impl, ctx, record, &out->owned, &rec, &rec_len, &stored);
    if (rc < 0)
        return rc;
    if (!out->owned) /* the frame will point into the mapping */
        emlio__view_map(out, rec, rec_len);
    out->data = rec;
    out->len = rec_len;
    out->label = -1;
    if (!o->raw) {
        emlio_example_field_t fields[2] = {
            { .key = o->bytes_key, .key_len = o->bytes_key_len },
            { .key = o->label_key, .key_len = o->label_key_len },
        };
        /* Records that are not Examples, or lack the key, pass as raw. */
        if (emlio_example_parse(rec, rec_len, fields, 2) > 0) {
            if (fields[0].kind == EMLIO_FEATURE_BYTES && fields[0].count) {
                out->data = fields[0].bytes;
                out->len = fields[0].bytes_len;
            }
            if (fields[1].kind == EMLIO_FEATURE_INT64 && fields[1].count)
                out->label = fields[1].int64;
            else if (o->label_required) {
                *missing = o->label_key;
                return EMLIO__FORMAT_EBADLABEL;
            }
        }
    }
    return s_sample_crc(o, rec, rec_len, stored, out);
}

/* One Example feature as the frame of field f. */
static int
s_feature_view(const emlio_example_field_t *ex, bool copied,
               emlio__view_t *view)
{
    if (ex->kind == EMLIO_FEATURE_BYTES && copied)
        return emlio__view_copy(view, ex->bytes, ex->bytes_len);
    if (ex->kind == EMLIO_FEATURE_BYTES) {
        emlio__view_map(view, ex->bytes, ex->bytes_len);
        return 0;
    }
    if (ex->kind == EMLIO_FEATURE_INT64)
        return emlio__view_int64(view, ex->int64);
    uint32_t bits; /* EMLIO_FEATURE_FLOAT */
    uint8_t le[4];
    memcpy(&bits, &ex->f32, 4);
    for (int k = 0; k < 4; k++)
        le[k] = (uint8_t)(bits >> (8 * k));
    return emlio__view_copy(view, le, 4);
}

/* The fields of an Example, one frame per configured key. */
static int
s_read_fields(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
              const emlio__read_opts_t *o, emlio__view_t *views,
              const char **missing)
{
    size_t nf = o->n_fields;
    uint8_t *copy;
    const uint8_t *rec;
    size_t rec_len;
    uint32_t stored;
    int rc = s_bytes(impl, ctx, record, &copy, &rec, &rec_len, &stored);
    if (rc == 0 && o->verify && emlio_crc32c(0, rec, rec_len) != stored)
        rc = EMLIO_ECORRUPT;
    emlio_example_field_t ex[EMLIO__FORMAT_MAX_FIELDS + 1];
    if (rc == 0) {
        memset(ex, 0, sizeof(ex));
        for (size_t f = 0; f < nf; f++) {
            ex[f].key = o->fields[f];
            ex[f].key_len = strlen(o->fields[f]);
        }
        ex[nf].key = o->label_key;
        ex[nf].key_len = o->label_key_len;
        if (emlio_example_parse(rec, rec_len, ex, nf + 1) < 0)
            rc = EMLIO_EFORMAT;
    }
    views[0].label = -1;
    if (rc == 0 && ex[nf].kind == EMLIO_FEATURE_INT64 && ex[nf].count)
        views[0].label = ex[nf].int64;
    for (size_t f = 0; f < nf && rc == 0; f++) {
        if (ex[f].count && (ex[f].kind == EMLIO_FEATURE_BYTES ||
                            ex[f].kind == EMLIO_FEATURE_INT64 ||
                            ex[f].kind == EMLIO_FEATURE_FLOAT)) {
            rc = s_feature_view(&ex[f], copy != NULL, &views[f]);
        } else {
            *missing = o->fields[f];
            rc = EMLIO__FORMAT_EMISSING;
        }
    }
    emlio__iobuf_free(copy);
    return rc;
}

static int
s_read(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
       const emlio__read_opts_t *o, emlio__view_t *views, const char **missing)
{
    if (o->n_fields)
        return s_read_fields(impl, ctx, record, o, views, missing);
    return s_read_one(impl, ctx, record, o, views, missing);
}

/* The TFRecord label as emliod finds it by default. */
static int64_t
s_default_label(const uint8_t *rec, size_t len)
{
    emlio_example_field_t f = { .key = "image/class/label", .key_len = 17 };
    if (emlio_example_parse(rec, len, &f, 1) > 0 &&
        f.kind == EMLIO_FEATURE_INT64 && f.count)
        return f.int64;
    return -1;
}

/* The whole record is the one field, named "". */
static int
s_record(const void *impl, size_t r, emlio_dataset_field_fn *fn, void *userdata,
         int64_t *label)
{
    const uint8_t *data;
    size_t len;
    int rc = emlio_tfrecord_record(impl, r, &data, &len, NULL);
    if (rc < 0)
        return rc;
    *label = s_default_label(data, len);
    return fn(userdata, "", data, len);
}

static uint64_t
s_record_bytes(const void *impl, size_t i)
{
    if (i >= emlio_tfrecord_count(impl))
        return 0;
    return emlio_tfrecord_loc(impl, i)->len + EMLIO_TFRECORD_OVERHEAD;
}

const emlio__format_ops_t emlio__format_tfrecord = {
    .name = "tfrecord",
    .suffix = ".tfrecord",
    .what = "*.tfrecord shards",
    .mapped = true,
    .create = s_create,
    .confine = s_confine,
    .open = s_open,
    .map_fd = s_map_fd,
    .unmap = s_unmap,
    .load_index = s_load_index,
    .scan = s_scan,
    .write_index = s_write_index,
    .index_table = s_index_table,
    .adopt_table = s_adopt_table,
    .errmsg = s_errmsg,
    .path = s_path,
    .blank = s_blank,
    .read_copy = s_read_copy,
    .extent = s_extent,
    .destroy = s_destroy,
    .count = s_count,
    .size = s_size,
    .record_bytes = s_record_bytes,
    .offset = s_offset,
    .advise = s_advise,
    .prefetch = s_prefetch,
    .has_field = s_has_field,
    .read = s_read,
    .record = s_record,
};
