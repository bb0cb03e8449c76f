/* tar.c - WebDataset tar shards: header walk, wds2idx indexes, members.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mapfile.h"
#include "tar.h"
#include "tar_header.h"
#include "tar_impl.h"

#define BLOCK             512
#define PAX_MAX_BYTES     ((uint64_t)1 << 20)
#define DALI_INDEX_PREFIX "v1.2 "

void
emlio__tar_index_release(emlio__tar_index_t *idx)
{
    if (idx->names)
        for (size_t i = 0; i < idx->n_members; i++)
            emlio_free(idx->names[i]);
    emlio_free(idx->names);
    for (size_t i = 0; i < idx->n_fields; i++)
        emlio_free(idx->fields[i]);
    emlio_free(idx->fields);
    emlio_free(idx->members);
    emlio_free(idx->first);
    memset(idx, 0, sizeof(*idx));
}

/* ---- building an index ------------------------------------------------ */

typedef struct {
    emlio__tar_index_t *idx;
    size_t cap_members;
    size_t cap_samples;
    char *key; /* the current sample's key */
    size_t key_len;
    size_t key_cap;
} s_builder_t;

/* Splits path[0, len) as webdataset does. Returns false for a member that
 * is not part of any sample (no key). */
static bool
s_split(const char *path, size_t len, size_t *key_len, const char **field,
        size_t *field_len)
{
    const char *slash = NULL;
    for (size_t i = len; i > 0; i--)
        if (path[i - 1] == '/') {
            slash = path + i - 1;
            break;
        }
    const char *base = slash ? slash + 1 : path;
    const char *end = path + len;
    const char *dot = memchr(base, '.', (size_t)(end - base));
    if (!dot || dot == base)
        return false;
    *key_len = (size_t)(dot - path);
    *field = dot + 1;
    *field_len = (size_t)(end - dot - 1);
    return true;
}

