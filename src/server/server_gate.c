/* server_gate.c - the admission of one GET: every gate a request passes
 * before a reader sees it, in the order they are asked; the GETs parked
 * for the copy budget and their way out; the readahead advice an admitted
 * GET gives. Frontend thread only.
 * SPDX-License-Identifier: MIT
 *
 * The frontend decodes a request, asks emlio__srv_gate_get, and does what
 * the verdict says: GO (emlio__srv_gate_dispatch hands it to the fair
 * scheduler), PARK (nothing: the gate holds it), REFUSE (answer ERROR with
 * the refusal's code and text). The gates, each with its own refusal:
 *
 *   0. unread     a peer that stopped reading, at its credit limit: its
 *                 requests are dropped before decoding, without a reply
 *                 (emlio__srv_gate_unread), so a flood costs almost nothing
 *   1. transform  the GET's spec is cached or compiles (server_xfspec.c),
 *                 and the daemon serves one field: EMLIO_EINVAL & co
 *   2. peer       its routing id is a known stream, or a new client fits
 *                 --max-clients (server_admit.c): EMLIO_ELIMIT
 *   3. credit     fewer than --max-credit GETs unanswered: EMLIO_ECREDIT,
 *                 the one code the client asks again on
 *   4. fields     a transform decodes the one default field; a session
 *                 that named fields cannot ask for one: EMLIO_EINVAL
 *   5. copy       what its reply may copy fits the connection's and the
 *                 daemon's budget (server_copy.c): now (GO), once earlier
 *                 replies are freed (PARK), never (EMLIO_ELIMIT)
 *
 * A GET that passes gate 4 holds one credit of its peer until its reply
 * is sent or it is dropped; gate 5's refusal gives it back.
 */
#include "base.h"

#include <zmq.h>

#include "server_internal.h"

bool
emlio__srv_gate_unread(emlio_server_t *self, const zmq_msg_t *identity)
{
    emlio__peer_t *known =
        emlio__srv_peer_find(self, zmq_msg_data((zmq_msg_t *)identity),
                             zmq_msg_size((zmq_msg_t *)identity), false);
    return known && known->stalled &&
           known->outstanding >= self->cfg.max_credit;
}

/* ---- readahead ------------------------------------------------------- */

/* The chunk of shard i that holds record r: records per chunk from the
 * shard's mean record size, so a chunk is about EMLIO__SRV_RA_CHUNK bytes.
 * Sets *per to the records per chunk. Returns the chunk's stamp, or NULL
 * (out of memory: the caller advises the record alone). */
static uint32_t *
s_ra_chunk(emlio_server_t *self, uint32_t i, uint64_t r, size_t *per)
{
    const emlio__shard_t *shard = &self->core->set.shards[i];
    size_t count = emlio__shard_count(shard);
    uint64_t mean = emlio__shard_size(shard) / EMLIO_MAX(count, 1);
    *per = (size_t)EMLIO_MAX(EMLIO__SRV_RA_CHUNK / EMLIO_MAX(mean, 1), 1);
    if (!self->adm.ra_stamp) {
        self->adm.ra_stamp =
            emlio_calloc(self->core->set.n, sizeof(*self->adm.ra_stamp));
        self->adm.ra_t0_ns = emlio__now_ns();
        if (!self->adm.ra_stamp)
            return NULL;
        self->adm.ra_n = self->core->set.n;
    }
    if (!self->adm.ra_stamp[i]) {
        self->adm.ra_stamp[i] =
            emlio_calloc(count / *per + 1, sizeof(**self->adm.ra_stamp));
        if (!self->adm.ra_stamp[i])
            return NULL;
    }
    return &self->adm.ra_stamp[i][r / *per];
}

/* Plan-driven readahead: the client asks for batches well before it needs
 * them, so telling the kernel now which records are coming overlaps the
 * disk with the work on earlier batches. One madvise per record was a
 * system call per sample (16% of the daemon at 512 B samples, with the
 * data in the page cache): a record's whole chunk (~1 MiB of its shard) is
 * advised instead, at most once per EMLIO__SRV_RA_REFRESH_MS, and the
 * plan's shuffle window reads the rest of the chunk soon anyway. Items
 * are checked later; bad ones are skipped here. */
static void
s_readahead(emlio_server_t *self, const emlio__msg_get_t *get)
{
    uint32_t now_ms = 0;
    for (size_t i = 0; i < get->n_items; i++) {
        const emlio__wire_item_t *item = &get->items[i];
        if (item->shard >= self->core->set.n)
            continue;
        const emlio__shard_t *shard = &self->core->set.shards[item->shard];
        size_t count = emlio__shard_count(shard);
        /* A shard read with exact reads gets none: a chunk of readahead
         * per record is what read a cold dataset 16-64 times over. Nor
         * does one served from its mapping while the dataset is read
         * (--io auto found it resident): advice would pull its missing
         * chunks into a page cache the dataset does not fit. */
        if (item->record >= count || emlio__shard_reads_io(shard) ||
            atomic_load_explicit(&self->core->io_reading, memory_order_relaxed))
            continue;
        size_t per = 1;
        uint32_t *stamp = s_ra_chunk(self, item->shard, item->record, &per);
        if (!now_ms)
            now_ms = (uint32_t)((emlio__now_ns() - self->adm.ra_t0_ns) /
                                1000000ull) +
                     1;
        if (stamp && *stamp && now_ms - *stamp < EMLIO__SRV_RA_REFRESH_MS)
            continue;
        size_t first =
            stamp ? (size_t)(item->record / per * per) : (size_t)item->record;
        size_t n = stamp ? EMLIO_MIN(per, count - first) : 1;
        emlio__shard_advise(shard, first, n, EMLIO_ADVISE_WILLNEED);
        if (stamp)
            *stamp = now_ms;
    }
}

