/* queue.c - a bounded, blocking queue of pointers (a ring under a mutex).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <pthread.h>

#include "queue.h"

struct emlio__queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty;
    pthread_cond_t not_full;
    void **ring;
    size_t cap;
    size_t head; /* next to pop */
    size_t len;
    bool closed;
};

emlio__queue_t *
emlio__queue_new(size_t cap)
{
    assert(cap >= 1);
    emlio__queue_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->ring = emlio_calloc(cap, sizeof(*self->ring));
    if (!self->ring) {
        emlio_free(self);
        return NULL;
    }
    self->cap = cap;
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->not_empty, NULL);
    pthread_cond_init(&self->not_full, NULL);
    return self;
}

void
emlio__queue_destroy(emlio__queue_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__queue_t *self = *self_p;
    pthread_mutex_destroy(&self->lock);
    pthread_cond_destroy(&self->not_empty);
    pthread_cond_destroy(&self->not_full);
    emlio_free(self->ring);
    emlio_free(self);
    *self_p = NULL;
}

int
emlio__queue_push(emlio__queue_t *self, void *item)
{
    pthread_mutex_lock(&self->lock);
    while (self->len == self->cap && !self->closed)
        pthread_cond_wait(&self->not_full, &self->lock);
    if (self->closed) {
        pthread_mutex_unlock(&self->lock);
        return EMLIO_ECLOSED;
    }
    self->ring[(self->head + self->len) % self->cap] = item;
    self->len++;
    pthread_cond_signal(&self->not_empty);
    pthread_mutex_unlock(&self->lock);
    return 0;
}

int
emlio__queue_pop(emlio__queue_t *self, void **item)
{
    pthread_mutex_lock(&self->lock);
    while (self->len == 0 && !self->closed)
        pthread_cond_wait(&self->not_empty, &self->lock);
    if (self->len == 0) {
        pthread_mutex_unlock(&self->lock);
        return EMLIO_ECLOSED;
    }
    *item = self->ring[self->head];
    self->head = (self->head + 1) % self->cap;
    self->len--;
    pthread_cond_signal(&self->not_full);
    pthread_mutex_unlock(&self->lock);
    return 0;
}

void
emlio__queue_close(emlio__queue_t *self)
{
    pthread_mutex_lock(&self->lock);
    self->closed = true;
    pthread_cond_broadcast(&self->not_empty);
    pthread_cond_broadcast(&self->not_full);
    pthread_mutex_unlock(&self->lock);
}

size_t
emlio__queue_len(emlio__queue_t *self)
{
    pthread_mutex_lock(&self->lock);
    size_t len = self->len;
    pthread_mutex_unlock(&self->lock);
    return len;
}