static int
s_field_id(emlio__tar_index_t *idx, const char *field, size_t len, uint32_t *id)
{
    for (size_t i = 0; i < idx->n_fields; i++)
        if (strlen(idx->fields[i]) == len &&
            memcmp(idx->fields[i], field, len) == 0) {
            *id = (uint32_t)i;
            return 0;
        }
    if (idx->n_fields >= EMLIO_TAR_MAX_FIELDS)
        return EMLIO_EFORMAT;
    char **fields =
        emlio_reallocarray(idx->fields, idx->n_fields + 1, sizeof(*fields));
    if (!fields)
        return EMLIO_ENOMEM;
    idx->fields = fields;
    char *copy = emlio_malloc(len + 1);
    if (!copy)
        return EMLIO_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        char c = field[i];
        copy[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    copy[len] = '\0';
    /* Lower-casing may make it equal to a known one. */
    for (size_t i = 0; i < idx->n_fields; i++)
        if (strcmp(idx->fields[i], copy) == 0) {
            emlio_free(copy);
            *id = (uint32_t)i;
            return 0;
        }
    idx->fields[idx->n_fields] = copy;
    *id = (uint32_t)idx->n_fields++;
    return 0;
}

/* Adds one regular member; starts a new sample when its key differs from
 * the current one. name may be NULL-free bytes [0, len). */
static int
s_add_member(s_builder_t *b, const char *path, size_t len, uint64_t offset,
             uint64_t size, bool keep_name, const char *name, char *errbuf,
             uint64_t header_off)
{
    size_t key_len, field_len;
    const char *field;
    if (!s_split(path, len, &key_len, &field, &field_len))
        return 0;
    emlio__tar_index_t *idx = b->idx;
    uint32_t id;
    int rc = s_field_id(idx, field, field_len, &id);
    if (rc == EMLIO_EFORMAT)
        return emlio__seterr(errbuf, rc,
                             "more than %d fields in '%s' at offset %" PRIu64,
                             EMLIO_TAR_MAX_FIELDS, name, header_off);
    if (rc < 0)
        return rc;
    bool same = idx->n_samples > 0 && key_len == b->key_len &&
                memcmp(path, b->key, key_len) == 0;
    if (same) {
        for (uint32_t m = idx->first[idx->n_samples - 1]; m < idx->n_members;
             m++)
            if (idx->members[m].field == id)
                return emlio__seterr(errbuf, EMLIO_EFORMAT,
                                     "duplicate field '%s' of sample '%.*s' "
                                     "in '%s' at offset %" PRIu64,
                                     idx->fields[id], (int)key_len, path, name,
                                     header_off);
    } else {
        if (idx->n_samples + 2 > b->cap_samples) {
            size_t cap = b->cap_samples ? b->cap_samples * 2 : 64;
            uint32_t *first =
                emlio_reallocarray(idx->first, cap, sizeof(*first));
            if (!first)
                return EMLIO_ENOMEM;
            idx->first = first;
            b->cap_samples = cap;
        }
        if (idx->n_members > UINT32_MAX - 1 || idx->n_samples >= INT_MAX)
            return emlio__seterr(errbuf, EMLIO_EFORMAT,
                                 "too many members in '%s'", name);
        idx->first[idx->n_samples++] = (uint32_t)idx->n_members;
        if (key_len + 1 > b->key_cap) {
            char *key = emlio_realloc(b->key, key_len + 1);
            if (!key)
                return EMLIO_ENOMEM;
            b->key = key;
            b->key_cap = key_len + 1;
        }
        memcpy(b->key, path, key_len);
        b->key_len = key_len;
    }
    if (idx->n_members == b->cap_members) {
        size_t cap = b->cap_members ? b->cap_members * 2 : 64;
        emlio__tar_member_t *members =
            emlio_reallocarray(idx->members, cap, sizeof(*members));
        if (!members)
            return EMLIO_ENOMEM;
        idx->members = members;
        if (keep_name) {
            char **names = emlio_reallocarray(idx->names, cap, sizeof(*names));
            if (!names)
                return EMLIO_ENOMEM;
            idx->names = names;
        }
        b->cap_members = cap;
    }
    if (keep_name) {
        char *copy = emlio_malloc(len + 1);
        if (!copy)
            return EMLIO_ENOMEM;
        memcpy(copy, path, len);
        copy[len] = '\0';
        idx->names[idx->n_members] = copy;
    }
    idx->members[idx->n_members++] = (emlio__tar_member_t){ offset, size, id };
    idx->first[idx->n_samples] = (uint32_t)idx->n_members;
    return 0;
}

static int
s_builder_finish(s_builder_t *b, int rc)
{
    emlio_free(b->key);
    if (rc < 0) {
        emlio__tar_index_release(b->idx);
        return rc;
    }
    if (b->idx->n_samples == 0) {
        emlio__tar_index_release(b->idx);
        return 0;
    }
    return (int)b->idx->n_samples;
}

static int
s_scan(const uint8_t *base, size_t size, const char *name, bool keep_names,
       emlio__tar_index_t *out, char *errbuf)
{
    memset(out, 0, sizeof(*out));
    s_builder_t b = { .idx = out };
    char *long_name = emlio_malloc(EMLIO_TAR_MAX_NAME);
    char *path = emlio_malloc(EMLIO_TAR_MAX_NAME + 2);
    if (!long_name || !path) {
        emlio_free(long_name);
        emlio_free(path);
        return s_builder_finish(&b, EMLIO_ENOMEM);
    }
    size_t long_len = 0;
    bool have_long = false;
    uint64_t pax_size = 0;
    bool have_pax_size = false;
    uint64_t off = 0;
    int rc = 0;
    while (rc == 0) {
        if (size - off < BLOCK) {
            if (off == size)
                break; /* no end-of-archive blocks: accepted, as tar does */
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "truncated tar header in '%s' at offset "
                               "%" PRIu64,
                               name, off);
            break;
        }
        const uint8_t *h = base + off;
        if (emlio__tarh_zero_block(h))
            break; /* end of archive; the rest is padding */
        if (!emlio__tarh_checksum_ok(h)) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "bad tar header checksum in '%s' at offset "
                               "%" PRIu64 "%s",
                               name, off, off == 0 ? " (not a tar file?)" : "");
            break;
        }
        uint64_t len;
        if (!emlio__tarh_number(h + 124, 12, &len)) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "bad member size in '%s' at offset %" PRIu64,
                               name, off);
            break;
        }
        uint8_t type = h[156];
        if (have_pax_size && emlio__tarh_regular(type))
            len = pax_size;
        uint64_t data = off + BLOCK;
        if (len > size - data) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "truncated tar member in '%s' at offset "
                               "%" PRIu64 ": %" PRIu64 " bytes of data, "
                               "%" PRIu64 " left in the file",
                               name, off, len, (uint64_t)(size - data));
            break;
        }
        uint64_t padded = (len + BLOCK - 1) / BLOCK * BLOCK;
        uint64_t next = padded > size - data ? size : data + padded;
        if (type == 'L') { /* GNU long name of the next member */
            size_t n = emlio__tarh_strnlen(base + data, (size_t)len);
            if (n == 0 || n >= EMLIO_TAR_MAX_NAME) {
                rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                                   "bad long name in '%s' at offset %" PRIu64,
                                   name, off);
                break;
            }
            memcpy(long_name, base + data, n);
            long_len = n;
            have_long = true;
        } else if (type == 'x') { /* pax header of the next member */
            if (len > PAX_MAX_BYTES ||
                emlio__tarh_pax(base + data, (size_t)len, long_name, &long_len,
                                &have_long, &pax_size, &have_pax_size) < 0) {
                rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                                   "bad pax header in '%s' at offset %" PRIu64,
                                   name, off);
                break;
            }
        } else {
            if (emlio__tarh_regular(type)) {
                size_t n;
                if (have_long) {
                    memcpy(path, long_name, long_len);
                    n = long_len;
                } else {
                    size_t nl = emlio__tarh_strnlen(h, 100);
                    size_t pl = 0;
                    if (memcmp(h + 257, "ustar", 5) == 0)
                        pl = emlio__tarh_strnlen(h + 345, 155);
                    n = 0;
                    if (pl) {
                        memcpy(path, h + 345, pl);
                        path[pl] = '/';
                        n = pl + 1;
                    }
                    memcpy(path + n, h, nl);
                    n += nl;
                }
                /* "./a.jpg" names the same member as "a.jpg". */
                const char *p = path;
                while (n >= 2 && p[0] == '.' && p[1] == '/') {
                    p += 2;
                    n -= 2;
                }
                rc = s_add_member(&b, p, n, data, len, keep_names, name, errbuf,
                                  off);
                if (rc < 0)
                    break;
            }
            /* 'g', 'K', '5', links, devices: nothing to serve. */
            have_long = false;
            have_pax_size = false;
        }
        off = next;
    }
    emlio_free(long_name);
    emlio_free(path);
    return s_builder_finish(&b, rc);
}

