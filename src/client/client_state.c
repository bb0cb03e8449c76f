/* client_state.c - the client's resume state: which batches of which
 * epoch were handed over, saved and loaded as a checked blob, and the
 * states of every rank of a run merged into what the job consumed, so a
 * run on another number of ranks can plan the rest (docs/planner.md,
 * "Elastic resume").
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

#include "plan_rest.h"

/* ---- resume state ------------------------------------------------------ */

/* Layout (little endian): "EMLS", u32 format 6, u64 seed, u32 world, rank,
 * batch_size, shuffle, window_shards, drop_last, char dataset[16],
 * u64 epoch, u64 n_batches, u64 share_join, u64 n_spans,
 * n_spans x (u64 begin, u64 end), bitmap[(n_batches + 7) / 8], the blend
 * section, u32 crc32c of all the bytes before it (docs/protocol.md,
 * "Resume state"). The spans are the epoch's global positions earlier
 * runs of the job consumed: the plan the bitmap names covers the rest.
 * The blend section says which sources and weights the positions are
 * of: u32 n_sources, u32 n_layers, per source the u64 fingerprint of its
 * data (emlio__source_digest), each earlier blend of the epoch (the
 * weights changed in it) with the spans consumed under it, then the
 * saving run's blend; a blend is u64 epoch_samples and per source u64
 * weight (IEEE 754 bits), u64 samples. The bitmap names batches of one
 * order, so the format follows the plan version: format 1 was plan
 * version 1. Formats 2 (no share_join: read as 0), 3 (no spans), 4 (no
 * blend section) and 5 (no sources' fingerprints) are read still. */
#define S_STATE_MAGIC "EMLS"

#define S_STATE_FORMAT 6u
_Static_assert(EMLIO_PLAN_VERSION == 2,
               "another plan order needs another resume state format");

#define S_STATE_FIXED2 (4 + 4 + 8 + 6 * 4 + 16 + 8 + 8)
#define S_STATE_FIXED3 (S_STATE_FIXED2 + 8)
#define S_STATE_FIXED4 (S_STATE_FIXED3 + 8)

static void
s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t
s_get32(const uint8_t *p)
{
    return (uint32_t)s_get64((const uint8_t[8]){ p[0], p[1], p[2], p[3] });
}

static void
s_put_params(const emlio_client_t *self, uint8_t *p)
{
    memcpy(p, S_STATE_MAGIC, 4);
    s_put32(p + 4, S_STATE_FORMAT);
    s_put64(p + 8, self->cfg.seed);
    s_put32(p + 16, self->cfg.world);
    s_put32(p + 20, self->cfg.rank);
    s_put32(p + 24, self->cfg.batch_size);
    /* The shared schedule is another order: bit 8 of the shuffle word.
     * The window is the one the plans use (a shared one comes from the
     * daemons: another --share-bytes there is another order). */
    s_put32(p + 28,
            (uint32_t)self->cfg.shuffle | (self->inv.share ? 0x100u : 0));
    s_put32(p + 32, self->inv.window);
    s_put32(p + 36, self->cfg.drop_last);
    memcpy(p + 40, self->inv.dataset, 16);
}

/* The resume of the current epoch: what earlier runs consumed of it
 * (NULL unless a resume put the client in it). */
static const emlio__resume_t *
s_current_resume(const emlio_client_t *self)
{
    bool mine = self->resume.live && self->resume.epoch == self->current.number;
    return mine ? &self->resume : NULL;
}

void
emlio__resume_clear(emlio__resume_t *r)
{
    emlio_free(r->spans);
    for (size_t i = 0; i < r->n_layers; i++) {
        emlio_free(r->layers[i].blend.src);
        emlio_free(r->layers[i].spans);
    }
    emlio_free(r->layers);
    *r = (emlio__resume_t){ 0 };
}

/* ---- the blend section --------------------------------------------------- */

static size_t
s_blend_bytes(uint32_t n_src)
{
    return 8 + 16 * (size_t)n_src;
}

