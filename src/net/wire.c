/* wire.c - encoding (msgpack-c) and bounded decoding of protocol messages.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <msgpack.h>

#include "wire.h"

/* ---- encoding ---------------------------------------------------------- */

static int
s_buf_write(void *data, const char *bytes, size_t len)
{
    return emlio_buf_add(data, bytes, len) == 0 ? 0 : -1;
}

static int
s_pack_key(msgpack_packer *pk, const char *key)
{
    size_t len = strlen(key);
    return msgpack_pack_str(pk, len) | msgpack_pack_str_body(pk, key, len);
}

static int
s_pack_cstr(msgpack_packer *pk, const char *s)
{
    return s_pack_key(pk, s ? s : "");
}

/* The packer returns our write callback's -1 from every call that could not
 * grow the buffer; the encoders OR those results together. */
static int
s_finish(int failed)
{
    return failed ? EMLIO_ENOMEM : 0;
}

/* Starts a header in out (cleared first): a map of `fields` entries whose
 * first is the message type. Returns non-zero when out could not grow. */
static int
s_begin(emlio_buf_t *out, msgpack_packer *pk, size_t fields, int type)
{
    emlio_buf_clear(out);
    msgpack_packer_init(pk, out, s_buf_write);
    return msgpack_pack_map(pk, fields) | s_pack_key(pk, "t") |
           msgpack_pack_uint8(pk, (uint8_t)type);
}

static int
s_pack_strs(msgpack_packer *pk, const char *key, char *const *strs, size_t n)
{
    int failed = s_pack_key(pk, key);
    failed |= msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        failed |= s_pack_cstr(pk, strs[i]);
    return failed;
}

int
emlio__wire_encode_hello(emlio_buf_t *out, const emlio__wire_hello_t *h)
{
    msgpack_packer pk;
    bool job = h->job && *h->job;
    int failed = s_begin(out, &pk,
                         (h->session ? 6 : 3) + job + (h->weight > 0) +
                             h->share + (h->n_fields > 0),
                         EMLIO_MSG_HELLO);
    if (h->n_fields)
        failed |= s_pack_strs(&pk, "fields", h->fields, h->n_fields);
    if (h->share) {
        failed |= s_pack_key(&pk, "share");
        failed |= msgpack_pack_true(&pk);
    }
    if (job) {
        failed |= s_pack_key(&pk, "job");
        failed |= s_pack_cstr(&pk, h->job);
    }
    if (h->weight > 0) {
        failed |= s_pack_key(&pk, "weight");
        failed |= msgpack_pack_uint64(&pk, h->weight);
    }
    failed |= s_pack_key(&pk, "v");
    failed |= msgpack_pack_uint64(&pk, EMLIO_WIRE_VERSION);
    failed |= s_pack_key(&pk, "name");
    failed |= s_pack_cstr(&pk, h->name);
    if (h->session) {
        failed |= s_pack_key(&pk, "session");
        failed |= msgpack_pack_uint64(&pk, h->session);
        failed |= s_pack_key(&pk, "stream");
        failed |= msgpack_pack_uint32(&pk, h->stream);
        failed |= s_pack_key(&pk, "id");
        failed |= msgpack_pack_uint64(&pk, h->id);
    }
    return s_finish(failed);
}

int
emlio__wire_encode_joined(emlio_buf_t *out, uint64_t id, const char *dataset)
{
    msgpack_packer pk;
    int failed = s_begin(out, &pk, 6, EMLIO_MSG_WELCOME);
    failed |= s_pack_key(&pk, "v");
    failed |= msgpack_pack_uint64(&pk, EMLIO_WIRE_VERSION);
    failed |= s_pack_key(&pk, "id");
    failed |= msgpack_pack_uint64(&pk, id);
    failed |= s_pack_key(&pk, "dataset");
    failed |= s_pack_cstr(&pk, dataset);
    failed |= s_pack_key(&pk, "joined");
    failed |= msgpack_pack_true(&pk);
    failed |= s_pack_key(&pk, "shards");
    failed |= msgpack_pack_array(&pk, 0);
    return s_finish(failed);
}

/* WELCOME's keys with a uint64 value, in the order they are sent. */
static int
s_pack_welcome_limits(msgpack_packer *pk, const emlio__wire_welcome_t *w)
{
    int failed = s_pack_key(pk, "max_batch");
    failed |= msgpack_pack_uint64(pk, w->max_batch);
    failed |= s_pack_key(pk, "max_credit");
    failed |= msgpack_pack_uint64(pk, w->max_credit);
    failed |= s_pack_key(pk, "max_streams");
    failed |= msgpack_pack_uint64(pk, w->max_streams);
    failed |= s_pack_key(pk, "sndbuf");
    failed |= msgpack_pack_uint64(pk, w->sndbuf);
    failed |= s_pack_key(pk, "xf_threads");
    failed |= msgpack_pack_uint64(pk, w->xf_threads);
    failed |= s_pack_key(pk, "core_mw");
    failed |= msgpack_pack_uint64(pk, w->core_mw);
    return failed;
}