int
emlio__tar_scan_mem(const uint8_t *base, size_t size, const char *name,
                    emlio__tar_index_t *out, char *errbuf)
{
    return s_scan(base, size, name, true, out, errbuf);
}

/* ---- DALI wds2idx v1.2 ----------------------------------------------------
 */

static bool
s_parse_u64(const char **p, const char *end, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    if (s == end || *s < '0' || *s > '9')
        return false;
    while (s < end && *s >= '0' && *s <= '9') {
        if (v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
        s++;
    }
    *p = s;
    *out = v;
    return true;
}

/* The next space-free token of [*p, end) on this line. */
static bool
s_token(const char **p, const char *end, const char **tok, size_t *len)
{
    const char *s = *p;
    while (s < end && *s == ' ')
        s++;
    const char *t = s;
    while (s < end && *s != ' ' && *s != '\n')
        s++;
    if (s == t)
        return false;
    *tok = t;
    *len = (size_t)(s - t);
    *p = s;
    return true;
}

int
emlio__tar_parse_index(const char *text, size_t len, const char *idx_name,
                       const uint8_t *base, size_t size, const char *name,
                       emlio__tar_index_t *out, char *errbuf)
{
    memset(out, 0, sizeof(*out));
    s_builder_t b = { .idx = out };
    const char *p = text;
    const char *end = text + len;
    size_t plen = strlen(DALI_INDEX_PREFIX);
    uint64_t declared = 0;
    if (len < plen || memcmp(text, DALI_INDEX_PREFIX, plen) != 0)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "'%s' is not a wds2idx v1.2 index", idx_name);
    p += plen;
    if (!s_parse_u64(&p, end, &declared) || p == end || *p != '\n')
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "bad first line in index '%s'", idx_name);
    p++;
    int rc = 0;
    size_t line = 1;
    uint64_t last_end = 0;
    size_t samples = 0;
    while (p < end && rc == 0) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) {
            rc = EMLIO_EFORMAT;
            break;
        }
        size_t before = out->n_samples;
        bool first_in_line = true;
        while (rc == 0) {
            const char *ext, *mname;
            size_t ext_len, mname_len;
            uint64_t off = 0, msize = 0;
            if (!s_token(&p, eol, &ext, &ext_len))
                break;
            while (p < eol && *p == ' ')
                p++;
            if (!s_parse_u64(&p, eol, &off)) {
                rc = EMLIO_EFORMAT;
                break;
            }
            while (p < eol && *p == ' ')
                p++;
            if (!s_parse_u64(&p, eol, &msize) ||
                !s_token(&p, eol, &mname, &mname_len)) {
                rc = EMLIO_EFORMAT;
                break;
            }
            /* The member's own header sits just before its data. */
            if (off % BLOCK || off < last_end + BLOCK || off > size ||
                msize > size - off ||
                !emlio__tarh_checksum_ok(base + off - BLOCK) ||
                !emlio__tarh_regular(base[off - BLOCK + 156])) {
                rc = EMLIO_EFORMAT;
                break;
            }
            uint64_t hsize;
            if (!emlio__tarh_number(base + off - BLOCK + 124, 12, &hsize) ||
                hsize != msize) {
                rc = EMLIO_EFORMAT;
                break;
            }
            size_t key_len, field_len;
            const char *field;
            if (!s_split(mname, mname_len, &key_len, &field, &field_len) ||
                field_len != ext_len || memcmp(field, ext, ext_len) != 0) {
                rc = EMLIO_EFORMAT;
                break;
            }
            /* Members of one line share a key; the next line starts a new
             * sample (a key seen on the previous line would merge). */
            bool new_sample = first_in_line;
            if (!first_in_line &&
                (key_len != b.key_len || memcmp(mname, b.key, key_len) != 0)) {
                rc = EMLIO_EFORMAT;
                break;
            }
            if (new_sample && out->n_samples > 0 && key_len == b.key_len &&
                memcmp(mname, b.key, key_len) == 0) {
                rc = EMLIO_EFORMAT;
                break;
            }
            rc = s_add_member(&b, mname, mname_len, off, msize, false, name,
                              errbuf, off - BLOCK);
            if (rc < 0)
                break;
            first_in_line = false;
            last_end = off + msize;
        }
        if (rc == 0 && (p != eol || out->n_samples != before + 1))
            rc = EMLIO_EFORMAT;
        p = eol + 1;
        samples++;
    }
    if (rc == 0 && samples != declared)
        rc = EMLIO_EFORMAT;
    if (rc == EMLIO_EFORMAT)
        emlio__seterr(errbuf, rc, "index '%s' line %zu does not describe '%s'",
                      idx_name, line, name);
    return s_builder_finish(&b, rc);
}

