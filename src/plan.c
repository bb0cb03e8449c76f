/* plan.c - the epoch planner: a pure function from a shard inventory and
 * the job's parameters to one rank's ordered samples and batch boundaries.
 * The algorithm and its generator are specified in docs/planner.md.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

/* 2^64 / phi, the splitmix64 increment. */
#define S_GOLDEN   UINT64_C(0x9e3779b97f4a7c15)
/* Initial value of the key derivation: "EMLIO" in ASCII, then zeros. */
#define S_KEY_INIT UINT64_C(0x454d4c494f000000)

struct emlio_plan {
    emlio_plan_sample_t *samples; /* this rank's samples, in order */
    size_t n_samples;
    size_t cap;
    size_t batch_size;
    size_t n_batches;
    uint64_t pad;
    uint64_t dataset;
    uint64_t dropped;
    char err[EMLIO_ERRMSG_LEN];
};

/* One distinct shard name after replicas are merged. */
struct s_shard {
    size_t first;     /* start of its run in the name-sorted entries */
    size_t count;     /* caller entries that carry this name */
    uint64_t records; /* equal in every entry, or the build fails */
    uint64_t weight;  /* what holder balancing counts: bytes or records */
    uint32_t caller;  /* the caller's index reported in samples */
    uint32_t daemon;  /* the holder chosen to read it */
};

/* A caller entry with its name, so qsort needs no context pointer. */
struct s_named {
    const char *name;
    uint32_t index;
};

/* A replicated shard waiting for a holder, in the greedy's order. */
struct s_weighted {
    uint64_t weight;
    uint32_t shard;
};

/* Everything one build works with. Freed by s_build_release. */
struct s_build {
    const emlio_plan_shard_t *shards;
    struct s_named *named; /* caller entries sorted by name, then index */
    struct s_shard *uniq;  /* distinct names in name order */
    size_t n_uniq;
    uint32_t *perm;   /* uniq indices in this epoch's order */
    uint64_t *wstart; /* first global position of each window */
    size_t n_win;
    size_t window;            /* shards per window */
    emlio_plan_sample_t *tmp; /* one window's samples */
    size_t tmp_win;           /* window held in tmp, or SIZE_MAX */
    uint64_t seed;
    uint64_t epoch;
    bool shuffle;
};

/* xoshiro256** (Blackman and Vigna, 2018), chosen because it is small,
 * fast, passes BigCrush and has a public reference implementation that a
 * second implementation of the planner can check itself against. */
typedef struct s_rng {
    uint64_t s[4];
} s_rng_t;

static uint64_t
s_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* The splitmix64 output function: a bijection on 64-bit words that mixes
 * every input bit into every output bit. */
static uint64_t
s_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t
s_splitmix64(uint64_t *state)
{
    *state += S_GOLDEN;
    return s_mix64(*state);
}

/* Seeds a generator for one stream of one epoch. Each window has its own
 * stream, so a rank can produce any window without drawing the numbers of
 * the windows before it, and every rank draws the same numbers. */
static void
s_rng_seed(s_rng_t *rng, uint64_t seed, uint64_t epoch, uint64_t stream)
{
    uint64_t key = S_KEY_INIT;
    key = s_mix64(key ^ seed);
    key = s_mix64(key ^ epoch);
    key = s_mix64(key ^ stream);
    for (size_t i = 0; i < 4; i++)
        rng->s[i] = s_splitmix64(&key);
}

static uint64_t
s_rng_next(s_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = s_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return result;
}

/* The full 128-bit product of a and b. */
static void
s_mul128(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo)
{
#if defined(__SIZEOF_INT128__)
    __extension__ unsigned __int128 m = (unsigned __int128)a * b;
    *hi = (uint64_t)(m >> 64);
    *lo = (uint64_t)m;
#else
    uint64_t a_lo = a & 0xffffffffu;
    uint64_t a_hi = a >> 32;
    uint64_t b_lo = b & 0xffffffffu;
    uint64_t b_hi = b >> 32;
    uint64_t ll = a_lo * b_lo;
    uint64_t lh = a_lo * b_hi;
    uint64_t hl = a_hi * b_lo;
    uint64_t hh = a_hi * b_hi;
    uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
    *hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
    *lo = (mid << 32) | (ll & 0xffffffffu);
#endif
}

