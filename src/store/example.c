/* example.c - zero-copy protobuf wire parsing and building of tf.train.Example.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "emlio/example.h"

/* Protobuf wire types. */
#define WT_VARINT 0
#define WT_I64    1
#define WT_LEN    2
#define WT_SGROUP 3
#define WT_EGROUP 4
#define WT_I32    5

/* Groups are the only recursive construct an Example can carry (inside
 * unknown fields); deeper nesting than this is an attack, not data. */
#define MAX_GROUP_DEPTH 32

/* A Feature as it is parsed: the kind set last, and the count and first
 * value of its list. */
typedef struct {
    int kind;
    size_t count;
    const uint8_t *bytes;
    size_t bytes_len;
    int64_t int64;
    float f32;
} s_feature_t;

/* Reads a varint at *pp (before end). Accepts the 10 bytes a 64-bit value
 * can take, not more. */
static int
s_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (p == end)
            return EMLIO_EPROTO;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 0);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return EMLIO_EPROTO;
}

static int
s_tag(const uint8_t **pp, const uint8_t *end, uint32_t *field, int *wt)
{
    uint64_t v;
    if (s_varint(pp, end, &v) < 0)
        return EMLIO_EPROTO;
    /* Field numbers are 1 .. 2^29 - 1; wire types 6 and 7 do not exist. */
    if (v >> 32 || (v >> 3) == 0 || (v & 7) > WT_I32)
        return EMLIO_EPROTO;
    *field = (uint32_t)(v >> 3);
    *wt = (int)(v & 7);
    return 0;
}

/* Reads a length-delimited payload, checking its length against end. */
static int
s_bytes(const uint8_t **pp, const uint8_t *end, const uint8_t **data,
        size_t *len)
{
    uint64_t n;
    if (s_varint(pp, end, &n) < 0 || n > (uint64_t)(end - *pp))
        return EMLIO_EPROTO;
    *data = *pp;
    *len = (size_t)n;
    *pp += n;
    return 0;
}

/* Skips the value of a field with the given wire type, whose tag has just
 * been read. A group runs until the end-group tag of the same field. */
static int
s_skip(const uint8_t **pp, const uint8_t *end, uint32_t field, int wt,
       int depth)
{
    const uint8_t *data;
    size_t len;
    uint64_t v;
    switch (wt) {
    case WT_VARINT:
        return s_varint(pp, end, &v);
    case WT_I64:
        if (end - *pp < 8)
            return EMLIO_EPROTO;
        *pp += 8;
        return 0;
    case WT_I32:
        if (end - *pp < 4)
            return EMLIO_EPROTO;
        *pp += 4;
        return 0;
    case WT_LEN:
        return s_bytes(pp, end, &data, &len);
    case WT_SGROUP:
        if (depth >= MAX_GROUP_DEPTH)
            return EMLIO_EPROTO;
        for (;;) {
            uint32_t inner;
            int inner_wt;
            if (s_tag(pp, end, &inner, &inner_wt) < 0)
                return EMLIO_EPROTO;
            if (inner_wt == WT_EGROUP)
                return inner == field ? 0 : EMLIO_EPROTO;
            if (s_skip(pp, end, inner, inner_wt, depth + 1) < 0)
                return EMLIO_EPROTO;
        }
    default: /* an end-group tag nobody opened */
        return EMLIO_EPROTO;
    }
}

