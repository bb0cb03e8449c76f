/* transform.c - the transform pipeline: parses the spec, reduces a chain
 * of crops, resizes and flips to one resample of the source (one box, one
 * scale per axis, one flip), draws torchvision's RandomResizedCrop boxes
 * from the counter-based generator, and owns the per-thread workspace.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <locale.h>
#include <math.h>

#include "transform_ws.h"

#define MAX_OPS       16
#define MAX_SIZE      16384
/* Buffers larger than this are freed after each image instead of kept. */
#define WS_KEEP_BYTES (32u << 20)

enum op_kind { OP_RRC, OP_RESIZE, OP_CENTER_CROP, OP_HFLIP };

typedef struct op {
    enum op_kind kind;
    uint32_t size;
    double scale_lo, scale_hi;
    double ratio_lo, ratio_hi;
    double p;
} op_t;

struct emlio_transform {
    op_t ops[MAX_OPS];
    size_t n_ops;
    uint32_t out_h, out_w;
    uint64_t max_pixels;
    char *spec; /* canonical */
};

static const char *const s_op_names[] = {
    [OP_RRC] = "random_resized_crop",
    [OP_RESIZE] = "resize",
    [OP_CENTER_CROP] = "center_crop",
    [OP_HFLIP] = "horizontal_flip",
};

int
emlio__tf_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
{
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ---- the spec parser ------------------------------------------------ */

typedef struct parser {
    const char *s;
    size_t pos;
    char *err;
    size_t errlen;
} parser_t;

static void
s_skip_space(parser_t *p)
{
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
           p->s[p->pos] == '\n' || p->s[p->pos] == '\r')
        p->pos++;
}

/* Copies the token [start, end) of the spec, cut to fit, for messages. */
static const char *
s_token(const parser_t *p, size_t start, size_t end, char *buf, size_t len)
{
    /* The text comes from a client: printable ASCII is quoted as it is,
     * every other byte as \xNN (no control bytes or broken UTF-8 in the
     * daemon's log or the client's error), and a cut token ends in "...",
     * never inside an escape. */
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = start; i < end; i++) {
        unsigned char c = (unsigned char)p->s[i];
        bool plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
        size_t need = plain ? 1 : 4;
        if (o + need + 4 > len) { /* room for "..." and the NUL */
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (plain) {
            buf[o++] = (char)c;
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}

/* Reads one argument value up to ',' or ')' into [*start, *end). */
static void
s_value(parser_t *p, size_t *start, size_t *end)
{
    s_skip_space(p);
    *start = p->pos;
    while (p->s[p->pos] && p->s[p->pos] != ',' && p->s[p->pos] != ')')
        p->pos++;
    *end = p->pos;
    while (*end > *start && (p->s[*end - 1] == ' ' || p->s[*end - 1] == '\t'))
        (*end)--;
}

/* A whole decimal number (strtod, in the C locale the caller set). */
static bool
s_number(const char *s, size_t len, double *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof(buf))
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (!strchr("0123456789.+-", buf[0]))
        return false; /* no "inf", "nan", hex */
    for (size_t i = 0; i < len; i++)
        if (!strchr("0123456789.eE+-", buf[i]))
            return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(buf, &end);
    if (end != buf + len || errno || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static int
s_parse_size(parser_t *p, const op_t *op, size_t vs, size_t ve, uint32_t *size)
{
    uint64_t v = 0;
    size_t i = vs;
    for (; i < ve && p->s[i] >= '0' && p->s[i] <= '9' && v <= MAX_SIZE; i++)
        v = v * 10 + (uint64_t)(p->s[i] - '0');
    char tok[64];
    if (i == vs || i != ve || v < 1 || v > MAX_SIZE)
        return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                             "%s: size must be an integer in 1..%d, got \"%s\"",
                             s_op_names[op->kind], MAX_SIZE,
                             s_token(p, vs, ve, tok, sizeof(tok)));
    *size = (uint32_t)v;
    return 0;
}

static int
s_parse_range(parser_t *p, const op_t *op, const char *key, size_t vs,
              size_t ve, double *lo, double *hi)
{
    const char *colon = memchr(p->s + vs, ':', ve - vs);
    char tok[64];
    if (!colon || !s_number(p->s + vs, (size_t)(colon - p->s) - vs, lo) ||
        !s_number(colon + 1, ve - (size_t)(colon + 1 - p->s), hi) ||
        !(*lo > 0) || !(*lo <= *hi))
        return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                             "%s: %s wants LO:HI with 0 < LO <= HI, got \"%s\"",
                             s_op_names[op->kind], key,
                             s_token(p, vs, ve, tok, sizeof(tok)));
    return 0;
}

/* One argument "[key=]value" of op. */
static int
s_parse_arg(parser_t *p, op_t *op, bool *have_size)
{
    size_t ks = p->pos, ke, vs, ve;
    s_value(p, &vs, &ve);
    ks = vs;
    const char *eq = memchr(p->s + vs, '=', ve - vs);
    char key[32] = "";
    if (eq) {
        ke = (size_t)(eq - p->s);
        while (ke > ks && (p->s[ke - 1] == ' ' || p->s[ke - 1] == '\t'))
            ke--;
        s_token(p, ks, ke, key, sizeof(key));
        vs = (size_t)(eq - p->s) + 1;
        while (vs < ve && (p->s[vs] == ' ' || p->s[vs] == '\t'))
            vs++;
    }
    bool sized = op->kind != OP_HFLIP;
    char tok[64];
    if (!eq && ve == vs)
        return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                             "%s: empty argument", s_op_names[op->kind]);
    if (sized && (!eq || !strcmp(key, "size"))) {
        if (*have_size)
            return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                                 "%s: size given twice", s_op_names[op->kind]);
        *have_size = true;
        return s_parse_size(p, op, vs, ve, &op->size);
    }
    if (op->kind == OP_RRC && !strcmp(key, "scale"))
        return s_parse_range(p, op, key, vs, ve, &op->scale_lo, &op->scale_hi);
    if (op->kind == OP_RRC && !strcmp(key, "ratio"))
        return s_parse_range(p, op, key, vs, ve, &op->ratio_lo, &op->ratio_hi);
    if (op->kind == OP_HFLIP && !strcmp(key, "p")) {
        if (!s_number(p->s + vs, ve - vs, &op->p) || op->p < 0 || op->p > 1)
            return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                                 "horizontal_flip: p must be in [0, 1], got "
                                 "\"%s\"",
                                 s_token(p, vs, ve, tok, sizeof(tok)));
        return 0;
    }
    return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                         "%s: unknown argument \"%s\"", s_op_names[op->kind],
                         eq ? key : s_token(p, vs, ve, tok, sizeof(tok)));
}