int
emlio__wire_encode_welcome(emlio_buf_t *out, const emlio__wire_welcome_t *w)
{
    msgpack_packer pk;
    size_t keys = 11 + (w->n_fields > 0) + (w->n_classes > 0) +
                  (w->format != NULL) + (w->max_copy_bytes > 0) +
                  (w->share_window > 0) + w->share_all;
    int failed = s_begin(out, &pk, keys, EMLIO_MSG_WELCOME);
    failed |= s_pack_key(&pk, "v");
    failed |= msgpack_pack_uint64(&pk, EMLIO_WIRE_VERSION);
    if (w->share_window) {
        failed |= s_pack_key(&pk, "share_window");
        failed |= msgpack_pack_uint64(&pk, w->share_window);
    }
    if (w->share_all) {
        failed |= s_pack_key(&pk, "share");
        failed |= msgpack_pack_true(&pk);
    }
    if (w->max_copy_bytes) {
        failed |= s_pack_key(&pk, "max_copy_bytes");
        failed |= msgpack_pack_uint64(&pk, w->max_copy_bytes);
    }
    if (w->format) {
        failed |= s_pack_key(&pk, "format");
        failed |= s_pack_cstr(&pk, w->format);
    }
    if (w->n_classes)
        failed |= s_pack_strs(&pk, "classes", w->classes, w->n_classes);
    if (w->n_fields)
        failed |= s_pack_strs(&pk, "fields", w->fields, w->n_fields);
    failed |= s_pack_key(&pk, "name");
    failed |= s_pack_cstr(&pk, w->name);
    failed |= s_pack_key(&pk, "dataset");
    failed |= s_pack_cstr(&pk, w->dataset);
    failed |= s_pack_welcome_limits(&pk, w);
    failed |= s_pack_key(&pk, "shards");
    failed |= msgpack_pack_array(&pk, w->n_shards);
    for (size_t i = 0; i < w->n_shards; i++) {
        const emlio__wire_shard_t *sh = &w->shards[i];
        failed |= msgpack_pack_array(&pk, sh->digest ? 4 : 3);
        failed |= msgpack_pack_str(&pk, sh->name_len);
        failed |= msgpack_pack_str_body(&pk, sh->name, sh->name_len);
        failed |= msgpack_pack_uint64(&pk, sh->records);
        failed |= msgpack_pack_uint64(&pk, sh->bytes);
        if (sh->digest)
            failed |= msgpack_pack_uint64(&pk, sh->digest);
    }
    return s_finish(failed);
}

int
emlio__wire_welcome_add_cursor(emlio_buf_t *out, const emlio_buf_t *base,
                               uint64_t segs, uint64_t cursor)
{
    const uint8_t *p = base->data;
    size_t len = base->len, head;
    uint64_t n;
    /* The base's map header: fixmap, map 16 or map 32. */
    if (len >= 1 && (p[0] & 0xf0) == 0x80) {
        n = p[0] & 0x0f;
        head = 1;
    } else if (len >= 3 && p[0] == 0xde) {
        n = (uint64_t)p[1] << 8 | p[2];
        head = 3;
    } else if (len >= 5 && p[0] == 0xdf) {
        n = (uint64_t)p[1] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 8 |
            p[4];
        head = 5;
    } else {
        return EMLIO_EPROTO;
    }
    if (n + 2 > UINT32_MAX)
        return EMLIO_EPROTO;
    msgpack_packer pk;
    emlio_buf_clear(out);
    msgpack_packer_init(&pk, out, s_buf_write);
    int failed = msgpack_pack_map(&pk, (size_t)n + 2);
    failed |= emlio_buf_add(out, p + head, len - head) < 0;
    failed |= s_pack_key(&pk, "share_segs");
    failed |= msgpack_pack_uint64(&pk, segs);
    failed |= s_pack_key(&pk, "share_cursor");
    failed |= msgpack_pack_uint64(&pk, cursor);
    return s_finish(failed);
}

int
emlio__wire_encode_get(emlio_buf_t *out, uint64_t id, const char *dataset,
                       const emlio__wire_item_t *items, size_t n,
                       const emlio__wire_xf_t *xf)
{
    msgpack_packer pk;
    bool with_xf = xf && xf->spec;
    bool unchecked = xf && xf->unchecked;
    bool pipelined = xf && xf->pipelined;
    bool cursor = xf && xf->segs;
    bool describe = xf && xf->describe;
    int failed = s_begin(out, &pk,
                         (with_xf ? 7 : 4) + unchecked + pipelined + describe +
                             2 * cursor,
                         EMLIO_MSG_GET);
    failed |= s_pack_key(&pk, "id");
    failed |= msgpack_pack_uint64(&pk, id);
    failed |= s_pack_key(&pk, "dataset");
    failed |= s_pack_cstr(&pk, dataset);
    if (with_xf) {
        failed |= s_pack_key(&pk, "transform");
        failed |= s_pack_cstr(&pk, xf->spec);
        failed |= s_pack_key(&pk, "seed");
        failed |= msgpack_pack_uint64(&pk, xf->seed);
        failed |= s_pack_key(&pk, "epoch");
        failed |= msgpack_pack_uint64(&pk, xf->epoch);
    }
    if (unchecked) {
        failed |= s_pack_key(&pk, "unchecked");
        failed |= msgpack_pack_true(&pk);
    }
    if (pipelined) {
        failed |= s_pack_key(&pk, "pipelined");
        failed |= msgpack_pack_true(&pk);
    }
    if (describe) {
        failed |= s_pack_key(&pk, "describe");
        failed |= msgpack_pack_true(&pk);
    }
    if (cursor) {
        failed |= s_pack_key(&pk, "segs");
        failed |= msgpack_pack_uint64(&pk, xf->segs);
        failed |= s_pack_key(&pk, "cursor");
        failed |= msgpack_pack_uint64(&pk, xf->cursor);
    }
    /* A flat [shard, record, shard, record, ...] array: half the framing of
     * an array of pairs, and trivially bounded when decoding. */
    failed |= s_pack_key(&pk, "items");
    failed |= msgpack_pack_array(&pk, 2 * n);
    for (size_t i = 0; i < n; i++) {
        failed |= msgpack_pack_uint32(&pk, items[i].shard);
        failed |= msgpack_pack_uint64(&pk, items[i].record);
    }
    return s_finish(failed);
}

/* Flat quadruples [shard, record, label, crc32c] per sample. */
static int
s_pack_samples(msgpack_packer *pk, const emlio__wire_sample_t *samples,
               size_t n)
{
    int failed = s_pack_key(pk, "samples");
    failed |= msgpack_pack_array(pk, 4 * n);
    for (size_t i = 0; i < n; i++) {
        failed |= msgpack_pack_uint32(pk, samples[i].shard);
        failed |= msgpack_pack_uint64(pk, samples[i].record);
        failed |= msgpack_pack_int64(pk, samples[i].label);
        failed |= msgpack_pack_uint32(pk, samples[i].crc);
    }
    return failed;
}