static uint8_t *
s_put_blend(uint8_t *p, const emlio_plan_source_t *src, uint32_t n,
            uint64_t epoch_samples)
{
    s_put64(p, epoch_samples);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t bits;
        memcpy(&bits, &src[i].weight, sizeof(bits));
        s_put64(p + 8 + 16 * i, bits);
        s_put64(p + 16 + 16 * i, src[i].samples);
    }
    return p + s_blend_bytes(n);
}

/* Reads the blend record at p (n_src sources) into *out. */
static int
s_read_blend(emlio_client_t *self, const uint8_t *p, emlio__blend_desc_t *out)
{
    out->epoch_samples = s_get64(p);
    out->src = emlio_calloc(EMLIO_MAX(self->n_src, 1u), sizeof(*out->src));
    if (!out->src)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < self->n_src; i++) {
        uint64_t bits = s_get64(p + 8 + 16 * i);
        memcpy(&out->src[i].weight, &bits, sizeof(bits));
        out->src[i].samples = s_get64(p + 16 + 16 * i);
    }
    return 0;
}

/* The section's size for this client's sources and res's layers. */
static size_t
s_section_bytes(const emlio_client_t *self, const emlio__resume_t *res)
{
    if (!self->n_src)
        return 8;
    size_t len = 8 + 8 * (size_t)self->n_src + s_blend_bytes(self->n_src);
    for (size_t i = 0; res && i < res->n_layers; i++)
        len += s_blend_bytes(self->n_src) + 8 + 16 * res->layers[i].n;
    return len;
}

static void
s_put_section(const emlio_client_t *self, const emlio__resume_t *res,
              uint8_t *p)
{
    size_t n_layers = self->n_src && res ? res->n_layers : 0;
    s_put32(p, self->n_src);
    s_put32(p + 4, (uint32_t)n_layers);
    p += 8;
    if (!self->n_src)
        return;
    for (uint32_t s = 0; s < self->n_src; s++, p += 8)
        s_put64(p, emlio__source_digest(self, s));
    for (size_t i = 0; i < n_layers; i++) {
        const emlio__layer_t *l = &res->layers[i];
        p = s_put_blend(p, l->blend.src, self->n_src, l->blend.epoch_samples);
        s_put64(p, l->n);
        for (size_t k = 0; k < l->n; k++) {
            s_put64(p + 8 + 16 * k, l->spans[k].begin);
            s_put64(p + 16 + 16 * k, l->spans[k].end);
        }
        p += 8 + 16 * l->n;
    }
    s_put_blend(p, self->plan_src, self->n_src, self->cfg.epoch_samples);
}

int
emlio_client_save_state(const emlio_client_t *self, uint8_t **blob_out,
                        size_t *len_out)
{
    assert(self && blob_out && len_out);
    if (!self->win.delivered)
        return emlio__seterr((char *)self->err, EMLIO_EINVAL,
                             "no epoch has been started");
    const emlio__resume_t *res = s_current_resume(self);
    const emlio_plan_span_t *spans = res ? res->spans : NULL;
    size_t n_spans = res ? res->n : 0;
    size_t bitmap = (self->current.n_batches + 7) / 8;
    size_t section = s_section_bytes(self, res);
    if (n_spans > (SIZE_MAX - S_STATE_FIXED4 - bitmap - section - 4) / 16)
        return emlio__seterr((char *)self->err, EMLIO_ENOMEM, "out of memory");
    size_t len = S_STATE_FIXED4 + 16 * n_spans + bitmap + section + 4;
    uint8_t *p = emlio_malloc(len);
    if (!p)
        return emlio__seterr((char *)self->err, EMLIO_ENOMEM, "out of memory");
    s_put_params(self, p);
    s_put64(p + 56, self->current.number);
    s_put64(p + 64, self->current.n_batches);
    s_put64(p + 72, self->inv.share ? self->inv.join : 0);
    s_put64(p + 80, n_spans);
    for (size_t i = 0; i < n_spans; i++) {
        s_put64(p + S_STATE_FIXED4 + 16 * i, spans[i].begin);
        s_put64(p + S_STATE_FIXED4 + 16 * i + 8, spans[i].end);
    }
    memcpy(p + S_STATE_FIXED4 + 16 * n_spans, self->win.delivered, bitmap);
    s_put_section(self, res, p + S_STATE_FIXED4 + 16 * n_spans + bitmap);
    s_put32(p + len - 4, emlio_crc32c(0, p, len - 4));
    *blob_out = p;
    *len_out = len;
    return 0;
}