/* A uniform integer in [0, range), range >= 1, by Lemire's multiply-and-
 * reject method ("Fast random integer generation in an interval", 2019):
 * unbiased, and it divides only on the rare rejection path. */
static uint64_t
s_rng_below(s_rng_t *rng, uint64_t range)
{
    uint64_t hi;
    uint64_t lo;
    s_mul128(s_rng_next(rng), range, &hi, &lo);
    if (lo < range) {
        uint64_t threshold = (0 - range) % range;
        while (lo < threshold)
            s_mul128(s_rng_next(rng), range, &hi, &lo);
    }
    return hi;
}

static int
s_cmp_named(const void *a, const void *b)
{
    const struct s_named *x = a;
    const struct s_named *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    return (x->index > y->index) - (x->index < y->index);
}

static int
s_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a;
    uint32_t y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Heaviest first, then name order, so the greedy is deterministic. */
static int
s_cmp_weighted(const void *a, const void *b)
{
    const struct s_weighted *x = a;
    const struct s_weighted *y = b;
    if (x->weight != y->weight)
        return x->weight < y->weight ? 1 : -1;
    return (x->shard > y->shard) - (x->shard < y->shard);
}

void
emlio_plan_params_init(emlio_plan_params_t *p)
{
    assert(p);
    memset(p, 0, sizeof(*p));
    p->world = 1;
    p->rank = 0;
    p->batch_size = 32;
    p->shuffle = EMLIO_SHUFFLE_WINDOW;
    /* One window over every shard: a uniform shuffle of the dataset. A
     * batch then holds what a uniform shuffle's would, however the
     * samples are laid out (an ImageFolder's shards are its classes). */
    p->window_shards = 0;
    p->drop_last = false;
}

emlio_plan_t *
emlio_plan_new(void)
{
    return emlio_calloc(1, sizeof(emlio_plan_t));
}

void
emlio_plan_destroy(emlio_plan_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_free((*self_p)->samples);
    emlio_free(*self_p);
    *self_p = NULL;
}

static void
s_build_release(struct s_build *b)
{
    emlio_free(b->named);
    emlio_free(b->uniq);
    emlio_free(b->perm);
    emlio_free(b->wstart);
    emlio_free(b->tmp);
}

static int
s_nomem(emlio_plan_t *self, const char *what)
{
    return emlio__seterr(self->err, EMLIO_ENOMEM,
                         "cannot plan epoch: out of memory for %s", what);
}

/* Checks the inventory and sorts it by name, so nothing later depends on
 * the order of the caller's array. */
static int
s_sort_inventory(emlio_plan_t *self, struct s_build *b, size_t n)
{
    const emlio_plan_shard_t *shards = b->shards;
    for (size_t i = 0; i < n; i++) {
        if (!shards[i].name)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "shard %zu has no name", i);
        if (!shards[i].holders || shards[i].n_holders == 0)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "shard '%s' has no holders", shards[i].name);
    }
    b->named = emlio_reallocarray(NULL, n, sizeof(*b->named));
    if (!b->named)
        return s_nomem(self, "the shard index");
    for (size_t i = 0; i < n; i++) {
        b->named[i].name = shards[i].name;
        b->named[i].index = (uint32_t)i;
    }
    qsort(b->named, n, sizeof(*b->named), s_cmp_named);
    return 0;
}

/* Merges entries of the same name into one shard. Replicas must agree on
 * the record count: a disagreement means two different files share a
 * name, and reading either would break exactly-once. */
