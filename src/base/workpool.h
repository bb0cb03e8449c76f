/* workpool.h - a pool of threads that run small units of work, at a lower
 * CPU priority than the threads that submit them.
 * SPDX-License-Identifier: MIT
 *
 * The transform stage on both ends (the daemon's --transform-threads, the
 * client's transform_threads) decodes images here, one sample per unit, so
 * that the samples of one batch spread over every thread and a batch is
 * ready in (batch / threads) decode times rather than batch decode times.
 * The caller embeds an emlio__work_t in its own unit and recovers it in fn
 * (container_of style); completion is the caller's business (the last unit
 * of a batch typically hands the batch on).
 *
 * Priority: each worker lowers its own scheduling priority by nice_delta
 * (setpriority on its thread id; Linux applies nice per thread) so that on
 * a busy host the readers and senders of raw-byte clients, and the client's
 * own receive path, run first: decoding is the stage that can wait.
 */
#ifndef EMLIO_WORKPOOL_H
#define EMLIO_WORKPOOL_H

#include <stddef.h>

typedef struct emlio__work emlio__work_t;
/* Runs one unit; thread_state is the worker's own (state_new's result). */
typedef void emlio__work_fn(emlio__work_t *work, void *thread_state);

struct emlio__work {
    emlio__work_fn *fn;
};

typedef struct emlio__workpool emlio__workpool_t;

typedef struct emlio__workpool_config {
    size_t threads;   /* >= 1 */
    size_t queue_cap; /* units waiting at most; submit blocks beyond */
    int nice_delta;   /* added to each worker's nice value (0 = none) */
    const char *name; /* thread name prefix (15 bytes with the number) */
    void *(*state_new)(void);        /* per-thread state; NULL = none */
    void (*state_free)(void *state); /* frees it at exit */
} emlio__workpool_config_t;

/* Starts the threads. NULL with *err set (an EMLIO_E code) on failure. */
emlio__workpool_t *emlio__workpool_new(const emlio__workpool_config_t *cfg,
                                       int *err);

/* Queues one unit, waiting while the queue is full. 0, or EMLIO_ECLOSED
 * once the pool is being destroyed (the unit is then the caller's). */
int emlio__workpool_submit(emlio__workpool_t *self, emlio__work_t *work);

/* Runs what is queued, joins the threads, frees the pool. Accepts NULL;
 * sets *self_p NULL. */
void emlio__workpool_destroy(emlio__workpool_t **self_p);

#endif /* EMLIO_WORKPOOL_H */
