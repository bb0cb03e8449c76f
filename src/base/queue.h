/* queue.h - a bounded, blocking queue of pointers between threads.
 * SPDX-License-Identifier: MIT
 *
 * Joins the daemon's pipeline stages where several producers meet several
 * consumers (readers -> serializers): push blocks while the queue is full,
 * which is the backpressure that bounds the daemon's memory; pop blocks
 * while it is empty. Closing wakes everyone: pushes fail, pops drain what
 * is left and then report the end. Thread-safe.
 */
#ifndef EMLIO_QUEUE_H
#define EMLIO_QUEUE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct emlio__queue emlio__queue_t;

/* A queue holding at most cap pointers (cap >= 1). NULL when out of
 * memory. */
emlio__queue_t *emlio__queue_new(size_t cap);

/* Frees the queue; the pointers still in it are the caller's to free
 * (drain with pop after close). Accepts NULL; sets *self_p NULL. */
void emlio__queue_destroy(emlio__queue_t **self_p);

/* Appends item, waiting while the queue is full. Returns 0, or
 * EMLIO_ECLOSED when the queue is (or gets) closed: item stays the
 * caller's. */
int emlio__queue_push(emlio__queue_t *self, void *item);

/* Takes the oldest item, waiting while the queue is empty and open.
 * Returns 0 with *item set, or EMLIO_ECLOSED once closed and empty. */
int emlio__queue_pop(emlio__queue_t *self, void **item);

/* Closes the queue and wakes every waiter. Idempotent. */
void emlio__queue_close(emlio__queue_t *self);

/* Items waiting now (a snapshot, for statistics). */
size_t emlio__queue_len(emlio__queue_t *self);

#endif /* EMLIO_QUEUE_H */