static int
s_merge_replicas(emlio_plan_t *self, struct s_build *b, size_t n)
{
    const emlio_plan_shard_t *shards = b->shards;
    b->uniq = emlio_reallocarray(NULL, n, sizeof(*b->uniq));
    if (!b->uniq)
        return s_nomem(self, "the shard table");
    b->n_uniq = 0;
    uint64_t total_bytes = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        const emlio_plan_shard_t *s = &shards[b->named[i].index];
        uint64_t lo = s->records;
        uint64_t hi = s->records;
        uint64_t bytes = s->bytes;
        while (j < n && strcmp(b->named[j].name, b->named[i].name) == 0) {
            const emlio_plan_shard_t *r = &shards[b->named[j].index];
            lo = EMLIO_MIN(lo, r->records);
            hi = EMLIO_MAX(hi, r->records);
            bytes = EMLIO_MAX(bytes, r->bytes);
            j++;
        }
        if (lo != hi)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "shard '%s' has conflicting record counts: "
                                 "%" PRIu64 " and %" PRIu64,
                                 s->name, lo, hi);
        struct s_shard *u = &b->uniq[b->n_uniq++];
        u->first = i;
        u->count = j - i;
        u->records = lo;
        u->weight = bytes;
        /* Saturate: the sum only ranks daemons against each other. */
        total_bytes =
            bytes > UINT64_MAX - total_bytes ? UINT64_MAX : total_bytes + bytes;
        i = j;
    }
    /* Without sizes, balance holders by record count instead. */
    if (total_bytes == 0)
        for (size_t k = 0; k < b->n_uniq; k++)
            b->uniq[k].weight = b->uniq[k].records;
    return 0;
}

/* Whether shard u has more than one distinct holder. */
static bool
s_replicated(const struct s_build *b, const struct s_shard *u)
{
    uint32_t d0 = b->shards[b->named[u->first].index].holders[0];
    for (size_t e = u->first; e < u->first + u->count; e++) {
        const emlio_plan_shard_t *s = &b->shards[b->named[e].index];
        for (uint32_t h = 0; h < s->n_holders; h++)
            if (s->holders[h] != d0)
                return true;
    }
    return false;
}

static size_t
s_daemon_slot(const uint32_t *ids, size_t n, uint32_t daemon)
{
    const uint32_t *p = bsearch(&daemon, ids, n, sizeof(*ids), s_cmp_u32);
    assert(p);
    return (size_t)(p - ids);
}

/* Chooses one holder per shard. Single-holder shards fix a base load on
 * their daemon; replicated shards then go, heaviest first, to the least
 * loaded of their holders (ties to the lowest daemon index). The choice
 * does not depend on the epoch, so each daemon keeps reading the same
 * files and its page cache stays useful from one epoch to the next. */