void
emlio_client_free_blob(uint8_t *blob)
{
    emlio_free(blob);
}

/* One blob, parsed: fields point into it. */
typedef struct s_state {
    uint32_t world, rank, batch_size;
    uint64_t epoch;
    uint64_t n_batches;
    uint64_t share_join;
    uint64_t n_spans;
    const uint8_t *spans; /* n_spans x 16 bytes */
    const uint8_t *bitmap;
    /* Format 5: the blend section, its earlier blends' count, where they
     * begin, and the saving run's blend record (NULL without sources or
     * before 5); format 6: the sources' fingerprints (else NULL). */
    const uint8_t *section;
    size_t section_len;
    uint32_t n_layers;
    const uint8_t *layers;
    const uint8_t *blend;
    const uint8_t *digests;
} s_state_t;

/* A blob's "which", for messages: "resume state" alone, or numbered when
 * it is one of several. */
static const char *
s_which(char *buf, size_t cap, size_t index, size_t n)
{
    if (n == 1)
        snprintf(buf, cap, "resume state");
    else
        snprintf(buf, cap, "resume state %zu of %zu", index, n);
    return buf;
}

/* Walks the blend section of st (of that format): the sources this
 * client has, at most EMLIO_PLAN_MAX_LAYERS earlier blends, every size
 * within the blob. */
static int
s_parse_section(emlio_client_t *self, s_state_t *st, uint32_t format,
                const char *which)
{
    const uint8_t *p = st->section;
    size_t left = st->section_len;
    if (left < 8)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged: its sizes do not add up", which);
    uint32_t n_src = s_get32(p);
    uint32_t n_layers = s_get32(p + 4);
    if (n_src != self->n_src)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s was made with %" PRIu32 " sources, this run "
                             "has %" PRIu32,
                             which, n_src, self->n_src);
    if (n_layers > EMLIO_PLAN_MAX_LAYERS || (!n_src && n_layers))
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged: %" PRIu32 " weight changes", which,
                             n_layers);
    p += 8;
    left -= 8;
    st->digests = NULL;
    if (format >= 6 && n_src) {
        if (left < 8 * (size_t)n_src)
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s is damaged: its sizes do not add up",
                                 which);
        st->digests = p;
        p += 8 * (size_t)n_src;
        left -= 8 * (size_t)n_src;
    }
    st->layers = p;
    size_t blend = s_blend_bytes(n_src);
    for (uint32_t i = 0; n_src && i < n_layers; i++) {
        uint64_t n = left >= blend + 8 ? s_get64(p + blend) : UINT64_MAX;
        if (n > (left - blend - 8) / 16)
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s is damaged: its weight change %" PRIu32
                                 " runs past its end",
                                 which, i);
        p += blend + 8 + 16 * n;
        left -= blend + 8 + 16 * n;
    }
    if (left != (n_src ? blend : 0))
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged: its sizes do not add up", which);
    st->n_layers = n_layers;
    st->blend = n_src ? p : NULL;
    return 0;
}

/* The first of this client's sources whose data is none of st's sources'
 * (its fingerprint is not among theirs), or NULL: none, only their order
 * differs, or st has no fingerprints. */
static const char *
s_changed_source(const emlio_client_t *self, const s_state_t *st)
{
    for (uint32_t i = 0; st->digests && i < self->n_src; i++) {
        uint64_t mine = emlio__source_digest(self, i);
        bool found = false;
        for (uint32_t k = 0; k < self->n_src && !found; k++)
            found = s_get64(st->digests + 8 * (size_t)k) == mine;
        if (!found)
            return self->src[i].name;
    }
    return NULL;
}

/* Whether the parsed blob st describes this client's job: seed, dataset
 * (with sources: the source whose data changed, named), shuffle, window
 * and drop_last; not the world, rank or batch, which the callers check
 * their way. Returns 0 or EMLIO_ESTATE saying what differs. */
