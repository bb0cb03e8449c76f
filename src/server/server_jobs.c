/* server_jobs.c - training jobs: the table, the policy, the fair dispatch.
 * SPDX-License-Identifier: MIT
 *
 * See server_jobs.h for what a job is and how the scheduler shares the
 * pipeline; docs/fairness.md for the operator's view.
 */
#include "base.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server_internal.h"

/* Credit per DRR turn at weight 1: about one GET of the client's default
 * size (2 MiB), so a turn is a GET or two and shares converge within a
 * few GETs of each job. */
#define S_QUANTUM ((uint64_t)1 << 20)

/* A reply's tag in front of its identity: its job, and the cost of its
 * slot (0: it holds none). */
#define S_TAG (sizeof(emlio__trainjob_t *) + sizeof(uint64_t))

static bool
s_name_ok(const char *name, size_t len)
{
    if (len == 0 || len > EMLIO__SRV_JOB_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isprint((unsigned char)name[i]))
            return false;
    return true;
}

int
emlio__srv_jobs_init(emlio__srv_jobs_t *jobs, const char *policy, int mode,
                     uint32_t max_jobs, char *err)
{
    memset(jobs, 0, sizeof(*jobs));
    pthread_mutex_init(&jobs->lock, NULL);
    jobs->max = max_jobs ? max_jobs : EMLIO_SERVER_MAX_JOBS;
    jobs->default_weight = 1;
    jobs->ledger = emlio_calloc(1, sizeof(*jobs->ledger));
    if (!jobs->ledger) {
        snprintf(err, EMLIO_ERRMSG_LEN, "out of memory");
        return EMLIO_ENOMEM;
    }
    atomic_init(&jobs->ledger->refs, 1);
    jobs->ledger->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    emlio__fairq_init(&jobs->q, S_QUANTUM);
    if (mode != EMLIO__SCHED_FAIR && mode != EMLIO__SCHED_FIFO) {
        snprintf(err, EMLIO_ERRMSG_LEN,
                 "schedule %d is not fair (0) or fifo (1)", mode);
        return EMLIO_EINVAL;
    }
    jobs->mode = (emlio__sched_mode_t)mode;
    if (!policy || !*policy)
        return 0;
    /* NAME=W[,NAME=W...]: names are printable, so ',' and '=' split. */
    for (const char *p = policy; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        char *stop = NULL;
        unsigned long w = eq ? strtoul(eq + 1, &stop, 10) : 0;
        size_t name_len = eq ? (size_t)(eq - p) : 0;
        if (!eq || stop != p + len || w < 1 || w > EMLIO_WIRE_MAX_WEIGHT ||
            !s_name_ok(p, name_len)) {
            snprintf(err, EMLIO_ERRMSG_LEN,
                     "bad job weight (--job-weight) '%.*s': want NAME=W with "
                     "W in 1..%u and a "
                     "printable NAME of at most %d bytes (* for every other "
                     "job)",
                     (int)EMLIO_MIN(len, 100), p, EMLIO_WIRE_MAX_WEIGHT,
                     EMLIO__SRV_JOB_NAME_MAX);
            return EMLIO_EINVAL;
        }
        if (name_len == 1 && *p == '*') {
            jobs->default_weight = (uint32_t)w;
        } else {
            emlio__job_policy_t *grown = emlio_reallocarray(
                jobs->policy, jobs->n_policy + 1, sizeof(*grown));
            if (!grown) {
                snprintf(err, EMLIO_ERRMSG_LEN, "out of memory");
                return EMLIO_ENOMEM;
            }
            jobs->policy = grown;
            emlio__job_policy_t *line = &grown[jobs->n_policy++];
            memcpy(line->name, p, name_len);
            line->name[name_len] = '\0';
            line->weight = (uint32_t)w;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

static void
s_ledger_unref(emlio__jobs_ledger_t *ledger)
{
    if (ledger && atomic_fetch_sub(&ledger->refs, 1) == 1) {
        if (ledger->wake_fd >= 0)
            close(ledger->wake_fd);
        emlio_free(ledger);
    }
}

void
emlio__srv_jobs_unref(emlio__trainjob_t *tjob)
{
    if (tjob && atomic_fetch_sub(&tjob->refs, 1) == 1) {
        s_ledger_unref(tjob->ledger);
        emlio_free(tjob);
    }
}

int
emlio__srv_jobs_wake_fd(const emlio__srv_jobs_t *jobs)
{
    return jobs->ledger ? jobs->ledger->wake_fd : -1;
}

void
emlio__srv_jobs_release(emlio__srv_jobs_t *jobs)
{
    for (size_t i = 0; i < jobs->n; i++)
        emlio__srv_jobs_unref(jobs->table[i]);
    emlio_free(jobs->table);
    emlio_free(jobs->policy);
    emlio__fairq_release(&jobs->q);
    s_ledger_unref(jobs->ledger);
    pthread_mutex_destroy(&jobs->lock);
    memset(jobs, 0, sizeof(*jobs));
}

void
emlio__srv_jobs_size_window(emlio__srv_jobs_t *jobs, uint64_t read_ahead_bytes)
{
    /* Enough bytes that every reader has GETs queued behind the one it
     * reads (--io read stages reads ahead of them up to read_ahead_bytes)
     * and that replies stream while others are read; little enough that a
     * newcomer waits behind a window, not behind every credit of every
     * other job, and that the transform queue (65,536 samples) is never
     * filled by GETs in the window, so readers never block on it (a GET
     * of 4,096 ImageNet records costs 450 MB: alone in flight). Shares
     * measured in bench/fairness.sh are closer with a smaller window: a
     * job's rate is its share over the pipeline's latency, which grows
     * with what the window lets queue. */
    jobs->window =
        EMLIO_MAX((uint64_t)64 << 20, 2 * (uint64_t)read_ahead_bytes);
}

/* The weight the policy allows a job: its line, else the default. */
static uint32_t
s_policy_weight(const emlio__srv_jobs_t *jobs, const char *name, bool named)
{
    for (size_t i = 0; named && i < jobs->n_policy; i++)
        if (!strcmp(jobs->policy[i].name, name))
            return jobs->policy[i].weight;
    return jobs->default_weight;
}

static emlio__trainjob_t *
s_find(emlio__srv_jobs_t *jobs, const char *name, size_t len, uint64_t anon)
{
    for (size_t i = 0; i < jobs->n; i++) {
        emlio__trainjob_t *j = jobs->table[i];
        if (name ? j->named && strlen(j->name) == len &&
                       !memcmp(j->name, name, len)
                 : !j->named && j->anon_key == anon)
            return j;
    }
    return NULL;
}

static void
s_log_job(emlio_server_t *self, const emlio__trainjob_t *j, const char *what)
{
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server", "job %s %s (weight %u)",
              j->name, what, atomic_load(&j->weight));
}

static void s_forget(emlio_server_t *self);

int
emlio__srv_jobs_attach(emlio_server_t *self, emlio__peer_t *peer,
                       const char *name, size_t name_len, uint64_t asked,
                       char *text, size_t len)
{
    emlio__srv_jobs_t *jobs = &self->jobs;
    if (name && !s_name_ok(name, name_len)) {
        snprintf(text, len,
                 "bad job name: want 1..%d printable bytes, got %zu%s",
                 EMLIO__SRV_JOB_NAME_MAX, name_len,
                 name_len && name_len <= EMLIO__SRV_JOB_NAME_MAX
                     ? " with a control or non-ASCII byte"
                     : "");
        return EMLIO_EINVAL;
    }
    uint64_t anon = peer->session ? peer->session : ++jobs->anon_serial;
    emlio__trainjob_t *j = s_find(jobs, name, name_len, anon);
    if (!j) {
        if (jobs->n >= jobs->max) {
            /* Jobs whose clients have gone may wait for the next tick.
             * (Not the connections' close events: draining them would
             * move the peers, this one among them.) */
            s_forget(self);
        }
        if (jobs->n >= jobs->max) {
            snprintf(text, len,
                     "too many jobs (limit %zu, emliod --max-jobs); "
                     "name this client's job as its other ranks do",
                     jobs->max);
            return EMLIO_ELIMIT;
        }
        if (jobs->n == jobs->cap) {
            size_t cap = jobs->cap ? 2 * jobs->cap : 16;
            emlio__trainjob_t **table =
                emlio_reallocarray(jobs->table, cap, sizeof(*table));
            if (!table) {
                snprintf(text, len, "out of memory");
                return EMLIO_ENOMEM;
            }
            pthread_mutex_lock(&jobs->lock);
            jobs->table = table;
            jobs->cap = cap;
            pthread_mutex_unlock(&jobs->lock);
        }
        j = emlio_calloc(1, sizeof(*j));
        if (!j) {
            snprintf(text, len, "out of memory");
            return EMLIO_ENOMEM;
        }
        atomic_init(&j->refs, 1); /* the table's */
        j->ledger = jobs->ledger;
        atomic_fetch_add(&jobs->ledger->refs, 1);
        j->named = name != NULL;
        j->anon_key = anon;
        if (name) {
            memcpy(j->name, name, name_len);
            j->name[name_len] = '\0';
        } else {
            snprintf(j->name, sizeof(j->name), "%s-%016" PRIx64,
                     peer->session ? "session" : "conn", anon);
        }
        j->since_ns = emlio__now_ns();
        pthread_mutex_lock(&jobs->lock);
        jobs->table[jobs->n++] = j;
        pthread_mutex_unlock(&jobs->lock);
    }
    uint32_t cap = s_policy_weight(jobs, j->name, j->named);
    /* The last HELLO's ask stands for the job; never above the policy. */
    uint32_t weight = asked ? (uint32_t)EMLIO_MIN(asked, cap) : cap;
    bool fresh = j->peers == 0 && j->flow.n == 0 && !atomic_load(&j->live);
    atomic_store(&j->weight, weight);
    j->flow.weight = weight;
    if (peer->tjob != j) {
        if (peer->tjob)
            emlio__srv_jobs_detach(self, peer);
        peer->tjob = j;
        j->peers++;
        if (fresh && j->named)
            s_log_job(self, j, "arrived");
    }
    return 0;
}

void
emlio__srv_jobs_detach(emlio_server_t *self, emlio__peer_t *peer)
{
    (void)self;
    emlio__trainjob_t *j = peer->tjob;
    if (j && j->peers)
        j->peers--;
    peer->tjob = NULL;
}

/* What the GET asks the pipeline to move: each item's shard's mean
 * record (a plain sum of record sizes would cost a lookup per item on
 * the frontend), and a transform's output block. */
static uint64_t
s_cost(const emlio_server_t *self, const emlio__job_t *job)
{
    const emlio__msg_get_t *get = &job->msg.get;
    const emlio__shardset_t *set = &self->core->set;
    uint64_t total = emlio__srv_xf_bytes(job);
    uint32_t last = UINT32_MAX;
    uint64_t mean = 0;
    for (size_t i = 0; i < get->n_items; i++) {
        uint32_t s = get->items[i].shard;
        if (s >= set->n)
            continue;
        if (s != last) {
            mean = emlio__shard_mean_record(&set->shards[s]);
            last = s;
        }
        total += mean;
    }
    return EMLIO_MAX(total, 1);
}

/* The bytes a job may have in the fair queue and the pipeline: its
 * weight's share of the window among the jobs that want some. A job that
 * stops reading keeps its replies, and so its bytes, in its sockets'
 * queues; the cap keeps the others' share free of them. */
static uint64_t
s_cap(const emlio__srv_jobs_t *jobs, const emlio__trainjob_t *j)
{
    uint32_t total = EMLIO_MAX(jobs->demand_weight, j->flow.weight);
    uint64_t cap = jobs->window / (total ? total : 1) * j->flow.weight;
    return EMLIO_MAX(cap, 1);
}

/* Whether j wants the pipeline (held, queued or in flight). */
static bool
s_wants(const emlio__trainjob_t *j)
{
    return j->n_held || j->flow.n || atomic_load(&j->inflight);
}

static void
s_demand(emlio__srv_jobs_t *jobs, emlio__trainjob_t *j, bool before)
{
    bool now = s_wants(j);
    if (now && !before)
        jobs->demand_weight += j->flow.weight;
    else if (!now && before && jobs->demand_weight >= j->flow.weight)
        jobs->demand_weight -= j->flow.weight;
}

static emlio__job_t *
s_of_item(emlio__fairq_item_t *it)
{
    return (emlio__job_t *)((char *)it - offsetof(emlio__job_t, sched.fq));
}

static void
s_hold(emlio__srv_jobs_t *jobs, emlio__trainjob_t *j, emlio__job_t *job)
{
    job->sched.held_next = NULL;
    if (j->held_tail)
        j->held_tail->sched.held_next = job;
    else
        j->held_head = job;
    j->held_tail = job;
    if (j->n_held++ == 0)
        jobs->n_holding++;
}

static int
s_send(emlio_server_t *self, void *work, emlio__job_t *job)
{
    emlio__trainjob_t *j = job->sched.tjob;
    uint64_t cost = job->sched.fq.cost;
    job->sched.dispatched = true;
    atomic_fetch_add(&j->ledger->inflight_cost, cost);
    atomic_fetch_add(&j->inflight, 1);
    atomic_fetch_add(&j->inflight_cost, cost);
    if (emlio__srv_send_work(self, work, job) < 0) {
        job->sched.dispatched = false;
        atomic_fetch_sub(&j->ledger->inflight_cost, cost);
        atomic_fetch_sub(&j->inflight, 1);
        atomic_fetch_sub(&j->inflight_cost, cost);
        return -1;
    }
    return 0;
}

static void
s_drop_unsent(emlio_server_t *self, emlio__job_t *job)
{
    emlio__peer_t *peer =
        emlio__srv_peer_find(self, zmq_msg_data(&job->identity),
                             zmq_msg_size(&job->identity), false);
    if (peer && peer->outstanding)
        peer->outstanding--;
    emlio__srv_job_drop(self, job);
}

static emlio__job_t *
s_unhold(emlio__srv_jobs_t *jobs, emlio__trainjob_t *j)
{
    emlio__job_t *job = j->held_head;
    j->held_head = job->sched.held_next;
    if (!j->held_head)
        j->held_tail = NULL;
    if (--j->n_held == 0)
        jobs->n_holding--;
    return job;
}

/* Group pacing of jobs that share reads (docs/fairness.md, "Shared
 * reads"). The shared cache holds two segments of the shared schedule
 * (four windows). A job whose readers run S_PACE_LAG segments or more
 * ahead of another sharing job that is reading would evict the chunks
 * that job is still copying, and from then on both read alone. So its
 * GETs past that wait, up to S_PACE_MAX_NS each, while it keeps one in
 * flight: the job ahead slows to one GET at a time, the one behind has
 * the pipeline's share and catches up. A job further behind than
 * S_PACE_REACH segments has lost the cache already: waiting for it would
 * only make the group read at its pace (it reads alone, from the
 * device), so the others go on. A job counts as reading while a GET of
 * it was read in the last S_PACE_ACTIVE_NS. */
#define S_PACE_LAG       2
#define S_PACE_REACH     4
#define S_PACE_MAX_NS    (250 * 1000000ull)
#define S_PACE_ACTIVE_NS (500 * 1000000ull)
/* Each held sharing GET looks at every job: with more jobs than this known
 * (a thousand clients, each a job of its own) pacing is off, so that the
 * frontend's dispatch never costs jobs x jobs. */
#define S_PACE_MAX_JOBS  64

static bool
s_group_waits(const emlio__srv_jobs_t *jobs, emlio__trainjob_t *j,
              const emlio__job_t *job, uint64_t now)
{
    const emlio__msg_get_t *get = &job->msg.get;
    if (jobs->n > S_PACE_MAX_JOBS || !atomic_load(&j->inflight) ||
        (j->pace_since_ns && now - j->pace_since_ns >= S_PACE_MAX_NS))
        return false;
    for (size_t i = 0; i < jobs->n; i++) {
        emlio__trainjob_t *k = jobs->table[i];
        uint64_t at = atomic_load(&k->read_ns);
        if (k == j || !at || now - at >= S_PACE_ACTIVE_NS ||
            !atomic_load(&k->peers) || atomic_load(&k->read_segs) != get->segs)
            continue;
        uint64_t behind = atomic_load(&k->read_cursor);
        if (get->cursor >= behind + S_PACE_LAG &&
            get->cursor <= behind + S_PACE_REACH)
            return true;
    }
    return false;
}

/* Moves j's held GETs on: the first of a job with nothing queued or in
 * flight straight to the readers, the rest into the fair queue while the
 * job is under its cap and not ahead of its sharing group. */
static void
s_feed(emlio_server_t *self, void *work, emlio__trainjob_t *j)
{
    emlio__srv_jobs_t *jobs = &self->jobs;
    uint64_t cap = s_cap(jobs, j);
    uint64_t now = 0;
    while (j->held_head) {
        emlio__job_t *job = j->held_head;
        if (job->io.share && job->msg.get.segs) {
            now = now ? now : emlio__now_ns();
            if (s_group_waits(jobs, j, job, now)) {
                if (!j->pace_since_ns)
                    j->pace_since_ns = now;
                return;
            }
            if (j->pace_since_ns) {
                atomic_fetch_add(&j->paced_ns, now - j->pace_since_ns);
                j->pace_since_ns = 0;
            }
        }
        if (!j->flow.n && !atomic_load(&j->inflight)) {
            s_unhold(jobs, j);
            atomic_fetch_add(&j->wait_ns,
                             emlio__now_ns() - job->sched.queued_ns);
            if (s_send(self, work, job) < 0)
                s_drop_unsent(self, job); /* stopping */
            continue;
        }
        if (j->queued_cost + atomic_load(&j->inflight_cost) >= cap)
            return;
        if (emlio__fairq_push(&jobs->q, &j->flow, &job->sched.fq) < 0)
            return; /* the ring could not grow: it stays held */
        s_unhold(jobs, j);
        j->queued_cost += job->sched.fq.cost;
        atomic_fetch_add(&j->queued, 1);
    }
}

/* Sends the GETs their jobs' shares of the window allow, in turn. */
static void
s_dispatch(emlio_server_t *self, void *work)
{
    emlio__srv_jobs_t *jobs = &self->jobs;
    if (jobs->n_holding)
        for (size_t i = 0; i < jobs->n; i++)
            if (jobs->table[i]->n_held)
                s_feed(self, work, jobs->table[i]);
    /* What is in the fair queue was let in under its job's cap, so the
     * window's shares hold; the queue gives the readers the jobs' GETs
     * interleaved by weight. */
    emlio__fairq_item_t *it;
    while ((it = emlio__fairq_peek(&jobs->q))) {
        emlio__fairq_pop(&jobs->q);
        emlio__job_t *job = s_of_item(it);
        job->sched.tjob->queued_cost -= job->sched.fq.cost;
        atomic_fetch_sub(&job->sched.tjob->queued, 1);
        atomic_fetch_add(&job->sched.tjob->wait_ns,
                         emlio__now_ns() - job->sched.queued_ns);
        if (s_send(self, work, job) < 0)
            s_drop_unsent(self, job); /* stopping */
    }
    /* GETs wait: a reply that leaves wakes us (emlio__srv_jobs_reply_left). */
    atomic_store(&jobs->ledger->starved,
                 jobs->q.n_items > 0 || jobs->n_holding > 0);
}

/* How long a cursor stays worth joining without a GET naming it: a job
 * that stopped reading that long ago has left the cache behind it. */
#define S_CURSOR_FRESH_NS (2 * 1000000000ull)

/* Whether the job that named the cursor is still in the table with a
 * stream attached: one that has left is not there to share with. */
static bool
s_cursor_owner_live(const emlio__srv_jobs_t *jobs)
{
    for (size_t i = 0; i < jobs->n; i++)
        if (jobs->table[i] == jobs->share_by)
            return atomic_load(&jobs->table[i]->peers) > 0;
    return false;
}

/* A sharing GET was read at the cursor it named (under jobs->lock). The
 * furthest cursor of the current segments is kept; a stale one (or one of
 * other segments: another window size, or one whose job has left) is
 * replaced: a job that just finished must not hold the cursor for 2 s at
 * a place no reader is, where a job arriving then would read alone. The
 * cursor is the client's word: a wrong one costs only the joiners'
 * sharing, never their samples (any cursor is a whole epoch of the plan). */
static void
s_note_cursor(emlio__srv_jobs_t *jobs, const emlio__trainjob_t *by,
              uint64_t segs, uint64_t cursor)
{
    uint64_t now = emlio__now_ns();
    bool fresh = jobs->share_at_ns &&
                 now - jobs->share_at_ns < S_CURSOR_FRESH_NS &&
                 (jobs->share_by == by || s_cursor_owner_live(jobs));
    if (fresh && segs == jobs->share_segs && cursor < jobs->share_cursor)
        return;
    if (fresh && segs != jobs->share_segs)
        return;
    jobs->share_segs = segs;
    jobs->share_cursor = cursor;
    jobs->share_at_ns = now;
    jobs->share_by = by;
}

void
emlio__srv_jobs_note_cursor(emlio__srv_jobs_t *jobs, emlio__trainjob_t *by,
                            uint64_t segs, uint64_t cursor)
{
    /* The job's own place, for the pacing (s_group_waits). Two readers may
     * race here; the loser's cursor is at most a GET behind. */
    if (atomic_load(&by->read_segs) != segs ||
        cursor > atomic_load(&by->read_cursor)) {
        atomic_store(&by->read_cursor, cursor);
        atomic_store(&by->read_segs, segs);
    }
    atomic_store(&by->read_ns, emlio__now_ns());
    pthread_mutex_lock(&jobs->lock);
    s_note_cursor(jobs, by, segs, cursor);
    pthread_mutex_unlock(&jobs->lock);
}

/* Whether another job than me named the cursor and is still here. */
static bool
s_cursor_owner_here(const emlio__srv_jobs_t *jobs, const emlio__trainjob_t *me)
{
    return jobs->share_by != me && s_cursor_owner_live(jobs);
}

bool
emlio__srv_jobs_join(emlio_server_t *self, emlio__peer_t *peer, uint64_t *segs,
                     uint64_t *cursor)
{
    emlio__trainjob_t *j = peer->tjob;
    emlio__srv_jobs_t *jobs = &self->jobs;
    if (!j)
        return false;
    if (!j->join_said) {
        uint64_t now = emlio__now_ns();
        j->join_said = true;
        pthread_mutex_lock(&jobs->lock);
        j->join_has = jobs->share_at_ns &&
                      now - jobs->share_at_ns < S_CURSOR_FRESH_NS &&
                      s_cursor_owner_here(jobs, j);
        j->join_segs = jobs->share_segs;
        j->join_cursor = jobs->share_cursor;
        pthread_mutex_unlock(&jobs->lock);
        if (j->join_has)
            emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                      "job %s joins the shared schedule at cursor %" PRIu64
                      " (lap %" PRIu64 ", segment %" PRIu64 " of %" PRIu64
                      "), where the jobs sharing reads are",
                      j->name, j->join_cursor, j->join_cursor / j->join_segs,
                      j->join_cursor % j->join_segs, j->join_segs);
    }
    *segs = j->join_segs;
    *cursor = j->join_cursor;
    return j->join_has;
}

int
emlio__srv_jobs_submit(emlio_server_t *self, void *work, emlio__job_t *job,
                       emlio__peer_t *peer)
{
    char text[EMLIO_ERRMSG_LEN];
    if (!peer->tjob &&
        emlio__srv_jobs_attach(self, peer, NULL, 0, 0, text, sizeof(text)) < 0)
        return emlio__srv_send_work(self, work, job); /* served, unscheduled */
    emlio__trainjob_t *j = peer->tjob;
    job->sched.tjob = j;
    job->io.share = self->core->share && (peer->share || self->cfg.share_all) &&
                    !atomic_load(&j->share_refused);
    atomic_fetch_add(&j->live, 1);
    atomic_fetch_add(&j->requests, 1);
    atomic_fetch_add(&j->samples, job->msg.get.n_items);
    job->sched.fq.cost = s_cost(self, job);
    if (self->jobs.mode == EMLIO__SCHED_FIFO)
        return s_send(self, work, job);
    job->sched.queued_ns = emlio__now_ns();
    bool before = s_wants(j);
    s_hold(&self->jobs, j, job);
    s_demand(&self->jobs, j, before);
    s_dispatch(self, work);
    return 0;
}

void
emlio__srv_jobs_reply_left(emlio__trainjob_t *tjob, uint64_t cost)
{
    if (!tjob)
        return;
    emlio__jobs_ledger_t *ledger = tjob->ledger;
    atomic_fetch_sub(&ledger->inflight_cost, cost);
    atomic_fetch_sub(&tjob->inflight_cost, cost);
    atomic_fetch_sub(&tjob->inflight, 1);
    if (atomic_exchange(&ledger->starved, false) && ledger->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t rc = write(ledger->wake_fd, &one, sizeof(one));
        (void)rc; /* a full counter wakes the frontend anyway */
    }
}

void
emlio__srv_jobs_kick(emlio_server_t *self, void *work)
{
    emlio__srv_jobs_t *jobs = &self->jobs;
    uint64_t n;
    if (jobs->ledger->wake_fd >= 0) {
        ssize_t rc = read(jobs->ledger->wake_fd, &n, sizeof(n));
        (void)rc; /* EAGAIN: nothing to drain */
    }
    /* Jobs that stopped wanting the pipeline give their weight back. */
    uint32_t demand = 0;
    for (size_t i = 0; i < jobs->n; i++)
        if (s_wants(jobs->table[i]))
            demand += jobs->table[i]->flow.weight;
    jobs->demand_weight = demand;
    s_dispatch(self, work);
}

int
emlio__srv_jobs_tag(emlio__job_t *job)
{
    size_t len = zmq_msg_size(&job->identity);
    zmq_msg_t tagged;
    if (zmq_msg_init_size(&tagged, S_TAG + len) != 0)
        return -1;
    uint8_t *p = zmq_msg_data(&tagged);
    /* Only a dispatched GET holds a slot to give back. */
    emlio__trainjob_t *holder = job->sched.dispatched ? job->sched.tjob : NULL;
    uint64_t cost = holder ? job->sched.fq.cost : 0;
    memcpy(p, &holder, sizeof(holder));
    memcpy(p + sizeof(job->sched.tjob), &cost, sizeof(cost));
    memcpy(p + S_TAG, zmq_msg_data(&job->identity), len);
    zmq_msg_close(&job->identity);
    zmq_msg_init(&job->identity);
    zmq_msg_move(&job->identity, &tagged);
    /* From here the reply carries the slot: the frontend gives it back.
     * No reference: until then the slot itself keeps the job known (a
     * job is forgotten only with nothing in flight); the frame that will
     * outlive the frontend takes one (server_request.c). */
    job->sched.dispatched = false;
    return 0;
}

int
emlio__srv_jobs_untag(zmq_msg_t *identity, emlio__trainjob_t **tjob,
                      uint64_t *cost)
{
    size_t len = zmq_msg_size(identity);
    if (len < S_TAG)
        return -1;
    const uint8_t *p = zmq_msg_data(identity);
    memcpy(tjob, p, sizeof(*tjob));
    memcpy(cost, p + sizeof(*tjob), sizeof(*cost));
    zmq_msg_t plain;
    if (zmq_msg_init_size(&plain, len - S_TAG) != 0)
        return -1;
    memcpy(zmq_msg_data(&plain), p + S_TAG, len - S_TAG);
    zmq_msg_close(identity);
    zmq_msg_init(identity);
    zmq_msg_move(identity, &plain);
    return 0;
}

void
emlio__srv_jobs_get_freed(emlio__job_t *job)
{
    emlio__trainjob_t *j = job->sched.tjob;
    if (!j)
        return;
    if (job->io.bytes)
        atomic_fetch_add(&j->disk_bytes, job->io.bytes);
    if (job->io.shared_bytes)
        atomic_fetch_add(&j->shared_bytes, job->io.shared_bytes);
    atomic_fetch_sub(&j->live, 1);
    job->sched.tjob = NULL;
}

/* Forgets the jobs with no stream, no GET and nothing in flight. */
static void
s_forget(emlio_server_t *self)
{
    emlio__srv_jobs_t *jobs = &self->jobs;
    for (size_t i = 0; i < jobs->n;) {
        emlio__trainjob_t *j = jobs->table[i];
        if (j->peers || s_wants(j) || atomic_load(&j->live)) {
            i++;
            continue;
        }
        if (j->named) {
            double s = (double)(emlio__now_ns() - j->since_ns) / 1e9;
            uint64_t b = atomic_load(&j->bytes);
            emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                      "job %s left after %.1f s: %.1f MB sent, %.1f MB/s, "
                      "%.1f MB read from the device, %.1f MB from "
                      "others' shared reads, %.2f s queued, %.2f s paced "
                      "to its sharing group",
                      j->name, s, (double)b / 1e6,
                      s > 0 ? (double)b / 1e6 / s : 0.0,
                      (double)atomic_load(&j->disk_bytes) / 1e6,
                      (double)atomic_load(&j->shared_bytes) / 1e6,
                      (double)atomic_load(&j->wait_ns) / 1e9,
                      (double)atomic_load(&j->paced_ns) / 1e9);
        }
        pthread_mutex_lock(&jobs->lock);
        jobs->table[i] = jobs->table[--jobs->n];
        pthread_mutex_unlock(&jobs->lock);
        emlio__srv_jobs_unref(j);
    }
}