/* ---- the handle -----------------------------------------------------------
 */

void
emlio__tar_drop(emlio__tar_t *self)
{
    if (self->table) {
        self->idx.members = NULL;
        self->idx.first = NULL;
        self->table = NULL;
    }
    emlio__tar_index_release(&self->idx);
    emlio_free(self->table_buf);
    emlio_free(self->pruned_key);
    emlio_free(self->pruned_example);
    self->table_buf = NULL;
    self->pruned_key = self->pruned_example = NULL;
    self->pruned = 0;
    atomic_store(&self->table_state, S_TABLE_OK);
}

emlio__tar_t *
emlio__tar_new(const char *path)
{
    emlio__tar_t *self = emlio_calloc(1, sizeof(*self));
    if (self && emlio__mapfile_init(&self->file, path) < 0) {
        emlio_free(self);
        return NULL;
    }
    return self;
}

void
emlio__tar_confine(emlio__tar_t *self, const emlio__root_t *root,
                   const char *rel)
{
    emlio__mapfile_confine(&self->file, root, rel);
}

void
emlio__tar_destroy(emlio__tar_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__tar_t *self = *self_p;
    emlio__tar_drop(self);
    emlio__mapfile_release(&self->file);
    emlio_free(self);
    *self_p = NULL;
}

int
emlio__tar_open(emlio__tar_t *self)
{
    assert(self && !self->file.open);
    size_t indexed = self->file.size;
    int rc = emlio__mapfile_open(&self->file);
    if (rc < 0)
        return rc;
    if (self->table && self->file.size != indexed)
        return emlio__seterr(self->file.err, -ESTALE,
                             "'%s' changed since it was indexed",
                             self->file.path);
    return 0;
}

