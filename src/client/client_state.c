/* client_state.c - the client's resume state: which batches of which
 * epoch were handed over, saved and loaded as a checked blob.
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

#include "crc32c.h"

/* ---- resume state ------------------------------------------------------ */

/* Layout (little endian): "EMLS", u32 format 3, u64 seed, u32 world, rank,
 * batch_size, shuffle, window_shards, drop_last, char dataset[16],
 * u64 epoch, u64 n_batches, u64 share_join, bitmap[(n_batches + 7) / 8],
 * u32 crc32c of all the bytes before it. The bitmap names batches of one
 * order, so the format follows the plan version: format 1 was plan
 * version 1. Format 2 is format 3 without share_join (read as 0: it was
 * saved before a job could join the shared schedule late). */
#define S_STATE_MAGIC "EMLS"

#define S_STATE_FORMAT 3u
_Static_assert(EMLIO_PLAN_VERSION == 2,
               "another plan order needs another resume state format");

#define S_STATE_FIXED2 (4 + 4 + 8 + 6 * 4 + 16 + 8 + 8)
#define S_STATE_FIXED  (S_STATE_FIXED2 + 8)

static void
s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t
s_get32(const uint8_t *p)
{
    return (uint32_t)s_get64((const uint8_t[8]){ p[0], p[1], p[2], p[3] });
}

static void
s_put_params(const emlio_client_t *self, uint8_t *p)
{
    memcpy(p, S_STATE_MAGIC, 4);
    s_put32(p + 4, S_STATE_FORMAT);
    s_put64(p + 8, self->cfg.seed);
    s_put32(p + 16, self->cfg.world);
    s_put32(p + 20, self->cfg.rank);
    s_put32(p + 24, self->cfg.batch_size);
    /* The shared schedule is another order: bit 8 of the shuffle word.
     * The window is the one the plans use (a shared one comes from the
     * daemons: another --share-bytes there is another order). */
    s_put32(p + 28,
            (uint32_t)self->cfg.shuffle | (self->inv.share ? 0x100u : 0));
    s_put32(p + 32, self->inv.window);
    s_put32(p + 36, self->cfg.drop_last);
    memcpy(p + 40, self->inv.dataset, 16);
}

int
emlio_client_save_state(const emlio_client_t *self, uint8_t **blob_out,
                        size_t *len_out)
{
    assert(self && blob_out && len_out);
    if (!self->win.delivered)
        return emlio__seterr((char *)self->err, EMLIO_EINVAL,
                             "no epoch has been started");
    size_t bitmap = (self->current.n_batches + 7) / 8;
    size_t len = S_STATE_FIXED + bitmap + 4;
    uint8_t *p = emlio_malloc(len);
    if (!p)
        return emlio__seterr((char *)self->err, EMLIO_ENOMEM, "out of memory");
    s_put_params(self, p);
    s_put64(p + 56, self->current.number);
    s_put64(p + 64, self->current.n_batches);
    s_put64(p + 72, self->inv.share ? self->inv.join : 0);
    memcpy(p + S_STATE_FIXED, self->win.delivered, bitmap);
    s_put32(p + len - 4, emlio_crc32c(0, p, len - 4));
    *blob_out = p;
    *len_out = len;
    return 0;
}

void
emlio_client_free_blob(uint8_t *blob)
{
    emlio_free(blob);
}

int
emlio_client_load_state(emlio_client_t *self, const uint8_t *blob, size_t len)
{
    assert(self && blob);
    if (len < S_STATE_FIXED2 + 4 || memcmp(blob, S_STATE_MAGIC, 4) ||
        s_get32(blob + len - 4) != emlio_crc32c(0, blob, len - 4))
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state is damaged or not an emlio state");
    uint32_t format = s_get32(blob + 4);
    size_t fixed = format == 2 ? S_STATE_FIXED2 : S_STATE_FIXED;
    if (len < fixed + 4)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state is damaged or not an emlio state");
    if (format != S_STATE_FORMAT && format != 2)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state has format %" PRIu32
                             ", expected %u%s",
                             format, S_STATE_FORMAT,
                             format == 1 ? ": it was saved against plan "
                                           "version 1, whose sample order "
                                           "differs; start the epoch again"
                                         : "");
    uint8_t mine[S_STATE_FIXED];
    s_put_params(self, mine);
    if (memcmp(mine + 8, blob + 8, 48)) { /* past magic and format */
        const char *what = memcmp(mine + 40, blob + 40, 16) ? "dataset"
                           : memcmp(mine + 8, blob + 8, 8)  ? "seed"
                                                            : "world, rank, "
                                                              "batch size or "
                                                              "shuffle";
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state was made with another %s", what);
    }
    uint64_t epoch = s_get64(blob + 56);
    uint64_t n = s_get64(blob + 64);
    /* A sharing job goes on from the cursor it started at, whatever the
     * daemons say now: its order is the saved one. */
    if (self->inv.share)
        self->inv.join = fixed == S_STATE_FIXED ? s_get64(blob + 72) : 0;
    /* Nothing requested ahead may survive: some of it may be delivered
     * already according to the state. */
    emlio__epoch_abandon(self, 0);
    self->ahead.live = false;
    int rc = emlio_client_begin_epoch(self, epoch);
    if (rc < 0)
        return rc;
    if (n != self->current.n_batches || len != fixed + (n + 7) / 8 + 4)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state has %" PRIu64 " batches, the plan "
                             "%zu",
                             n, self->current.n_batches);
    memcpy(self->win.delivered, blob + fixed, (n + 7) / 8);
    self->win.n_delivered = 0;
    for (size_t i = 0; i < n; i++)
        self->win.n_delivered += emlio__window_is_delivered(self, i);
    if (self->win.n_delivered == n)
        self->current.live = true; /* next() reports the end at once */
    return (int)(n - self->win.n_delivered);
}
