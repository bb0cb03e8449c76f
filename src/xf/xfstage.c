/* xfstage.c - a batch of encoded samples into one tensor block.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <pthread.h>
#include <time.h>

#include "xfstage.h"

/* ---- tensor blocks ----------------------------------------------------- */

/* Each block is preceded by this header, so put needs only the pointer. */
typedef struct s_block {
    emlio__xf_blocks_t *pool;
    size_t bytes;
    struct s_block *next; /* on the free list */
    max_align_t align[];  /* the data follows, aligned */
} s_block_t;

struct emlio__xf_blocks {
    pthread_mutex_t lock;
    size_t refs; /* the owner + every block out */
    size_t keep_bytes;
    size_t kept_bytes;
    s_block_t *free;
};

emlio__xf_blocks_t *
emlio__xf_blocks_new(size_t keep_bytes)
{
    emlio__xf_blocks_t *pool = emlio_calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    pthread_mutex_init(&pool->lock, NULL);
    pool->refs = 1;
    pool->keep_bytes = keep_bytes;
    return pool;
}

static void
s_pool_unref_locked_and_unlock(emlio__xf_blocks_t *pool)
{
    bool last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->lock);
    if (!last)
        return;
    for (s_block_t *b = pool->free, *next; b; b = next) {
        next = b->next;
        emlio_free(b);
    }
    pthread_mutex_destroy(&pool->lock);
    emlio_free(pool);
}

uint8_t *
emlio__xf_block_get(emlio__xf_blocks_t *pool, size_t bytes)
{
    pthread_mutex_lock(&pool->lock);
    /* First fit among the kept blocks: batches of one client have one
     * size, so the first is nearly always right. */
    s_block_t **link = &pool->free;
    while (*link && (*link)->bytes < bytes)
        link = &(*link)->next;
    s_block_t *b = *link;
    if (b) {
        *link = b->next;
        pool->kept_bytes -= b->bytes;
    }
    pool->refs++;
    pthread_mutex_unlock(&pool->lock);
    if (!b) {
        b = emlio_malloc(sizeof(*b) + bytes);
        if (!b) {
            pthread_mutex_lock(&pool->lock);
            s_pool_unref_locked_and_unlock(pool);
            return NULL;
        }
        b->pool = pool;
        b->bytes = bytes;
    }
    b->next = NULL;
    return (uint8_t *)b->align;
}

void
emlio__xf_block_put(uint8_t *block)
{
    if (!block)
        return;
    s_block_t *b = (s_block_t *)(block - offsetof(s_block_t, align));
    emlio__xf_blocks_t *pool = b->pool;
    pthread_mutex_lock(&pool->lock);
    if (pool->refs > 1 && pool->kept_bytes + b->bytes <= pool->keep_bytes) {
        b->next = pool->free;
        pool->free = b;
        pool->kept_bytes += b->bytes;
        b = NULL;
    }
    s_pool_unref_locked_and_unlock(pool);
    emlio_free(b);
}

void
emlio__xf_blocks_release(emlio__xf_blocks_t **pool_p)
{
    emlio__xf_blocks_t *pool = *pool_p;
    if (!pool)
        return;
    *pool_p = NULL;
    pthread_mutex_lock(&pool->lock);
    /* Nothing is kept once the owner is gone: blocks coming back are
     * freed (put sees refs == 1 only for the last one). */
    for (s_block_t *b = pool->free, *next; b; b = next) {
        next = b->next;
        emlio_free(b);
    }
    pool->free = NULL;
    pool->kept_bytes = 0;
    pool->keep_bytes = 0;
    s_pool_unref_locked_and_unlock(pool);
}

/* ---- one batch ------------------------------------------------------------
 */

typedef struct s_unit {
    emlio__work_t work; /* first: the pool hands this back */
    emlio__xf_job_t *job;
    size_t index;
} s_unit_t;

/* What start allocates: a unit per sample transformed, and for each
 * sample the one whose output it copies (itself when it is transformed).
 * A sample's output is a pure function of (spec, seed, epoch, key, bytes),
 * so a record named twice in one batch is decoded once: one GET naming
 * one record 4,096 times (issue 34) costs one decode, not 4,096. */