emlio__mapfile_t *
emlio__tar_file(emlio__tar_t *self)
{
    return &self->file;
}

int
emlio__tar_map_fd(emlio__tar_t *self, int fd, const struct stat *st)
{
    return emlio__mapfile_map_fd(&self->file, fd, st);
}

void
emlio__tar_unmap(emlio__tar_t *self)
{
    emlio__mapfile_unmap(&self->file);
}

int
emlio__tar_scan(emlio__tar_t *self)
{
    assert(self && self->file.open);
    emlio__tar_drop(self);
    return emlio__tar_scan_mem(self->file.base, self->file.size,
                               self->file.path, &self->idx, self->file.err);
}

/* Where two indexes of one shard differ, as a sample number; -1 when
 * they are the same (members, offsets, sizes, fields and samples). */
static ssize_t
s_index_diff(const emlio__tar_index_t *a, const emlio__tar_index_t *b)
{
    size_t n = a->n_samples < b->n_samples ? a->n_samples : b->n_samples;
    for (size_t i = 0; i < n; i++) {
        if (a->first[i + 1] - a->first[i] != b->first[i + 1] - b->first[i])
            return (ssize_t)i;
        for (uint32_t k = 0; k < a->first[i + 1] - a->first[i]; k++) {
            const emlio__tar_member_t *ma = &a->members[a->first[i] + k];
            const emlio__tar_member_t *mb = &b->members[b->first[i] + k];
            if (ma->offset != mb->offset || ma->len != mb->len ||
                strcmp(a->fields[ma->field], b->fields[mb->field]) != 0)
                return (ssize_t)i;
        }
    }
    return a->n_samples == b->n_samples ? -1 : (ssize_t)n;
}

/* An index is a hint: it is kept only when it says what a header walk of
 * the shard finds. Checking each listed member's header already touched
 * every header page, so the walk costs about what the check did; what it
 * adds is the members the index left out (samples silently dropped) and
 * the names in the headers themselves (a label member listed as the
 * image, a member moved to another sample). */
static int
s_check_index(emlio__tar_t *self, const char *idx_path)
{
    emlio__tar_index_t walked;
    char err[EMLIO_ERRMSG_LEN];
    int rc = s_scan(self->file.base, self->file.size, self->file.path, false,
                    &walked, err);
    if (rc < 0) {
        emlio__tar_index_release(&self->idx);
        return emlio__seterr(self->file.err, rc, "%s", err);
    }
    ssize_t at = s_index_diff(&self->idx, &walked);
    size_t listed = self->idx.n_samples, found = walked.n_samples;
    emlio__tar_index_release(&walked);
    if (at < 0)
        return (int)listed;
    emlio__tar_index_release(&self->idx);
    return emlio__seterr(self->file.err, EMLIO_EFORMAT,
                         "index '%s' does not describe '%s' (%zu samples "
                         "listed, %zu found; first difference at sample %zd)",
                         idx_path, self->file.path, listed, found, at);
}

int
emlio__tar_load_index(emlio__tar_t *self, const char *idx_path)
{
    assert(self && self->file.open);
    char *text;
    size_t got;
    int rc =
        emlio__mapfile_read_beside(&self->file, idx_path, true, &text, &got);
    if (rc < 0)
        return rc;
    emlio__tar_drop(self);
    rc = emlio__tar_parse_index(text, got, idx_path, self->file.base,
                                self->file.size, self->file.path, &self->idx,
                                self->file.err);
    emlio_free(text);
    if (rc >= 0)
        rc = s_check_index(self, idx_path);
    return rc;
}