/* The optional keys of a BATCH about the device: "disk" (0..100) and
 * "rd", each unless left out. */
static int
s_io_keys(emlio__wire_io_t io)
{
    return (io.disk >= 0) + (io.read > 0) + (io.shared > 0) +
           (io.where != NULL);
}

/* The optional keys of a BATCH of n samples (s_io_keys counts them). */
static int
s_pack_io(msgpack_packer *pk, emlio__wire_io_t io, size_t n)
{
    int failed = 0;
    if (io.where) {
        failed |= s_pack_key(pk, "where");
        failed |= msgpack_pack_array(pk, n);
        for (size_t i = 0; i < n; i++) {
            const char *w = io.where[i] ? io.where[i] : "";
            size_t len = EMLIO_MIN(strlen(w), (size_t)EMLIO_WIRE_MAX_WHERE);
            failed |= msgpack_pack_str(pk, len);
            failed |= msgpack_pack_str_body(pk, w, len);
        }
    }
    if (io.disk >= 0) {
        failed |= s_pack_key(pk, "disk");
        failed |= msgpack_pack_uint8(pk, (uint8_t)EMLIO_MIN(io.disk, 100));
    }
    if (io.read > 0) {
        failed |= s_pack_key(pk, "rd");
        failed |= msgpack_pack_uint64(pk, io.read);
    }
    if (io.shared > 0) {
        failed |= s_pack_key(pk, "sh");
        failed |= msgpack_pack_uint64(pk, io.shared);
    }
    return failed;
}

int
emlio__wire_encode_batch(emlio_buf_t *out, uint64_t id,
                         const emlio__wire_sample_t *samples, size_t n,
                         const emlio__wire_span_t *spans, size_t n_spans,
                         emlio__wire_io_t io)
{
    msgpack_packer pk;
    int failed = s_begin(out, &pk, 4 + s_io_keys(io), EMLIO_MSG_BATCH);
    failed |= s_pack_key(&pk, "id");
    failed |= msgpack_pack_uint64(&pk, id);
    failed |= s_pack_samples(&pk, samples, n);
    failed |= s_pack_io(&pk, io, n);
    /* Flat [offset, length] pairs; offset -1: the span's own frame. */
    failed |= s_pack_key(&pk, "pack");
    failed |= msgpack_pack_array(&pk, 2 * n_spans);
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[i].off == EMLIO_WIRE_PACK_OWN)
            failed |= msgpack_pack_int64(&pk, -1);
        else
            failed |= msgpack_pack_uint64(&pk, spans[i].off);
        failed |= msgpack_pack_uint64(&pk, spans[i].len);
    }
    return s_finish(failed);
}

int
emlio__wire_encode_batch_tensor(emlio_buf_t *out, uint64_t id,
                                const emlio__wire_sample_t *samples, size_t n,
                                const emlio__wire_tensor_t *t,
                                emlio__wire_io_t io)
{
    msgpack_packer pk;
    int failed = s_begin(out, &pk, 5 + s_io_keys(io), EMLIO_MSG_BATCH);
    failed |= s_pack_key(&pk, "id");
    failed |= msgpack_pack_uint64(&pk, id);
    failed |= s_pack_io(&pk, io, n);
    failed |= s_pack_key(&pk, "shape");
    failed |= msgpack_pack_array(&pk, 4);
    failed |= msgpack_pack_uint64(&pk, n);
    failed |= msgpack_pack_uint32(&pk, t->height);
    failed |= msgpack_pack_uint32(&pk, t->width);
    failed |= msgpack_pack_uint32(&pk, t->channels);
    failed |= s_pack_key(&pk, "xf_ns");
    failed |= msgpack_pack_uint64(&pk, t->xf_ns);
    failed |= s_pack_samples(&pk, samples, n);
    return s_finish(failed);
}

int
emlio__wire_encode_error(emlio_buf_t *out, uint64_t id, int code,
                         const char *text)
{
    msgpack_packer pk;
    int failed = s_begin(out, &pk, 4, EMLIO_MSG_ERROR);
    failed |= s_pack_key(&pk, "id");
    failed |= msgpack_pack_uint64(&pk, id);
    failed |= s_pack_key(&pk, "code");
    failed |= msgpack_pack_int64(&pk, code);
    failed |= s_pack_key(&pk, "msg");
    failed |= s_pack_cstr(&pk, text);
    return s_finish(failed);
}

/* ---- decoding ---------------------------------------------------------- */

/* A cursor over untrusted msgpack bytes. Every read checks the remaining
 * length first; a failed read sets err and makes all later reads fail. */
typedef struct s_reader {
    const uint8_t *p;
    const uint8_t *end;
    char *err;
    bool failed;
} s_reader_t;

#define S_MAX_DEPTH 8

static bool
s_fail(s_reader_t *r, const char *what)
{
    if (!r->failed && r->err)
        snprintf(r->err, EMLIO_ERRMSG_LEN, "malformed message: %s", what);
    r->failed = true;
    return false;
}

static bool
s_need(s_reader_t *r, size_t n)
{
    if (r->failed)
        return false;
    if ((size_t)(r->end - r->p) < n)
        return s_fail(r, "truncated");
    return true;
}