static int
s_same_job(emlio_client_t *self, const uint8_t *blob, const s_state_t *st,
           const char *which)
{
    uint8_t mine[S_STATE_FIXED2];
    s_put_params(self, mine);
    /* Past magic, format, and world, rank and batch size. */
    if (!memcmp(mine + 8, blob + 8, 8) && !memcmp(mine + 28, blob + 28, 28))
        return 0;
    const char *source =
        memcmp(mine + 40, blob + 40, 16) ? s_changed_source(self, st) : NULL;
    if (source)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s was made with other data in source '%s': "
                             "its daemons serve another dataset than they "
                             "did, or it names other daemons",
                             which, source);
    /* The sources' names and stratify are folded into the dataset's
     * fingerprint; their weights are recorded apart. */
    const char *what = memcmp(mine + 40, blob + 40, 16)
                           ? (self->n_src ? "dataset or sources (their "
                                            "names, order, or stratify)"
                                          : "dataset")
                       : memcmp(mine + 8, blob + 8, 8) ? "seed"
                       : memcmp(mine + 28, blob + 28, 4)
                           ? "shuffle"
                           : "shard window or drop_last";
    return emlio__seterr(self->err, EMLIO_ESTATE, "%s was made with another %s",
                         which, what);
}

/* Checks a blob's framing and that it describes this client's job (seed,
 * dataset, order, window, drop_last: not the world, rank or batch, which
 * the callers check their way), and parses it into *st. */
static int
s_parse(emlio_client_t *self, const uint8_t *blob, size_t len,
        const char *which, s_state_t *st)
{
    if (len < S_STATE_FIXED2 + 4 || memcmp(blob, S_STATE_MAGIC, 4) ||
        s_get32(blob + len - 4) != emlio_crc32c(0, blob, len - 4))
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged or not an emlio state", which);
    uint32_t format = s_get32(blob + 4);
    if (format < 2 || format > S_STATE_FORMAT)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s has format %" PRIu32 ", expected %u%s", which,
                             format, S_STATE_FORMAT,
                             format == 1 ? ": it was saved against plan "
                                           "version 1, whose sample order "
                                           "differs; start the epoch again"
                                         : "");
    size_t fixed = format == 2   ? S_STATE_FIXED2
                   : format == 3 ? S_STATE_FIXED3
                                 : S_STATE_FIXED4;
    if (format < 5 && self->n_src)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s has format %" PRIu32 ", which did not record "
                             "the sources' weights; start the epoch again",
                             which, format);
    if (len < fixed + 4)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged or not an emlio state", which);
    st->world = s_get32(blob + 16);
    st->rank = s_get32(blob + 20);
    st->batch_size = s_get32(blob + 24);
    st->epoch = s_get64(blob + 56);
    st->n_batches = s_get64(blob + 64);
    st->share_join = format >= 3 ? s_get64(blob + 72) : 0;
    st->n_spans = format >= 4 ? s_get64(blob + 80) : 0;
    size_t room = len - fixed - 4;
    uint64_t bitmap = st->n_batches / 8 + (st->n_batches % 8 != 0);
    if (st->world == 0 || st->rank >= st->world || st->batch_size == 0 ||
        st->n_spans > room / 16 || bitmap > room - 16 * st->n_spans ||
        (format < 5 && room - 16 * st->n_spans != bitmap))
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged: its sizes do not add up", which);
    st->spans = blob + fixed;
    st->bitmap = blob + fixed + 16 * st->n_spans;
    st->section = st->bitmap + bitmap;
    st->section_len = room - 16 * st->n_spans - (size_t)bitmap;
    st->n_layers = 0;
    st->blend = NULL;
    st->digests = NULL;
    int rc = format < 5 ? 0 : s_parse_section(self, st, format, which);
    return rc < 0 ? rc : s_same_job(self, blob, st, which);
}

static bool
s_delivered(const s_state_t *st, uint64_t i)
{
    return st->bitmap[i / 8] >> (i % 8) & 1;
}

/* Reads n spans at p into a new array *out, checking they are sorted,
 * disjoint and non-empty. */
