/* tfrecord.c - memory-mapped TFRecord shards: the handle, its DALI
 * index, its records, and its table of format operations (format.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <sched.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "emlio/example.h"
#include "format.h"
#include "iobuf.h"
#include "mapfile.h"
#include "tfrecord.h"

struct emlio_tfrecord {
    emlio__mapfile_t file; /* the shard, its mapping, its last error */
    emlio_tfrecord_loc_t *locs;
    size_t n;
    /* A table taken from the dataset index (dsindex.h) is borrowed from
     * its mapping and checked against table_crc when a record is first
     * asked for (S_TABLE_*), not at start, so a start touches no table. */
    bool borrowed;
    uint32_t table_crc;
    atomic_int table_state;
};

enum { S_TABLE_OK = 0, S_TABLE_UNCHECKED, S_TABLE_CHECKING, S_TABLE_BAD };

static inline uint32_t
s_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

emlio_tfrecord_t *
emlio_tfrecord_new(const char *path)
{
    assert(path);
    emlio_tfrecord_t *self = emlio_calloc(1, sizeof(*self));
    if (self && emlio__mapfile_init(&self->file, path) < 0) {
        emlio_free(self);
        return NULL;
    }
    return self;
}

static void
s_reset_index(emlio_tfrecord_t *self)
{
    if (!self->borrowed)
        emlio_free(self->locs);
    self->locs = NULL;
    self->n = 0;
    self->borrowed = false;
    atomic_store(&self->table_state, S_TABLE_OK);
}

/* The format's adopt_table (format.h): takes the record table from the
 * dataset index (dsindex.h): table[0, len) holds `records`
 * emlio_tfrecord_loc_t, borrowed from a mapping that outlives the handle,
 * for a file of size bytes (checked again by open). The table is checked
 * against crc when a record is first asked for; a mismatch rescans the
 * mapping (same count) or refuses every record with EMLIO_EFORMAT. Needs
 * no open file. TFRecord has no prune, so every table fits whatever
 * prune says. Returns the record count, EMLIO_EFORMAT (a table of the
 * wrong size) or -ESTALE (the mapped file has another size). */
static int
s_adopt_table(void *impl, const void *table, size_t len, uint64_t records,
              uint64_t size, uint32_t crc, const char *prune)
{
    emlio_tfrecord_t *self = impl;
    (void)prune;
    if (records > INT_MAX || len != records * sizeof(emlio_tfrecord_loc_t) ||
        ((uintptr_t)table % _Alignof(emlio_tfrecord_loc_t)) != 0)
        return emlio__seterr(self->file.err, EMLIO_EFORMAT,
                             "index table of '%s' has a bad size",
                             self->file.path);
    if (self->file.open && size != self->file.size)
        return emlio__seterr(self->file.err, -ESTALE,
                             "'%s' changed since it was indexed",
                             self->file.path);
    s_reset_index(self);
    self->locs = (emlio_tfrecord_loc_t *)(uintptr_t)table;
    self->n = (size_t)records;
    self->file.size = (size_t)size;
    self->borrowed = true;
    self->table_crc = crc;
    atomic_store(&self->table_state, S_TABLE_UNCHECKED);
    return (int)records;
}

/* Whether a table describes records in file order that do not overlap
 * and lie inside size bytes: a forged table with a valid CRC must not
 * serve one record's bytes as another's (both would pass their CRC). */
static bool
s_table_sane(const emlio_tfrecord_loc_t *locs, size_t n, uint64_t size)
{
    uint64_t end = 0;
    for (size_t i = 0; i < n; i++) {
        const emlio_tfrecord_loc_t *loc = &locs[i];
        if (loc->offset < end || loc->offset > size ||
            loc->len > EMLIO_TFRECORD_MAX_RECORD ||
            loc->len + EMLIO_TFRECORD_OVERHEAD > size - loc->offset)
            return false;
        end = loc->offset + loc->len + EMLIO_TFRECORD_OVERHEAD;
    }
    return true;
}

/* The first check of a borrowed table: its CRC and its order, and when
 * either fails a rescan of the mapping into the heap (same record count,
 * else every record is refused as EMLIO_EFORMAT); with the shard not
 * mapped, the check waits for the next use. One thread checks; others
 * wait. */