static uint64_t
s_be(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Reads a big-endian length of n bytes following the type byte. */
static bool
s_read_be(s_reader_t *r, size_t n, uint64_t *out)
{
    if (!s_need(r, n))
        return false;
    *out = s_be(r->p, n);
    r->p += n;
    return true;
}

static bool
s_read_uint(s_reader_t *r, uint64_t *out)
{
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p++;
    if (t <= 0x7f) {
        *out = t;
        return true;
    }
    switch (t) {
    case 0xcc:
        return s_read_be(r, 1, out);
    case 0xcd:
        return s_read_be(r, 2, out);
    case 0xce:
        return s_read_be(r, 4, out);
    case 0xcf:
        return s_read_be(r, 8, out);
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: {
        /* Signed encodings of non-negative values are legal msgpack. */
        int64_t v;
        size_t n = (size_t)1 << (t - 0xd0);
        uint64_t raw;
        if (!s_read_be(r, n, &raw))
            return false;
        v = n == 8 ? (int64_t)raw
                   : (int64_t)(raw ^ (1ull << (8 * n - 1))) -
                         (int64_t)(1ull << (8 * n - 1));
        if (v < 0)
            return s_fail(r, "negative value where unsigned expected");
        *out = (uint64_t)v;
        return true;
    }
    default:
        return s_fail(r, "expected an unsigned integer");
    }
}

static bool
s_read_bool(s_reader_t *r, bool *out)
{
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p++;
    if (t != 0xc2 && t != 0xc3)
        return s_fail(r, "expected a boolean");
    *out = t == 0xc3;
    return true;
}

static bool
s_read_int(s_reader_t *r, int64_t *out)
{
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p;
    if (t >= 0xe0) {
        r->p++;
        *out = (int8_t)t;
        return true;
    }
    if (t >= 0xd0 && t <= 0xd3) {
        r->p++;
        size_t n = (size_t)1 << (t - 0xd0);
        uint64_t raw;
        if (!s_read_be(r, n, &raw))
            return false;
        if (n == 8)
            *out = (int64_t)raw;
        else
            *out = (int64_t)(raw ^ (1ull << (8 * n - 1))) -
                   (int64_t)(1ull << (8 * n - 1));
        return true;
    }
    uint64_t u;
    if (!s_read_uint(r, &u))
        return false;
    if (u > INT64_MAX)
        return s_fail(r, "integer out of range");
    *out = (int64_t)u;
    return true;
}

/* Strings and binaries are both accepted where text is expected. */
static bool
s_read_str(s_reader_t *r, const char **s, size_t *len)
{
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p++;
    uint64_t n;
    if (t >= 0xa0 && t <= 0xbf)
        n = t & 0x1f;
    else if (t == 0xd9 || t == 0xc4) {
        if (!s_read_be(r, 1, &n))
            return false;
    } else if (t == 0xda || t == 0xc5) {
        if (!s_read_be(r, 2, &n))
            return false;
    } else if (t == 0xdb || t == 0xc6) {
        if (!s_read_be(r, 4, &n))
            return false;
    } else {
        return s_fail(r, "expected a string");
    }
    if (!s_need(r, n))
        return false;
    *s = (const char *)r->p;
    *len = n;
    r->p += n;
    return true;
}

/* Reads an array header; n is checked against the bytes that remain (every
 * element takes at least min_elem bytes) so a 5-byte frame cannot make us
 * allocate for four billion elements. */
static bool
s_read_array(s_reader_t *r, uint64_t *n, size_t min_elem)
{
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p++;
    if (t >= 0x90 && t <= 0x9f)
        *n = t & 0x0f;
    else if (t == 0xdc)
        s_read_be(r, 2, n);
    else if (t == 0xdd)
        s_read_be(r, 4, n);
    else
        return s_fail(r, "expected an array");
    if (r->failed)
        return false;
    if (*n > (uint64_t)(r->end - r->p) / min_elem)
        return s_fail(r, "array longer than the message");
    return true;
}

static bool
s_read_map(s_reader_t *r, uint64_t *n)
{
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p++;
    if (t >= 0x80 && t <= 0x8f)
        *n = t & 0x0f;
    else if (t == 0xde)
        s_read_be(r, 2, n);
    else if (t == 0xdf)
        s_read_be(r, 4, n);
    else
        return s_fail(r, "expected a map");
    if (!r->failed && *n > (uint64_t)(r->end - r->p) / 2)
        return s_fail(r, "map longer than the message");
    return !r->failed;
}

/* Skips one value of any type (unknown keys), with bounded nesting. */
static bool
s_skip(s_reader_t *r, int depth)
{
    if (depth > S_MAX_DEPTH)
        return s_fail(r, "nested too deeply");
    if (!s_need(r, 1))
        return false;
    uint8_t t = *r->p;
    uint64_t n = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
        r->p++;
        return true;
    }
    if ((t >= 0xa0 && t <= 0xbf) || (t >= 0xc4 && t <= 0xc6) ||
        (t >= 0xd9 && t <= 0xdb)) {
        const char *s;
        size_t len;
        return s_read_str(r, &s, &len);
    }
    if ((t >= 0x90 && t <= 0x9f) || t == 0xdc || t == 0xdd) {
        if (!s_read_array(r, &n, 1))
            return false;
        for (uint64_t i = 0; i < n; i++)
            if (!s_skip(r, depth + 1))
                return false;
        return true;
    }
    if ((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf) {
        if (!s_read_map(r, &n))
            return false;
        for (uint64_t i = 0; i < 2 * n; i++)
            if (!s_skip(r, depth + 1))
                return false;
        return true;
    }
    r->p++;
    switch (t) {
    case 0xcc:
    case 0xd0:
        n = 1;
        break;
    case 0xcd:
    case 0xd1:
        n = 2;
        break;
    case 0xca:
    case 0xce:
    case 0xd2:
        n = 4;
        break;
    case 0xcb:
    case 0xcf:
    case 0xd3:
        n = 8;
        break;
    case 0xd4: /* fixext 1, 2, 4, 8, 16: type byte + data */
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        n = 1 + ((size_t)1 << (t - 0xd4));
        break;
    case 0xc7:
    case 0xc8:
    case 0xc9: {
        uint64_t len;
        if (!s_read_be(r, (size_t)1 << (t - 0xc7), &len))
            return false;
        n = len + 1;
        if (n < len)
            return s_fail(r, "extension too long");
        break;
    }
    default:
        return s_fail(r, "unknown type byte");
    }
    if (!s_need(r, n))
        return false;
    r->p += n;
    return true;
}

static bool
s_key_is(const char *key, size_t len, const char *want)
{
    return strlen(want) == len && memcmp(key, want, len) == 0;
}

/* What the decoder reads, whatever the type: every key it knows, in one
 * struct, sorted into the type's own (s_flat_t) at the end. The
 * keys of a map may come in any order, the type's among them. */
typedef struct s_flat {
    int type;
    uint64_t version;
    uint64_t id;
    const char *name;
    size_t name_len;
    const char *dataset;
    size_t dataset_len;
    uint64_t max_batch;
    uint64_t max_credit;
    uint64_t session;
    const char *job;
    size_t job_len;
    uint64_t weight;
    bool share;
    uint64_t share_window;
    uint64_t segs;
    uint64_t cursor;
    uint64_t stream;
    uint64_t max_streams;
    uint64_t sndbuf;
    uint64_t max_copy_bytes;
    bool joined;
    int64_t code;
    const char *text;
    size_t text_len;
    emlio__wire_shard_t *shards;
    size_t n_shards;
    emlio__wire_item_t *items;
    size_t n_items;
    emlio__wire_sample_t *samples;
    size_t n_samples;
    emlio__wire_span_t *spans;
    size_t n_spans;
    bool packed;
    emlio__wire_str_t *fields;
    size_t n_fields;
    uint64_t xf_threads;
    uint64_t core_mw;
    const char *xf_spec;
    size_t xf_spec_len;
    uint64_t xf_seed;
    uint64_t xf_epoch;
    bool unchecked;
    bool has_disk;
    int disk;
    uint64_t read;
    uint64_t shared;
    bool pipelined;
    bool describe;
    emlio__wire_str_t *where;
    size_t n_where;
    bool has_shape;
    uint64_t shape[4];
    uint64_t xf_ns;
    emlio__wire_str_t *classes;
    size_t n_classes;
    const char *format;
    size_t format_len;
} s_flat_t;

static bool
s_decode_shards(s_reader_t *r, s_flat_t *msg)
{
    uint64_t n;
    if (!s_read_array(r, &n, 4)) /* fixarray + three one-byte values */
        return false;
    if (n > EMLIO_WIRE_MAX_SHARDS)
        return s_fail(r, "too many shards");
    msg->shards = emlio_calloc(n, sizeof(*msg->shards));
    if (!msg->shards)
        return s_fail(r, "out of memory");
    msg->n_shards = n;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t fields;
        emlio__wire_shard_t *s = &msg->shards[i];
        if (!s_read_array(r, &fields, 1))
            return false;
        if (fields < 3)
            return s_fail(r, "shard entry needs name, records, bytes");
        if (!s_read_str(r, &s->name, &s->name_len) ||
            !s_read_uint(r, &s->records) || !s_read_uint(r, &s->bytes))
            return false;
        if (s->name_len == 0 || s->name_len > EMLIO_WIRE_MAX_NAME)
            return s_fail(r, "bad shard name length");
        if (fields > 3 && !s_read_uint(r, &s->digest))
            return false;
        for (uint64_t f = 4; f < fields; f++)
            if (!s_skip(r, 1))
                return false;
    }
    return true;
}