/* "(args)" after an op's name, or nothing. */
static int
s_parse_args(parser_t *p, op_t *op)
{
    bool have_size = false;
    s_skip_space(p);
    if (p->s[p->pos] == '(') {
        p->pos++;
        s_skip_space(p);
        if (p->s[p->pos] == ')')
            p->pos++;
        else
            for (;;) {
                int rc = s_parse_arg(p, op, &have_size);
                if (rc < 0)
                    return rc;
                if (p->s[p->pos] == ')') {
                    p->pos++;
                    break;
                }
                if (p->s[p->pos] != ',')
                    return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                                         "%s: missing \")\"",
                                         s_op_names[op->kind]);
                p->pos++;
            }
    }
    if (op->kind != OP_HFLIP && !have_size)
        return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                             "%s: missing size, as in %s(224)",
                             s_op_names[op->kind], s_op_names[op->kind]);
    return 0;
}

static int
s_parse_op(parser_t *p, op_t *op)
{
    s_skip_space(p);
    size_t start = p->pos;
    /* A name runs to the next separator, so that a misspelt one is named
     * whole ("cr\xc3\xb8p", not "cr"). */
    while (p->s[p->pos] && !strchr("(),; \t\r\n", p->s[p->pos]))
        p->pos++;
    char name[64];
    s_token(p, start, p->pos, name, sizeof(name));
    memset(op, 0, sizeof(*op));
    op->scale_lo = 0.08;
    op->scale_hi = 1.0;
    op->ratio_lo = 3.0 / 4.0;
    op->ratio_hi = 4.0 / 3.0;
    op->p = 0.5;
    size_t k = 0;
    while (k < EMLIO_ARRAY_SIZE(s_op_names) && strcmp(name, s_op_names[k]))
        k++;
    if (k == EMLIO_ARRAY_SIZE(s_op_names)) {
        if (!name[0])
            return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                                 "expected an operation at offset %zu", start);
        return emlio__tf_err(p->err, p->errlen, EMLIO_EINVAL,
                             "unknown operation \"%s\" (known: "
                             "random_resized_crop, resize, center_crop, "
                             "horizontal_flip)",
                             name);
    }
    op->kind = (enum op_kind)k;
    return s_parse_args(p, op);
}

