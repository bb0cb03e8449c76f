/* tfrecord.c - memory-mapped TFRecord shards, their scan and DALI indexes.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <sched.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "crc32c.h"
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

static inline uint64_t
s_le64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
           (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 |
           (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static inline uint32_t
s_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline void
s_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void
s_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A growable array of locations; the parsers fill one and hand it over. */
typedef struct {
    emlio_tfrecord_loc_t *locs;
    size_t n;
    size_t cap;
} s_locvec_t;

static int
s_locvec_push(s_locvec_t *v, uint64_t offset, uint64_t len)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        emlio_tfrecord_loc_t *locs =
            emlio_reallocarray(v->locs, cap, sizeof(*locs));
        if (!locs)
            return EMLIO_ENOMEM;
        v->locs = locs;
        v->cap = cap;
    }
    v->locs[v->n].offset = offset;
    v->locs[v->n].len = len;
    v->n++;
    return 0;
}

/* Hands the vector to the caller, or frees it on failure, so both parsers
 * keep the "nothing allocated on error" promise in one place. */
static int
s_locvec_finish(s_locvec_t *v, int rc, emlio_tfrecord_loc_t **locs_out,
                size_t *n_out)
{
    if (rc == 0 && v->n > INT_MAX)
        rc = EMLIO_EFORMAT;
    if (rc < 0) {
        emlio_free(v->locs);
        *locs_out = NULL;
        *n_out = 0;
        return rc;
    }
    *locs_out = v->locs;
    *n_out = v->n;
    return (int)v->n;
}

/* Checks the record header at off: 12 bytes present, the length CRC, the
 * length limit and the record inside [0, size). Stores the data length. */
static int
s_check_header(const uint8_t *base, size_t size, uint64_t off, const char *name,
               uint64_t *len_out, char *errbuf)
{
    if (size - off < 12)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "truncated record header in '%s' at offset "
                             "%" PRIu64 "%s",
                             name, off,
                             off == 0 ? " (not a tfrecord file?)" : "");
    const uint8_t *p = base + off;
    uint64_t len = s_le64(p);
    if (emlio_crc32c_unmask(s_le32(p + 8)) != emlio_crc32c(0, p, 8))
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "bad length crc in '%s' at offset %" PRIu64 "%s",
                             name, off,
                             off == 0 ? " (not a tfrecord file?)" : "");
    if (len > EMLIO_TFRECORD_MAX_RECORD)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "record of %" PRIu64 " bytes in '%s' at offset "
                             "%" PRIu64 " exceeds the %u byte limit",
                             len, name, off, EMLIO_TFRECORD_MAX_RECORD);
    if (len + EMLIO_TFRECORD_OVERHEAD > size - off)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "truncated record in '%s' at offset %" PRIu64
                             ": %" PRIu64 " bytes of data, %" PRIu64
                             " left in the file",
                             name, off, len, (uint64_t)(size - off - 12));
    *len_out = len;
    return 0;
}

int
emlio__tfrecord_scan_mem(const uint8_t *base, size_t size, bool verify_data,
                         const char *name, emlio_tfrecord_loc_t **locs_out,
                         size_t *n_out, char *errbuf)
{
    s_locvec_t v = { NULL, 0, 0 };
    uint64_t off = 0;
    int rc = 0;
    while (off < size) {
        uint64_t len;
        rc = s_check_header(base, size, off, name, &len, errbuf);
        if (rc < 0)
            break;
        if (verify_data) {
            const uint8_t *data = base + off + 12;
            uint32_t stored = emlio_crc32c_unmask(s_le32(data + len));
            if (emlio_crc32c(0, data, len) != stored) {
                rc = emlio__seterr(errbuf, EMLIO_ECORRUPT,
                                   "bad data crc in '%s' at offset %" PRIu64,
                                   name, off);
                break;
            }
        }
        rc = s_locvec_push(&v, off, len);
        if (rc < 0) {
            emlio__seterr(errbuf, rc, "out of memory indexing '%s'", name);
            break;
        }
        off += len + EMLIO_TFRECORD_OVERHEAD;
    }
    if (rc == 0 && v.n > INT_MAX)
        emlio__seterr(errbuf, EMLIO_EFORMAT, "too many records in '%s'", name);
    return s_locvec_finish(&v, rc, locs_out, n_out);
}

/* Parses an unsigned decimal at *pp (before end) into *out; moves *pp past
 * it. Returns false when there is no digit or the value overflows. */
static bool
s_parse_u64(const char **pp, const char *end, uint64_t *out)
{
    const char *p = *pp;
    uint64_t v = 0;
    if (p == end || *p < '0' || *p > '9')
        return false;
    while (p < end && *p >= '0' && *p <= '9') {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
        p++;
    }
    *pp = p;
    *out = v;
    return true;
}

