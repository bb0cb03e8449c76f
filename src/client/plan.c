/* plan.c - the epoch planner: a pure function from a shard inventory and
 * the job's parameters to one rank's batches, each computed on demand from
 * a keyed permutation, so that a plan holds O(shards), never O(samples).
 * The algorithm and its generator are specified in docs/planner.md.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "plan_blend.h"
#include "plan_rest.h"

/* 2^64 / phi, the splitmix64 increment. */
#define S_GOLDEN   UINT64_C(0x9e3779b97f4a7c15)
/* Initial value of the key derivation: "EMLIO" in ASCII, then zeros. */
#define S_KEY_INIT UINT64_C(0x454d4c494f000000)

/* One distinct shard, at its place in this epoch's order. Sixteen bytes a
 * shard is all a plan keeps: a sample's shard is found by binary search on
 * start, which makes the plan independent of the number of samples. */
struct s_slot {
    uint64_t start;  /* global index of its first record in window order */
    uint32_t caller; /* the caller's index reported in samples */
    uint32_t daemon; /* the holder chosen to read it */
};

/* emlio_plan_batch fills this on a const plan: it is a separate object
 * the plan points to, so the plan itself is never written there. */
struct s_batchbuf {
    size_t cap;
    size_t win;                   /* window whose keys are in f, or SIZE_MAX */
    emlio__perm_t f;              /* that window's permutation */
    emlio__blend_cache_t blend;   /* a stratified batch's counts */
    emlio_plan_sample_t *samples; /* cap entries */
};

/* One window of the epoch's order: its first slot and, in a shared
 * schedule, the cursor of the segment it lies in (docs/planner.md). */
struct s_window {
    size_t first;
    uint64_t cursor;
};

struct emlio_plan {
    struct s_slot *slots; /* the distinct shards in epoch order */
    size_t n_slots;
    size_t slots_cap;
    size_t window; /* shards per window, >= 1 */
    /* The windows in epoch order, and a sentinel whose first is n_slots.
     * Runs of `window` slots, except that a shared schedule cuts them
     * inside each segment (a segment's last window may be short). */
    struct s_window *wins;
    size_t n_win;
    size_t wins_cap;
    uint64_t segments; /* of the shared schedule; 1 when not shared */
    uint64_t seed;
    uint64_t epoch;
    bool shuffle;
    bool shared;        /* the shard order is the dataset's (s_dataset_key) */
    emlio__rest_t rest; /* what earlier runs consumed of the epoch */
    bool blended;       /* sources: positions map through blend */
    emlio__blend_t blend;
    /* Stratified: ranks take their batch i from global batch i (world x
     * batch_size rest positions from i x that), not contiguous slices,
     * so each step's samples are one stratified global batch. */
    bool stratified;
    uint32_t rank;
    emlio__strata_t strata; /* stratified: the rest's layout */
    uint64_t first;         /* this rank's first rest position */
    uint64_t n_samples;
    size_t batch_size;
    size_t n_batches;
    uint64_t pad;
    uint64_t dataset;
    uint64_t dropped;
    struct s_batchbuf *buf;
    char err[EMLIO_ERRMSG_LEN];
};

/* One distinct shard name after replicas are merged, while building. Its
 * record count, caller index and daemon go straight into the plan's slot
 * of the same index (start holds the record count until s_order_shards),
 * so that a build needs at most 48 bytes a shard beyond the plan's 16. */
struct s_shard {
    uint32_t first;  /* start of its run in the name-sorted entries */
    uint32_t count;  /* caller entries that carry this name */
    uint64_t weight; /* what holder balancing counts: bytes or records */
};

/* A caller entry with its name, so qsort needs no context pointer. */
struct s_named {
    const char *name;
    uint32_t source;
    uint32_t index;
};

/* A replicated shard waiting for a holder, in the greedy's order. */
struct s_weighted {
    uint64_t weight;
    uint32_t shard;
};

/* Everything one build works with. Freed by s_build_release, except the
 * slots, which the plan owns. */
