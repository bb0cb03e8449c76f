/* server_copy.c - the byte budget of copied replies: what a GET may make
 * the daemon copy into memory, per connection and per daemon.
 * SPDX-License-Identifier: MIT
 *
 * Samples of mapped, leased shards are zero-copy frames of the page cache;
 * everything else (ImageFolder files, shards read by pread because no
 * lease could be had) is copied into fresh memory that lives until ZeroMQ
 * has sent the frame. Without a bound, one 8 KB GET naming a 200 KB
 * record 4,096 times costs 800 MB. So each GET is charged, at admission,
 * the bytes its copies can take (each record's size, as the format lists
 * it, and for a GET with a transform the tensor block it makes), against
 * its connection's account and the daemon's; the charge is
 * given back when the last frame of its reply is freed (or the job ends
 * without one). A GET larger than a connection's whole budget is refused
 * with EMLIO_ELIMIT; one that does not fit now is parked by the gate
 * (server_gate.c; its credit stays used, so a client cannot queue more
 * than its credits) until earlier replies free enough.
 */
#include "base.h"

#include <zmq.h>

#include "server_internal.h"

emlio__copy_acct_t *
emlio__srv_copy_acct_new(void)
{
    emlio__copy_acct_t *acct = emlio_calloc(1, sizeof(*acct));
    if (acct) {
        atomic_init(&acct->bytes, 0);
        atomic_init(&acct->refs, 1);
    }
    return acct;
}

void
emlio__srv_copy_acct_unref(emlio__copy_acct_t **acct_p)
{
    emlio__copy_acct_t *acct = *acct_p;
    *acct_p = NULL;
    if (acct && atomic_fetch_sub(&acct->refs, 1) == 1)
        emlio_free(acct);
}

void
emlio__srv_copy_release(emlio__copy_charge_t *charge)
{
    if (charge->bytes) {
        if (charge->conn)
            atomic_fetch_sub(&charge->conn->bytes, charge->bytes);
        if (charge->daemon)
            atomic_fetch_sub(charge->daemon, charge->bytes);
    }
    emlio__srv_copy_acct_unref(&charge->conn);
    *charge = (emlio__copy_charge_t){ 0 };
}

/* What reading the GET's samples can copy: records of shards that are
 * not zero-copy, and for a packed reply what its frame may hold (sets
 * job->pack.cap, within the budget). Items out of range cost nothing (the
 * reader refuses them). */
static uint64_t
s_estimate(const emlio_server_t *self, emlio__job_t *job)
{
    const emlio__msg_get_t *get = &job->msg.get;
    const emlio__shardset_t *set = &self->core->set;
    /* A GET with a transform also makes one tensor block of every sample
     * (server_xf.c): fresh memory like a copy, held until its frame
     * is sent. */
    uint64_t total = emlio__srv_xf_bytes(job);
    uint64_t pack = 0;
    uint32_t last = UINT32_MAX; /* the shard whose mean is in `mean` */
    uint64_t mean = 0;
    uint64_t per = emlio__srv_fields_per(self, job->fields);
    for (size_t i = 0; i < get->n_items; i++) {
        const emlio__wire_item_t *item = &get->items[i];
        if (item->shard >= set->n)
            continue;
        const emlio__shard_t *shard = &set->shards[item->shard];
        if (job->pack.on && item->shard != last) {
            mean = emlio__shard_mean_record(shard);
            last = item->shard;
        }
        /* What the packed frame may take of this sample: twice its
         * shard's mean record, when that is small enough to be packed
         * (the reader packs no more than the charge; the rest goes as
         * frames of their own). */
        if (job->pack.on && mean <= per * job->pack.max)
            pack += EMLIO_MIN(2 * mean, per * job->pack.max);
        if (emlio__shard_zero_copy(shard))
            continue;
        if (shard->ops->record_bytes &&
            item->record < emlio__shard_count(shard))
            total +=
                shard->ops->record_bytes(shard->impl, (size_t)item->record);
    }
    job->pack.cap = 0;
    if (job->pack.on) {
        /* Bounded by the samples' sizes, so the charge stays near what
         * the frame holds, and by what the budget leaves: packing is an
         * optimisation, never a reason to refuse a GET. */
        uint64_t cap =
            EMLIO_MIN(self->cfg.max_copy_bytes, self->cfg.max_copy_bytes_total);
        pack = EMLIO_MIN(pack, (uint64_t)EMLIO__SRV_PACK_CAP);
        job->pack.cap = total < cap / 2 ? EMLIO_MIN(pack, cap / 2 - total) : 0;
        total += job->pack.cap;
    }
    return total;
}

/* ---- the pool of packed frames' buffers ---- */

void
emlio__srv_pack_pool_init(emlio__pack_pool_t *pool)
{
    memset(pool, 0, sizeof(*pool));
    pthread_mutex_init(&pool->lock, NULL);
}

void
emlio__srv_pack_pool_release(emlio__pack_pool_t *pool)
{
    for (size_t c = 0; c < EMLIO__SRV_PACK_CLASSES; c++)
        while (pool->free[c]) {
            void *buf = pool->free[c];
            memcpy(&pool->free[c], buf, sizeof(void *));
            emlio_free(buf);
        }
    pthread_mutex_destroy(&pool->lock);
}