/* An array of at most max_n strings of min_len..max_len bytes each, into
 * *out (owned by the message) and *n_out; too_many and bad_len are the
 * errors for a longer array and for a string outside those lengths. */
static bool
s_decode_strs(s_reader_t *r, emlio__wire_str_t **out, size_t *n_out,
              uint64_t max_n, size_t min_len, size_t max_len,
              const char *too_many, const char *bad_len)
{
    uint64_t n;
    if (!s_read_array(r, &n, 1))
        return false;
    if (n > max_n)
        return s_fail(r, too_many);
    *out = emlio_calloc(n ? n : 1, sizeof(**out));
    if (!*out)
        return s_fail(r, "out of memory");
    *n_out = n;
    for (uint64_t i = 0; i < n; i++) {
        emlio__wire_str_t *str = &(*out)[i];
        if (!s_read_str(r, &str->s, &str->len))
            return false;
        if (str->len < min_len || str->len > max_len)
            return s_fail(r, bad_len);
    }
    return true;
}

static bool
s_decode_fields(s_reader_t *r, s_flat_t *msg)
{
    return s_decode_strs(r, &msg->fields, &msg->n_fields, EMLIO_WIRE_MAX_FIELDS,
                         1, EMLIO_WIRE_MAX_NAME, "too many fields",
                         "bad field name length");
}

/* WELCOME's class names: 1..EMLIO_WIRE_MAX_CLASSES strings of
 * 1..EMLIO_WIRE_MAX_NAME bytes (label i's name at i). */
static bool
s_decode_classes(s_reader_t *r, s_flat_t *msg)
{
    return s_decode_strs(r, &msg->classes, &msg->n_classes,
                         EMLIO_WIRE_MAX_CLASSES, 1, EMLIO_WIRE_MAX_NAME,
                         "too many classes", "bad class name length");
}

static bool
s_decode_items(s_reader_t *r, s_flat_t *msg, size_t max_items)
{
    uint64_t n;
    if (!s_read_array(r, &n, 1))
        return false;
    if (n % 2)
        return s_fail(r, "items must be shard, record pairs");
    if (n / 2 > max_items)
        return s_fail(r, "too many items in one request");
    msg->items = emlio_calloc(n / 2, sizeof(*msg->items));
    if (!msg->items)
        return s_fail(r, "out of memory");
    msg->n_items = n / 2;
    for (uint64_t i = 0; i < n / 2; i++) {
        uint64_t shard;
        if (!s_read_uint(r, &shard) || !s_read_uint(r, &msg->items[i].record))
            return false;
        if (shard > UINT32_MAX)
            return s_fail(r, "shard index out of range");
        msg->items[i].shard = (uint32_t)shard;
    }
    return true;
}