struct s_build {
    const emlio_plan_shard_t *shards;
    struct s_named *named; /* caller entries sorted by name, then index */
    struct s_shard *uniq;  /* distinct names in name order */
    struct s_slot *slots;  /* the plan's slots, one per uniq entry */
    size_t n_uniq;
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

/* The key of one stream of one epoch. Each window has its own stream, so a
 * rank can produce any window without the numbers of the windows before
 * it, and every rank derives the same keys. */
static uint64_t
s_stream_key(uint64_t seed, uint64_t epoch, uint64_t stream)
{
    uint64_t key = S_KEY_INIT;
    key = s_mix64(key ^ seed);
    key = s_mix64(key ^ epoch);
    return s_mix64(key ^ stream);
}

/* Seeds a generator for one stream of one epoch. */
static void
s_rng_seed(s_rng_t *rng, uint64_t seed, uint64_t epoch, uint64_t stream)
{
    uint64_t key = s_stream_key(seed, epoch, stream);
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
    if (x->source != y->source)
        return x->source < y->source ? -1 : 1;
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
    emlio_plan_t *self = *self_p;
    emlio_free(self->slots);
    emlio_free(self->wins);
    emlio__rest_release(&self->rest);
    emlio__blend_release(&self->blend);
    if (self->buf) {
        emlio_free(self->buf->samples);
        emlio__blend_cache_release(&self->buf->blend);
    }
    emlio_free(self->buf);
    emlio_free(self);
    *self_p = NULL;
}

static void
s_build_release(struct s_build *b)
{
    emlio_free(b->named);
    emlio_free(b->uniq);
}

static int
s_nomem(emlio_plan_t *self, const char *what)
{
    return emlio__seterr(self->err, EMLIO_ENOMEM,
                         "cannot plan epoch: out of memory for %s", what);
}

/* Checks the inventory and sorts it by source and name, so nothing later
 * depends on the order of the caller's array. */
static int
s_sort_inventory(emlio_plan_t *self, struct s_build *b, size_t n,
                 size_t n_sources)
{
    const emlio_plan_shard_t *shards = b->shards;
    for (size_t i = 0; i < n; i++) {
        /* Without sources the field is not read: callers that fill
         * shards field by field need not know it. */
        if (n_sources && shards[i].source >= n_sources)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "shard '%s' names source %" PRIu32 " of %zu",
                                 shards[i].name ? shards[i].name : "?",
                                 shards[i].source, n_sources);
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
        b->named[i].source = n_sources ? shards[i].source : 0;
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
    /* Reused across builds: fresh pages are dear, and the client plans
     * every epoch into the same two plans. */
    if (n > self->slots_cap) {
        struct s_slot *grown =
            emlio_reallocarray(self->slots, n, sizeof(*grown));
        if (!grown)
            return s_nomem(self, "the shard order");
        self->slots = grown;
        self->slots_cap = n;
    }
    b->slots = self->slots;
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
        while (j < n && b->named[j].source == b->named[i].source &&
               strcmp(b->named[j].name, b->named[i].name) == 0) {
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
        b->slots[b->n_uniq].start = lo;
        struct s_shard *u = &b->uniq[b->n_uniq++];
        u->first = (uint32_t)i;
        u->count = (uint32_t)(j - i);
        u->weight = bytes;
        /* Saturate: the sum only ranks daemons against each other. */
        total_bytes =
            bytes > UINT64_MAX - total_bytes ? UINT64_MAX : total_bytes + bytes;
        i = j;
    }
    /* Without sizes, balance holders by record count instead. */
    if (total_bytes == 0)
        for (size_t k = 0; k < b->n_uniq; k++)
            b->uniq[k].weight = b->slots[k].start;
    return 0;
}

/* Whether shard u has more than one distinct holder. */
static bool
s_replicated(const struct s_build *b, const struct s_shard *u)
{
    uint32_t d0 = b->shards[b->named[u->first].index].holders[0];
    for (size_t e = u->first; e < (size_t)u->first + u->count; e++) {
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

/* The distinct daemon indices of the inventory, sorted, into *ids_out.
 * Returns their number, or < 0. */
static int64_t
s_daemon_ids(emlio_plan_t *self, const struct s_build *b, size_t n,
             uint32_t **ids_out)
{
    const emlio_plan_shard_t *shards = b->shards;
    size_t n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        if (shards[i].n_holders > SIZE_MAX - n_ids)
            return s_nomem(self, "the holder table");
        n_ids += shards[i].n_holders;
    }
    uint32_t *ids = emlio_reallocarray(NULL, n_ids, sizeof(*ids));
    if (!ids)
        return s_nomem(self, "the holder table");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < shards[i].n_holders; h++)
            ids[k++] = shards[i].holders[h];
    qsort(ids, n_ids, sizeof(*ids), s_cmp_u32);
    size_t n_daemons = 0;
    for (size_t i = 0; i < n_ids; i++)
        if (n_daemons == 0 || ids[n_daemons - 1] != ids[i])
            ids[n_daemons++] = ids[i];
    *ids_out = ids;
    return (int64_t)n_daemons;
}

static void
s_add_load(uint64_t *load, uint64_t weight)
{
    /* Saturate: loads only rank daemons against each other. */
    *load = weight > UINT64_MAX - *load ? UINT64_MAX : *load + weight;
}

/* Chooses one holder per shard. Single-holder shards fix a base load on
 * their daemon; replicated shards then go, heaviest first, to the least
 * loaded of their holders (ties to the lowest daemon index). The choice
 * does not depend on the epoch, so each daemon keeps reading the same
 * files and its page cache stays useful from one epoch to the next.
 * Tables are sized by daemons and replicated shards, not by entries: at
 * a million shards the build's transient memory is what a plan costs. */
static int
s_choose_holders(emlio_plan_t *self, struct s_build *b, size_t n)
{
    const emlio_plan_shard_t *shards = b->shards;
    uint32_t *ids = NULL;
    int64_t got = s_daemon_ids(self, b, n, &ids);
    if (got < 0)
        return (int)got;
    size_t n_daemons = (size_t)got;
    uint64_t *load = emlio_calloc(n_daemons, sizeof(*load));
    struct s_weighted *rep = NULL;
    int rc = 0;
    if (!load) {
        rc = s_nomem(self, "the holder table");
        goto out;
    }
    size_t n_rep = 0;
    for (size_t u = 0; u < b->n_uniq; u++) {
        const struct s_shard *sh = &b->uniq[u];
        struct s_slot *slot = &b->slots[u];
        if (s_replicated(b, sh)) {
            slot->caller = UINT32_MAX; /* below n <= UINT32_MAX otherwise */
            n_rep++;
            continue;
        }
        const emlio_plan_shard_t *s = &shards[b->named[sh->first].index];
        slot->daemon = s->holders[0];
        slot->caller = b->named[sh->first].index;
        s_add_load(&load[s_daemon_slot(ids, n_daemons, slot->daemon)],
                   sh->weight);
    }
    rep = emlio_reallocarray(NULL, n_rep, sizeof(*rep));
    if (!rep) {
        rc = s_nomem(self, "the holder table");
        goto out;
    }
    n_rep = 0;
    for (size_t u = 0; u < b->n_uniq; u++)
        if (b->slots[u].caller == UINT32_MAX)
            rep[n_rep++] =
                (struct s_weighted){ b->uniq[u].weight, (uint32_t)u };
    qsort(rep, n_rep, sizeof(*rep), s_cmp_weighted);
    for (size_t r = 0; r < n_rep; r++) {
        const struct s_shard *sh = &b->uniq[rep[r].shard];
        size_t best = SIZE_MAX;
        uint32_t best_caller = 0;
        /* Entries are in caller-index order within the name, so the first
         * entry listing the best holder is the lowest such index. */
        for (size_t e = sh->first; e < (size_t)sh->first + sh->count; e++) {
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
        b->slots[rep[r].shard].daemon = ids[best];
        b->slots[rep[r].shard].caller = best_caller;
        s_add_load(&load[best], sh->weight);
    }
out:
    emlio_free(ids);
    emlio_free(load);
    emlio_free(rep);
    return rc;
}

/* Sets f up as one stream's permutation of [0, m). The network runs on t
 * bits, 2^t the smallest power of two >= m but at least 4, split into a
 * right half of floor(t/2) bits and a left half of the rest. */
void
emlio__perm_init(emlio__perm_t *f, uint64_t seed, uint64_t epoch,
                 uint64_t stream, uint64_t m)
{
    uint64_t key = s_stream_key(seed, epoch, stream);
    for (size_t i = 0; i < EMLIO__PERM_ROUNDS; i++)
        f->key[i] = s_splitmix64(&key);
    unsigned t = 2;
    while (t < 64 && (UINT64_C(1) << t) < m)
        t++;
    f->m = m;
    f->lo_bits = t / 2;
    f->lo_mask = (UINT64_C(1) << f->lo_bits) - 1;
    f->hi_mask = (UINT64_C(1) << (t - f->lo_bits)) - 1;
}

/* One pass of the network over [0, 2^t). Each half-round x ^= F(y) is its
 * own inverse whatever F is, so the pass is a bijection; the round
 * function is splitmix64's mixer keyed by xor, whose every output bit
 * depends on every input bit. */
static uint64_t
s_perm_pass(const emlio__perm_t *f, uint64_t x)
{
    uint64_t l = x >> f->lo_bits;
    uint64_t r = x & f->lo_mask;
    for (size_t i = 0; i < EMLIO__PERM_ROUNDS; i += 2) {
        l ^= s_mix64(f->key[i] ^ r) & f->hi_mask;
        r ^= s_mix64(f->key[i + 1] ^ l) & f->lo_mask;
    }
    return (l << f->lo_bits) | r;
}

/* Cycle-walking: a pass that lands outside [0, m) is applied again. Since
 * a pass permutes [0, 2^t), following x's cycle comes back into [0, m),
 * and the first value there defines a permutation of [0, m) (Black and
 * Rogaway, 2002). 2^t < 2m (or t = 2), so a position takes at most 2
 * passes on average. */
uint64_t
emlio__perm_apply(const emlio__perm_t *f, uint64_t x)
{
    if (f->m < 2)
        return x;
    do
        x = s_perm_pass(f, x);
    while (x >= f->m);
    return x;
}

/* The shared schedule's key: the dataset as every job of it sees it, its
 * shards' names and record counts in file order (docs/planner.md,
 * "Shared schedule"). The slots are in file order, each with its record
 * count in start. */
static uint64_t
s_dataset_key(const struct s_build *b, const struct s_slot *slots)
{
    uint64_t key = s_mix64(S_KEY_INIT ^ UINT64_C(0x5348415245)); /* "SHARE" */
    for (size_t p = 0; p < b->n_uniq; p++) {
        uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a 64 */
        for (const char *c = b->shards[slots[p].caller].name; *c; c++)
            h = (h ^ (uint8_t)*c) * UINT64_C(0x100000001b3);
        key = s_mix64(s_mix64(key ^ h) ^ slots[p].start);
    }
    return key;
}

/* Reverses slots [lo, hi). */
static void
s_reverse(struct s_slot *slots, size_t lo, size_t hi)
{
    while (hi - lo > 1) {
        struct s_slot t = slots[lo];
        slots[lo++] = slots[--hi];
        slots[hi] = t;
    }
}

/* Fisher-Yates over slots [lo, hi) from stream (key, epoch, stream). */
static void
s_shuffle_slots(struct s_slot *slots, size_t lo, size_t hi, uint64_t key,
                uint64_t epoch, uint64_t stream)
{
    s_rng_t rng;
    s_rng_seed(&rng, key, epoch, stream);
    for (size_t i = hi - lo; i-- > 1;) {
        size_t j = (size_t)s_rng_below(&rng, (uint64_t)i + 1);
        struct s_slot t = slots[lo + i];
        slots[lo + i] = slots[lo + j];
        slots[lo + j] = t;
    }
}

/* Makes room for n windows and the sentinel. */
static int
s_reserve_windows(emlio_plan_t *self, size_t n)
{
    if (n + 1 <= self->wins_cap)
        return 0;
    struct s_window *grown =
        emlio_reallocarray(self->wins, n + 1, sizeof(*grown));
    if (!grown)
        return s_nomem(self, "the windows");
    self->wins = grown;
    self->wins_cap = n + 1;
    return 0;
}

/* Cuts slots [lo, hi) into windows of self->window slots, each with the
 * given cursor (the last one may be short). */
static void
s_cut_windows(emlio_plan_t *self, size_t lo, size_t hi, uint64_t cursor)
{
    for (size_t first = lo; first < hi; first += self->window)
        self->wins[self->n_win++] = (struct s_window){ first, cursor };
}

/* The shared schedule's order (docs/planner.md, "The shared schedule"):
 * a base order of the shards drawn from the dataset alone, cut into
 * segments of two windows that never change, visited from the job's join
 * point on; each segment's shards in the order of the lap it is visited
 * in. A job that joins others mid-epoch so reads, from its first batch,
 * the segment they are reading, and each of its epochs is still every
 * segment once. */
static int
s_order_shared(emlio_plan_t *self, struct s_build *b, uint64_t join)
{
    struct s_slot *slots = self->slots;
    size_t n = b->n_uniq;
    uint64_t key = s_dataset_key(b, slots);
    s_shuffle_slots(slots, 0, n, key, 0, 0);
    uint64_t n_seg = emlio_plan_shared_segments(n, (uint32_t)self->window);
    size_t seg = n_seg > 1 ? 2 * self->window : n;
    uint64_t k = join % n_seg;
    /* Rotate the base order left by k segments (all but the last are
     * full), so that segment k comes first. */
    size_t m = (size_t)k * seg;
    if (m > 0) {
        s_reverse(slots, 0, m);
        s_reverse(slots, m, n);
        s_reverse(slots, 0, n);
    }
    int rc = s_reserve_windows(self, n / self->window + (size_t)n_seg + 1);
    if (rc < 0)
        return rc;
    self->segments = n_seg;
    size_t lo = 0;
    for (uint64_t p = 0; p < n_seg; p++) {
        uint64_t i = (k + p) % n_seg;
        uint64_t lap = join / n_seg + self->epoch + (k + p >= n_seg);
        size_t len = i + 1 < n_seg ? seg : n - (size_t)(n_seg - 1) * seg;
        s_shuffle_slots(slots, lo, lo + len, key, lap, i + 1);
        s_cut_windows(self, lo, lo + len, join + self->epoch * n_seg + p);
        lo += len;
    }
    return 0;
}

/* Orders the shards for this epoch: shuffles the slots in place, replaces
 * each one's record count by the global index of its first record, and
 * cuts the order into windows. */
static int
s_order_shards(emlio_plan_t *self, struct s_build *b, size_t window,
               uint64_t join)
{
    /* The slots are in file order, each with its record count in start. */
    struct s_slot *slots = self->slots;
    /* Window 0: one window spanning all shards (at least one, so an empty
     * inventory still has a window). */
    self->window = window ? window : EMLIO_MAX(b->n_uniq, (size_t)1);
    self->n_win = 0;
    self->segments = 1;
    int rc = 0;
    if (self->blended) {
        /* Sources: their records source-major in file order, one window;
         * the blend mixes them (plan_blend.c). */
        self->window = EMLIO_MAX(b->n_uniq, (size_t)1);
        rc = s_reserve_windows(self, 1);
        if (rc == 0)
            s_cut_windows(self, 0, self->window, 0);
    } else if (self->shuffle && self->shared && b->n_uniq > 1) {
        rc = s_order_shared(self, b, join);
    } else {
        if (self->shuffle && b->n_uniq > 1)
            s_shuffle_slots(slots, 0, b->n_uniq, self->seed, self->epoch, 0);
        rc = s_reserve_windows(self, b->n_uniq / self->window + 1);
        if (rc == 0)
            s_cut_windows(self, 0, EMLIO_MAX(b->n_uniq, (size_t)1), 0);
    }
    if (rc < 0)
        return rc;
    self->wins[self->n_win].first = b->n_uniq;
    uint64_t pos = 0;
    for (size_t p = 0; p < b->n_uniq; p++) {
        uint64_t records = slots[p].start;
        if (records > UINT64_MAX - pos)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "cannot plan epoch: dataset has more "
                                 "than 2^64 - 1 records");
        slots[p].start = pos;
        pos += records;
    }
    self->n_slots = b->n_uniq;
    self->dataset = pos;
    return 0;
}

static void
s_clear(emlio_plan_t *self)
{
    self->n_slots = 0;
    self->n_win = 0;
    self->first = 0;
    self->n_samples = 0;
    self->batch_size = 0;
    self->n_batches = 0;
    self->pad = 0;
    self->dataset = 0;
    self->dropped = 0;
    self->rest.n = 0;
    self->rest.done = 0;
    self->blended = false;
    self->blend.n = 0;
    self->stratified = false;
    memset(&self->strata, 0, sizeof(self->strata));
}

/* Sizes this rank's share of the rest of the epoch (all of it unless
 * earlier runs consumed some): rank r takes the contiguous rest positions
 * [r * per_rank, (r + 1) * per_rank) of the order extended by padding
 * (positions past the end wrap to its start). Only the bounds are kept;
 * emlio_plan_position maps one to the epoch's global order. */
/* Stratified slices: rank r's batch i is rest positions i G + r B ..
 * + B of global batch i (G = world x B); the short last global batch of
 * L positions is cut into world parts of ceil(L / world), padded past
 * the end as contiguous slices are (drop_last drops it). */
static int
s_slice_stratified(emlio_plan_t *self, const emlio_plan_params_t *p, uint64_t n)
{
    emlio__strata_t *st = &self->strata;
    emlio__strata_init(st, n, p->world, p->batch_size, p->drop_last);
    self->dropped = p->drop_last ? n % st->global : 0;
    self->n_samples = st->full * p->batch_size + st->part;
    uint64_t start = emlio__strata_first(st, p->rank, st->full);
    uint64_t end = start + st->part;
    self->pad = end > n ? end - EMLIO_MAX(start, n) : 0;
    self->first = 0;
    self->batch_size = p->batch_size;
    uint64_t n_batches = st->full + (st->part != 0);
    if (n_batches > SIZE_MAX)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "cannot plan epoch: %" PRIu64 " batches per rank "
                             "exceed this machine's size_t",
                             n_batches);
    self->n_batches = (size_t)n_batches;
    return 0;
}