static int
s_read_spans(emlio_client_t *self, const uint8_t *p, uint64_t n,
             const char *which, emlio_plan_span_t **out)
{
    *out = NULL;
    if (n == 0)
        return 0;
    emlio_plan_span_t *spans = emlio_calloc((size_t)n, sizeof(*spans));
    if (!spans)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        spans[i] =
            (emlio_plan_span_t){ s_get64(p + 16 * i), s_get64(p + 16 * i + 8) };
        if (spans[i].begin >= spans[i].end ||
            (i && spans[i].begin < spans[i - 1].end)) {
            emlio_free(spans);
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s is damaged: consumed span %" PRIu64
                                 " is empty or out of order",
                                 which, i);
        }
    }
    *out = spans;
    return 0;
}

/* Whether st was saved with this client's weights, counts and epoch size
 * (a state without sources: yes). */
static bool
s_same_blend(const emlio_client_t *self, const s_state_t *st)
{
    if (!st->blend)
        return true;
    if (s_get64(st->blend) != self->cfg.epoch_samples)
        return false;
    for (uint32_t i = 0; i < self->n_src; i++) {
        const uint8_t *p = st->blend + 8 + 16 * (size_t)i;
        uint64_t bits;
        memcpy(&bits, &self->plan_src[i].weight, sizeof(bits));
        if (s_get64(p) != bits || s_get64(p + 8) != self->plan_src[i].samples)
            return false;
    }
    return true;
}

/* Makes what st says earlier runs consumed of its epoch the client's
 * resume: its spans and the blends the epoch had before (none: the
 * epoch is planned whole). The planner checks the spans against the
 * epoch's size when the epoch begins. */
static int
s_set_resume(emlio_client_t *self, const s_state_t *st, const char *which)
{
    emlio__resume_t *res = &self->resume;
    emlio__resume_clear(res);
    int rc = s_read_spans(self, st->spans, st->n_spans, which, &res->spans);
    if (rc < 0)
        return rc;
    res->n = (size_t)st->n_spans;
    if (st->n_layers &&
        !(res->layers = emlio_calloc(st->n_layers, sizeof(*res->layers))))
        rc = emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    const uint8_t *p = st->layers;
    for (uint32_t i = 0; i < st->n_layers && rc == 0; i++) {
        emlio__layer_t *l = &res->layers[i];
        res->n_layers++;
        rc = s_read_blend(self, p, &l->blend);
        p += s_blend_bytes(self->n_src);
        uint64_t n = s_get64(p);
        if (rc == 0)
            rc = s_read_spans(self, p + 8, n, which, &l->spans);
        l->n = (size_t)n;
        p += 8 + 16 * n;
    }
    if (rc < 0) {
        emlio__resume_clear(res);
        return rc;
    }
    res->epoch = st->epoch;
    res->live = res->n > 0 || res->n_layers > 0;
    return 0;
}

/* Begins epoch (planned as self->resume says) with nothing requested
 * ahead surviving: some of it may be delivered already according to the
 * state. */
static int
s_begin(emlio_client_t *self, uint64_t epoch)
{
    emlio__epoch_abandon(self, 0);
    self->ahead.live = false;
    return emlio_client_begin_epoch(self, epoch);
}

int
emlio_client_load_state(emlio_client_t *self, const uint8_t *blob, size_t len)
{
    assert(self && blob);
    s_state_t st;
    int rc = s_parse(self, blob, len, "resume state", &st);
    if (rc < 0)
        return rc;
    if (st.world != self->cfg.world || st.rank != self->cfg.rank ||
        st.batch_size != self->cfg.batch_size)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state was saved by rank %" PRIu32
                             " of %" PRIu32 " with batch %" PRIu32
                             "; this is rank %" PRIu32 " of %" PRIu32
                             " with batch %" PRIu32
                             ": to resume on another number of ranks, give "
                             "every rank's state to emlio_client_load_states",
                             st.rank, st.world, st.batch_size, self->cfg.rank,
                             self->cfg.world, self->cfg.batch_size);
    /* Other weights: the rest of the epoch follows from what the whole job
     * delivered, which only every rank's state together says. */
    if (!s_same_blend(self, &st)) {
        if (st.world == 1)
            return emlio_client_load_states(self, &blob, &len, 1);
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state was saved with other weights, "
                             "counts or epoch size of the sources: to change "
                             "them in the middle of an epoch, give every "
                             "rank's state to emlio_client_load_states "
                             "(emlio fetch --resume-from)");
    }
    /* A sharing job goes on from the cursor it started at, whatever the
     * daemons say now: its order is the saved one. */
    if (self->inv.share)
        self->inv.join = st.share_join;
    rc = s_set_resume(self, &st, "resume state");
    if (rc < 0)
        return rc;
    rc = s_begin(self, st.epoch);
    if (rc < 0) {
        /* Spans the plan refuses would fail every later begin of the
         * epoch: the state is dropped with its error. */
        emlio__resume_clear(&self->resume);
        return rc;
    }
    uint64_t n = st.n_batches;
    if (n != self->current.n_batches)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state has %" PRIu64 " batches, the plan "
                             "%zu",
                             n, self->current.n_batches);
    memcpy(self->win.delivered, st.bitmap, (n + 7) / 8);
    self->win.n_delivered = 0;
    for (size_t i = 0; i < n; i++)
        self->win.n_delivered += emlio__window_is_delivered(self, i);
    if (self->win.n_delivered == n)
        self->current.live = true; /* next() reports the end at once */
    return (int)(n - self->win.n_delivered);
}