void
emlio__srv_jobs_tick(emlio_server_t *self, void *work)
{
    emlio__srv_jobs_kick(self, work);
    s_forget(self);
}

void
emlio__srv_jobs_drop_queued(emlio_server_t *self)
{
    emlio__fairq_item_t *it;
    while ((it = emlio__fairq_peek(&self->jobs.q))) {
        emlio__fairq_pop(&self->jobs.q);
        emlio__job_t *job = s_of_item(it);
        job->sched.tjob->queued_cost -= job->sched.fq.cost;
        atomic_fetch_sub(&job->sched.tjob->queued, 1);
        emlio__srv_job_drop(self, job);
    }
    for (size_t i = 0; i < self->jobs.n; i++) {
        emlio__trainjob_t *j = self->jobs.table[i];
        while (j->held_head) {
            emlio__job_t *job = j->held_head;
            j->held_head = job->sched.held_next;
            emlio__srv_job_drop(self, job);
        }
        j->held_tail = NULL;
        j->n_held = 0;
    }
    self->jobs.n_holding = 0;
}

size_t
emlio_server_jobs(emlio_server_t *self, emlio_server_job_t *out, size_t cap)
{
    emlio__srv_jobs_t *jobs = &self->jobs;
    pthread_mutex_lock(&jobs->lock);
    size_t n = jobs->n;
    for (size_t i = 0; i < n && i < cap; i++) {
        const emlio__trainjob_t *j = jobs->table[i];
        emlio_server_job_t *o = &out[i];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", j->name);
        o->named = j->named;
        o->weight = atomic_load(&j->weight);
        o->streams = atomic_load(&j->peers);
        o->queued = atomic_load(&j->queued);
        o->requests = atomic_load(&j->requests);
        o->samples = atomic_load(&j->samples);
        o->bytes = atomic_load(&j->bytes);
        o->disk_bytes = atomic_load(&j->disk_bytes);
        o->shared_bytes = atomic_load(&j->shared_bytes);
        o->wait_ns = atomic_load(&j->wait_ns);
        o->since_ns = j->since_ns;
    }
    pthread_mutex_unlock(&jobs->lock);
    return n;
}
