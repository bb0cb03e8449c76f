/* client_state.c - the client's resume state: which batches of which
 * epoch were handed over, saved and loaded as a checked blob, and the
 * states of every rank of a run merged into what the job consumed, so a
 * run on another number of ranks can plan the rest (docs/planner.md,
 * "Elastic resume").
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

#include "crc32c.h"
#include "plan_rest.h"

/* ---- resume state ------------------------------------------------------ */

/* Layout (little endian): "EMLS", u32 format 4, u64 seed, u32 world, rank,
 * batch_size, shuffle, window_shards, drop_last, char dataset[16],
 * u64 epoch, u64 n_batches, u64 share_join, u64 n_spans,
 * n_spans x (u64 begin, u64 end), bitmap[(n_batches + 7) / 8],
 * u32 crc32c of all the bytes before it (docs/protocol.md, "Resume
 * state"). The spans are the epoch's global positions earlier runs of the
 * job consumed: the plan the bitmap names covers the rest. The bitmap
 * names batches of one order, so the format follows the plan version:
 * format 1 was plan version 1. Formats 2 (no share_join: read as 0) and 3
 * (no spans) are read still. */
#define S_STATE_MAGIC "EMLS"

#define S_STATE_FORMAT 4u
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

/* The spans earlier runs consumed of the current epoch (none unless a
 * resume put the client in it). */
static size_t
s_current_spans(const emlio_client_t *self, const emlio_plan_span_t **out)
{
    bool mine = self->resume.live && self->resume.epoch == self->current.number;
    *out = mine ? self->resume.spans : NULL;
    return mine ? self->resume.n : 0;
}

int
emlio_client_save_state(const emlio_client_t *self, uint8_t **blob_out,
                        size_t *len_out)
{
    assert(self && blob_out && len_out);
    if (!self->win.delivered)
        return emlio__seterr((char *)self->err, EMLIO_EINVAL,
                             "no epoch has been started");
    const emlio_plan_span_t *spans;
    size_t n_spans = s_current_spans(self, &spans);
    size_t bitmap = (self->current.n_batches + 7) / 8;
    if (n_spans > (SIZE_MAX - S_STATE_FIXED4 - bitmap - 4) / 16)
        return emlio__seterr((char *)self->err, EMLIO_ENOMEM, "out of memory");
    size_t len = S_STATE_FIXED4 + 16 * n_spans + bitmap + 4;
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
    if (len < fixed + 4)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged or not an emlio state", which);
    uint8_t mine[S_STATE_FIXED2];
    s_put_params(self, mine);
    /* Past magic, format, and world, rank and batch size. */
    if (memcmp(mine + 8, blob + 8, 8) || memcmp(mine + 28, blob + 28, 28)) {
        /* The sources, their weights and counts are folded into the
         * dataset's fingerprint: changing them mid-run is not built. */
        const char *what = memcmp(mine + 40, blob + 40, 16)
                               ? (self->n_src ? "dataset or blend of sources "
                                                "(names, weights, counts, "
                                                "epoch size, stratify)"
                                              : "dataset")
                           : memcmp(mine + 8, blob + 8, 8) ? "seed"
                           : memcmp(mine + 28, blob + 28, 4)
                               ? "shuffle"
                               : "shard window or drop_last";
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s was made with another %s", which, what);
    }
    st->world = s_get32(blob + 16);
    st->rank = s_get32(blob + 20);
    st->batch_size = s_get32(blob + 24);
    st->epoch = s_get64(blob + 56);
    st->n_batches = s_get64(blob + 64);
    st->share_join = format >= 3 ? s_get64(blob + 72) : 0;
    st->n_spans = format >= 4 ? s_get64(blob + 80) : 0;
    size_t room = len - fixed - 4;
    if (st->world == 0 || st->rank >= st->world || st->batch_size == 0 ||
        st->n_spans > room / 16 ||
        (room - 16 * st->n_spans) != (st->n_batches + 7) / 8)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "%s is damaged: its sizes do not add up", which);
    st->spans = blob + fixed;
    st->bitmap = blob + fixed + 16 * st->n_spans;
    return 0;
}

static void
s_span_at(const s_state_t *st, uint64_t i, emlio_plan_span_t *out)
{
    out->begin = s_get64(st->spans + 16 * i);
    out->end = s_get64(st->spans + 16 * i + 8);
}

static bool
s_delivered(const s_state_t *st, uint64_t i)
{
    return st->bitmap[i / 8] >> (i % 8) & 1;
}

/* Makes the spans of st what earlier runs consumed of its epoch (none:
 * the epoch is planned whole). The planner checks them against the
 * epoch's size when the epoch begins. */
static int
s_set_resume(emlio_client_t *self, const s_state_t *st, const char *which)
{
    self->resume.live = false;
    self->resume.n = 0;
    if (st->n_spans == 0)
        return 0;
    emlio_plan_span_t *spans =
        emlio_reallocarray(self->resume.spans, st->n_spans, sizeof(*spans));
    if (!spans)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    self->resume.spans = spans;
    for (uint64_t i = 0; i < st->n_spans; i++) {
        s_span_at(st, i, &spans[i]);
        if (spans[i].begin >= spans[i].end ||
            (i && spans[i].begin < spans[i - 1].end))
            return emlio__seterr(self->err, EMLIO_ESTATE,
                                 "%s is damaged: consumed span %" PRIu64
                                 " is empty or out of order",
                                 which, i);
    }
    self->resume.n = (size_t)st->n_spans;
    self->resume.epoch = st->epoch;
    self->resume.live = true;
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
    /* A sharing job goes on from the cursor it started at, whatever the
     * daemons say now: its order is the saved one. */
    if (self->inv.share)
        self->inv.join = st.share_join;
    rc = s_set_resume(self, &st, "resume state");
    if (rc < 0)
        return rc;
    rc = s_begin(self, st.epoch);
    if (rc < 0)
        return rc;
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
                memcmp(s->spans, o->spans, 16 * s->n_spans))
                return emlio__seterr(
                    self->err, EMLIO_ESTATE,
                    "%s and %s disagree on what runs before them consumed: "
                    "they were not saved by one run",
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
    if (rc == 0)
        rc = s_rest_before(self, epoch, &rest, &rest_size);
    if (rc == 0)
        rc = s_gather(self, st, n, epoch, &rest, rest_size, &all);
    for (size_t i = 0; i < self->resume.n && rc == 0; i++)
        if (s_spans_add(&all, self->resume.spans[i].begin,
                        self->resume.spans[i].end) < 0)
            rc = emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    emlio__rest_release(&rest);
    emlio_free(st);
    if (rc < 0) {
        self->resume.live = false;
        emlio_free(all.v);
        return rc;
    }
    emlio__spans_normalize(all.v, &all.n);
    emlio_free(self->resume.spans);
    self->resume = (emlio__resume_t){ all.n > 0, epoch, all.v, all.n };
    rc = s_begin(self, epoch);
    return rc < 0 ? rc : (int)self->current.n_batches;
}