int
emlio__tar_write_index(const emlio__tar_t *self, const char *idx_path)
{
    const emlio__tar_index_t *idx = &self->idx;
    if (!idx->names || idx->n_samples == 0)
        return -EINVAL;
    emlio_buf_t text = EMLIO_BUF_INIT;
    int rc = emlio_buf_addf(&text, "v1.2 %zu\n", idx->n_samples);
    for (size_t s = 0; s < idx->n_samples && rc == 0; s++) {
        for (uint32_t m = idx->first[s]; m < idx->first[s + 1] && rc == 0;
             m++) {
            const char *nm = idx->names[m];
            for (const char *c = nm; *c; c++)
                if (*c == ' ' || *c == '\n' || *c == '\t' || *c == '\r')
                    rc = -EINVAL;
            if (rc == 0)
                rc = emlio_buf_addf(&text, "%s%s %" PRIu64 " %" PRIu64 " %s",
                                    m == idx->first[s] ? "" : " ",
                                    idx->fields[idx->members[m].field],
                                    idx->members[m].offset, idx->members[m].len,
                                    nm);
        }
        if (rc == 0)
            rc = emlio_buf_addf(&text, "\n");
    }
    if (rc < 0) {
        emlio_buf_release(&text);
        return rc == -EINVAL ? rc : -ENOMEM;
    }
    rc = emlio__write_file_atomic(idx_path, text.data, text.len);
    emlio_buf_release(&text);
    return rc;
}

const char *
emlio__tar_path(const emlio__tar_t *self)
{
    return self->file.path;
}

const char *
emlio__tar_errmsg(const emlio__tar_t *self)
{
    return self->file.err;
}

size_t
emlio__tar_count(const emlio__tar_t *self)
{
    return self->idx.n_samples;
}

uint64_t
emlio__tar_size(const emlio__tar_t *self)
{
    return self->file.size;
}

const emlio__tar_index_t *
emlio__tar_index(const emlio__tar_t *self)
{
    emlio__tar_ready(self);
    return &self->idx;
}

uint64_t
emlio__tar_offset(const emlio__tar_t *self, size_t i)
{
    if (i >= self->idx.n_samples || emlio__tar_ready(self) < 0 ||
        self->idx.first[i] >= self->idx.n_members)
        return 0;
    return self->idx.members[self->idx.first[i]].offset;
}

static bool
s_image_field(const char *f)
{
    static const char *const images[] = { "jpg", "jpeg", "png",  "webp",
                                          "ppm", "pgm",  "tif",  "tiff",
                                          "bmp", "gif",  "image" };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(images); i++)
        if (strcmp(f, images[i]) == 0)
            return true;
    return false;
}

/* emlio__tar_find on an index already checked (the prune, which also
 * runs inside the first-read check, calls this one). */
static int
s_find(const emlio__tar_t *self, size_t i, const char *field, size_t *member)
{
    const emlio__tar_index_t *idx = &self->idx;
    if (i >= idx->n_samples)
        return EMLIO_ENOTFOUND;
    if (field) {
        for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++)
            if (strcmp(idx->fields[idx->members[m].field], field) == 0) {
                *member = m;
                return 0;
            }
        return -ENOENT;
    }
    bool found = false;
    for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++) {
        const char *f = idx->fields[idx->members[m].field];
        if (s_image_field(f)) {
            *member = m;
            return 0;
        }
        if (!found && strcmp(f, "cls") != 0) {
            *member = m;
            found = true;
        }
    }
    return found ? 0 : -ENOENT;
}

int
emlio__tar_find(const emlio__tar_t *self, size_t i, const char *field,
                size_t *member)
{
    /* A table that failed its check and could not be rebuilt (the shard
     * read by copying, not mapped) serves nothing until it is. */
    if (i < self->idx.n_samples && emlio__tar_ready(self) < 0)
        return EMLIO_EFORMAT;
    return s_find(self, i, field, member);
}

/* Whether sample i can be served as field says: a list "jpg,cls,json" (a
 * daemon's --fields) needs every member named; one field needs it; NULL
 * needs an image member. */
static bool
s_servable(const emlio__tar_t *self, size_t i, const char *field)
{
    const emlio__tar_index_t *idx = &self->idx;
    size_t m;
    if (!field)
        return s_find(self, i, NULL, &m) == 0 &&
               s_image_field(idx->fields[idx->members[m].field]);
    char one[EMLIO_TAR_MAX_NAME + 1];
    for (const char *p = field; *p;) {
        size_t n = strcspn(p, ",");
        if (n > EMLIO_TAR_MAX_NAME)
            return false; /* longer than any member's field */
        memcpy(one, p, n);
        one[n] = '\0';
        if (s_find(self, i, one, &m) != 0)
            return false;
        p += n + (p[n] == ',');
    }
    return true;
}