/* The shortest text that reads back as v, in the C locale. */
static void
s_format_double(char *buf, size_t len, double v)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static int
s_canonical(emlio_transform_t *self)
{
    emlio_buf_t b = EMLIO_BUF_INIT;
    int rc = 0;
    for (size_t i = 0; i < self->n_ops && rc == 0; i++) {
        const op_t *op = &self->ops[i];
        char a[32], c[32], d[32], e[32];
        rc |= emlio_buf_addf(&b, "%s%s", i ? "," : "", s_op_names[op->kind]);
        switch (op->kind) {
        case OP_RRC:
            s_format_double(a, sizeof(a), op->scale_lo);
            s_format_double(c, sizeof(c), op->scale_hi);
            s_format_double(d, sizeof(d), op->ratio_lo);
            s_format_double(e, sizeof(e), op->ratio_hi);
            rc |= emlio_buf_addf(&b, "(%u,scale=%s:%s,ratio=%s:%s)", op->size,
                                 a, c, d, e);
            break;
        case OP_RESIZE:
        case OP_CENTER_CROP:
            rc |= emlio_buf_addf(&b, "(%u)", op->size);
            break;
        case OP_HFLIP:
            s_format_double(a, sizeof(a), op->p);
            rc |= emlio_buf_addf(&b, "(p=%s)", a);
            break;
        }
    }
    if (rc < 0) {
        emlio_buf_release(&b);
        return EMLIO_ENOMEM;
    }
    self->spec = (char *)b.data;
    return 0;
}

/* Walks the ops with the input's size unknown: the output's must not be. */
static int
s_output_shape(emlio_transform_t *self, char *err, size_t errlen)
{
    uint64_t h = 0, w = 0; /* 0: depends on the input */
    for (size_t i = 0; i < self->n_ops; i++) {
        const op_t *op = &self->ops[i];
        if (op->kind == OP_RRC || op->kind == OP_CENTER_CROP)
            h = w = op->size;
        else if (op->kind == OP_RESIZE && h && w) {
            uint64_t s = EMLIO_MIN(h, w), l = EMLIO_MAX(h, w);
            uint64_t nl = (uint64_t)((double)(op->size * l) / (double)s);
            if (w <= h) {
                w = op->size;
                h = nl;
            } else {
                h = op->size;
                w = nl;
            }
        } else if (op->kind == OP_RESIZE)
            h = w = 0;
    }
    if (!h || !w)
        return emlio__tf_err(err, errlen, EMLIO_EINVAL,
                             "the output size depends on the input's: end "
                             "the spec with center_crop or "
                             "random_resized_crop");
    if (h > MAX_SIZE || w > MAX_SIZE)
        return emlio__tf_err(err, errlen, EMLIO_EINVAL,
                             "output %" PRIu64 "x%" PRIu64 " is too large", w,
                             h);
    self->out_h = (uint32_t)h;
    self->out_w = (uint32_t)w;
    return 0;
}

static int
s_parse_ops(emlio_transform_t *self, const char *spec, char *err, size_t errlen)
{
    parser_t p = { .s = spec, .err = err, .errlen = errlen };
    for (;;) {
        if (self->n_ops == MAX_OPS)
            return emlio__tf_err(err, errlen, EMLIO_EINVAL,
                                 "more than %d operations", MAX_OPS);
        int rc = s_parse_op(&p, &self->ops[self->n_ops]);
        if (rc < 0)
            return rc;
        self->n_ops++;
        s_skip_space(&p);
        if (!spec[p.pos])
            return 0;
        if (spec[p.pos] != ',') {
            char tok[32];
            return emlio__tf_err(
                err, errlen, EMLIO_EINVAL, "%s: unexpected \"%s\" after it",
                s_op_names[self->ops[self->n_ops - 1].kind],
                s_token(&p, p.pos, p.pos + strnlen(spec + p.pos, 16), tok,
                        sizeof(tok)));
        }
        p.pos++;
    }
}