/* ---- the states of every rank: elastic resume --------------------------- */

/* Consumed spans as they are gathered, before normalization. */
typedef struct s_spans {
    emlio_plan_span_t *v;
    size_t n;
    size_t cap;
} s_spans_t;

static int
s_spans_add(void *arg, uint64_t begin, uint64_t end)
{
    s_spans_t *s = arg;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        emlio_plan_span_t *v = emlio_reallocarray(s->v, cap, sizeof(*v));
        if (!v)
            return EMLIO_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (emlio_plan_span_t){ begin, end };
    return 0;
}

/* Checks that the n states are one run's, a state per rank, of a job with
 * this client's global batch, and finds the epoch they resume (*epoch)
 * and the state whose spans say what runs before theirs consumed (*base).
 * A rank may have finished the epoch before the others and saved its
 * state at the end of it: that is the epoch before, complete. */
static int
s_check_run(emlio_client_t *self, const s_state_t *st, size_t n,
            uint64_t *epoch, size_t *base)
{
    char a[64], b[64];
    uint32_t world = st[0].world, batch = st[0].batch_size;
    uint64_t top = 0;
    for (size_t i = 0; i < n; i++) {
        if (st[i].world != world || st[i].batch_size != batch)
            return emlio__seterr(
                self->err, EMLIO_ESTATE,
                "%s was saved by a run of %" PRIu32 " ranks x batch %" PRIu32
                ", %s by one of %" PRIu32 " x %" PRIu32
                ": give the states of one run",
                s_which(a, sizeof(a), i, n), st[i].world, st[i].batch_size,
                s_which(b, sizeof(b), 0, n), world, batch);
        top = EMLIO_MAX(top, st[i].epoch);
    }
    uint64_t global = (uint64_t)world * batch;
    uint64_t mine = (uint64_t)self->cfg.world * self->cfg.batch_size;
    if (global != mine)
        return emlio__seterr(
            self->err, EMLIO_ESTATE,
            "resume states are of a job with global batch %" PRIu32
            " x %" PRIu32 " = %" PRIu64 ", this run's is %" PRIu32 " x %" PRIu32
            " = %" PRIu64 "%s",
            world, batch, global, self->cfg.world, self->cfg.batch_size, mine,
            global % self->cfg.world ? ": elastic resume keeps the global "
                                       "batch, and this world size does not "
                                       "divide it"
                                     : ": elastic resume keeps the global "
                                       "batch (batch size = global batch / "
                                       "world size)");
    /* By rank, up to n (a damaged world of 2^32 must not size anything):
     * with one state per rank of the world, ranks 0 .. n - 1 are all
     * there and world == n. */
    size_t *by_rank = emlio_calloc(n, sizeof(*by_rank));
    if (!by_rank)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (st[i].rank >= n)
            continue;
        size_t *seen = &by_rank[st[i].rank];
        if (*seen)
            rc = emlio__seterr(self->err, EMLIO_ESTATE,
                               "%s and %s are both of rank %" PRIu32,
                               s_which(a, sizeof(a), *seen - 1, n),
                               s_which(b, sizeof(b), i, n), st[i].rank);
        *seen = i + 1;
    }
    uint64_t missing = n; /* all of 0 .. n - 1 seen: rank n, when world > n */
    for (size_t r = 0; r < n && rc == 0 && missing == n; r++)
        if (!by_rank[r])
            missing = r;
    emlio_free(by_rank);
    if (rc == 0 && (missing < n || world > n))
        rc = emlio__seterr(self->err, EMLIO_ESTATE,
                           "no resume state of rank %" PRIu64 " of the %" PRIu32
                           " that ran was given",
                           missing, world);
    if (rc < 0)
        return rc;
    *base = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        const s_state_t *s = &st[i];
        if (s->epoch == top) {
            if (*base == SIZE_MAX) {
                *base = i;
                continue;
            }
            const s_state_t *o = &st[*base];
            if (s->share_join != o->share_join || s->n_spans != o->n_spans ||
                memcmp(s->spans, o->spans, 16 * s->n_spans) ||
                s->section_len != o->section_len ||
                memcmp(s->section, o->section, s->section_len))
                return emlio__seterr(
                    self->err, EMLIO_ESTATE,
                    "%s and %s disagree on what runs before them consumed "
                    "or on the sources' weights: they were not saved by "
                    "one run",
                    s_which(a, sizeof(a), *base, n),
                    s_which(b, sizeof(b), i, n));
            continue;
        }
        bool complete = s->epoch + 1 == top;
        for (uint64_t k = 0; complete && k < s->n_batches; k++)
            complete = s_delivered(s, k);
        if (!complete)
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s is in epoch %" PRIu64
                                 " unfinished while another is in epoch "
                                 "%" PRIu64 ": give the states of one run",
                                 s_which(a, sizeof(a), i, n), s->epoch, top);
    }
    *epoch = top;
    return 0;
}