size_t
emlio__tar_prune_now(emlio__tar_t *self, const char *field, char *example,
                     size_t len)
{
    emlio__tar_index_t *idx = &self->idx;
    size_t kept = 0, dropped = 0;
    uint32_t out = 0;
    for (size_t i = 0; i < idx->n_samples; i++) {
        uint32_t a = idx->first[i], z = idx->first[i + 1];
        if (!s_servable(self, i, field)) {
            if (dropped++ == 0 && example) {
                /* The member's own name, from its ustar header. */
                const uint8_t *h =
                    self->file.base + idx->members[a].offset - BLOCK;
                snprintf(example, len, "'%.*s' in '%s' at offset %" PRIu64,
                         (int)emlio__tarh_strnlen(h, 100), (const char *)h,
                         self->file.path, idx->members[a].offset - BLOCK);
            }
            for (uint32_t k = a; idx->names && k < z; k++)
                emlio_free(idx->names[k]);
            continue;
        }
        idx->first[kept++] = out;
        for (uint32_t k = a; k < z; k++, out++) {
            idx->members[out] = idx->members[k];
            if (idx->names)
                idx->names[out] = idx->names[k];
        }
    }
    if (dropped) {
        idx->n_samples = kept;
        idx->n_members = out;
        idx->first[kept] = out;
    }
    return dropped;
}

const uint8_t *
emlio__tar_data(const emlio__tar_t *self, size_t member)
{
    return self->file.base + self->idx.members[member].offset;
}

int
emlio__tar_field(const emlio__tar_t *self, size_t i, const char *field,
                 const uint8_t **data, size_t *len)
{
    size_t m;
    int rc = emlio__tar_find(self, i, field, &m);
    if (rc < 0)
        return rc;
    *data = emlio__tar_data(self, m);
    *len = (size_t)self->idx.members[m].len;
    return 0;
}

int
emlio__tar_default_field(const emlio__tar_t *self, size_t i,
                         const uint8_t **data, size_t *len)
{
    return emlio__tar_field(self, i, NULL, data, len);
}

int64_t
emlio__tar_parse_label(const uint8_t *p, size_t n)
{
    size_t k = 0;
    while (k < n && (p[k] == ' ' || p[k] == '\t'))
        k++;
    bool neg = k < n && p[k] == '-';
    if (neg)
        k++;
    int64_t v = 0;
    size_t digits = 0;
    for (; k < n && p[k] >= '0' && p[k] <= '9'; k++, digits++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (p[k] - '0');
    }
    while (k < n &&
           (p[k] == ' ' || p[k] == '\n' || p[k] == '\r' || p[k] == '\t'))
        k++;
    if (!digits || k != n)
        return -1;
    return neg ? -v : v;
}

int64_t
emlio__tar_label(const emlio__tar_t *self, size_t i, const char *field)
{
    const uint8_t *p;
    size_t n;
    if (emlio__tar_field(self, i, field, &p, &n) < 0)
        return -1;
    return emlio__tar_parse_label(p, n);
}

bool
emlio__tar_header_ok(const uint8_t *h, uint64_t len)
{
    uint64_t hsize;
    return emlio__tarh_checksum_ok(h) && emlio__tarh_regular(h[156]) &&
           emlio__tarh_number(h + 124, 12, &hsize) &&
           (hsize == len || hsize == 0);
}

int
emlio__tar_blank(emlio__tar_t *self)
{
    return emlio__mapfile_blank(&self->file);
}

int
emlio__tar_advise(const emlio__tar_t *self, size_t first, size_t n, int advice)
{
    const emlio__tar_index_t *idx = &self->idx;
    if (!self->file.base || first >= idx->n_samples || n == 0)
        return 0;
    emlio__tar_ready(self);
    if (idx->first[first] == idx->first[EMLIO_MIN(first + n, idx->n_samples)])
        return 0; /* no members (a table that failed its check) */
    size_t last = EMLIO_MIN(first + n, idx->n_samples) - 1;
    const emlio__tar_member_t *a = &idx->members[idx->first[first]];
    const emlio__tar_member_t *z = &idx->members[idx->first[last + 1] - 1];
    /* Anything but "not needed" is "needed soon", as before. */
    return emlio__mapfile_advise(
        &self->file, a->offset - BLOCK, z->offset + z->len,
        advice == EMLIO_ADVISE_DONTNEED ? EMLIO_ADVISE_DONTNEED
                                        : EMLIO_ADVISE_WILLNEED);
}