static int
s_slice(emlio_plan_t *self, const emlio_plan_params_t *p)
{
    int rc = emlio__rest_set(&self->rest, p->done, p->n_done, self->dataset,
                             self->err);
    if (rc < 0)
        return rc;
    uint64_t n = self->dataset - self->rest.done;
    self->stratified = p->stratify;
    self->rank = p->rank;
    if (p->stratify)
        return s_slice_stratified(self, p, n);
    uint64_t per_rank;
    if (emlio_plan_slice(n, p->world, p->rank, p->batch_size, p->drop_last,
                         &self->first, &per_rank) < 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "cannot plan epoch: dataset has more "
                             "than 2^64 - %" PRIu32 " records",
                             p->world);
    self->dropped = p->drop_last ? n - per_rank * p->world : 0;
    uint64_t n_batches =
        per_rank / p->batch_size + (per_rank % p->batch_size != 0);
    if (n_batches > SIZE_MAX)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "cannot plan epoch: %" PRIu64 " batches per rank "
                             "exceed this machine's size_t",
                             n_batches);
    uint64_t end = self->first + per_rank;
    self->pad = end > n ? end - EMLIO_MAX(self->first, n) : 0;
    self->n_samples = per_rank;
    self->batch_size = p->batch_size;
    self->n_batches = (size_t)n_batches;
    return 0;
}