int
emlio_transform_parse(const char *spec, emlio_transform_t **out, char *err,
                      size_t errlen)
{
    if (!out)
        return emlio__tf_err(err, errlen, EMLIO_EINVAL, "no output pointer");
    *out = NULL;
    if (!spec)
        return emlio__tf_err(err, errlen, EMLIO_EINVAL, "no spec");
    emlio_transform_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return emlio__tf_err(err, errlen, EMLIO_ENOMEM, "out of memory");
    self->max_pixels = EMLIO_TRANSFORM_MAX_PIXELS_DEFAULT;
    /* Numbers read and print in the C locale whatever the host program
     * set ("0.08", never "0,08"); uselocale is per thread. */
    locale_t c_loc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    locale_t old = c_loc ? uselocale(c_loc) : (locale_t)0;
    int rc =
        c_loc ? 0 : emlio__tf_err(err, errlen, EMLIO_ENOMEM, "out of memory");
    if (rc == 0)
        rc = s_parse_ops(self, spec, err, errlen);
    if (rc == 0)
        rc = s_output_shape(self, err, errlen);
    if (rc == 0 && s_canonical(self) < 0)
        rc = emlio__tf_err(err, errlen, EMLIO_ENOMEM, "out of memory");
    if (c_loc) {
        uselocale(old);
        freelocale(c_loc);
    }
    if (rc < 0) {
        emlio_transform_destroy(&self);
        return rc;
    }
    *out = self;
    return 0;
}

void
emlio_transform_destroy(emlio_transform_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->spec);
    free(*self_p);
    *self_p = NULL;
}

const char *
emlio_transform_spec(const emlio_transform_t *self)
{
    return self ? self->spec : "";
}

uint32_t
emlio_transform_height(const emlio_transform_t *self)
{
    return self ? self->out_h : 0;
}

uint32_t
emlio_transform_width(const emlio_transform_t *self)
{
    return self ? self->out_w : 0;
}

size_t
emlio_transform_output_bytes(const emlio_transform_t *self)
{
    return self ? (size_t)self->out_h * self->out_w * 3 : 0;
}

void
emlio_transform_set_max_pixels(emlio_transform_t *self, uint64_t max_pixels)
{
    if (self)
        self->max_pixels =
            max_pixels ? max_pixels : EMLIO_TRANSFORM_MAX_PIXELS_DEFAULT;
}

/* ---- geometry: the chain as one resample ---------------------------- */

/* torchvision's RandomResizedCrop.get_params for a width x height image,
 * drawing from the stream key (see transform.h for the draw layout). */
static void
s_rrc_params(const op_t *op, uint64_t key, int64_t width, int64_t height,
             emlio_transform_box_t *box)
{
    double area = (double)height * (double)width;
    double log_lo = emlio__det_log(op->ratio_lo);
    double log_hi = emlio__det_log(op->ratio_hi);
    for (uint64_t a = 0; a < 10; a++) {
        double u_area = emlio__rng_uniform(key, 4 * a);
        double u_ratio = emlio__rng_uniform(key, 4 * a + 1);
        double target =
            area * (op->scale_lo + (op->scale_hi - op->scale_lo) * u_area);
        double aspect = emlio__det_exp(log_lo + (log_hi - log_lo) * u_ratio);
        double w = emlio__det_round(sqrt(target * aspect));
        double h = emlio__det_round(sqrt(target / aspect));
        if (w > 0 && w <= (double)width && h > 0 && h <= (double)height) {
            box->width = (uint32_t)w;
            box->height = (uint32_t)h;
            box->top = (uint32_t)emlio__rng_below(
                key, 4 * a + 2, (uint64_t)(height - (int64_t)h + 1));
            box->left = (uint32_t)emlio__rng_below(
                key, 4 * a + 3, (uint64_t)(width - (int64_t)w + 1));
            return;
        }
    }
    /* The fallback: a centre crop of the ratio range's nearest end. */
    double in_ratio = (double)width / (double)height;
    int64_t w = width, h = height;
    if (in_ratio < op->ratio_lo)
        h = (int64_t)emlio__det_round((double)w / op->ratio_lo);
    else if (in_ratio > op->ratio_hi)
        w = (int64_t)emlio__det_round((double)h * op->ratio_hi);
    w = EMLIO_MAX(EMLIO_MIN(w, width), 1);
    h = EMLIO_MAX(EMLIO_MIN(h, height), 1);
    box->width = (uint32_t)w;
    box->height = (uint32_t)h;
    box->top = (uint32_t)((height - h) / 2);
    box->left = (uint32_t)((width - w) / 2);
}

