/* plan_rest.c - the rest of an epoch after earlier runs consumed part of it:
 * consumed spans kept sorted, and rest positions mapped to global ones.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "plan_rest.h"

int
emlio__rest_set(emlio__rest_t *r, const emlio_plan_span_t *spans, size_t n,
                uint64_t size, char *err)
{
    assert(r && (spans || n == 0));
    r->n = 0;
    r->done = 0;
    uint64_t prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        const emlio_plan_span_t *s = &spans[i];
        if (s->begin >= s->end || s->end > size || (i && s->begin < prev_end))
            return emlio__seterr(err, EMLIO_EINVAL,
                                 "consumed span %zu [%" PRIu64 ", %" PRIu64
                                 ") is %s",
                                 i, s->begin, s->end,
                                 s->begin >= s->end ? "empty"
                                 : s->end > size    ? "past the epoch's end"
                                                    : "out of order or "
                                                      "overlaps the one "
                                                      "before");
        prev_end = s->end;
    }
    if (n > r->cap) {
        emlio__rest_span_t *grown =
            emlio_reallocarray(r->spans, n, sizeof(*grown));
        if (!grown)
            return emlio__seterr(err, EMLIO_ENOMEM,
                                 "out of memory for %zu consumed spans", n);
        r->spans = grown;
        r->cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        r->spans[i] =
            (emlio__rest_span_t){ spans[i].begin, spans[i].end, r->done };
        r->done += spans[i].end - spans[i].begin;
    }
    r->n = n;
    return 0;
}

void
emlio__rest_release(emlio__rest_t *r)
{
    emlio_free(r->spans);
    *r = (emlio__rest_t){ 0 };
}

/* Spans that lie wholly before rest position q: the rest positions before
 * span i number begin - done_before, which never decreases with i. */
static size_t
s_spans_before(const emlio__rest_t *r, uint64_t q)
{
    size_t lo = 0;
    size_t hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const emlio__rest_span_t *s = &r->spans[mid];
        if (s->begin - s->done_before <= q)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

uint64_t
emlio__rest_position(const emlio__rest_t *r, uint64_t q)
{
    size_t k = s_spans_before(r, q);
    if (k == 0)
        return q;
    const emlio__rest_span_t *s = &r->spans[k - 1];
    return q + s->done_before + (s->end - s->begin);
}

int
emlio__rest_map(const emlio__rest_t *r, uint64_t q0, uint64_t q1,
                int (*emit)(void *arg, uint64_t begin, uint64_t end), void *arg)
{
    size_t k = s_spans_before(r, q0);
    uint64_t g = emlio__rest_position(r, q0);
    while (q0 < q1) {
        while (k < r->n && r->spans[k].begin <= g) /* spans that touch */
            g = r->spans[k++].end;
        /* The run from g goes on to the next consumed span or to q1. */
        uint64_t len = q1 - q0;
        if (k < r->n && r->spans[k].begin - g < len)
            len = r->spans[k].begin - g;
        int rc = emit(arg, g, g + len);
        if (rc)
            return rc;
        q0 += len;
        g += len;
    }
    return 0;
}

static int
s_cmp_span(const void *a, const void *b)
{
    const emlio_plan_span_t *x = a;
    const emlio_plan_span_t *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

void
emlio__spans_normalize(emlio_plan_span_t *spans, size_t *n)
{
    if (*n == 0)
        return;
    qsort(spans, *n, sizeof(*spans), s_cmp_span);
    size_t out = 0;
    for (size_t i = 1; i < *n; i++) {
        if (spans[i].begin <= spans[out].end) {
            if (spans[i].end > spans[out].end)
                spans[out].end = spans[i].end;
        } else {
            spans[++out] = spans[i];
        }
    }
    *n = out + 1;
}

/* Public: the slice of an epoch's rest that one rank takes (plan.h). */
void
emlio__strata_init(emlio__strata_t *st, uint64_t rest, uint32_t world,
                   uint32_t batch_size, bool drop_last)
{
    st->batch = batch_size;
    st->global = (uint64_t)world * batch_size;
    st->full = rest / st->global;
    uint64_t short_len = rest % st->global;
    st->part = drop_last ? 0 : short_len / world + (short_len % world != 0);
}

uint64_t
emlio__strata_first(const emlio__strata_t *st, uint32_t rank, uint64_t i)
{
    return i < st->full ? i * st->global + (uint64_t)rank * st->batch
                        : st->full * st->global + (uint64_t)rank * st->part;
}

uint64_t
emlio_plan_rank_batches(uint64_t rest, uint32_t world, uint32_t batch_size,
                        bool drop_last, bool stratify)
{
    if (world == 0 || batch_size == 0)
        return 0;
    if (stratify) {
        emlio__strata_t st;
        emlio__strata_init(&st, rest, world, batch_size, drop_last);
        return st.full + (st.part != 0);
    }
    uint64_t first, count;
    if (emlio_plan_slice(rest, world, 0, batch_size, drop_last, &first,
                         &count) < 0)
        return 0;
    return count / batch_size + (count % batch_size != 0);
}

int
emlio_plan_batch_span(uint64_t rest, uint32_t world, uint32_t rank,
                      uint32_t batch_size, bool drop_last, bool stratify,
                      uint64_t k, uint64_t *q0, uint64_t *q1)
{
    assert(q0 && q1);
    uint64_t first, count;
    if (emlio_plan_slice(rest, world, rank, batch_size, drop_last, &first,
                         &count) < 0)
        return EMLIO_EINVAL;
    uint64_t b = batch_size;
    if (stratify) {
        emlio__strata_t st;
        emlio__strata_init(&st, rest, world, batch_size, drop_last);
        *q0 = emlio__strata_first(&st, rank, k);
        *q1 = *q0 + (k < st.full ? b : st.part);
    } else {
        *q0 = first + EMLIO_MIN(k * b, count);
        *q1 = first + EMLIO_MIN((k + 1) * b, count);
    }
    *q1 = EMLIO_MIN(*q1, rest);
    *q0 = EMLIO_MIN(*q0, *q1);
    return 0;
}

int
emlio_plan_slice(uint64_t rest, uint32_t world, uint32_t rank,
                 uint32_t batch_size, bool drop_last, uint64_t *first,
                 uint64_t *count)
{
    assert(first && count);
    if (world == 0 || rank >= world || batch_size == 0)
        return EMLIO_EINVAL;
    uint64_t per_rank;
    if (drop_last) {
        uint64_t step = (uint64_t)world * batch_size;
        per_rank = rest / step * batch_size;
    } else {
        /* world * per_rank < rest + world must fit the position type. */
        if (rest > UINT64_MAX - world)
            return EMLIO_EINVAL;
        per_rank = rest / world + (rest % world != 0);
    }
    *first = rank * per_rank;
    *count = per_rank;
    return 0;
}