static float
s_f32(const uint8_t *p)
{
    uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                    (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* Parses a BytesList, FloatList or Int64List (kind says which) from
 * p[0, len) into out's count and first value. Repeated scalars may come
 * packed (one length-delimited run) or unpacked (one tag per value), and a
 * writer may mix both, so both are counted. */
static int
s_parse_list(const uint8_t *p, size_t len, int kind, s_feature_t *out)
{
    const uint8_t *end = p + len;
    while (p < end) {
        uint32_t field;
        int wt;
        if (s_tag(&p, end, &field, &wt) < 0)
            return EMLIO_EPROTO;
        const uint8_t *data;
        size_t n;
        uint64_t v;
        if (field != 1) {
            if (s_skip(&p, end, field, wt, 0) < 0)
                return EMLIO_EPROTO;
        } else if (kind == EMLIO_FEATURE_BYTES && wt == WT_LEN) {
            if (s_bytes(&p, end, &data, &n) < 0)
                return EMLIO_EPROTO;
            if (out->count++ == 0) {
                out->bytes = data;
                out->bytes_len = n;
            }
        } else if (kind == EMLIO_FEATURE_FLOAT && wt == WT_I32) {
            if (end - p < 4)
                return EMLIO_EPROTO;
            if (out->count++ == 0)
                out->f32 = s_f32(p);
            p += 4;
        } else if (kind == EMLIO_FEATURE_FLOAT && wt == WT_LEN) {
            if (s_bytes(&p, end, &data, &n) < 0 || n % 4)
                return EMLIO_EPROTO;
            if (out->count == 0 && n)
                out->f32 = s_f32(data);
            out->count += n / 4;
        } else if (kind == EMLIO_FEATURE_INT64 && wt == WT_VARINT) {
            if (s_varint(&p, end, &v) < 0)
                return EMLIO_EPROTO;
            if (out->count++ == 0)
                out->int64 = (int64_t)v;
        } else if (kind == EMLIO_FEATURE_INT64 && wt == WT_LEN) {
            if (s_bytes(&p, end, &data, &n) < 0)
                return EMLIO_EPROTO;
            const uint8_t *q = data;
            while (q < data + n) {
                if (s_varint(&q, data + n, &v) < 0)
                    return EMLIO_EPROTO;
                if (out->count++ == 0)
                    out->int64 = (int64_t)v;
            }
        } else {
            /* Field 1 with a wire type its schema does not allow: protobuf
             * parsers keep such a field as unknown, and so do we. */
            if (s_skip(&p, end, field, wt, 0) < 0)
                return EMLIO_EPROTO;
        }
    }
    return 0;
}

/* Merges a serialized Feature into out. Its lists form a oneof: a member
 * different from the current one replaces it, the same member merges into
 * it (protobuf's merge rule for repeated message fields). */
static int
s_parse_feature(const uint8_t *p, size_t len, s_feature_t *out)
{
    const uint8_t *end = p + len;
    while (p < end) {
        uint32_t field;
        int wt;
        if (s_tag(&p, end, &field, &wt) < 0)
            return EMLIO_EPROTO;
        if (field < EMLIO_FEATURE_BYTES || field > EMLIO_FEATURE_INT64 ||
            wt != WT_LEN) {
            if (s_skip(&p, end, field, wt, 0) < 0)
                return EMLIO_EPROTO;
            continue;
        }
        const uint8_t *data;
        size_t n;
        if (s_bytes(&p, end, &data, &n) < 0)
            return EMLIO_EPROTO;
        if (out->kind != (int)field) {
            memset(out, 0, sizeof(*out));
            out->kind = (int)field;
        }
        if (s_parse_list(data, n, out->kind, out) < 0)
            return EMLIO_EPROTO;
    }
    return 0;
}

/* Called once per map entry with its key and parsed Feature. */
typedef int s_entry_fn(void *userdata, const uint8_t *key, size_t key_len,
                       const s_feature_t *feature);

/* Parses one Features map entry: key = 1, value = 2. A missing key is the
 * empty string and a missing value an empty Feature, as in protobuf. */
static int
s_parse_entry(const uint8_t *p, size_t len, s_entry_fn *fn, void *userdata)
{
    const uint8_t *end = p + len;
    const uint8_t *key = p; /* any non-NULL pointer for the empty key */
    size_t key_len = 0;
    s_feature_t feature = { 0 };
    while (p < end) {
        uint32_t field;
        int wt;
        if (s_tag(&p, end, &field, &wt) < 0)
            return EMLIO_EPROTO;
        const uint8_t *data;
        size_t n;
        if (field == 1 && wt == WT_LEN) {
            if (s_bytes(&p, end, &key, &key_len) < 0)
                return EMLIO_EPROTO;
        } else if (field == 2 && wt == WT_LEN) {
            if (s_bytes(&p, end, &data, &n) < 0 ||
                s_parse_feature(data, n, &feature) < 0)
                return EMLIO_EPROTO;
        } else if (s_skip(&p, end, field, wt, 0) < 0) {
            return EMLIO_EPROTO;
        }
    }
    return fn(userdata, key, key_len, &feature);
}

/* Walks every map entry of the Example in wire order. Example.features may
 * appear more than once (concatenated serializations merge), so every
 * occurrence is walked. Stops at fn's first non-zero return. */
static int
s_walk(const uint8_t *buf, size_t len, s_entry_fn *fn, void *userdata)
{
    /* buf may be NULL for an empty message, and NULL + 0 is undefined. */
    if (len == 0)
        return 0;
    const uint8_t *p = buf;
    const uint8_t *end = buf + len;
    while (p < end) {
        uint32_t field;
        int wt;
        if (s_tag(&p, end, &field, &wt) < 0)
            return EMLIO_EPROTO;
        if (field != 1 || wt != WT_LEN) {
            if (s_skip(&p, end, field, wt, 0) < 0)
                return EMLIO_EPROTO;
            continue;
        }
        const uint8_t *feats;
        size_t feats_len;
        if (s_bytes(&p, end, &feats, &feats_len) < 0)
            return EMLIO_EPROTO;
        const uint8_t *q = feats;
        const uint8_t *feats_end = feats + feats_len;
        while (q < feats_end) {
            if (s_tag(&q, feats_end, &field, &wt) < 0)
                return EMLIO_EPROTO;
            if (field != 1 || wt != WT_LEN) {
                if (s_skip(&q, feats_end, field, wt, 0) < 0)
                    return EMLIO_EPROTO;
                continue;
            }
            const uint8_t *entry;
            size_t entry_len;
            if (s_bytes(&q, feats_end, &entry, &entry_len) < 0)
                return EMLIO_EPROTO;
            int rc = s_parse_entry(entry, entry_len, fn, userdata);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

typedef struct {
    emlio_example_field_t *fields;
    size_t n;
} s_lookup_t;

static int
s_lookup_entry(void *userdata, const uint8_t *key, size_t key_len,
               const s_feature_t *feature)
{
    s_lookup_t *lookup = userdata;
    for (size_t i = 0; i < lookup->n; i++) {
        emlio_example_field_t *f = &lookup->fields[i];
        if (f->key_len != key_len ||
            (key_len && memcmp(f->key, key, key_len) != 0))
            continue;
        /* A later entry with the same key replaces the earlier one. */
        f->kind = feature->kind;
        f->count = feature->count;
        f->bytes = feature->bytes;
        f->bytes_len = feature->bytes_len;
        f->int64 = feature->int64;
        f->f32 = feature->f32;
    }
    return 0;
}

static void
s_clear_fields(emlio_example_field_t *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fields[i].kind = EMLIO_FEATURE_NONE;
        fields[i].count = 0;
        fields[i].bytes = NULL;
        fields[i].bytes_len = 0;
        fields[i].int64 = 0;
        fields[i].f32 = 0.0f;
    }
}

int
emlio_example_parse(const uint8_t *buf, size_t len,
                    emlio_example_field_t *fields, size_t n)
{
    assert((buf || len == 0) && (fields || n == 0));
    s_clear_fields(fields, n);
    s_lookup_t lookup = { fields, n };
    if (s_walk(buf, len, s_lookup_entry, &lookup) < 0) {
        /* Leave no half-filled results behind a failed parse. */
        s_clear_fields(fields, n);
        return EMLIO_EPROTO;
    }
    int found = 0;
    for (size_t i = 0; i < n; i++)
        if (fields[i].kind != EMLIO_FEATURE_NONE)
            found++;
    return found;
}

typedef struct {
    emlio_example_key_fn *fn;
    void *userdata;
} s_foreach_t;

static int
s_foreach_entry(void *userdata, const uint8_t *key, size_t key_len,
                const s_feature_t *feature)
{
    s_foreach_t *each = userdata;
    return each->fn(each->userdata, key, key_len, feature->kind,
                    feature->count);
}

int
emlio_example_foreach(const uint8_t *buf, size_t len, emlio_example_key_fn *fn,
                      void *userdata)
{
    assert((buf || len == 0) && fn);
    s_foreach_t each = { fn, userdata };
    /* Entries are reported as they are parsed, so fn may already have seen
     * some keys when a later byte turns out malformed. */
    return s_walk(buf, len, s_foreach_entry, &each);
}

static size_t
s_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v as a varint at p and returns the bytes written. */
static size_t
s_put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Size of a length-delimited field (one-byte tag) with a payload of n. */
static size_t
s_field_len(size_t n)
{
    return 1 + s_varint_len(n) + n;
}

/* Writes the tag byte and length of a length-delimited field. */
static size_t
s_put_header(uint8_t *p, uint32_t field, size_t n)
{
    p[0] = (uint8_t)(field << 3 | WT_LEN);
    return 1 + s_put_varint(p + 1, n);
}

int
emlio_example_build(emlio_buf_t *out, const char *bytes_key,
                    const uint8_t *bytes, size_t bytes_len,
                    const char *int64_key, int64_t int64)
{
    assert(out && bytes_key && int64_key && (bytes || bytes_len == 0));
    size_t bkey_len = strlen(bytes_key);
    size_t ikey_len = strlen(int64_key);
    /* Sizes from the inside out: a packed Int64List of one value, as
     * TensorFlow writes it. Sizes stay far from SIZE_MAX: bytes_len
     * describes memory the caller already holds. */
    if (bytes_len > SIZE_MAX / 2)
        return EMLIO_ENOMEM;
    size_t blist = s_field_len(bytes_len); /* BytesList.value */
    size_t bfeat = s_field_len(blist);     /* Feature.bytes_list */
    size_t bentry = s_field_len(bkey_len) + s_field_len(bfeat);
    size_t packed = s_varint_len((uint64_t)int64);
    size_t ilist = s_field_len(packed); /* Int64List.value */
    size_t ifeat = s_field_len(ilist);  /* Feature.int64_list */
    size_t ientry = s_field_len(ikey_len) + s_field_len(ifeat);
    size_t feats = s_field_len(bentry) + s_field_len(ientry);
    size_t total = s_field_len(feats);
    int rc = emlio_buf_grow(out, total);
    if (rc < 0)
        return rc;
    uint8_t *start = out->data + out->len;
    uint8_t *p = start;
    p += s_put_header(p, 1, feats);  /* Example.features */
    p += s_put_header(p, 1, bentry); /* Features.feature entry */
    p += s_put_header(p, 1, bkey_len);
    memcpy(p, bytes_key, bkey_len);
    p += bkey_len;
    p += s_put_header(p, 2, bfeat);
    p += s_put_header(p, EMLIO_FEATURE_BYTES, blist);
    p += s_put_header(p, 1, bytes_len);
    if (bytes_len)
        memcpy(p, bytes, bytes_len);
    p += bytes_len;
    p += s_put_header(p, 1, ientry);
    p += s_put_header(p, 1, ikey_len);
    memcpy(p, int64_key, ikey_len);
    p += ikey_len;
    p += s_put_header(p, 2, ifeat);
    p += s_put_header(p, EMLIO_FEATURE_INT64, ilist);
    p += s_put_header(p, 1, packed);
    p += s_put_varint(p, (uint64_t)int64);
    assert((size_t)(p - start) == total);
    out->len += total;
    out->data[out->len] = 0; /* the spare byte emlio_buf_grow keeps */
    return 0;
}