static bool
s_decode_samples(s_reader_t *r, s_flat_t *msg, size_t max_items)
{
    uint64_t n;
    if (!s_read_array(r, &n, 1))
        return false;
    if (n % 4)
        return s_fail(r, "samples must be shard, record, label, crc groups");
    if (n / 4 > max_items)
        return s_fail(r, "too many samples in one batch");
    msg->samples = emlio_calloc(n / 4, sizeof(*msg->samples));
    if (!msg->samples)
        return s_fail(r, "out of memory");
    msg->n_samples = n / 4;
    for (uint64_t i = 0; i < n / 4; i++) {
        emlio__wire_sample_t *s = &msg->samples[i];
        uint64_t shard;
        uint64_t crc;
        if (!s_read_uint(r, &shard) || !s_read_uint(r, &s->record) ||
            !s_read_int(r, &s->label) || !s_read_uint(r, &crc))
            return false;
        if (shard > UINT32_MAX || crc > UINT32_MAX)
            return s_fail(r, "sample field out of range");
        s->shard = (uint32_t)shard;
        s->crc = (uint32_t)crc;
    }
    return true;
}

/* A BATCH's "where": one string per quadruple, each at most
 * EMLIO_WIRE_MAX_WHERE bytes (its count is checked against the samples
 * once the whole header is read). */
static bool
s_decode_where(s_reader_t *r, s_flat_t *msg, size_t max_items)
{
    return s_decode_strs(r, &msg->where, &msg->n_where, max_items, 0,
                         EMLIO_WIRE_MAX_WHERE, "too many records in where",
                         "a where entry is too long");
}

/* The offset table of a packed BATCH: flat [offset, length] pairs, offset
 * -1 for a span in its own frame (checked against the frames by
 * emlio__wire_pack_check, which knows them). */
static bool
s_decode_pack(s_reader_t *r, s_flat_t *msg, size_t max_items)
{
    uint64_t n;
    if (!s_read_array(r, &n, 1))
        return false;
    if (n % 2)
        return s_fail(r, "pack must be offset, length pairs");
    if (n / 2 > (uint64_t)max_items * EMLIO_WIRE_MAX_FIELDS)
        return s_fail(r, "too many sample frames in one batch");
    msg->packed = true;
    msg->spans = emlio_calloc(n ? n / 2 : 1, sizeof(*msg->spans));
    if (!msg->spans)
        return s_fail(r, "out of memory");
    msg->n_spans = n / 2;
    for (uint64_t i = 0; i < n / 2; i++) {
        int64_t off;
        if (!s_read_int(r, &off) || !s_read_uint(r, &msg->spans[i].len))
            return false;
        if (off < -1)
            return s_fail(r, "negative offset in the pack table");
        msg->spans[i].off = off < 0 ? EMLIO_WIRE_PACK_OWN : (uint64_t)off;
    }
    return true;
}

/* Which header keys each message type must carry. */
enum {
    S_HAS_T = 1 << 0,
    S_HAS_V = 1 << 1,
    S_HAS_ID = 1 << 2,
    S_HAS_NAME = 1 << 3,
    S_HAS_DATASET = 1 << 4,
    S_HAS_SHARDS = 1 << 5,
    S_HAS_ITEMS = 1 << 6,
    S_HAS_SAMPLES = 1 << 7,
    S_HAS_CODE = 1 << 8,
    S_HAS_LIMITS = 1 << 9,
    S_HAS_SEED = 1 << 10,
    S_HAS_EPOCH = 1 << 11
};

static const unsigned s_required[] = {
    [EMLIO_MSG_HELLO] = S_HAS_T | S_HAS_V,
    [EMLIO_MSG_WELCOME] = S_HAS_T | S_HAS_V | S_HAS_DATASET | S_HAS_SHARDS,
    [EMLIO_MSG_GET] = S_HAS_T | S_HAS_ID | S_HAS_ITEMS,
    [EMLIO_MSG_BATCH] = S_HAS_T | S_HAS_ID | S_HAS_SAMPLES,
    [EMLIO_MSG_ERROR] = S_HAS_T | S_HAS_ID | S_HAS_CODE,
};

static void
s_flat_release(s_flat_t *msg)
{
    emlio_free(msg->shards);
    emlio_free(msg->items);
    emlio_free(msg->samples);
    emlio_free(msg->spans);
    emlio_free(msg->fields);
    emlio_free(msg->classes);
    emlio_free(msg->where);
    memset(msg, 0, sizeof(*msg));
}

void
emlio__wire_msg_release(emlio__wire_msg_t *msg)
{
    switch (msg->type) {
    case EMLIO_MSG_HELLO:
        emlio_free(msg->hello.fields);
        break;
    case EMLIO_MSG_WELCOME:
        emlio_free(msg->welcome.shards);
        emlio_free(msg->welcome.fields);
        emlio_free(msg->welcome.classes);
        break;
    case EMLIO_MSG_GET:
        emlio_free(msg->get.items);
        break;
    case EMLIO_MSG_BATCH:
        emlio_free(msg->batch.samples);
        emlio_free(msg->batch.spans);
        emlio_free(msg->batch.where);
        break;
    default:
        break;
    }
    memset(msg, 0, sizeof(*msg));
}

/* Moves what the type defines from f into msg (f keeps the rest, for
 * s_flat_release). */