/* Makes room for one batch in the buffer emlio_plan_batch fills. */
static int
s_reserve_batch(emlio_plan_t *self)
{
    size_t want =
        (size_t)EMLIO_MIN(self->n_samples, (uint64_t)self->batch_size);
    if (!self->buf) {
        self->buf = emlio_calloc(1, sizeof(*self->buf));
        if (!self->buf)
            return s_nomem(self, "a batch");
    }
    self->buf->win = SIZE_MAX;
    if (emlio__blend_cache_reserve(&self->buf->blend, &self->blend) < 0)
        return s_nomem(self, "a batch");
    if (want <= self->buf->cap)
        return 0;
    emlio_plan_sample_t *grown =
        emlio_reallocarray(self->buf->samples, want, sizeof(*grown));
    if (!grown)
        return s_nomem(self, "a batch");
    self->buf->samples = grown;
    self->buf->cap = want;
    return 0;
}

static int
s_check_params(emlio_plan_t *self, const emlio_plan_params_t *params, size_t n)
{
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
    if (params->n_sources && !params->sources)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "%zu sources, but no source array",
                             params->n_sources);
    if (!params->n_sources && (params->epoch_samples || params->stratify))
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "an epoch size or stratified batches need "
                             "sources to take them from");
    if (params->n_sources && (params->shared || params->window_shards))
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "sources are mixed whole: no shuffle windows "
                             "(window_shards %" PRIu32 ") and no shared "
                             "schedule",
                             params->window_shards);
    if (params->n_layers && (!params->n_sources || !params->layers))
        return emlio__seterr(
            self->err, EMLIO_EINVAL, "%zu earlier blends of the epoch, but %s",
            params->n_layers,
            params->n_sources ? "no array of them" : "no sources to blend");
    if (params->n_layers > EMLIO_PLAN_MAX_LAYERS)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "the weights changed %zu times in the epoch "
                             "(at most %d)",
                             params->n_layers, EMLIO_PLAN_MAX_LAYERS);
    if ((uint64_t)params->world * params->batch_size > UINT32_MAX &&
        params->stratify)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "a global batch of %" PRIu64 " samples is too "
                             "large to stratify",
                             (uint64_t)params->world * params->batch_size);
    return 0;
}