typedef struct s_units {
    s_unit_t *unit;
    size_t *same_as;
    char **err; /* each failed sample's own text (NULL: none kept) */
} s_units_t;

static bool
s_same(const emlio__xf_sample_t *x, const emlio__xf_sample_t *y)
{
    return x->key == y->key && x->len == y->len &&
           (x->data == y->data || !x->len || !memcmp(x->data, y->data, x->len));
}

/* Orders samples by content (key, length, bytes), equal ones by
 * position, so the first of equal samples sorts first. */
static int
s_by_content(const void *a, const void *b)
{
    const emlio__xf_sample_t *x = *(const emlio__xf_sample_t *const *)a;
    const emlio__xf_sample_t *y = *(const emlio__xf_sample_t *const *)b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    int c =
        x->data == y->data || !x->len ? 0 : memcmp(x->data, y->data, x->len);
    if (c)
        return c;
    return x < y ? -1 : x > y;
}

/* Fills same_as[i] with the first sample equal to sample i; returns the
 * number of distinct samples. order: room for n pointers. */
static size_t
s_find_same(const emlio__xf_job_t *job, size_t *same_as,
            const emlio__xf_sample_t **order)
{
    for (size_t i = 0; i < job->n; i++)
        order[i] = &job->samples[i];
    qsort(order, job->n, sizeof(*order), s_by_content);
    size_t distinct = 0, first = 0;
    for (size_t k = 0; k < job->n; k++) {
        size_t i = (size_t)(order[k] - job->samples);
        if (k == 0 || !s_same(order[first], order[k])) {
            first = k;
            distinct++;
        }
        same_as[i] = (size_t)(order[first] - job->samples);
    }
    return distinct;
}

/* The last unit is done: copies of repeated samples, then the caller's
 * done. */
static void
s_finish(emlio__xf_job_t *job)
{
    s_units_t *u = job->units;
    size_t out_bytes = emlio_transform_output_bytes(job->transform);
    for (size_t i = 0; u && i < job->n; i++) {
        size_t j = u->same_as[i];
        if (j == i)
            continue;
        job->samples[i].rc = job->samples[j].rc;
        job->samples[i].crc = job->samples[j].crc;
        if (job->samples[j].rc == 0) {
            memcpy(job->block + i * out_bytes, job->block + j * out_bytes,
                   out_bytes);
        } else {
            atomic_fetch_add(&job->failed, 1);
            u->err[i] = u->err[j] ? emlio_strdup(u->err[j]) : NULL;
        }
    }
    job->done(job);
}

static uint64_t
s_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void
s_unit_run(emlio__work_t *work, void *state)
{
    s_unit_t *unit = (s_unit_t *)work;
    emlio__xf_job_t *job = unit->job;
    emlio__xf_sample_t *s = &job->samples[unit->index];
    size_t out_bytes = emlio_transform_output_bytes(job->transform);
    uint8_t *out = job->block + unit->index * out_bytes;
    char err[sizeof(job->err)];
    uint64_t t0 = s_thread_cpu_ns();
    emlio_transform_ws_set_max_bytes(state, job->ws_max_bytes);
    s->rc =
        emlio_transform_apply(job->transform, state, s->data, s->len, job->seed,
                              job->epoch, s->key, out, err, sizeof(err));
    if (s->rc == 0 && job->want_crc)
        s->crc = emlio_crc32c(0, out, out_bytes);
    atomic_fetch_add(&job->cpu_ns, s_thread_cpu_ns() - t0);
    if (s->rc != 0) {
        atomic_fetch_add(&job->failed, 1);
        size_t none = 0;
        /* The first failure to claim the slot writes the text; done() runs
         * after every unit's decrement, so it sees the text complete. */
        if (atomic_compare_exchange_strong(&job->first_failed, &none,
                                           unit->index + 1))
            memcpy(job->err, err, sizeof(job->err));
        s_units_t *u = job->units;
        u->err[unit->index] = emlio_strdup(err); /* NULL: strerror's */
    }
    if (atomic_fetch_sub(&job->remaining, 1) == 1)
        s_finish(job);
}