static void
s_sort(s_flat_t *f, emlio__wire_msg_t *msg)
{
    memset(msg, 0, sizeof(*msg));
    msg->type = f->type;
    msg->id = f->id;
    switch (f->type) {
    case EMLIO_MSG_HELLO:
        msg->hello = (emlio__msg_hello_t){
            .version = f->version,
            .name = f->name,
            .name_len = f->name_len,
            .session = f->session,
            .stream = f->stream,
            .job = f->job,
            .job_len = f->job_len,
            .weight = f->weight,
            .share = f->share,
            .fields = f->fields,
            .n_fields = f->n_fields,
        };
        f->fields = NULL;
        break;
    case EMLIO_MSG_WELCOME:
        msg->welcome = (emlio__msg_welcome_t){
            .version = f->version,
            .joined = f->joined,
            .name = f->name,
            .name_len = f->name_len,
            .dataset = f->dataset,
            .dataset_len = f->dataset_len,
            .format = f->format,
            .format_len = f->format_len,
            .max_batch = f->max_batch,
            .max_credit = f->max_credit,
            .max_streams = f->max_streams,
            .sndbuf = f->sndbuf,
            .max_copy_bytes = f->max_copy_bytes,
            .xf_threads = f->xf_threads,
            .core_mw = f->core_mw,
            .share = f->share,
            .share_window = f->share_window,
            .share_segs = f->segs,
            .share_cursor = f->cursor,
            .shards = f->shards,
            .n_shards = f->n_shards,
            .fields = f->fields,
            .n_fields = f->n_fields,
            .classes = f->classes,
            .n_classes = f->n_classes,
        };
        f->shards = NULL;
        f->fields = NULL;
        f->classes = NULL;
        break;
    case EMLIO_MSG_GET:
        msg->get = (emlio__msg_get_t){
            .dataset = f->dataset,
            .dataset_len = f->dataset_len,
            .items = f->items,
            .n_items = f->n_items,
            .xf_spec = f->xf_spec,
            .xf_spec_len = f->xf_spec_len,
            .xf_seed = f->xf_seed,
            .xf_epoch = f->xf_epoch,
            .flags = { .unchecked = f->unchecked,
                       .pipelined = f->pipelined,
                       .describe = f->describe },
            .segs = f->segs,
            .cursor = f->cursor,
        };
        f->items = NULL;
        break;
    case EMLIO_MSG_BATCH:
        msg->batch = (emlio__msg_batch_t){
            .samples = f->samples,
            .n_samples = f->n_samples,
            .packed = f->packed,
            .spans = f->spans,
            .n_spans = f->n_spans,
            .where = f->where,
            .n_where = f->n_where,
            .has_disk = f->has_disk,
            .disk = f->disk,
            .read = f->read,
            .shared = f->shared,
            .has_shape = f->has_shape,
            .xf_ns = f->xf_ns,
        };
        memcpy(msg->batch.shape, f->shape, sizeof(f->shape));
        f->samples = NULL;
        f->spans = NULL;
        f->where = NULL;
        break;
    case EMLIO_MSG_ERROR:
        msg->error = (emlio__msg_error_t){
            .code = f->code,
            .text = f->text,
            .text_len = f->text_len,
        };
        break;
    default:
        break;
    }
}

/* The shape of a tensor BATCH: [samples, height, width, channels], each
 * bounded so that their product cannot overflow (checked by the client
 * against what it asked for). */
static bool
s_decode_shape(s_reader_t *r, s_flat_t *msg)
{
    uint64_t n;
    if (!s_read_array(r, &n, 1))
        return false;
    if (n != 4)
        return s_fail(r, "shape must be [samples, height, width, channels]");
    for (int i = 0; i < 4; i++)
        if (!s_read_uint(r, &msg->shape[i]))
            return false;
    if (msg->shape[0] > EMLIO_WIRE_MAX_SAMPLES || msg->shape[1] > 65535 ||
        msg->shape[2] > 65535 || msg->shape[3] > 4)
        return s_fail(r, "shape out of range");
    msg->has_shape = true;
    return true;
}

/* An unsigned key of the header: where it goes, and the S_HAS_ bit it
 * sets (0 = none). */
typedef struct s_uint_key {
    const char *key;
    size_t offset;
    unsigned has;
} s_uint_key_t;

static const s_uint_key_t s_uint_keys[] = {
    { "v", offsetof(s_flat_t, version), S_HAS_V },
    { "id", offsetof(s_flat_t, id), S_HAS_ID },
    { "max_batch", offsetof(s_flat_t, max_batch), S_HAS_LIMITS },
    { "max_credit", offsetof(s_flat_t, max_credit), 0 },
    { "session", offsetof(s_flat_t, session), 0 },
    { "stream", offsetof(s_flat_t, stream), 0 },
    { "max_streams", offsetof(s_flat_t, max_streams), 0 },
    { "sndbuf", offsetof(s_flat_t, sndbuf), 0 },
    { "xf_threads", offsetof(s_flat_t, xf_threads), 0 },
    { "core_mw", offsetof(s_flat_t, core_mw), 0 },
    { "max_copy_bytes", offsetof(s_flat_t, max_copy_bytes), 0 },
    { "seed", offsetof(s_flat_t, xf_seed), S_HAS_SEED },
    { "epoch", offsetof(s_flat_t, xf_epoch), S_HAS_EPOCH },
    { "xf_ns", offsetof(s_flat_t, xf_ns), 0 },
    { "weight", offsetof(s_flat_t, weight), 0 },
    { "share_window", offsetof(s_flat_t, share_window), 0 },
    { "sh", offsetof(s_flat_t, shared), 0 },
};

/* Decodes the value of one header key into msg; unknown keys are skipped.
 * Sets the key's S_HAS_ bit in *seen. */
