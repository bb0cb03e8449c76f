/* server_jobs.h - training jobs as the daemon knows them, and the fair
 * scheduler that shares its readers among them.
 * SPDX-License-Identifier: MIT
 *
 * A job is what a HELLO names ("job", docs/protocol.md 4.1): every rank
 * and stream of one training job say the same name, and count as one.
 * A client that names none is a job of its own (its session, or its
 * connection for a client without a session). The job table and the fair
 * queue are the frontend thread's; the counters a job's GETs add to on
 * the pipeline threads are atomic, and the table is read under its lock by
 * emlio_server_jobs (the metrics).
 *
 * Scheduling (docs/fairness.md): under --schedule fair (the default) an
 * admitted GET is queued on its job's flow of a weighted deficit round
 * robin (fairq.h), costed by the bytes it asks for (the records it reads
 * or decodes, and a transform's output), and dispatched to the readers
 * while the pipeline holds less than a window of bytes. So the
 * readers', transforms' and serializers' time goes to jobs by weight,
 * whatever the number of streams or ranks each opens; a job whose GETs
 * stop coming leaves the ring at once and its share goes to the others;
 * a job holds at most its weight's share of the window in the pipeline
 * (its first GET always goes at once: a job with nothing in flight never
 * waits behind another's large GETs). --schedule fifo dispatches in arrival
 * order, as before (for comparison: bench/fairness.sh).
 */
#ifndef EMLIO_SERVER_JOBS_H
#define EMLIO_SERVER_JOBS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <zmq.h>

#include "fairq.h"

struct emlio_server;
struct emlio__job;
struct emlio__peer;

/* Bytes of a job name the daemon accepts (the wire allows more). */
#define EMLIO__SRV_JOB_NAME_MAX 64

/* What the frames of replies in flight count against: it outlives the
 * server while any frame holds a job that holds it (ZeroMQ frees a
 * frame when it has written it, maybe after emlio_server_destroy). */
typedef struct emlio__jobs_ledger {
    atomic_uint refs;
    atomic_uint_fast64_t inflight_cost; /* bytes of all jobs' GETs not yet
                                           left */
    atomic_bool starved;                /* GETs wait for a slot */
    int wake_fd;                        /* eventfd the frontend polls */
} emlio__jobs_ledger_t;

typedef struct emlio__trainjob {
    atomic_uint refs; /* the table's, and each reply frame's in flight */
    emlio__jobs_ledger_t *ledger;
    char name[EMLIO__SRV_JOB_NAME_MAX + 1];
    bool named;         /* said in HELLO; else one client's own */
    uint64_t anon_key;  /* an unnamed job's session (or peer serial) */
    atomic_uint weight; /* in force: asked, capped by the policy */
    atomic_uint peers;  /* streams attached (written by the frontend) */
    atomic_uint queued; /* GETs in its flow (flow.n, for the stats) */
    uint64_t since_ns;
    emlio__fairq_flow_t flow;
    /* Its GETs beyond what it may have in the fair queue and the
     * pipeline (its cap): in arrival order, fed to the queue as its
     * replies leave (frontend only). */
    struct emlio__job *held_head, *held_tail;
    size_t n_held;
    /* GETs dispatched whose reply has not left the daemon (written to its
     * socket, lost, or dropped), and their cost; decremented on any
     * thread. queued_cost: the cost of its GETs in the fair queue. */
    atomic_uint_fast64_t inflight;
    atomic_uint_fast64_t inflight_cost;
    uint64_t queued_cost;
    /* GETs submitted and not yet freed: the job lives while any does. */
    atomic_uint_fast64_t live;
    atomic_uint_fast64_t requests;
    atomic_uint_fast64_t samples;
    atomic_uint_fast64_t bytes;        /* reply bytes forwarded */
    atomic_uint_fast64_t disk_bytes;   /* read from the file system for it */
    atomic_uint_fast64_t shared_bytes; /* of bytes, copied from reads that
                                          other jobs made (sharecache.h) */
    /* Its sharing GETs: bytes of chunks they read into the shared cache,
     * and record bytes they got out of it. A job that reads far more than
     * it uses is not reading the shared schedule's windows (random GETs
     * would make the device read a 4 MiB chunk per record): it is served
     * with exact reads instead (share_refused, logged once). */
    atomic_uint_fast64_t share_loaded;
    atomic_uint_fast64_t share_used;
    atomic_bool share_refused;
    /* The furthest cursor of the shared schedule its readers read a GET
     * of this job at lately (segments read_segs, at read_ns; 0: none):
     * where it is, for the group pacing of the jobs ahead of it. */
    atomic_uint_fast64_t read_segs, read_cursor, read_ns;
    atomic_uint_fast64_t paced_ns; /* its GETs' time held back to the group */
    uint64_t pace_since_ns;        /* its first held GET waits for the group
                                      since (0: not; frontend only) */
    atomic_uint_fast64_t wait_ns;  /* its GETs' time in the fair queue */
    /* Where its first WELCOME told it to join the shared schedule
     * (emlio__srv_jobs_join): every later rank of the job is told the
     * same, so that its ranks plan one order (frontend only). */
    bool join_said;
    bool join_has; /* a cursor was given (else: from the start) */
    uint64_t join_segs, join_cursor;
} emlio__trainjob_t;

typedef enum {
    EMLIO__SCHED_FAIR = 0,
    EMLIO__SCHED_FIFO = 1,
} emlio__sched_mode_t;

/* One policy line of --job-weight: NAME=W, or *=W for every other job. */
typedef struct emlio__job_policy {
    char name[EMLIO__SRV_JOB_NAME_MAX + 1];
    uint32_t weight;
} emlio__job_policy_t;