static int
s_choose_holders(emlio_plan_t *self, struct s_build *b, size_t n)
{
    const emlio_plan_shard_t *shards = b->shards;
    size_t n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        if (shards[i].n_holders > SIZE_MAX - n_ids)
            return s_nomem(self, "the holder table");
        n_ids += shards[i].n_holders;
    }
    uint32_t *ids = emlio_reallocarray(NULL, n_ids, sizeof(*ids));
    uint64_t *load = emlio_calloc(n_ids, sizeof(*load));
    struct s_weighted *rep = emlio_reallocarray(NULL, b->n_uniq, sizeof(*rep));
    int rc = 0;
    if (!ids || !load || !rep) {
        rc = s_nomem(self, "the holder table");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < shards[i].n_holders; h++)
            ids[k++] = shards[i].holders[h];
    qsort(ids, n_ids, sizeof(*ids), s_cmp_u32);
    size_t n_daemons = 0;
    for (size_t i = 0; i < n_ids; i++)
        if (n_daemons == 0 || ids[n_daemons - 1] != ids[i])
            ids[n_daemons++] = ids[i];

    size_t n_rep = 0;
    for (size_t u = 0; u < b->n_uniq; u++) {
        struct s_shard *sh = &b->uniq[u];
        if (s_replicated(b, sh)) {
            rep[n_rep].weight = sh->weight;
            rep[n_rep].shard = (uint32_t)u;
            n_rep++;
            continue;
        }
        const emlio_plan_shard_t *s = &shards[b->named[sh->first].index];
        sh->daemon = s->holders[0];
        sh->caller = b->named[sh->first].index;
        size_t slot = s_daemon_slot(ids, n_daemons, sh->daemon);
        load[slot] = sh->weight > UINT64_MAX - load[slot]
                         ? UINT64_MAX
                         : load[slot] + sh->weight;
    }
    qsort(rep, n_rep, sizeof(*rep), s_cmp_weighted);
    for (size_t r = 0; r < n_rep; r++) {
        struct s_shard *sh = &b->uniq[rep[r].shard];
        size_t best = SIZE_MAX;
        uint32_t best_caller = 0;
        /* Entries are in caller-index order within the name, so the first
         * entry listing the best holder is the lowest such index. */
        for (size_t e = sh->first; e < sh->first + sh->count; e++) {
            const emlio_plan_shard_t *s = &shards[b->named[e].index];
            for (uint32_t h = 0; h < s->n_holders; h++) {
                size_t slot = s_daemon_slot(ids, n_daemons, s->holders[h]);
                if (best == SIZE_MAX || load[slot] < load[best] ||
                    (load[slot] == load[best] && slot < best)) {
                    best = slot;
                    best_caller = b->named[e].index;
                }
            }
        }
        sh->daemon = ids[best];
        sh->caller = best_caller;
        load[best] = sh->weight > UINT64_MAX - load[best]
                         ? UINT64_MAX
                         : load[best] + sh->weight;
    }
out:
    emlio_free(ids);
    emlio_free(load);
    emlio_free(rep);
    return rc;
}

/* Orders the shards for this epoch and cuts the order into windows. */
static int
s_order_shards(emlio_plan_t *self, struct s_build *b)
{
    b->perm = emlio_reallocarray(NULL, b->n_uniq, sizeof(*b->perm));
    if (!b->perm)
        return s_nomem(self, "the shard order");
    for (size_t i = 0; i < b->n_uniq; i++)
        b->perm[i] = (uint32_t)i;
    if (b->shuffle && b->n_uniq > 1) {
        s_rng_t rng;
        s_rng_seed(&rng, b->seed, b->epoch, 0);
        for (size_t i = b->n_uniq - 1; i > 0; i--) {
            size_t j = (size_t)s_rng_below(&rng, (uint64_t)i + 1);
            uint32_t t = b->perm[i];
            b->perm[i] = b->perm[j];
            b->perm[j] = t;
        }
    }
    /* Window 0: one window spanning all shards (at least one, so an empty
     * inventory still has a window table). */
    if (b->window == 0)
        b->window = EMLIO_MAX(b->n_uniq, (size_t)1);
    b->n_win = b->n_uniq / b->window + (b->n_uniq % b->window != 0);
    b->wstart = emlio_reallocarray(NULL, b->n_win + 1, sizeof(*b->wstart));
    if (!b->wstart)
        return s_nomem(self, "the window table");
    uint64_t pos = 0;
    uint64_t widest = 0;
    for (size_t w = 0; w < b->n_win; w++) {
        b->wstart[w] = pos;
        size_t end = EMLIO_MIN((w + 1) * b->window, b->n_uniq);
        for (size_t p = w * b->window; p < end; p++) {
            uint64_t r = b->uniq[b->perm[p]].records;
            if (r > UINT64_MAX - pos)
                return emlio__seterr(self->err, EMLIO_EINVAL,
                                     "cannot plan epoch: dataset has more "
                                     "than 2^64 records");
            pos += r;
        }
        widest = EMLIO_MAX(widest, pos - b->wstart[w]);
    }
    b->wstart[b->n_win] = pos;
    if (widest > SIZE_MAX / sizeof(*b->tmp))
        return s_nomem(self, "a shuffle window");
    b->tmp = emlio_reallocarray(NULL, (size_t)widest, sizeof(*b->tmp));
    if (!b->tmp)
        return s_nomem(self, "a shuffle window");
    b->tmp_win = SIZE_MAX;
    return 0;
}

