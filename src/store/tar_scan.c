/* tar_scan.c - reading a tar archive: the parts of a header (numbers,
 * checksums, types, pax records), the walk of an archive's headers into
 * members grouped by sample, and the parse of a wds2idx index checked
 * against the archive (the parsers of untrusted bytes, fuzzed on memory).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "tar.h"

#define PAX_MAX_BYTES     ((uint64_t)1 << 20)
#define DALI_INDEX_PREFIX "v1.2 "

/* ---- the parts of a header -------------------------------------------- */

/* Octal (NUL/space padded) or GNU base-256 number field. */
bool
emlio__tarh_number(const uint8_t *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (p[0] & 0x80) { /* base-256, big endian, positive only */
        if (p[0] & 0x40)
            return false;
        v = p[0] & 0x3f;
        for (size_t i = 1; i < n; i++) {
            if (v >> 55)
                return false;
            v = v << 8 | p[i];
        }
        *out = v;
        return true;
    }
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\0'))
        i++;
    bool digits = false;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) {
        if (v >> 60)
            return false;
        v = v << 3 | (uint64_t)(p[i] - '0');
        digits = true;
    }
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != '\0')
            return false;
    if (!digits)
        v = 0;
    *out = v;
    return true;
}

bool
emlio__tarh_checksum_ok(const uint8_t *h)
{
    uint64_t stored;
    if (!emlio__tarh_number(h + 148, 8, &stored))
        return false;
    uint64_t sum = 0;
    int64_t ssum = 0;
    for (size_t i = 0; i < EMLIO__TAR_BLOCK; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
        sum += c;
        ssum += (int8_t)c;
    }
    return stored == sum || (int64_t)stored == ssum;
}

bool
emlio__tarh_zero_block(const uint8_t *h)
{
    for (size_t i = 0; i < EMLIO__TAR_BLOCK; i++)
        if (h[i])
            return false;
    return true;
}

size_t
emlio__tarh_strnlen(const uint8_t *p, size_t n)
{
    const uint8_t *z = memchr(p, 0, n);
    return z ? (size_t)(z - p) : n;
}

bool
emlio__tarh_regular(uint8_t type)
{
    return type == '0' || type == '\0' || type == '7';
}

/* Reads the "path" and "size" records of a pax extended header
 * data[0, len): "<len> <key>=<value>\n" each. */
int
emlio__tarh_pax(const uint8_t *data, size_t len, char *path, size_t *path_len,
                bool *have_path, uint64_t *size, bool *have_size)
{
    size_t off = 0;
    while (off < len) {
        uint64_t rec = 0;
        size_t i = off;
        while (i < len && data[i] >= '0' && data[i] <= '9' && rec < len) {
            rec = rec * 10 + (uint64_t)(data[i] - '0');
            i++;
        }
        if (i == off || i >= len || data[i] != ' ' || rec > len - off ||
            rec < (uint64_t)(i - off) + 3 || data[off + rec - 1] != '\n')
            return EMLIO_EFORMAT;
        const uint8_t *kv = data + i + 1;
        size_t kv_len = (size_t)(off + rec - 1 - (i + 1));
        const uint8_t *eq = memchr(kv, '=', kv_len);
        if (!eq)
            return EMLIO_EFORMAT;
        size_t klen = (size_t)(eq - kv);
        const uint8_t *val = eq + 1;
        size_t vlen = kv_len - klen - 1;
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            if (vlen == 0 || vlen >= EMLIO_TAR_MAX_NAME)
                return EMLIO_EFORMAT;
            memcpy(path, val, vlen);
            *path_len = vlen;
            *have_path = true;
        } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
            uint64_t v = 0;
            if (vlen == 0 || vlen > 19)
                return EMLIO_EFORMAT;
            for (size_t k = 0; k < vlen; k++) {
                if (val[k] < '0' || val[k] > '9')
                    return EMLIO_EFORMAT;
                v = v * 10 + (uint64_t)(val[k] - '0');
            }
            *size = v;
            *have_size = true;
        }
        off += (size_t)rec;
    }
    return 0;
}

bool
emlio__tar_header_ok(const uint8_t *h, uint64_t len)
{
    uint64_t hsize;
    return emlio__tarh_checksum_ok(h) && emlio__tarh_regular(h[156]) &&
           emlio__tarh_number(h + 124, 12, &hsize) &&
           (hsize == len || hsize == 0);
}

/* ---- walking an archive ------------------------------------------------- */

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
        /* Room for this sample and the end marker after it. */
        if (emlio__grow(&idx->first, &b->cap_samples, idx->n_samples + 1,
                        sizeof(*idx->first), 64) < 0)
            return EMLIO_ENOMEM;
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
        char *copy = emlio__memdupz(path, len);
        if (!copy)
            return EMLIO_ENOMEM;
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

int
emlio__tar_walk(const uint8_t *base, size_t size, const char *name,
                bool keep_names, emlio__tar_index_t *out, char *errbuf)
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
        if (size - off < EMLIO__TAR_BLOCK) {
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
        uint64_t data = off + EMLIO__TAR_BLOCK;
        if (len > size - data) {
            rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                               "truncated tar member in '%s' at offset "
                               "%" PRIu64 ": %" PRIu64 " bytes of data, "
                               "%" PRIu64 " left in the file",
                               name, off, len, (uint64_t)(size - data));
            break;
        }
        uint64_t padded =
            (len + EMLIO__TAR_BLOCK - 1) / EMLIO__TAR_BLOCK * EMLIO__TAR_BLOCK;
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
    return emlio__tar_walk(base, size, name, true, out, errbuf);
}

/* ---- DALI wds2idx v1.2 ------------------------------------------------ */

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
            if (off % EMLIO__TAR_BLOCK || off < last_end + EMLIO__TAR_BLOCK ||
                off > size || msize > size - off ||
                !emlio__tarh_checksum_ok(base + off - EMLIO__TAR_BLOCK) ||
                !emlio__tarh_regular(base[off - EMLIO__TAR_BLOCK + 156])) {
                rc = EMLIO_EFORMAT;
                break;
            }
            uint64_t hsize;
            if (!emlio__tarh_number(base + off - EMLIO__TAR_BLOCK + 124, 12,
                                    &hsize) ||
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
                              errbuf, off - EMLIO__TAR_BLOCK);
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
