/* workpool.c - threads that run units of work at a lower priority.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "queue.h"
#include "workpool.h"

struct emlio__workpool {
    emlio__workpool_config_t cfg;
    emlio__queue_t *queue;
    pthread_t *threads;
    size_t started;
};

typedef struct s_worker_arg {
    emlio__workpool_t *pool;
    size_t index;
} s_worker_arg_t;

static void *
s_worker_main(void *arg)
{
    s_worker_arg_t a = *(s_worker_arg_t *)arg;
    emlio_free(arg);
    emlio__workpool_t *self = a.pool;
    char name[16];
    snprintf(name, sizeof(name), "%.10s-%zu", self->cfg.name, a.index);
    pthread_setname_np(pthread_self(), name);
    if (self->cfg.nice_delta) {
        /* Best effort: an unprivileged process may always lower its own
         * priority, never raise it. */
        pid_t tid = (pid_t)syscall(SYS_gettid);
        errno = 0;
        int now = getpriority(PRIO_PROCESS, (id_t)tid);
        if (errno == 0)
            (void)setpriority(PRIO_PROCESS, (id_t)tid,
                              now + self->cfg.nice_delta);
    }
    void *state = self->cfg.state_new ? self->cfg.state_new() : NULL;
    void *item;
    while (emlio__queue_pop(self->queue, &item) == 0) {
        emlio__work_t *work = item;
        work->fn(work, state);
    }
    if (state && self->cfg.state_free)
        self->cfg.state_free(state);
    return NULL;
}

emlio__workpool_t *
emlio__workpool_new(const emlio__workpool_config_t *cfg, int *err)
{
    *err = EMLIO_ENOMEM;
    if (cfg->threads == 0) {
        *err = EMLIO_EINVAL;
        return NULL;
    }
    emlio__workpool_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->cfg = *cfg;
    if (!self->cfg.name)
        self->cfg.name = "emlio-work";
    self->queue = emlio__queue_new(cfg->queue_cap ? cfg->queue_cap : 1024);
    self->threads = emlio_calloc(cfg->threads, sizeof(*self->threads));
    if (!self->queue || !self->threads)
        goto fail;
    for (; self->started < cfg->threads; self->started++) {
        s_worker_arg_t *arg = emlio_malloc(sizeof(*arg));
        if (!arg)
            goto fail;
        *arg = (s_worker_arg_t){ self, self->started };
        int rc = pthread_create(&self->threads[self->started], NULL,
                                s_worker_main, arg);
        if (rc != 0) {
            emlio_free(arg);
            *err = -rc;
            goto fail;
        }
    }
    return self;
fail:
    emlio__workpool_destroy(&self);
    return NULL;
}

int
emlio__workpool_submit(emlio__workpool_t *self, emlio__work_t *work)
{
    return emlio__queue_push(self->queue, work);
}

void
emlio__workpool_destroy(emlio__workpool_t **self_p)
{
    emlio__workpool_t *self = *self_p;
    if (!self)
        return;
    *self_p = NULL;
    if (self->queue)
        emlio__queue_close(self->queue); /* workers drain, then exit */
    for (size_t i = 0; i < self->started; i++)
        pthread_join(self->threads[i], NULL);
    emlio__queue_destroy(&self->queue);
    emlio_free(self->threads);
    emlio_free(self);
}