/* Produces window w's samples in global order into b->tmp: the records of
 * its shards in epoch order, then (shuffling) a Fisher-Yates permutation
 * drawn from the window's own stream. */
static void
s_make_window(struct s_build *b, size_t w)
{
    if (b->tmp_win == w)
        return;
    size_t k = 0;
    size_t end = EMLIO_MIN((w + 1) * b->window, b->n_uniq);
    for (size_t p = w * b->window; p < end; p++) {
        const struct s_shard *u = &b->uniq[b->perm[p]];
        for (uint64_t r = 0; r < u->records; r++) {
            emlio_plan_sample_t *s = &b->tmp[k++];
            s->shard = u->caller;
            s->daemon = u->daemon;
            s->record = r;
            s->pad = false;
        }
    }
    if (b->shuffle && k > 1) {
        s_rng_t rng;
        s_rng_seed(&rng, b->seed, b->epoch, (uint64_t)w + 1);
        for (size_t i = k - 1; i > 0; i--) {
            size_t j = (size_t)s_rng_below(&rng, (uint64_t)i + 1);
            emlio_plan_sample_t t = b->tmp[i];
            b->tmp[i] = b->tmp[j];
            b->tmp[j] = t;
        }
    }
    b->tmp_win = w;
}

/* Copies global positions [lo, lo + len) (all < dataset size) to dst. */
static void
s_fill(struct s_build *b, uint64_t lo, uint64_t len, emlio_plan_sample_t *dst,
       bool pad)
{
    /* The last window starting at or before lo holds it (empty windows
     * share a start with their successor and so are skipped). */
    size_t a = 0;
    size_t z = b->n_win;
    while (z - a > 1) {
        size_t mid = a + (z - a) / 2;
        if (b->wstart[mid] <= lo)
            a = mid;
        else
            z = mid;
    }
    for (size_t w = a; len > 0; w++) {
        assert(w < b->n_win);
        uint64_t end = b->wstart[w + 1];
        if (end <= lo)
            continue;
        s_make_window(b, w);
        size_t off = (size_t)(lo - b->wstart[w]);
        size_t take = (size_t)EMLIO_MIN(end - lo, len);
        memcpy(dst, b->tmp + off, take * sizeof(*dst));
        if (pad)
            for (size_t i = 0; i < take; i++)
                dst[i].pad = true;
        dst += take;
        lo += take;
        len -= take;
    }
}

static void
s_clear(emlio_plan_t *self)
{
    self->n_samples = 0;
    self->batch_size = 0;
    self->n_batches = 0;
    self->pad = 0;
    self->dataset = 0;
    self->dropped = 0;
}

/* Slices this rank's share out of the global order: rank r takes the
 * contiguous positions [r * per_rank, (r + 1) * per_rank) of the order
 * extended by padding (positions past the end wrap to its start). */
