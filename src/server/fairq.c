/* fairq.c - weighted deficit round robin (see fairq.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "fairq.h"

void
emlio__fairq_init(emlio__fairq_t *q, uint64_t quantum)
{
    memset(q, 0, sizeof(*q));
    q->quantum = quantum ? quantum : 1;
}

void
emlio__fairq_release(emlio__fairq_t *q)
{
    emlio_free(q->ring);
    memset(q, 0, sizeof(*q));
}

int
emlio__fairq_push(emlio__fairq_t *q, emlio__fairq_flow_t *flow,
                  emlio__fairq_item_t *item)
{
    if (!flow->in_ring) {
        if (emlio__grow(&q->ring, &q->cap, q->n_ring, sizeof(*q->ring), 8) < 0)
            return EMLIO_ENOMEM;
        /* A newcomer waits for its turn behind the flows already there:
         * placed just before the cursor, it comes last in this round. */
        size_t at = q->cursor;
        memmove(&q->ring[at + 1], &q->ring[at],
                (q->n_ring - at) * sizeof(*q->ring));
        q->ring[at] = flow;
        q->n_ring++;
        q->cursor = (at + 1) % q->n_ring;
        flow->in_ring = true;
        flow->topped = false;
        flow->deficit = 0;
    }
    item->next = NULL;
    if (flow->tail)
        flow->tail->next = item;
    else
        flow->head = item;
    flow->tail = item;
    flow->n++;
    q->n_items++;
    return 0;
}

/* Takes flow i out of the ring, keeping the others' order and whose turn
 * it is. */
static void
s_leave(emlio__fairq_t *q, size_t i)
{
    emlio__fairq_flow_t *flow = q->ring[i];
    flow->in_ring = false;
    flow->topped = false;
    flow->deficit = 0; /* an idle flow keeps no credit */
    memmove(&q->ring[i], &q->ring[i + 1],
            (q->n_ring - i - 1) * sizeof(*q->ring));
    q->n_ring--;
    if (i < q->cursor)
        q->cursor--;
    if (q->cursor >= q->n_ring)
        q->cursor = 0;
}

emlio__fairq_item_t *
emlio__fairq_peek(emlio__fairq_t *q)
{
    /* Each pass either finds an item or tops up one flow; a flow's
     * deficit grows by at least quantum per turn, so the longest item
     * is reached in cost / quantum rounds. */
    while (q->n_ring) {
        emlio__fairq_flow_t *flow = q->ring[q->cursor];
        if (!flow->head) {
            s_leave(q, q->cursor);
            continue;
        }
        if (!flow->topped) {
            uint64_t grant = q->quantum * (flow->weight ? flow->weight : 1);
            flow->deficit = flow->deficit > UINT64_MAX - grant
                                ? UINT64_MAX
                                : flow->deficit + grant;
            flow->topped = true;
        }
        if (flow->head->cost <= flow->deficit)
            return flow->head;
        flow->topped = false; /* its turn ends; the credit stays */
        q->cursor = (q->cursor + 1) % q->n_ring;
    }
    return NULL;
}

void
emlio__fairq_pop(emlio__fairq_t *q)
{
    assert(q->n_ring);
    emlio__fairq_flow_t *flow = q->ring[q->cursor];
    emlio__fairq_item_t *item = flow->head;
    assert(item && item->cost <= flow->deficit);
    flow->deficit -= item->cost;
    flow->head = item->next;
    if (!flow->head)
        flow->tail = NULL;
    item->next = NULL;
    flow->n--;
    q->n_items--;
    if (!flow->head) {
        s_leave(q, q->cursor);
    } else if (flow->head->cost > flow->deficit) {
        flow->topped = false;
        q->cursor = (q->cursor + 1) % q->n_ring;
    }
}
