/* tfrecord_scan.c - TFRecord framing as bytes: the scan of a shard and
 * the parse of a DALI index (the parsers of untrusted bytes, fuzzed on
 * memory), and the framing of one record for writers.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "tfrecord.h"

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
    if (emlio__grow(&v->locs, &v->cap, v->n, sizeof(*v->locs), 64) < 0)
        return EMLIO_ENOMEM;
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