static int
s_table_check(emlio_tfrecord_t *self)
{
    int state = S_TABLE_UNCHECKED;
    if (!atomic_compare_exchange_strong(&self->table_state, &state,
                                        S_TABLE_CHECKING)) {
        while ((state = atomic_load(&self->table_state)) == S_TABLE_CHECKING)
            sched_yield();
        return state == S_TABLE_OK ? 0 : EMLIO_EFORMAT;
    }
    state = S_TABLE_OK;
    if (emlio_crc32c(0, self->locs, self->n * sizeof(*self->locs)) !=
            self->table_crc ||
        !s_table_sane(self->locs, self->n, self->file.size)) {
        if (!self->file.base) {
            /* Not mapped now (the shard cache has it closed): nothing to
             * rescan; checked again at the next use, which maps it. */
            atomic_store(&self->table_state, S_TABLE_UNCHECKED);
            return EMLIO_EFORMAT;
        }
        emlio_tfrecord_loc_t *locs = NULL;
        size_t n = 0;
        char err[EMLIO_ERRMSG_LEN];
        int rc = self->file.base
                     ? emlio__tfrecord_scan_mem(self->file.base,
                                                self->file.size, false,
                                                self->file.path, &locs, &n, err)
                     : EMLIO_EFORMAT;
        if (rc >= 0 && n == self->n) {
            self->locs = locs; /* the mapped table stays mapped */
            self->borrowed = false;
        } else {
            emlio_free(locs);
            state = S_TABLE_BAD;
        }
    }
    atomic_store(&self->table_state, state);
    return state == S_TABLE_OK ? 0 : EMLIO_EFORMAT;
}

/* Whether the table may be used: one relaxed load on the hot path. The
 * handle is logically const to readers; the check only fills what a
 * reader would see anyway. */
static inline int
s_table_ready(const emlio_tfrecord_t *self)
{
    if (atomic_load_explicit(&self->table_state, memory_order_acquire) ==
        S_TABLE_OK)
        return 0;
    return s_table_check((emlio_tfrecord_t *)(uintptr_t)self);
}

void
emlio_tfrecord_destroy(emlio_tfrecord_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_tfrecord_t *self = *self_p;
    s_reset_index(self);
    emlio__mapfile_release(&self->file);
    emlio_free(self);
    *self_p = NULL;
}

int
emlio_tfrecord_open(emlio_tfrecord_t *self)
{
    assert(self);
    if (self->file.open)
        return emlio__seterr(self->file.err, EMLIO_EINVAL,
                             "'%s' is already open", self->file.path);
    size_t indexed = self->file.size;
    int rc = emlio__mapfile_open(&self->file);
    if (rc < 0)
        return rc;
    if (self->borrowed && self->file.size != indexed)
        return emlio__seterr(self->file.err, -ESTALE,
                             "'%s' changed since it was indexed: %zu bytes, "
                             "indexed at %zu",
                             self->file.path, self->file.size, indexed);
    return 0;
}

int
emlio_tfrecord_scan(emlio_tfrecord_t *self, bool verify_data)
{
    assert(self && self->file.open);
    s_reset_index(self);
    return emlio__tfrecord_scan_mem(self->file.base, self->file.size,
                                    verify_data, self->file.path, &self->locs,
                                    &self->n, self->file.err);
}

int
emlio_tfrecord_load_index(emlio_tfrecord_t *self, const char *idx_path)
{
    assert(self && self->file.open && idx_path);
    s_reset_index(self);
    char *text;
    size_t len;
    int rc =
        emlio__mapfile_read_beside(&self->file, idx_path, false, &text, &len);
    if (rc < 0)
        return rc;
    rc = emlio__tfrecord_parse_index(text, len, idx_path, self->file.base,
                                     self->file.size, self->file.path,
                                     &self->locs, &self->n, self->file.err);
    emlio_free(text);
    return rc;
}

/* Appends v in decimal and then c; the caller made room (21 bytes).
 * snprintf was half of a first start at 10M records. */
static size_t
s_put_dec(char *p, uint64_t v, char c)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t k = 0; k < n; k++)
        p[k] = tmp[n - 1 - k];
    p[n] = c;
    return n + 1;
}

int
emlio_tfrecord_write_index(const emlio_tfrecord_t *self, const char *idx_path)
{
    assert(self && idx_path);
    /* Two numbers of at most 20 digits and their separators per line. */
    if (self->n > SIZE_MAX / 42)
        return -ENOMEM;
    char *text = emlio_malloc(self->n * 42 + 1);
    if (!text)
        return -ENOMEM;
    size_t len = 0;
    for (size_t i = 0; i < self->n; i++) {
        len += s_put_dec(text + len, self->locs[i].offset, ' ');
        len += s_put_dec(text + len,
                         self->locs[i].len + EMLIO_TFRECORD_OVERHEAD, '\n');
    }
    int rc = emlio__write_file_atomic(idx_path, text, len);
    emlio_free(text);
    return rc;
}

const char *
emlio_tfrecord_path(const emlio_tfrecord_t *self)
{
    assert(self);
    return self->file.path;
}

/* The format's index_table: the record table, what the dataset index
 * stores (*len bytes). */
static const void *
s_index_table(void *impl, size_t *len)
{
    const emlio_tfrecord_t *self = impl;
    *len = self->n * sizeof(*self->locs);
    return self->locs;
}

size_t
emlio_tfrecord_count(const emlio_tfrecord_t *self)
{
    assert(self);
    return self->n;
}

uint64_t
emlio_tfrecord_size(const emlio_tfrecord_t *self)
{
    assert(self);
    return self->file.size;
}