/* Adds to out the global positions the batches the states of `epoch`
 * delivered cover: each state's rank took the rest positions its slice
 * says (emlio_plan_slice), which rest maps back to global ones. Padding
 * (rest positions past the rest's end) consumed nothing. */
static int
s_gather(emlio_client_t *self, const s_state_t *st, size_t n, uint64_t epoch,
         const emlio__rest_t *rest, uint64_t rest_size, s_spans_t *out)
{
    char a[64];
    for (size_t i = 0; i < n; i++) {
        const s_state_t *s = &st[i];
        if (s->epoch != epoch)
            continue;
        uint64_t q0, q1;
        if (emlio_plan_batch_span(rest_size, s->world, s->rank, s->batch_size,
                                  self->cfg.drop_last, self->cfg.stratify, 0,
                                  &q0, &q1) < 0)
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s cannot be of this dataset",
                                 s_which(a, sizeof(a), i, n));
        uint64_t want =
            emlio_plan_rank_batches(rest_size, s->world, s->batch_size,
                                    self->cfg.drop_last, self->cfg.stratify);
        if (s->n_batches != want)
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s has %" PRIu64 " batches, its rank's plan "
                                 "%" PRIu64 ": it was saved against another "
                                 "inventory",
                                 s_which(a, sizeof(a), i, n), s->n_batches,
                                 want);
        for (uint64_t k = 0; k < s->n_batches; k++) {
            if (!s_delivered(s, k))
                continue;
            emlio_plan_batch_span(rest_size, s->world, s->rank, s->batch_size,
                                  self->cfg.drop_last, self->cfg.stratify, k,
                                  &q0, &q1);
            if (q0 < q1 && emlio__rest_map(rest, q0, q1, s_spans_add, out) < 0)
                return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        }
    }
    return 0;
}

/* Sizes the rest that the runs before the states' left of epoch: the
 * epoch's size from a plan of this client, less base's spans (loaded into
 * rest). */
static int
s_rest_before(emlio_client_t *self, uint64_t epoch, emlio__rest_t *rest,
              uint64_t *rest_size)
{
    emlio_plan_t *plan = emlio_plan_new();
    if (!plan)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    int rc = emlio__epoch_plan(self, plan, epoch);
    uint64_t size = rc < 0 ? 0 : emlio_plan_dataset_size(plan);
    emlio_plan_destroy(&plan);
    if (rc < 0)
        return rc;
    rc = emlio__rest_set(rest, self->resume.spans, self->resume.n, size,
                         self->err);
    if (rc < 0)
        return rc;
    *rest_size = size - rest->done;
    return 0;
}

