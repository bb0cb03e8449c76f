/* client_epoch.c - the client's epochs: the current one and the one
 * requested ahead, as two values of one type (emlio__epoch_t).
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

/* Drops every batch in flight or waiting except those of generation keep
 * (0: drops all) and leaves no epoch in progress; a failure of the epoch
 * dropped is forgotten with it. */
void
emlio__epoch_abandon(emlio_client_t *self, uint32_t keep)
{
    emlio__window_drop(self, keep);
    self->current.live = false;
    self->failed_rc = 0;
}

/* Never generation 0: id 0 is what a daemon uses for errors it cannot tie
 * to a request, and HELLO ids use generation 0. */
static uint32_t
s_next_gen(uint32_t gen)
{
    gen = (gen + 1) & 0xffffff;
    return gen ? gen : 1;
}

/* Plans `epoch` for this rank into plan (the rest of it, when a resume
 * state says earlier runs consumed some). Returns its batch count or < 0. */
int
emlio__epoch_plan(emlio_client_t *self, emlio_plan_t *plan, uint64_t epoch)
{
    emlio_plan_shard_t *in = emlio_calloc(self->inv.n_shards, sizeof(*in));
    if (!in)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < self->inv.n_shards; i++)
        in[i] = (emlio_plan_shard_t){
            self->inv.shards[i].name,      self->inv.shards[i].records,
            self->inv.shards[i].bytes,     self->inv.shards[i].holders,
            self->inv.shards[i].n_holders, self->inv.shards[i].source
        };
    emlio_plan_params_t params;
    emlio_plan_params_init(&params);
    params.world = self->cfg.world;
    params.rank = self->cfg.rank;
    params.batch_size = self->cfg.batch_size;
    params.epoch = epoch;
    params.seed = self->cfg.seed;
    params.shuffle = self->cfg.shuffle;
    params.window_shards = self->inv.window;
    params.shared = self->inv.share;
    params.share_join = self->inv.join;
    params.drop_last = self->cfg.drop_last;
    params.sources = self->plan_src;
    params.n_sources = self->n_src;
    params.epoch_samples = self->cfg.epoch_samples;
    params.stratify = self->cfg.stratify;
    emlio_plan_layer_t *layers = NULL;
    const emlio__resume_t *res = &self->resume;
    if (res->live && res->epoch == epoch) {
        params.done = res->spans;
        params.n_done = res->n;
        if (res->blend) {
            params.sources = res->blend->src;
            params.epoch_samples = res->blend->epoch_samples;
        }
        if (res->n_layers &&
            !(layers = emlio_calloc(res->n_layers, sizeof(*layers)))) {
            emlio_free(in);
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < res->n_layers; i++)
            layers[i] =
                (emlio_plan_layer_t){ res->layers[i].blend.src,
                                      res->layers[i].blend.epoch_samples,
                                      res->layers[i].spans, res->layers[i].n };
        params.layers = layers;
        params.n_layers = res->n_layers;
    }
    int rc = emlio_plan_build(plan, in, self->inv.n_shards, &params);
    emlio_free(in);
    emlio_free(layers);
    if (rc < 0)
        return emlio__seterr(self->err, rc, "cannot plan epoch %" PRIu64 ": %s",
                             epoch, emlio_plan_errmsg(plan));
    size_t n = emlio_plan_batch_count(plan);
    if (n > UINT32_MAX)
        return emlio__seterr(self->err, EMLIO_ELIMIT, "too many batches");
    return (int)n;
}

/* begin_epoch(epoch) when that epoch was requested ahead: it becomes the
 * current one, with the batches already in flight or arrived; the old
 * current's plan is kept for the next epoch planned ahead. */
static void
s_take_ahead(emlio_client_t *self)
{
    emlio__epoch_abandon(self, self->ahead.gen);
    emlio__epoch_t old = self->current;
    self->current = self->ahead;
    self->current.live = false; /* until begin_epoch got through */
    self->ahead = old;
    self->ahead.live = false;
}

/* Plans `epoch` afresh as the current one, dropping whatever was in flight
 * (the epoch ahead too). Its generation follows the last one used, so no
 * late reply of either is taken for one of its batches. */
static int
s_plan_current(emlio_client_t *self, uint64_t epoch)
{
    uint32_t last = self->ahead.live ? self->ahead.gen : self->current.gen;
    emlio__epoch_abandon(self, 0);
    self->ahead.live = false;
    int rc = emlio__epoch_plan(self, self->current.plan, epoch);
    if (rc < 0)
        return rc;
    self->current.n_batches = (size_t)rc;
    self->current.next_to_send = 0;
    self->current.gen = s_next_gen(last);
    return 0;
}

int
emlio__epoch_begin(emlio_client_t *self, uint64_t epoch)
{
    /* What a resume state said earlier runs consumed is of its epoch. */
    if (self->resume.live && self->resume.epoch != epoch)
        self->resume.live = false;
    bool took_ahead = self->ahead.live && self->ahead.number == epoch;
    if (took_ahead) {
        s_take_ahead(self);
    } else {
        int rc = s_plan_current(self, epoch);
        if (rc < 0)
            return rc;
    }
    uint64_t now = emlio__now_ns();
    int rc = emlio__window_begin(self, now);
    if (rc < 0)
        return rc;
    self->current.number = epoch;
    self->current.live = true;
    self->fig.epoch_start_ns = now;
    self->fig.last_delivery_ns = now;
    self->fig.first_batch_ns = 0;
    self->fig.total_wait_ns += self->fig.wait_ns;
    self->fig.wait_ns = 0;
    self->fig.samples = 0;
    self->fig.bytes = 0;
    self->fig.disk_read = 0;
    self->fig.shared = 0;
    if (took_ahead) {
        /* Batches of this epoch that arrived while the last one ran are
         * complete now, and only now ready (their holes are compacted into
         * this epoch's skipped list). */
        rc = emlio__window_adopt(self);
        if (rc < 0)
            return rc;
    }
    return (int)self->current.n_batches;
}

/* With every batch of the current epoch requested and room in the window,
 * requests the next epoch's first batches (cfg.end_epoch permitting), so
 * the pipe stays full across the epoch boundary. A plan that fails here
 * only means no overlap: begin_epoch will report the failure. */
int
emlio__epoch_fill_ahead(emlio_client_t *self)
{
    uint64_t next = self->current.number + 1;
    if (!self->current.live || next == 0 ||
        (self->cfg.end_epoch && next >= self->cfg.end_epoch))
        return 0;
    if (!self->ahead.live) {
        int n = emlio__epoch_plan(self, self->ahead.plan, next);
        if (n < 0) {
            snprintf(self->err, sizeof(self->err), "no error");
            self->cfg.end_epoch = next; /* do not try again */
            return 0;
        }
        self->ahead.live = true;
        self->ahead.number = next;
        self->ahead.gen = s_next_gen(self->current.gen);
        self->ahead.n_batches = (size_t)n;
        self->ahead.next_to_send = 0;
    }
    while (self->win.n_slots < self->win.limit &&
           self->ahead.next_to_send < self->ahead.n_batches &&
           emlio__budget_has_credit(self)) {
        int rc = emlio__window_request(self, &self->ahead,
                                       self->ahead.next_to_send++);
        if (rc < 0)
            return rc;
    }
    return 0;
}