typedef struct emlio__srv_jobs {
    pthread_mutex_t lock; /* the table's shape, for readers of stats */
    emlio__trainjob_t **table;
    size_t n, cap, max;
    uint64_t anon_serial;
    emlio__job_policy_t *policy;
    size_t n_policy;
    uint32_t default_weight;
    emlio__sched_mode_t mode;
    emlio__fairq_t q;
    /* The pipeline's window: GETs (and their estimated bytes) dispatched
     * to the readers whose replies have not reached the frontend. */
    uint64_t window;        /* bytes (GET costs) in the pipeline at once */
    size_t n_holding;       /* jobs with held GETs */
    uint32_t demand_weight; /* sum of weights of jobs with GETs */
    emlio__jobs_ledger_t *ledger;
    /* The furthest cursor of the shared schedule at which the readers
     * read a sharing job's GET lately, for the segments it named
     * (docs/planner.md, "Joining"): where the shared reads are, not how
     * far ahead the clients ask. at_ns 0: none yet. Under lock (the
     * readers write it). */
    uint64_t share_segs, share_cursor, share_at_ns;
    const emlio__trainjob_t *share_by; /* the job that named it (compared,
                                          never followed: it may be gone) */
} emlio__srv_jobs_t;

/* Parses --job-weight "NAME=W[,NAME=W...]" (W 1..1000; "*" sets the
 * default, else 1) into jobs. 0, or EMLIO_EINVAL with err set. */
int emlio__srv_jobs_init(emlio__srv_jobs_t *jobs, const char *policy, int mode,
                         uint32_t max_jobs, char *err);
void emlio__srv_jobs_release(emlio__srv_jobs_t *jobs);

/* Sizes the pipeline's window (bytes) from the read-ahead. */
void emlio__srv_jobs_size_window(emlio__srv_jobs_t *jobs,
                                 uint64_t read_ahead_bytes);

/* Attaches peer to the job its HELLO names (name NULL: its own), with
 * the weight asked (0: the policy's). 0, or an error code with text set
 * (a bad name, too many jobs); the peer is then left unattached. */
int emlio__srv_jobs_attach(struct emlio_server *self, struct emlio__peer *peer,
                           const char *name, size_t name_len, uint64_t asked,
                           char *text, size_t len);

/* The peer is going: its job loses a stream. */
void emlio__srv_jobs_detach(struct emlio_server *self,
                            struct emlio__peer *peer);

/* Queues an admitted GET of peer for dispatch (or sends it now under
 * fifo), and dispatches what the window allows. -1 when the readers are
 * gone (stopping): the caller drops the GET. */
int emlio__srv_jobs_submit(struct emlio_server *self, void *work,
                           struct emlio__job *job, struct emlio__peer *peer);

/* The frontend forwards a reply of tjob (the tag the serializer put on
 * it, NULL for an unscheduled GET): its slot is given back when the
 * reply's last frame leaves the daemon, by emlio__srv_jobs_reply_left
 * on the thread that frees the frame, or at once when it is lost. */
void emlio__srv_jobs_reply_left(struct emlio__trainjob *tjob, uint64_t cost);

/* References to a job, for the frames of its replies. */
void emlio__srv_jobs_unref(struct emlio__trainjob *tjob);

/* The descriptor the frontend polls for "a slot is free" (-1: none). */
int emlio__srv_jobs_wake_fd(const emlio__srv_jobs_t *jobs);

/* The frontend was woken (wake_fd) or has a moment: GETs whose jobs have
 * room now go on. Drains wake_fd. */
void emlio__srv_jobs_kick(struct emlio_server *self, void *work);

/* The serializer tags a job's reply with its training job: the reply's
 * identity frame gains the tjob pointer in front (the done socket is
 * in-process). emlio__srv_jobs_untag reverses it on the frontend, giving
 * the identity back and the tag (the job whose slot the reply holds, and
 * its cost). 0; -1 when the identity could not be restored (out of
 * memory: the reply is lost), *tjob and *cost still set when the tag
 * was read. */
int emlio__srv_jobs_tag(struct emlio__job *job);
int emlio__srv_jobs_untag(zmq_msg_t *identity, struct emlio__trainjob **tjob,
                          uint64_t *cost);

/* Called when a GET is freed, on any thread: its job's counters. */
void emlio__srv_jobs_get_freed(struct emlio__job *job);

/* Once a second on the frontend: slots of GETs dropped without a reply
 * are given back, and jobs with no stream, no queued and no live GET are
 * forgotten (logged with what they received). */
void emlio__srv_jobs_tick(struct emlio_server *self, void *work);

/* A reader read a sharing GET of job `by` at (segs, cursor): any thread. */
void emlio__srv_jobs_note_cursor(emlio__srv_jobs_t *jobs,
                                 struct emlio__trainjob *by, uint64_t segs,
                                 uint64_t cursor);

/* Where a job that shares reads should begin in the shared schedule, for
 * the WELCOME of peer's stream 0 (after its HELLO attached it): the
 * cursor that sharing jobs' GETs were read at in the last 2 s, if the job
 * whose GET it was is still connected, pinned for the
 * job at its first WELCOME, so that all its ranks hear the same. True
 * with *segs and *cursor set; false: none to join (start at 0). */
bool emlio__srv_jobs_join(struct emlio_server *self, struct emlio__peer *peer,
                          uint64_t *segs, uint64_t *cursor);

/* Drops every queued GET (the frontend stops). */
void emlio__srv_jobs_drop_queued(struct emlio_server *self);

#endif /* EMLIO_SERVER_JOBS_H */