/* The states' blend, when it is not this client's: the rest they left is
 * planned with it while they are merged. */
static int
s_their_blend(emlio_client_t *self, const s_state_t *st,
              emlio__blend_desc_t *out)
{
    *out = (emlio__blend_desc_t){ 0 };
    if (s_same_blend(self, st))
        return 0;
    int rc = s_read_blend(self, st->blend, out);
    self->resume.blend = rc == 0 ? out : NULL;
    return rc;
}

/* The weights changed: the blend the states ran with becomes an earlier
 * layer of the epoch, with all they consumed of it (all, taken), and
 * this run starts a new one with nothing of it consumed. */
static int
s_push_layer(emlio_client_t *self, emlio__blend_desc_t *theirs, s_spans_t *all)
{
    emlio__resume_t *res = &self->resume;
    if (res->n_layers >= EMLIO_PLAN_MAX_LAYERS)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "the weights changed %d times in epoch %" PRIu64
                             " already: finish it with these",
                             EMLIO_PLAN_MAX_LAYERS, res->epoch);
    emlio__layer_t *grown =
        emlio_reallocarray(res->layers, res->n_layers + 1, sizeof(*grown));
    if (!grown)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    res->layers = grown;
    res->layers[res->n_layers++] = (emlio__layer_t){ *theirs, all->v, all->n };
    *theirs = (emlio__blend_desc_t){ 0 };
    *all = (s_spans_t){ 0 };
    return 0;
}

int
emlio_client_load_states(emlio_client_t *self, const uint8_t *const *blobs,
                         const size_t *lens, size_t n)
{
    assert(self && (blobs || n == 0) && (lens || n == 0));
    if (n == 0)
        return emlio__seterr(self->err, EMLIO_EINVAL, "no resume state given");
    s_state_t *st = emlio_calloc(n, sizeof(*st));
    if (!st)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    s_spans_t all = { 0 };
    emlio__rest_t rest = { 0 };
    emlio__blend_desc_t theirs = { 0 };
    char which[64];
    uint64_t epoch = 0, rest_size = 0;
    size_t base = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = s_parse(self, blobs[i], lens[i],
                     s_which(which, sizeof(which), i, n), &st[i]);
    if (rc == 0)
        rc = s_check_run(self, st, n, &epoch, &base);
    if (rc == 0 && self->inv.share)
        self->inv.join = st[base].share_join;
    if (rc == 0)
        rc = s_set_resume(self, &st[base],
                          s_which(which, sizeof(which), base, n));
    if (rc == 0) {
        /* The rest they left is of their epoch, which may have ended
         * since: a resume of a later one has nothing to plan from. */
        self->resume.live = true;
        self->resume.epoch = epoch;
        rc = s_their_blend(self, &st[base], &theirs);
    }
    if (rc == 0)
        rc = s_rest_before(self, epoch, &rest, &rest_size);
    if (rc == 0)
        rc = s_gather(self, st, n, epoch, &rest, rest_size, &all);
    for (size_t i = 0; i < self->resume.n && rc == 0; i++)
        if (s_spans_add(&all, self->resume.spans[i].begin,
                        self->resume.spans[i].end) < 0)
            rc = emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    emlio__rest_release(&rest);
    self->resume.blend = NULL;
    emlio__spans_normalize(all.v, &all.n);
    emlio_free(self->resume.spans);
    self->resume.spans = NULL;
    self->resume.n = 0;
    if (rc == 0 && theirs.src)
        rc = s_push_layer(self, &theirs, &all);
    emlio_free(theirs.src);
    emlio_free(st);
    if (rc < 0) {
        emlio__resume_clear(&self->resume);
        emlio_free(all.v);
        return rc;
    }
    self->resume.spans = all.v;
    self->resume.n = all.n;
    self->resume.live = all.n > 0 || self->resume.n_layers > 0;
    rc = s_begin(self, epoch);
    if (rc < 0)
        emlio__resume_clear(&self->resume);
    return rc < 0 ? rc : (int)self->current.n_batches;
}