const emlio_tfrecord_loc_t *
emlio_tfrecord_loc(const emlio_tfrecord_t *self, size_t i)
{
    assert(self && i < self->n);
    (void)s_table_ready(self); /* a bad table's records fail their CRC */
    return &self->locs[i];
}

int
emlio_tfrecord_record(const emlio_tfrecord_t *self, size_t i,
                      const uint8_t **data, size_t *len, uint32_t *stored_crc)
{
    assert(self && data && len);
    if (i >= self->n)
        return EMLIO_ENOTFOUND;
    if (s_table_ready(self) < 0)
        return EMLIO_EFORMAT;
    const emlio_tfrecord_loc_t *loc = &self->locs[i];
    /* The index was checked when it was built, but the check is two
     * compares and keeps a corrupted entry from reading outside the map. */
    if (loc->offset > self->file.size || loc->len > EMLIO_TFRECORD_MAX_RECORD ||
        loc->len + EMLIO_TFRECORD_OVERHEAD > self->file.size - loc->offset)
        return EMLIO_EFORMAT;
    const uint8_t *p = self->file.base + loc->offset + 12;
    *data = p;
    *len = (size_t)loc->len;
    if (stored_crc)
        *stored_crc = emlio_crc32c_unmask(s_le32(p + loc->len));
    return 0;
}

/* The format's prefetch: record i into the CPU caches, its index entry
 * (data false), or its framing and stored CRC (data true, the index entry
 * read). Does nothing for i out of range; never faults. */
static void
s_prefetch(const void *impl, size_t i, bool data)
{
    const emlio_tfrecord_t *self = impl;
    if (i >= self->n || !self->file.base)
        return;
    const emlio_tfrecord_loc_t *loc = &self->locs[i];
    if (!data) {
        __builtin_prefetch(loc);
        return;
    }
    /* Prefetch instructions do not fault, so a bad entry is harmless. */
    const uint8_t *p = self->file.base + loc->offset;
    /* A record up to 8 KB is read whole (parsed, CRCed): fetch all its lines,
     * since a shuffled read starts each record on a cold line and the
     * CRC loop would otherwise wait for them one by one. */
    size_t end = 12 + loc->len + 4;
    if (end > 8192)
        end = 64;
    for (size_t off = 0; off < end; off += 64)
        __builtin_prefetch(p + off);
    __builtin_prefetch(p + 12 + loc->len);
}

int
emlio_tfrecord_verify(const emlio_tfrecord_t *self, size_t i)
{
    const uint8_t *data;
    size_t len;
    uint32_t stored;
    int rc = emlio_tfrecord_record(self, i, &data, &len, &stored);
    if (rc < 0)
        return rc;
    return emlio_crc32c(0, data, len) == stored ? 0 : EMLIO_ECORRUPT;
}

int
emlio_tfrecord_advise(const emlio_tfrecord_t *self, size_t first, size_t n,
                      int advice)
{
    assert(self);
    if (first > self->n || n > self->n - first)
        return -EINVAL;
    if (n == 0)
        return 0;
    const emlio_tfrecord_loc_t *last = &self->locs[first + n - 1];
    return emlio__mapfile_advise(
        &self->file, self->locs[first].offset,
        last->offset + last->len + EMLIO_TFRECORD_OVERHEAD, advice);
}

const char *
emlio_tfrecord_errmsg(const emlio_tfrecord_t *self)
{
    assert(self);
    return self->file.err;
}

/* ---- the format's table (format.h) ----
 * The public emlio_tfrecord_* functions are typed and the table's entries
 * take the handle as void *: the few entries below that only call one of
 * them adapt the type and do nothing else. */

static void *
s_create(const char *path)
{
    return emlio_tfrecord_new(path);
}

static void
s_destroy(void *impl)
{
    emlio_tfrecord_t *file = impl;
    emlio_tfrecord_destroy(&file);
}

/* The mapped file, for the shard set to confine, map, unmap and blank. */
static emlio__mapfile_t *
s_file(void *impl)
{
    return &((emlio_tfrecord_t *)impl)->file;
}

static int
s_open(void *impl)
{
    return emlio_tfrecord_open(impl);
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

static void
s_advise(const void *impl, size_t first, size_t n, int advice)
{
    (void)emlio_tfrecord_advise(impl, first, n, advice);
}

static uint64_t
s_offset(const void *impl, size_t i)
{
    const emlio_tfrecord_t *self = impl;
    return i < self->n ? self->locs[i].offset : 0;
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
    *buf_out = buf;
    *data = rec + 12;
    *len = (size_t)loc->len;
    *stored = emlio_crc32c_unmask(s_le32(rec + 12 + loc->len));
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

/* Listed in emlio__formats (format.c). */
const emlio__format_ops_t emlio__format_tfrecord = {
    .name = "tfrecord",
    .suffix = ".tfrecord",
    .what = "*.tfrecord shards",
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
    .offset = s_offset,
    .advise = s_advise,
    .prefetch = s_prefetch,
    .has_field = s_has_field,
    .read = s_read,
    .record = s_record,
};
