/* fairq.h - weighted deficit round robin over flows of queued items.
 * SPDX-License-Identifier: MIT
 *
 * The daemon's fair shares (docs/fairness.md): each training job is a flow,
 * each admitted GET an item costing its bytes. Flows with items take turns;
 * a turn grants the flow quantum x weight of credit ("deficit") and lets it
 * send items while their cost fits (Shreedhar and Varghese, SIGCOMM'95).
 * Over any busy period each flow's bytes are within one quantum plus one
 * item of its weight's share, whatever the number of items it queues: a
 * job that opens 32 streams gets no more than one that opens 2. An idle
 * flow leaves the ring at once and keeps no credit, so its share goes to
 * the others.
 *
 * Peek and pop are split so that a dispatch that cannot go now (the
 * readers' queue is full) leaves the item first in line:
 *
 *   while ((it = emlio__fairq_peek(q)) && try_send(it))
 *       emlio__fairq_pop(q);
 *
 * No locks: one thread (the frontend) owns a queue. Items and flows are
 * the caller's memory; a flow must stay alive while it has items.
 */
#ifndef EMLIO_FAIRQ_H
#define EMLIO_FAIRQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct emlio__fairq_item {
    struct emlio__fairq_item *next;
    uint64_t cost; /* bytes, >= 1 */
} emlio__fairq_item_t;

typedef struct emlio__fairq_flow {
    emlio__fairq_item_t *head, *tail;
    size_t n;         /* items queued */
    uint64_t deficit; /* credit left of its turns */
    uint32_t weight;  /* >= 1 */
    bool in_ring;
    bool topped; /* this turn's quantum is granted */
} emlio__fairq_flow_t;

typedef struct emlio__fairq {
    emlio__fairq_flow_t **ring; /* flows with items, in turn order */
    size_t n_ring;
    size_t cap;
    size_t cursor;    /* whose turn it is */
    uint64_t quantum; /* credit per turn at weight 1 */
    size_t n_items;
} emlio__fairq_t;

/* A queue granting quantum bytes per turn per unit of weight. */
void emlio__fairq_init(emlio__fairq_t *q, uint64_t quantum);
void emlio__fairq_release(emlio__fairq_t *q);

/* Queues item (cost set by the caller) behind flow's others. Returns 0, or
 * EMLIO_ENOMEM when the ring cannot grow (nothing queued then). */
int emlio__fairq_push(emlio__fairq_t *q, emlio__fairq_flow_t *flow,
                      emlio__fairq_item_t *item);

/* The item whose turn it is, left queued; NULL when none is. Repeated
 * calls without a pop return the same item. */
emlio__fairq_item_t *emlio__fairq_peek(emlio__fairq_t *q);

/* Removes the item the last peek returned and charges its flow. */
void emlio__fairq_pop(emlio__fairq_t *q);

#endif /* EMLIO_FAIRQ_H */