static size_t
s_pack_class(size_t size)
{
    size_t c = 0;
    while (c + 1 < EMLIO__SRV_PACK_CLASSES &&
           ((size_t)1 << (EMLIO__SRV_PACK_MIN_SHIFT + c)) < size)
        c++;
    return c;
}

uint8_t *
emlio__srv_pack_get(emlio__pack_pool_t *pool, size_t want, size_t *size)
{
    size_t c = s_pack_class(want);
    *size = (size_t)1 << (EMLIO__SRV_PACK_MIN_SHIFT + c);
    if (want > *size)
        return NULL;
    pthread_mutex_lock(&pool->lock);
    void *buf = pool->free[c];
    if (buf) {
        memcpy(&pool->free[c], buf, sizeof(void *));
        pool->n_free[c]--;
    }
    pthread_mutex_unlock(&pool->lock);
    return buf ? buf : emlio_malloc(*size);
}

void
emlio__srv_pack_put(emlio__pack_pool_t *pool, uint8_t *buf, size_t size)
{
    size_t c = s_pack_class(size);
    pthread_mutex_lock(&pool->lock);
    if ((pool->n_free[c] + 1) * size <= EMLIO__SRV_PACK_KEEP ||
        pool->n_free[c] < 2) {
        memcpy(buf, &pool->free[c], sizeof(void *));
        pool->free[c] = buf;
        pool->n_free[c]++;
        buf = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    emlio_free(buf);
}

/* What both accounts can still take now. */
static uint64_t
s_room(const emlio_server_t *self, const emlio__copy_acct_t *conn)
{
    uint64_t mine = conn ? atomic_load(&conn->bytes) : 0;
    uint64_t all = atomic_load(&self->core->copied);
    uint64_t room_conn =
        mine < self->cfg.max_copy_bytes ? self->cfg.max_copy_bytes - mine : 0;
    uint64_t room_all = all < self->cfg.max_copy_bytes_total
                            ? self->cfg.max_copy_bytes_total - all
                            : 0;
    return EMLIO_MIN(room_conn, room_all);
}

/* Whether a charge of bytes fits both accounts now. */
static bool
s_fits(const emlio_server_t *self, const emlio__copy_acct_t *conn,
       uint64_t bytes)
{
    return bytes <= s_room(self, conn);
}

/* Packs only what `room` bytes of budget leave after the job's copies
 * proper (nothing, at worst). */
static void
s_shrink_pack(emlio__job_t *job, uint64_t room)
{
    uint64_t rest = job->copy.want - job->pack.cap; /* the copies proper */
    job->pack.cap = room > rest ? EMLIO_MIN(job->pack.cap, room - rest) : 0;
    job->copy.want = rest + job->pack.cap;
}

static void
s_charge(emlio_server_t *self, emlio__job_t *job, emlio__copy_acct_t *conn)
{
    job->copy.charge.bytes = job->copy.want;
    job->copy.charge.daemon = &self->core->copied;
    if (conn) {
        atomic_fetch_add(&conn->refs, 1);
        atomic_fetch_add(&conn->bytes, job->copy.want);
    }
    job->copy.charge.conn = conn;
    atomic_fetch_add(&self->core->copied, job->copy.want);
}

int
emlio__srv_copy_admit(emlio_server_t *self, emlio__job_t *job,
                      emlio__peer_t *peer, bool queued, char *text, size_t len)
{
    job->copy.want = s_estimate(self, job);
    if (job->copy.want == 0)
        return 0;
    uint64_t cap =
        EMLIO_MIN(self->cfg.max_copy_bytes, self->cfg.max_copy_bytes_total);
    if (job->copy.want > cap) {
        snprintf(text, len,
                 "request would copy %" PRIu64 " bytes into memory, more "
                 "than the daemon's budget of %" PRIu64 " bytes per "
                 "connection (--max-copy-bytes); ask for fewer samples",
                 job->copy.want, cap);
        return EMLIO_ELIMIT;
    }
    /* Packing is an optimisation: a GET whose frames could go zero-copy
     * never waits for the budget to pack them (with 256 KiB frames packed,
     * a connection under --max-copy-bytes of a few batches waited for
     * every reply's release, up to a 100 ms poll each), it packs what fits
     * now; and it takes none of the budget that parked GETs, which need
     * their copies, wait for. */
    if (job->pack.cap &&
        (queued || !s_fits(self, peer->copy, job->copy.want))) {
        s_shrink_pack(job, queued ? 0 : s_room(self, peer->copy));
        if (job->copy.want == 0)
            return 0;
    }
    return emlio__srv_copy_charge_if_fits(self, job, peer->copy) ? 0 : 1;
}

bool
emlio__srv_copy_charge_if_fits(emlio_server_t *self, emlio__job_t *job,
                               emlio__copy_acct_t *acct)
{
    if (!s_fits(self, acct, job->copy.want))
        return false;
    s_charge(self, job, acct);
    return true;
}