/* ---- the gates ------------------------------------------------------- */

static emlio__gate_verdict_t s_refuse(emlio__refusal_t *why, int code,
                                      const char *fmt, ...) EMLIO_PRINTF(3, 4);

static emlio__gate_verdict_t
s_refuse(emlio__refusal_t *why, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->text, sizeof(why->text), fmt, ap);
    va_end(ap);
    why->code = code;
    return EMLIO__GATE_REFUSE;
}

/* Parks an admitted GET until the copy budget has room (gate 5). It keeps
 * a reference to the account it will be charged to, since the peer may be
 * forgotten while it waits. */
static emlio__gate_verdict_t
s_park(emlio_server_t *self, emlio__job_t *job, emlio__peer_t *peer,
       emlio__refusal_t *why)
{
    if (emlio__grow(&self->adm.parked, &self->adm.cap_parked,
                    self->adm.n_parked, sizeof(*self->adm.parked), 16) < 0)
        return s_refuse(why, EMLIO_ENOMEM, "out of memory");
    if (peer->copy)
        atomic_fetch_add(&peer->copy->refs, 1);
    job->copy.waits_on = peer->copy;
    self->adm.parked[self->adm.n_parked++] = job;
    atomic_fetch_add(&self->count.copy_waits, 1);
    return EMLIO__GATE_PARK;
}

emlio__gate_verdict_t
emlio__srv_gate_get(emlio_server_t *self, emlio__job_t *job,
                    emlio__peer_t **peer_out, emlio__refusal_t *why)
{
    *peer_out = NULL;
    why->code = 0;
    why->text[0] = '\0';
    int rc = emlio__srv_xf_admit(self, job, why->text);
    if (rc < 0) {
        why->code = rc;
        return EMLIO__GATE_REFUSE;
    }
    emlio__peer_t *peer = emlio__srv_peer_find(
        self, zmq_msg_data(&job->identity), zmq_msg_size(&job->identity), true);
    if (!peer)
        return s_refuse(why, EMLIO_ELIMIT,
                        "too many client connections (limit %" PRIu32 ")",
                        self->cfg.max_clients);
    if (peer->outstanding >= self->cfg.max_credit)
        return s_refuse(why, EMLIO_ECREDIT,
                        "too many outstanding requests (limit %" PRIu32 ")",
                        self->cfg.max_credit);
    job->fields = peer->fields;
    if (job->xf.spec && job->fields)
        return s_refuse(why, EMLIO_EINVAL,
                        "transforms decode the one default field of a "
                        "sample; this client asked for fields");
    *peer_out = peer;
    peer->outstanding++;
    /* The only place the count grows, so a peer that ever has two GETs
     * unanswered is seen here. */
    emlio__srv_peer_coalesce(self, peer);
    /* Raw samples go packed (a tensor batch is one frame already). */
    job->pack.on = !job->xf.spec;
    job->pack.max = job->pack.on ? peer->pack_max : 0;
    rc = emlio__srv_copy_admit(self, job, peer, !!self->adm.n_parked, why->text,
                               sizeof(why->text));
    if (rc < 0) {
        peer->outstanding--;
        *peer_out = NULL;
        why->code = rc;
        return EMLIO__GATE_REFUSE;
    }
    emlio__gate_verdict_t verdict =
        rc == 1 ? s_park(self, job, peer, why) : EMLIO__GATE_GO;
    if (verdict == EMLIO__GATE_REFUSE) {
        peer->outstanding--;
        *peer_out = NULL;
        return verdict;
    }
    if (self->cfg.readahead)
        s_readahead(self, &job->msg.get);
    return verdict;
}

int
emlio__srv_gate_dispatch(emlio_server_t *self, void *work, emlio__job_t *job,
                         emlio__peer_t *peer)
{
    /* A parked GET whose peer was forgotten while it waited still goes:
     * its client may yet read the reply, and no job counts its credit. */
    if ((peer ? emlio__srv_jobs_submit(self, work, job, peer)
              : emlio__srv_send_work(self, work, job)) == 0)
        return 0;
    if (peer && peer->outstanding)
        peer->outstanding--;
    emlio__srv_job_drop(self, job);
    return -1;
}

/* ---- the parked GETs' way out ----------------------------------------- */

void
emlio__srv_gate_parked_run(emlio_server_t *self, void *work)
{
    size_t kept = 0;
    for (size_t i = 0; i < self->adm.n_parked; i++) {
        emlio__job_t *job = self->adm.parked[i];
        if (!emlio__srv_copy_charge_if_fits(self, job, job->copy.waits_on)) {
            self->adm.parked[kept++] = job;
            continue;
        }
        emlio__srv_copy_acct_unref(&job->copy.waits_on);
        emlio__peer_t *peer =
            emlio__srv_peer_find(self, zmq_msg_data(&job->identity),
                                 zmq_msg_size(&job->identity), false);
        (void)emlio__srv_gate_dispatch(self, work, job, peer);
    }
    self->adm.n_parked = kept;
}

void
emlio__srv_gate_parked_drop(emlio_server_t *self)
{
    for (size_t i = 0; i < self->adm.n_parked; i++) {
        emlio__srv_copy_acct_unref(&self->adm.parked[i]->copy.waits_on);
        emlio__srv_job_drop(self, self->adm.parked[i]);
    }
    self->adm.n_parked = 0;
    emlio_free(self->adm.parked);
    self->adm.parked = NULL;
    self->adm.cap_parked = 0;
}