static void
s_axis_init(emlio__axis_t *a, uint32_t n)
{
    memset(a, 0, sizeof(*a));
    a->scale = 1.0;
    a->clip_hi = a->ext_hi = n;
    a->n = n;
}

/* Crops [c, c + m) of the current image on this axis (c < 0 or c + m > n
 * pads with black); mirrored first when the image is flipped. */
static void
s_axis_crop(emlio__axis_t *a, int64_t c, int64_t m, bool flipped)
{
    if (flipped)
        c = a->n - c - m;
    double lo = a->base + (double)(a->off + c) * a->scale;
    double hi = a->base + (double)(a->off + c + m) * a->scale;
    a->ext_lo = EMLIO_MAX(a->ext_lo, lo);
    a->ext_hi = EMLIO_MIN(a->ext_hi, hi);
    a->off += c;
    a->n = m;
}

/* Resizes the current image to m on this axis. PIL filters over the image
 * it is given, so the clip becomes the current extent. */
static void
s_axis_resize(emlio__axis_t *a, int64_t m)
{
    a->base += (double)a->off * a->scale;
    a->off = 0;
    a->scale *= (double)a->n / (double)m;
    a->clip_lo = a->ext_lo;
    a->clip_hi = a->ext_hi;
    a->n = m;
}

/* torchvision's center_crop offset, padding included. */
static int64_t
s_center_offset(int64_t n, int64_t m)
{
    if (m > n)
        return -((m - n) / 2);
    return (int64_t)emlio__det_round((double)(n - m) / 2.0);
}

typedef struct geometry_ctx {
    const emlio_transform_t *self;
    uint64_t seed, epoch, sample_key;
} geometry_ctx_t;

static int
s_geometry(void *vctx, uint32_t width, uint32_t height, emlio__resample_t *rs,
           char *err, size_t errlen)
{
    const geometry_ctx_t *g = vctx;
    const emlio_transform_t *self = g->self;
    if (!width || !height)
        return emlio__tf_err(err, errlen, EMLIO_EFORMAT, "image is %ux%u",
                             width, height);
    memset(rs, 0, sizeof(*rs));
    s_axis_init(&rs->x, width);
    s_axis_init(&rs->y, height);
    for (size_t i = 0; i < self->n_ops; i++) {
        const op_t *op = &self->ops[i];
        uint64_t key = emlio__rng_key(g->seed, g->epoch, g->sample_key, i);
        int64_t w = rs->x.n, h = rs->y.n, s = op->size;
        emlio_transform_box_t b;
        switch (op->kind) {
        case OP_RESIZE: {
            int64_t sh = EMLIO_MIN(w, h), lg = EMLIO_MAX(w, h);
            double nl = (double)(s * lg) / (double)sh;
            if (nl > (double)INT32_MAX)
                return emlio__tf_err(err, errlen, EMLIO_EFORMAT,
                                     "resize(%u) of %" PRId64 "x%" PRId64
                                     " is too large",
                                     op->size, w, h);
            s_axis_resize(&rs->x, w <= h ? s : (int64_t)nl);
            s_axis_resize(&rs->y, w <= h ? (int64_t)nl : s);
            break;
        }
        case OP_CENTER_CROP:
            s_axis_crop(&rs->x, s_center_offset(w, s), s, rs->flip);
            s_axis_crop(&rs->y, s_center_offset(h, s), s, false);
            break;
        case OP_RRC:
            s_rrc_params(op, key, w, h, &b);
            s_axis_crop(&rs->x, b.left, b.width, rs->flip);
            s_axis_crop(&rs->y, b.top, b.height, false);
            s_axis_resize(&rs->x, s);
            s_axis_resize(&rs->y, s);
            break;
        case OP_HFLIP:
            if (emlio__rng_uniform(key, 0) < op->p)
                rs->flip = !rs->flip;
            break;
        }
    }
    assert(rs->x.n == self->out_w && rs->y.n == self->out_h);
    return 0;
}