static const char *
s_skip_blanks(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

int
emlio__tfrecord_parse_index(const char *text, size_t len, const char *idx_name,
                            const uint8_t *base, size_t size, const char *name,
                            emlio_tfrecord_loc_t **locs_out, size_t *n_out,
                            char *errbuf)
{
    s_locvec_t v = { NULL, 0, 0 };
    const char *p = text;
    const char *end = len ? text + len : text; /* text may be NULL if 0 */
    uint64_t expect = 0; /* where the next record must start */
    size_t line = 0;
    int rc = 0;
    while (p < end && rc == 0) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        line++;
        /* DALI reads the index with operator>>, so be as lenient about
         * blanks and CRLF line ends as it is, but demand two numbers. */
        const char *q = s_skip_blanks(p, eol);
        p = eol < end ? eol + 1 : end;
        if (q == eol)
            continue;
        uint64_t off;
        uint64_t total;
        bool ok = s_parse_u64(&q, eol, &off);
        const char *sep = q;
        q = s_skip_blanks(q, eol);
        ok = ok && q > sep && s_parse_u64(&q, eol, &total);
        if (!ok || s_skip_blanks(q, eol) != eol) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "malformed line %zu in index '%s'", line,
                               idx_name);
            break;
        }
        if (off != expect) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "index '%s' does not match '%s': line %zu "
                               "has offset %" PRIu64 ", expected %" PRIu64,
                               idx_name, name, line, off, expect);
            break;
        }
        if (total < EMLIO_TFRECORD_OVERHEAD || off >= size ||
            total > size - off) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "index '%s' does not match '%s': line %zu "
                               "describes %" PRIu64 " bytes at offset "
                               "%" PRIu64 " of a %zu byte file",
                               idx_name, name, line, total, off, size);
            break;
        }
        uint64_t rec_len;
        rc = s_check_header(base, size, off, name, &rec_len, errbuf);
        if (rc < 0)
            break;
        if (rec_len != total - EMLIO_TFRECORD_OVERHEAD) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "index '%s' does not match '%s': line %zu "
                               "says %" PRIu64 " bytes at offset %" PRIu64
                               ", the record has %" PRIu64,
                               idx_name, name, line, total, off,
                               rec_len + EMLIO_TFRECORD_OVERHEAD);
            break;
        }
        rc = s_locvec_push(&v, off, rec_len);
        if (rc < 0)
            emlio__seterr(errbuf, rc, "out of memory loading index '%s'",
                          idx_name);
        expect = off + total;
    }
    if (rc == 0 && expect != size)
        rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                           "index '%s' does not match '%s': it covers "
                           "%" PRIu64 " of %zu bytes",
                           idx_name, name, expect, size);
    if (rc == 0 && v.n > INT_MAX)
        emlio__seterr(errbuf, EMLIO_EFORMAT, "too many records in '%s'",
                      idx_name);
    return s_locvec_finish(&v, rc, locs_out, n_out);
}

int
emlio_tfrecord_append(emlio_buf_t *out, const uint8_t *data, size_t len)
{
    int rc = emlio_buf_grow(out, len + EMLIO_TFRECORD_OVERHEAD);
    if (rc < 0)
        return rc;
    uint8_t *p = out->data + out->len;
    s_put_le64(p, len);
    s_put_le32(p + 8, emlio_crc32c_mask(emlio_crc32c(0, p, 8)));
    if (len)
        memcpy(p + 12, data, len);
    s_put_le32(p + 12 + len, emlio_crc32c_mask(emlio_crc32c(0, data, len)));
    out->len += len + EMLIO_TFRECORD_OVERHEAD;
    out->data[out->len] = 0; /* the spare byte emlio_buf_grow keeps */
    return 0;
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

int
emlio__tfrecord_adopt(emlio_tfrecord_t *self, const void *table, size_t len,
                      uint64_t records, uint64_t size, uint32_t crc)
{
    assert(self);
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

void
emlio__tfrecord_confine(emlio_tfrecord_t *self, const emlio__root_t *root,
                        const char *rel)
{
    emlio__mapfile_confine(&self->file, root, rel);
}

int
emlio__tfrecord_map_fd(emlio_tfrecord_t *self, int fd, const struct stat *st)
{
    return emlio__mapfile_map_fd(&self->file, fd, st);
}

void
emlio__tfrecord_unmap(emlio_tfrecord_t *self)
{
    emlio__mapfile_unmap(&self->file);
}

int
emlio__tfrecord_blank(emlio_tfrecord_t *self)
{
    return emlio__mapfile_blank(&self->file);
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

const void *
emlio__tfrecord_table(const emlio_tfrecord_t *self, size_t *len)
{
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

void
emlio__tfrecord_prefetch(const emlio_tfrecord_t *self, size_t i, bool data)
{
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