/* Sources: each one's record count, from the slots in file order (each
 * with its record count in start), and the epoch's quotas. */
static int
s_blend_sources(emlio_plan_t *self, const struct s_build *b,
                const emlio_plan_params_t *params)
{
    uint64_t *sizes = emlio_calloc(params->n_sources, sizeof(*sizes));
    if (!sizes)
        return s_nomem(self, "the sources");
    int rc = 0;
    for (size_t p = 0; p < b->n_uniq && rc == 0; p++) {
        uint32_t s = b->shards[self->slots[p].caller].source;
        if (self->slots[p].start > UINT64_MAX - sizes[s])
            rc = emlio__seterr(self->err, EMLIO_EINVAL,
                               "cannot plan epoch: source %" PRIu32
                               " has more than 2^64 - 1 records",
                               s);
        else
            sizes[s] += self->slots[p].start;
    }
    if (rc == 0)
        rc = emlio__blend_init(&self->blend, params, sizes, self->err);
    emlio_free(sizes);
    return rc;
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
    int rc = s_check_params(self, params, n);
    if (rc < 0)
        return rc;
    struct s_build b = { 0 };
    b.shards = shards;
    self->seed = params->seed;
    self->epoch = params->epoch;
    self->shuffle = params->shuffle == EMLIO_SHUFFLE_WINDOW;
    self->shared = params->shared;
    self->blended = params->n_sources > 0;
    rc = s_sort_inventory(self, &b, n, params->n_sources);
    if (rc == 0)
        rc = s_merge_replicas(self, &b, n);
    if (rc == 0)
        rc = s_choose_holders(self, &b, n);
    /* Only the merged shards are needed from here: lower the peak. */
    emlio_free(b.named);
    b.named = NULL;
    if (rc == 0 && self->blended)
        rc = s_blend_sources(self, &b, params);
    if (rc == 0)
        rc =
            s_order_shards(self, &b, params->window_shards, params->share_join);
    /* The epoch is the blend's quotas, not the records laid out. */
    if (rc == 0 && self->blended)
        self->dataset = self->blend.total;
    if (rc == 0)
        rc = s_slice(self, params);
    if (rc == 0)
        rc = s_reserve_batch(self);
    s_build_release(&b);
    if (rc < 0)
        s_clear(self);
    return rc;
}

