/* xfstage.c - a batch of encoded samples into one tensor block.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <pthread.h>
#include <time.h>

#include "crc32c.h"
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
    }
    if (atomic_fetch_sub(&job->remaining, 1) == 1)
        job->done(job);
}

int
emlio__xf_job_start(emlio__xf_job_t *job, emlio__workpool_t *pool)
{
    atomic_init(&job->remaining, job->n);
    atomic_init(&job->cpu_ns, 0);
    atomic_init(&job->failed, 0);
    atomic_init(&job->first_failed, 0);
    job->err[0] = '\0';
    job->units = NULL;
    if (job->n == 0) {
        job->done(job);
        return 0;
    }
    s_unit_t *units = emlio_calloc(job->n, sizeof(*units));
    if (!units)
        return EMLIO_ENOMEM;
    job->units = units;
    for (size_t i = 0; i < job->n; i++) {
        units[i] = (s_unit_t){ { s_unit_run }, job, i };
        int rc = emlio__workpool_submit(pool, &units[i].work);
        if (rc < 0) {
            /* Only while the pool is being destroyed: the units already
             * queued still run; account for the rest as failed so that
             * done still runs exactly once. */
            for (size_t k = i; k < job->n; k++) {
                job->samples[k].rc = rc;
                atomic_fetch_add(&job->failed, 1);
                if (atomic_fetch_sub(&job->remaining, 1) == 1)
                    job->done(job);
            }
            return 0;
        }
    }
    return 0;
}

void
emlio__xf_job_cleanup(emlio__xf_job_t *job)
{
    emlio_free(job->units);
    job->units = NULL;
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
    emlio_transform_ws_free(&w);
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