static bool
s_decode_key(s_reader_t *r, s_flat_t *msg, const char *key, size_t klen,
             size_t max_items, unsigned *seen)
{
    for (size_t k = 0; k < sizeof(s_uint_keys) / sizeof(s_uint_keys[0]); k++) {
        if (!s_key_is(key, klen, s_uint_keys[k].key))
            continue;
        *seen |= s_uint_keys[k].has;
        return s_read_uint(r,
                           (uint64_t *)((char *)msg + s_uint_keys[k].offset));
    }
    if (s_key_is(key, klen, "t")) {
        uint64_t u;
        if (!s_read_uint(r, &u))
            return false;
        if (u < EMLIO_MSG_HELLO || u > EMLIO_MSG_ERROR)
            return s_fail(r, "unknown message type");
        msg->type = (int)u;
        *seen |= S_HAS_T;
        return true;
    }
    if (s_key_is(key, klen, "name")) {
        *seen |= S_HAS_NAME;
        return s_read_str(r, &msg->name, &msg->name_len);
    }
    if (s_key_is(key, klen, "job")) {
        if (!s_read_str(r, &msg->job, &msg->job_len))
            return false;
        return msg->job_len > 0 && msg->job_len <= EMLIO_WIRE_MAX_JOB
                   ? true
                   : s_fail(r, "bad job name length");
    }
    if (s_key_is(key, klen, "dataset")) {
        *seen |= S_HAS_DATASET;
        return s_read_str(r, &msg->dataset, &msg->dataset_len);
    }
    if (s_key_is(key, klen, "joined"))
        return s_read_bool(r, &msg->joined);
    if (s_key_is(key, klen, "share"))
        return s_read_bool(r, &msg->share);
    if (s_key_is(key, klen, "disk")) {
        uint64_t u;
        if (!s_read_uint(r, &u))
            return false;
        msg->disk = (int)EMLIO_MIN(u, 100);
        msg->has_disk = true;
        return true;
    }
    if (s_key_is(key, klen, "rd"))
        return s_read_uint(r, &msg->read);
    if (s_key_is(key, klen, "unchecked"))
        return s_read_bool(r, &msg->unchecked);
    if (s_key_is(key, klen, "pipelined"))
        return s_read_bool(r, &msg->pipelined);
    if (s_key_is(key, klen, "describe"))
        return s_read_bool(r, &msg->describe);
    if (s_key_is(key, klen, "where") && !msg->where)
        return s_decode_where(r, msg, max_items);
    if (s_key_is(key, klen, "segs") || s_key_is(key, klen, "share_segs"))
        return s_read_uint(r, &msg->segs);
    if (s_key_is(key, klen, "cursor") || s_key_is(key, klen, "share_cursor"))
        return s_read_uint(r, &msg->cursor);
    if (s_key_is(key, klen, "code")) {
        *seen |= S_HAS_CODE;
        return s_read_int(r, &msg->code);
    }
    if (s_key_is(key, klen, "msg"))
        return s_read_str(r, &msg->text, &msg->text_len);
    if (s_key_is(key, klen, "format"))
        return s_read_str(r, &msg->format, &msg->format_len);
    if (s_key_is(key, klen, "transform")) {
        if (!s_read_str(r, &msg->xf_spec, &msg->xf_spec_len))
            return false;
        if (msg->xf_spec_len == 0 || msg->xf_spec_len > EMLIO_WIRE_MAX_SPEC)
            return s_fail(r, "bad transform spec length");
        return true;
    }
    if (s_key_is(key, klen, "shape") && !msg->has_shape)
        return s_decode_shape(r, msg);
    if (s_key_is(key, klen, "shards") && !msg->shards) {
        *seen |= S_HAS_SHARDS;
        return s_decode_shards(r, msg);
    }
    if (s_key_is(key, klen, "fields") && !msg->fields)
        return s_decode_fields(r, msg);
    if (s_key_is(key, klen, "classes") && !msg->classes)
        return s_decode_classes(r, msg);
    if (s_key_is(key, klen, "items") && !msg->items) {
        *seen |= S_HAS_ITEMS;
        return s_decode_items(r, msg, max_items);
    }
    if (s_key_is(key, klen, "pack") && !msg->packed)
        return s_decode_pack(r, msg, max_items);
    if (s_key_is(key, klen, "samples") && !msg->samples) {
        *seen |= S_HAS_SAMPLES;
        return s_decode_samples(r, msg, max_items);
    }
    return s_skip(r, 1);
}

int
emlio__wire_decode(emlio__wire_msg_t *out, const uint8_t *buf, size_t len,
                   size_t max_items, char *errbuf)
{
    s_reader_t r = { buf, buf + len, errbuf, false };
    memset(out, 0, sizeof(*out));
    s_flat_t flat, *msg = &flat;
    memset(msg, 0, sizeof(*msg));
    if (max_items == 0 || max_items > EMLIO_WIRE_MAX_SAMPLES)
        max_items = EMLIO_WIRE_MAX_SAMPLES;
    if (len > EMLIO_WIRE_MAX_HEADER) {
        s_fail(&r, "header frame too large");
        return EMLIO_EPROTO;
    }
    uint64_t n;
    unsigned seen = 0;
    if (!s_read_map(&r, &n))
        goto fail;
    for (uint64_t i = 0; i < n; i++) {
        const char *key;
        size_t klen;
        if (!s_read_str(&r, &key, &klen) ||
            !s_decode_key(&r, msg, key, klen, max_items, &seen))
            goto fail;
    }
    if (!(seen & S_HAS_T)) {
        s_fail(&r, "no message type");
        goto fail;
    }
    if ((seen & s_required[msg->type]) != s_required[msg->type]) {
        s_fail(&r, "a required field is missing");
        goto fail;
    }
    /* A transform's draws are a function of its seed and epoch: served
     * with 0 for either left out, the batch would silently be another
     * run's (issue 34). */
    if (msg->type == EMLIO_MSG_GET && msg->xf_spec &&
        (seen & (S_HAS_SEED | S_HAS_EPOCH)) != (S_HAS_SEED | S_HAS_EPOCH)) {
        s_fail(&r, "a GET with a transform needs its seed and epoch");
        goto fail;
    }
    if (msg->where && msg->n_where != msg->n_samples) {
        s_fail(&r, "where does not match the samples");
        goto fail;
    }
    if (msg->has_shape && msg->packed) {
        s_fail(&r, "a tensor batch cannot be packed");
        goto fail;
    }
    if (msg->has_shape && msg->shape[0] != msg->n_samples) {
        s_fail(&r, "shape does not match the samples");
        goto fail;
    }
    if (r.p != r.end) {
        s_fail(&r, "trailing bytes after the header");
        goto fail;
    }
    s_sort(msg, out);
    s_flat_release(msg); /* what the type does not define */
    return (int)len;
fail:
    s_flat_release(msg);
    return EMLIO_EPROTO;
}