static int
s_slice(emlio_plan_t *self, struct s_build *b, const emlio_plan_params_t *p)
{
    uint64_t n = b->wstart[b->n_win];
    uint64_t world = p->world;
    uint64_t per_rank;
    if (p->drop_last) {
        uint64_t step = world * p->batch_size;
        per_rank = n / step * p->batch_size;
        self->dropped = n - per_rank * world;
    } else {
        per_rank = n / world + (n % world != 0);
    }
    if (per_rank > SIZE_MAX / sizeof(*self->samples))
        return s_nomem(self, "this rank's samples");
    if (per_rank > self->cap) {
        emlio_plan_sample_t *grown = emlio_reallocarray(
            self->samples, (size_t)per_rank, sizeof(*self->samples));
        if (!grown)
            return s_nomem(self, "this rank's samples");
        self->samples = grown;
        self->cap = (size_t)per_rank;
    }
    uint64_t lo = p->rank * per_rank;
    uint64_t hi = lo + per_rank;
    emlio_plan_sample_t *dst = self->samples;
    if (lo < n) {
        uint64_t len = EMLIO_MIN(hi, n) - lo;
        s_fill(b, lo, len, dst, false);
        dst += len;
    }
    if (hi > n) {
        uint64_t start = EMLIO_MAX(lo, n);
        uint64_t len = hi - start;
        uint64_t q = (start - n) % n;
        self->pad = len;
        while (len > 0) {
            uint64_t take = EMLIO_MIN(len, n - q);
            s_fill(b, q, take, dst, true);
            dst += take;
            len -= take;
            q = 0;
        }
    }
    self->n_samples = (size_t)per_rank;
    self->batch_size = p->batch_size;
    self->n_batches =
        (size_t)(per_rank / p->batch_size + (per_rank % p->batch_size != 0));
    self->dataset = n;
    return 0;
}

int
emlio_plan_build(emlio_plan_t *self, const emlio_plan_shard_t *shards, size_t n,
                 const emlio_plan_params_t *params)
{
    assert(self);
    assert(params);
    assert(shards || n == 0);
    s_clear(self);
    self->err[0] = '\0';
    if (params->world == 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "invalid world size 0: need at least one rank");
    if (params->rank >= params->world)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "invalid rank %" PRIu32 ": world has %" PRIu32
                             " ranks",
                             params->rank, params->world);
    if (params->batch_size == 0)
        return emlio__seterr(self->err, EMLIO_EINVAL, "invalid batch size 0");
    if (params->shuffle != EMLIO_SHUFFLE_NONE &&
        params->shuffle != EMLIO_SHUFFLE_WINDOW)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "unknown shuffle policy %d", params->shuffle);
    if (n > UINT32_MAX)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "too many shards: %zu (at most %" PRIu32 ")", n,
                             UINT32_MAX);

    struct s_build b = { 0 };
    b.shards = shards;
    b.window = params->window_shards; /* 0: all shards, see s_order_shards */
    b.seed = params->seed;
    b.epoch = params->epoch;
    b.shuffle = params->shuffle == EMLIO_SHUFFLE_WINDOW;
    int rc = s_sort_inventory(self, &b, n);
    if (rc == 0)
        rc = s_merge_replicas(self, &b, n);
    if (rc == 0)
        rc = s_choose_holders(self, &b, n);
    if (rc == 0)
        rc = s_order_shards(self, &b);
    if (rc == 0)
        rc = s_slice(self, &b, params);
    s_build_release(&b);
    if (rc < 0)
        s_clear(self);
    return rc;
}

size_t
emlio_plan_batch_count(const emlio_plan_t *self)
{
    assert(self);
    return self->n_batches;
}

const emlio_plan_sample_t *
emlio_plan_batch(const emlio_plan_t *self, size_t i, size_t *n)
{
    assert(self);
    assert(n);
    assert(i < self->n_batches);
    size_t start = i * self->batch_size;
    *n = EMLIO_MIN(self->batch_size, self->n_samples - start);
    return self->samples + start;
}

uint64_t
emlio_plan_sample_count(const emlio_plan_t *self)
{
    assert(self);
    return self->n_samples;
}

uint64_t
emlio_plan_pad_count(const emlio_plan_t *self)
{
    assert(self);
    return self->pad;
}

uint64_t
emlio_plan_dataset_size(const emlio_plan_t *self)
{
    assert(self);
    return self->dataset;
}

uint64_t
emlio_plan_dropped_count(const emlio_plan_t *self)
{
    assert(self);
    return self->dropped;
}

const char *
emlio_plan_errmsg(const emlio_plan_t *self)
{
    assert(self);
    return self->err;
}