/* The last slot in [lo, hi) whose start is <= x; slot lo's start is. Among
 * slots of equal start (shards without records) that is the last, the one
 * that holds x. */
static size_t
s_find_slot(const struct s_slot *slots, size_t lo, size_t hi, uint64_t x)
{
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (slots[mid].start <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The window holding global position g < dataset: the last whose first
 * slot starts at or before g. */
static size_t
s_find_window(const emlio_plan_t *self, uint64_t g)
{
    size_t lo = 0;
    size_t hi = self->n_win;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (self->slots[self->wins[mid].first].start <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The sample at global position g < dataset of the epoch's order: the
 * window holding g, g's offset permuted within it, then the shard and
 * record at the permuted index. */
static void
s_sample_at(const emlio_plan_t *self, uint64_t g, emlio_plan_sample_t *out)
{
    struct s_batchbuf *buf = self->buf;
    if (self->blended) {
        uint64_t r =
            emlio__blend_record(&self->blend, &buf->blend, g, &out->source);
        const struct s_slot *slot =
            &self->slots[s_find_slot(self->slots, 0, self->n_slots, r)];
        out->shard = slot->caller;
        out->daemon = slot->daemon;
        out->record = r - slot->start;
        out->pad = false;
        return;
    }
    out->source = 0;
    size_t w = s_find_window(self, g);
    size_t s_lo = self->wins[w].first;
    size_t s_hi = self->wins[w + 1].first;
    uint64_t base = self->slots[s_lo].start;
    uint64_t x = g;
    if (self->shuffle) {
        if (buf->win != w) {
            uint64_t end =
                s_hi < self->n_slots ? self->slots[s_hi].start : self->dataset;
            emlio__perm_init(&buf->f, self->seed, self->epoch, (uint64_t)w + 1,
                             end - base);
            buf->win = w;
        }
        x = base + emlio__perm_apply(&buf->f, g - base);
    }
    const struct s_slot *slot =
        &self->slots[s_find_slot(self->slots, s_lo, s_hi, x)];
    out->shard = slot->caller;
    out->daemon = slot->daemon;
    out->record = x - slot->start;
    out->pad = false;
}

/* The rest position of sample k of this rank's plan, and whether it is
 * padding (past the rest's end: it wraps to its start). */
static uint64_t
s_rest_position(const emlio_plan_t *self, uint64_t k, bool *pad)
{
    uint64_t rest = self->dataset - self->rest.done;
    uint64_t q = self->first + k;
    if (self->stratified)
        q = emlio__strata_first(&self->strata, self->rank,
                                k / self->batch_size) +
            k % self->batch_size;
    *pad = q >= rest;
    return q >= rest ? (q - rest) % rest : q;
}

const emlio_plan_sample_t *
emlio_plan_batch(const emlio_plan_t *self, size_t i, size_t *n)
{
    assert(self);
    assert(n);
    assert(i < self->n_batches);
    uint64_t start = (uint64_t)i * self->batch_size;
    size_t len =
        (size_t)EMLIO_MIN((uint64_t)self->batch_size, self->n_samples - start);
    emlio_plan_sample_t *dst = self->buf->samples;
    for (size_t k = 0; k < len; k++) {
        bool pad;
        uint64_t q = s_rest_position(self, start + k, &pad);
        s_sample_at(self,
                    self->rest.n ? emlio__rest_position(&self->rest, q) : q,
                    &dst[k]);
        dst[k].pad = pad;
    }
    *n = len;
    return dst;
}

uint64_t
emlio_plan_shared_segments(uint64_t shards, uint32_t window_shards)
{
    /* Two windows a segment; a window of half the shards or more is one
     * segment of all. */
    if (window_shards == 0 || window_shards > shards / 2 || shards < 2)
        return 1;
    uint64_t seg = 2 * (uint64_t)window_shards;
    return shards / seg + (shards % seg != 0);
}

uint64_t
emlio_plan_segments(const emlio_plan_t *self)
{
    assert(self);
    return self->segments ? self->segments : 1;
}

uint64_t
emlio_plan_batch_cursor(const emlio_plan_t *self, size_t i)
{
    assert(self);
    assert(i < self->n_batches);
    if (!self->shared || !self->n_win)
        return 0;
    uint64_t g = emlio_plan_position(self, (uint64_t)i * self->batch_size);
    return self->wins[s_find_window(self, g)].cursor;
}

size_t
emlio_plan_batch_count(const emlio_plan_t *self)
{
    assert(self);
    return self->n_batches;
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
emlio_plan_position(const emlio_plan_t *self, uint64_t k)
{
    assert(self);
    assert(k < self->n_samples);
    bool pad;
    uint64_t q = s_rest_position(self, k, &pad);
    return self->rest.n ? emlio__rest_position(&self->rest, q) : q;
}

uint64_t
emlio_plan_rest_size(const emlio_plan_t *self)
{
    assert(self);
    return self->dataset - self->rest.done;
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

uint64_t
emlio_plan_source_quota(const emlio_plan_t *self, size_t s)
{
    assert(self);
    if (!self->blended || s >= self->blend.n)
        return 0;
    return self->blend.src[s].delivered + self->blend.src[s].quota;
}

const char *
emlio_plan_errmsg(const emlio_plan_t *self)
{
    assert(self);
    return self->err;
}

size_t
emlio_plan_memory(const emlio_plan_t *self)
{
    assert(self);
    size_t len = sizeof(*self) + self->slots_cap * sizeof(*self->slots) +
                 self->wins_cap * sizeof(*self->wins) +
                 emlio__blend_memory(&self->blend);
    if (self->buf)
        len +=
            sizeof(*self->buf) + self->buf->cap * sizeof(*self->buf->samples);
    return len;
}