int
emlio_transform_crop_params(const emlio_transform_t *self, size_t op_index,
                            uint32_t width, uint32_t height, uint64_t seed,
                            uint64_t epoch, uint64_t sample_key,
                            emlio_transform_box_t *box)
{
    if (!self || !box || op_index >= self->n_ops ||
        self->ops[op_index].kind != OP_RRC || !width || !height)
        return EMLIO_EINVAL;
    uint64_t key = emlio__rng_key(seed, epoch, sample_key, op_index);
    s_rrc_params(&self->ops[op_index], key, width, height, box);
    return 0;
}

uint64_t
emlio_transform_sample_key(const char *shard_name, uint64_t record)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (const char *c = shard_name ? shard_name : ""; *c; c++) {
        h ^= (uint8_t)*c;
        h *= 0x100000001b3ull;
    }
    return emlio__rng_mix(h ^ emlio__rng_mix(record + 1));
}

int
emlio_transform_apply(const emlio_transform_t *self, emlio_transform_ws_t *ws,
                      const uint8_t *data, size_t len, uint64_t seed,
                      uint64_t epoch, uint64_t sample_key, uint8_t *out,
                      char *err, size_t errlen)
{
    if (!self || !ws || !out || (!data && len))
        return emlio__tf_err(err, errlen, EMLIO_EINVAL,
                             "transform: NULL argument");
    geometry_ctx_t g = { self, seed, epoch, sample_key };
    emlio__resample_t rs;
    int rc = emlio__image_transform(ws, data, len, self->max_pixels, s_geometry,
                                    &g, &rs, out, err, errlen);
    emlio__ws_trim(ws);
    return rc;
}

/* ---- the workspace -------------------------------------------------- */

emlio_transform_ws_t *
emlio_transform_ws_new(void)
{
    emlio_transform_ws_t *ws = emlio_calloc(1, sizeof(*ws));
    if (ws)
        ws->max_bytes = EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT;
    return ws;
}

static void
s_ws_drop(emlio_transform_ws_t *ws, emlio__wsbuf_t *b)
{
    free(b->p);
    ws->held -= b->cap;
    b->p = NULL;
    b->cap = 0;
}

void
emlio_transform_ws_destroy(emlio_transform_ws_t **ws_p)
{
    if (!ws_p || !*ws_p)
        return;
    emlio_transform_ws_t *ws = *ws_p;
    s_ws_drop(ws, &ws->region);
    s_ws_drop(ws, &ws->temp);
    s_ws_drop(ws, &ws->coef);
    s_ws_drop(ws, &ws->acc);
    s_ws_drop(ws, &ws->coef16);
    emlio__image_ws_release(ws);
    free(ws);
    *ws_p = NULL;
}

void
emlio_transform_ws_set_max_bytes(emlio_transform_ws_t *ws, uint64_t max_bytes)
{
    if (ws)
        ws->max_bytes =
            max_bytes ? max_bytes : EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT;
}

uint64_t
emlio_transform_ws_bytes(const emlio_transform_ws_t *ws)
{
    return ws ? ws->held : 0;
}

int
emlio__ws_reserve(emlio_transform_ws_t *ws, emlio__wsbuf_t *b, size_t bytes,
                  char *err, size_t errlen)
{
    if (b->cap >= bytes && b->p)
        return 0;
    /* Round up so slowly growing images do not reallocate every time. */
    size_t want = bytes < 4096 ? 4096 : bytes + bytes / 8;
    if (want < bytes || ws->held - b->cap + want > ws->max_bytes) {
        want = bytes;
        if (ws->held - b->cap + want > ws->max_bytes)
            return emlio__tf_err(err, errlen, EMLIO_ELIMIT,
                                 "transform needs %zu more bytes than the "
                                 "workspace's cap of %" PRIu64,
                                 bytes, ws->max_bytes);
    }
    s_ws_drop(ws, b);
    b->p = emlio_malloc(want);
    if (!b->p)
        return emlio__tf_err(err, errlen, EMLIO_ENOMEM,
                             "out of memory (%zu bytes)", want);
    b->cap = want;
    ws->held += want;
    return 0;
}

void
emlio__ws_trim(emlio_transform_ws_t *ws)
{
    emlio__wsbuf_t *bufs[] = { &ws->region, &ws->temp, &ws->coef, &ws->acc,
                               &ws->coef16 };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(bufs); i++)
        if (bufs[i]->cap > WS_KEEP_BYTES)
            s_ws_drop(ws, bufs[i]);
}