int
emlio__xf_job_start(emlio__xf_job_t *job, emlio__workpool_t *pool)
{
    atomic_init(&job->cpu_ns, 0);
    atomic_init(&job->failed, 0);
    atomic_init(&job->first_failed, 0);
    job->err[0] = '\0';
    job->units = NULL;
    job->transformed = 0;
    if (job->n == 0) {
        atomic_init(&job->remaining, 0);
        job->done(job);
        return 0;
    }
    s_units_t *u = emlio_calloc(1, sizeof(*u));
    const emlio__xf_sample_t **order = emlio_calloc(job->n, sizeof(*order));
    if (u) {
        u->unit = emlio_calloc(job->n, sizeof(*u->unit));
        u->same_as = emlio_calloc(job->n, sizeof(*u->same_as));
        u->err = emlio_calloc(job->n, sizeof(*u->err));
    }
    if (!u || !order || !u->unit || !u->same_as || !u->err) {
        if (u) {
            emlio_free(u->unit);
            emlio_free(u->same_as);
            emlio_free(u->err);
        }
        emlio_free(u);
        emlio_free(order);
        return EMLIO_ENOMEM;
    }
    size_t distinct = s_find_same(job, u->same_as, order);
    emlio_free(order);
    job->units = u;
    job->transformed = distinct;
    atomic_init(&job->remaining, distinct);
    /* Every unit is made before the first is queued: once the last one is,
     * the job may finish on a pool thread and its done() free it (the
     * daemon's serializer frees the job that holds it), so nothing of the
     * job is read after that submit. Reading job->n past it was a
     * use-after-free that ASan caught with 1-sample GETs under load. */
    s_unit_t *units = u->unit;
    size_t k = 0;
    for (size_t i = 0; i < job->n; i++)
        if (u->same_as[i] == i)
            units[k++] = (s_unit_t){ { s_unit_run }, job, i };
    for (size_t q = 0; q < distinct; q++) {
        int rc = emlio__workpool_submit(pool, &units[q].work);
        if (rc < 0) {
            /* Only while the pool is being destroyed: the units already
             * queued still run. Units q.. are still ours, so the job lives
             * until the last of them is counted as failed, and done runs
             * exactly once. */
            for (size_t m = q; m < distinct; m++) {
                job->samples[units[m].index].rc = rc;
                atomic_fetch_add(&job->failed, 1);
                if (atomic_fetch_sub(&job->remaining, 1) == 1)
                    s_finish(job);
            }
            return 0;
        }
    }
    return 0;
}

void
emlio__xf_job_cleanup(emlio__xf_job_t *job)
{
    s_units_t *u = job->units;
    if (u) {
        for (size_t i = 0; i < job->n; i++)
            emlio_free(u->err[i]);
        emlio_free(u->err);
        emlio_free(u->unit);
        emlio_free(u->same_as);
        emlio_free(u);
    }
    job->units = NULL;
}

const char *
emlio__xf_job_error(const emlio__xf_job_t *job, size_t i)
{
    const s_units_t *u = job->units;
    if (i >= job->n || job->samples[i].rc == 0)
        return NULL;
    if (u && u->err[i])
        return u->err[i];
    return emlio_strerror(job->samples[i].rc);
}

static void *
s_ws_new(void)
{
    return emlio_transform_ws_new();
}

static void
s_ws_free(void *ws)
{
    emlio_transform_ws_t *w = ws;
    emlio_transform_ws_destroy(&w);
}

uint64_t
emlio__xf_ws_cap(uint64_t memory_limit, size_t threads)
{
    uint64_t cap = EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT;
    if (memory_limit && threads)
        cap = EMLIO_MAX(EMLIO_MIN(cap, memory_limit / 4 / threads),
                        EMLIO__XF_WS_MIN_BYTES);
    return cap;
}

emlio__workpool_t *
emlio__xf_pool_new(size_t threads, int nice_delta, const char *name, int *err)
{
    emlio__workpool_config_t cfg = { .threads = threads,
                                     .queue_cap = 1u << 16,
                                     .nice_delta = nice_delta,
                                     .name = name,
                                     .state_new = s_ws_new,
                                     .state_free = s_ws_free };
    return emlio__workpool_new(&cfg, err);
}
