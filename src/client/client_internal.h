/* client_internal.h - the rooms of emlio_client_t and what they call of
 * each other; private to src/client*.c.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_CLIENT_INTERNAL_H
#define EMLIO_CLIENT_INTERNAL_H

#include "base.h"

#include <zmq.h>

#include "client_xf.h"
#include "net.h"

/* The client lives in five files, one per room, each owning one part of
 * struct emlio_client:
 *   client.c         public API and lifecycle: new, connect, begin_epoch,
 *                    next (the wait loop), destroy, accessors, stats
 *   client_conn.c    connections and streams (conn): DEALER sockets,
 *                    their monitors, HELLO/WELCOME; client_inventory.c
 *                    the merged inventory (inv): shards by content,
 *                    classes as one list;
 *                    client_tune.c its measurements: TCP_INFO, receive
 *                    buffers by RTT, the stream tuner's feed
 *                    (emlio__client_tune)
 *   client_epoch.c   the epoch (current, ahead): plans, generations,
 *                    taking over the epoch requested ahead, abandoning
 *   client_window.c  the window (win): batches in flight, receiving and
 *                    filing replies, reorder and hand-over
 *   client_state.c   resume state: save and load the delivered bitmap
 *   client_xf.c      the transform stage (decode_at, placement, the decode
 *                    pool); client_tensor.c files tensor replies and makes
 *                    batches of tensors ready
 * A room touches another's fields only through the functions below,
 * except for reading the current epoch's number and generation. */

#define EMLIO__CLIENT_MAX_DAEMONS 255 /* part numbers are 8 bits of an id */
#define EMLIO__CLIENT_MAX_STREAMS EMLIO_WIRE_MAX_STREAMS
/* The rate the first epoch is sized for, from the first RTT sample (stream
 * 0's TCP handshake, over TCP_INFO), before anything was measured: the
 * streams to start with (client_conn.c) and the requests in flight
 * (client_window.c). About what this 2-core VM's loopback carries: at
 * 100 ms with 32 MiB windows that is 8 streams, whose slow starts run side
 * by side (2, at 500 MB/s, left the first epoch waiting for the tuner's
 * next step); at 30 ms with 8 MiB windows 9, where 1 GB/s gave 5, and on
 * busy CPUs the tuner adds streams only while they run full, so 30 ms
 * stayed at 5 in some runs, 3-10% below 10. The tuner and the window grow
 * from there while the consumer waits. */
#define EMLIO__CLIENT_START_RATE  2e9 /* bytes/s: 16 Gb/s */
/* Request ids: generation (24 bits) | batch index (32) | part (8). The
 * generation changes with every epoch so late replies to an abandoned epoch
 * are recognized and dropped. */
#define EMLIO__ID(gen, batch, part) \
    (((uint64_t)(gen) << 40) | ((uint64_t)(batch) << 8) | (uint64_t)(part))
#define EMLIO__ID_GEN(id)   ((id) >> 40)
#define EMLIO__ID_BATCH(id) (((id) >> 8) & 0xffffffffu)
#define EMLIO__ID_PART(id)  ((id)&0xffu)

/* ---- connections and streams (client_conn.c) --------------------------- */

/* One stream to a daemon: a DEALER socket and what the client knows of
 * its connection. */
typedef struct emlio__cstream {
    void *sock;             /* the DEALER */
    void *mon;              /* PAIR receiving its connection events */
    uint32_t outstanding;   /* GETs in flight: the daemon grants max_credit per
                               connection */
    bool down;              /* lost its connection; reconnecting */
    bool ready;             /* may carry GETs: joined the session */
    int fd;                 /* its TCP socket (TCP_INFO), or -1 */
    uint8_t lane;           /* its I/O thread (iolanes.h) */
    uint64_t rx_bytes;      /* sample bytes received */
    uint64_t rx_bytes_tick; /* rx_bytes at the last tuner tick */
    double rx_rate;         /* bytes/s over the last tuner tick */
} emlio__cstream_t;

typedef struct emlio__cdaemon {
    char *endpoint;
    uint32_t n_streams; /* streams opened */
    emlio__cstream_t streams[EMLIO__CLIENT_MAX_STREAMS];
    uint32_t max_streams;       /* the daemon's session limit; 0 = a daemon
                                   without sessions (each stream a client) */
    uint64_t sndbuf;            /* its send buffer per connection; 0 =
                                   not said */
    uint64_t failed_handshakes; /* transient handshake failures seen */
    uint64_t opened_ns; /* when streams were last opened to it: a batch's
                           parts wait a round trip for them to join
                           (client_budget.c) */
    char dataset[64];
    int disk;            /* the last BATCH's "disk" share (percent) */
    uint64_t disk_at_ns; /* when it came */
    uint32_t *local_id;  /* global shard -> this daemon's shard id, or
                            UINT32_MAX when it does not hold the shard */
    /* This daemon's label i is the job's label_map[i] (its ImageFolder
     * classes are part of a union: client_inventory.c); NULL: as sent. */
    int64_t *label_map;
    size_t n_label_map;
    uint64_t max_batch;
    uint64_t max_credit;
    uint64_t max_copy;     /* WELCOME's max_copy_bytes: what one GET may make
                              the daemon copy (0: not said) */
    uint64_t share_window; /* WELCOME's share_window (0: not said) */
    bool share_all;        /* WELCOME's "share": it shares every job's
                              reads (emliod --share-all) */
    uint64_t share_segs;   /* WELCOME's "share_segs" (0: not said) and */
    uint64_t share_cursor; /* "share_cursor": where its sharing jobs are */
    uint32_t source;       /* the source it serves (0 without sources) */
} emlio__cdaemon_t;

/* The daemons, their streams, and what the path and the tuner see. */
typedef struct emlio__conn {
    emlio__cdaemon_t *daemons;
    uint32_t n_daemons;
    uint64_t session;     /* random: lets the daemons count our streams once */
    zmq_pollitem_t *poll; /* n_poll streams, then n_poll monitors */
    size_t n_poll;
    uint32_t *poll_daemon; /* poll item i -> daemon, stream */
    uint32_t *poll_stream;
    emlio__netpath_limits_t limits;  /* this host's TCP buffer limits */
    emlio__netpath_bufplan_t rcvbuf; /* how each stream's receive buffer is
                                       sized */
    bool rcvbuf_by_rtt;              /* rcvbuf planned from the first RTT */
    emlio__tuner_t tuner;
    emlio__iolanes_t lanes; /* which I/O threads the streams use */
    uint64_t window_bytes;  /* per-stream TCP window the path allows */
    uint64_t rtt_ns;        /* RTT floor over our streams (TCP_INFO) */
    uint64_t srtt_ns;       /* smoothed RTT now */
    uint64_t total_bytes;   /* sample bytes received, all epochs */
    uint64_t cpu_idle;      /* host CPU jiffies at the last tuner tick */
    uint64_t cpu_total;
    bool advised; /* the window advice was logged */
} emlio__conn_t;

typedef struct emlio__cshard {
    char *name;
    uint64_t records;
    uint64_t bytes;
    uint32_t *holders;
    uint32_t n_holders;
    uint32_t source; /* its daemons' source (0 without sources) */
} emlio__cshard_t;

/* The merged inventory the daemons' WELCOMEs gave. */
typedef struct emlio__inventory {
    emlio__cshard_t *shards;
    size_t n_shards;
    char **fields;    /* the daemons' field names; NULL = one
                         unnamed field */
    size_t n_fields;  /* frames per sample, >= 1 */
    char dataset[17]; /* fingerprint over all daemons' datasets */
    char **classes;   /* label i's name, from WELCOME; NULL = not known */
    size_t n_classes;
    char format[16]; /* the first daemon's dataset format; "" = not said */
    uint32_t window; /* shards per window the plans use: cfg.window_shards,
                        or when sharing the shared schedule's */
    bool share;      /* plans follow the shared schedule: cfg.share, or a
                        daemon shares every job's reads */
    uint64_t segs;   /* the shared schedule's segments (plans say it) */
    uint64_t join;   /* the cursor epoch 0 starts at (docs/planner.md,
                        "Joining"): the daemons' or the resume state's */
} emlio__inventory_t;

/* ---- the epoch (client_epoch.c) ----------------------------------------- */

/* One epoch as the client runs it: its plan and how far its requests got.
 * The client holds two values of this type: `current`, the epoch next()
 * hands over, and `ahead`, the next epoch, planned and requested while
 * current's last batches are still arriving (so the pipe never drains
 * between epochs; its batches wait in the window until begin_epoch takes
 * it). Taking the epoch ahead swaps the two (plans included). */
typedef struct emlio__epoch {
    emlio_plan_t *plan;  /* owned; rebuilt for each epoch */
    bool live;           /* current: an epoch is in progress; ahead: one is
                            planned and being requested */
    uint64_t number;     /* the epoch */
    uint32_t gen;        /* its request generation (in the request ids) */
    size_t n_batches;    /* in its plan */
    size_t next_to_send; /* next plan batch to request */
} emlio__epoch_t;

/* What earlier runs of the job consumed of the epoch a resume state put
 * it in (docs/planner.md, "Elastic resume"): that epoch's plans cover
 * only the rest. Other epochs are planned whole. */
/* A blend of the sources: the weights (and counts) and the epoch size a
 * run of the job planned with; self->n_src entries. */
typedef struct emlio__blend_desc {
    emlio_plan_source_t *src;
    uint64_t epoch_samples;
} emlio__blend_desc_t;

/* An earlier blend of the epoch, when the weights changed in it: what the
 * runs under it consumed of its positions (docs/planner.md, "Weights
 * changed mid-epoch"). */
typedef struct emlio__layer {
    emlio__blend_desc_t blend;
    emlio_plan_span_t *spans; /* sorted, disjoint */
    size_t n;
} emlio__layer_t;

typedef struct emlio__resume {
    bool live;
    uint64_t epoch;
    emlio_plan_span_t *spans; /* sorted, disjoint */
    size_t n;
    emlio__layer_t *layers; /* oldest first */
    size_t n_layers;
    /* While the states of a run with other weights are merged: their
     * blend, which the rest they left is planned with; else NULL. */
    const emlio__blend_desc_t *blend;
} emlio__resume_t;

/* Frees what r holds and empties it. */
void emlio__resume_clear(emlio__resume_t *r);

/* ---- the window (client_window.c) --------------------------------------- */

/* Samples of one batch that one daemon serves in one GET (a part). */
typedef struct emlio__part {
    uint32_t daemon;
    uint32_t n;
    uint32_t *positions; /* indices into the batch's samples */
    bool done;
    uint32_t sock; /* the stream the GET went out on */
    uint64_t sent_ns;
} emlio__part_t;

/* A batch goes through three states: in flight (parts outstanding),
 * complete (parts_done == n_parts: every sample received and checked) and
 * ready (handed to the caller when next() gets to it). The one transition
 * complete -> ready is emlio__batch_ready (client_window.c). */
struct emlio_batch {
    emlio_client_t *owner;
    uint64_t epoch;
    uint64_t index;
    uint32_t gen; /* request generation: its epoch's, in the request ids */
    emlio_sample_t *samples;
    size_t n; /* samples planned */
    size_t cap;
    zmq_msg_t *frames;
    size_t n_frames;
    const uint8_t **fdata; /* [position * n_fields + field] */
    size_t *flen;
    emlio__part_t *parts;
    uint32_t n_parts;
    uint32_t cap_parts;
    uint32_t parts_done;
    bool ready; /* may be handed over (see emlio__batch_ready) */
    /* Transforms (client_tensor.c). */
    bool xf_server;        /* the daemons were asked for tensors */
    bool xf_pending;       /* in the client's decode pool */
    bool xf_disowned;      /* dropped while in the pool: freed on return */
    uint8_t *xf_block;     /* a pooled tensor block this batch holds */
    const uint8_t *images; /* n x H x W x 3 handed over; NULL = none */
    uint32_t *positions;   /* storage for the parts' positions */
    /* What each position's record is, as its daemon described it (BATCH
     * "where", asked for when decoding here): cap strings of
     * EMLIO__WHERE_ROOM bytes, "" when not said; NULL until a reply
     * carried one. Only for messages. */
    char *where;
    uint64_t bytes;
    uint64_t disk_read;       /* what the daemons read for it (BATCH "rd") */
    uint64_t shared;          /* of it, copied from others' reads ("sh") */
    uint64_t cursor;          /* the shared schedule's, at its first sample
                                 (its GETs say it; 0 when not sharing) */
    struct emlio_batch *next; /* ready queue or free list */
};

#define EMLIO__WHERE_ROOM (EMLIO_WIRE_MAX_WHERE + 1)

/* Batch b's description of the record at position pos, or NULL when its
 * daemon gave none. */
const char *emlio__batch_where(const emlio_batch_t *b, size_t pos);

/* Batches requested and not yet handed over, and how many may be. */
typedef struct emlio__window {
    emlio_batch_t **slots; /* batches requested and not yet handed over */
    size_t n_slots;
    size_t cap_slots;
    emlio_batch_t *ready_head; /* ready, out-of-order delivery queue */
    emlio_batch_t *ready_tail;
    emlio_batch_t *free_list;
    uint32_t limit;          /* batches in flight allowed now */
    uint32_t max;            /* the most `limit` may grow to */
    uint64_t min_latency_ns; /* fastest request seen: RTT + service time */
    uint64_t adapt_ns;       /* when the window was last resized */
    uint64_t adapt_batches;  /* batches delivered at that time */
    uint64_t batch_bytes;    /* mean bytes of one batch in this dataset */
    /* A daemon's share of a batch goes out as GETs of at most part_samples
     * samples (about cfg.request_bytes each): at most parts_max GETs of
     * one batch to one daemon, each taking one of its credits. */
    uint32_t part_samples;
    uint32_t parts_max;
    uint32_t get_max; /* the most samples every daemon takes in one GET
                         (WELCOME max_batch): parts never exceed it */
    double grow_rate; /* batches/s when a starving consumer last grew
                         the window; 0 = not since the last rebound */
    bool grown_out;   /* that growth did not pay off: stop growing */
    size_t outstanding_parts;
    size_t outstanding_samples; /* in those parts: what the tuner's
                                   queued bytes are counted from */
    uint64_t refused_since_ns;  /* first of the refusals for credit since the
                                   last part filed; 0 = none */
    emlio__wire_item_t *items;  /* one GET's [shard, record] pairs */
    /* Hand-over of the current epoch (saved by the resume state). */
    size_t next_deliver; /* in_order: the batch due next */
    uint8_t *delivered;  /* bitmap over the epoch's batches */
    size_t n_delivered;
    emlio_sample_t *skipped; /* records daemons left out as corrupt */
    size_t n_skipped;
    size_t cap_skipped;
} emlio__window_t;

/* The current epoch's figures (emlio_client_stats). */
typedef struct emlio__figures {
    uint64_t epoch_start_ns;
    uint64_t last_delivery_ns;
    uint64_t first_batch_ns;
    uint64_t wait_ns;
    uint64_t total_wait_ns; /* all epochs before this one */
    uint64_t samples;
    uint64_t bytes;
    uint64_t disk_read; /* the daemons' "rd" for this epoch's batches */
    uint64_t shared;    /* their "sh" */
    uint64_t retries;
} emlio__figures_t;

struct emlio_client {
    emlio_ctx_t *ctx;
    emlio_client_config_t cfg;
    char *name;
    char *job; /* cfg.job or the environment's; NULL: none */
    char err[EMLIO_ERRMSG_LEN];
    int failed_rc; /* next() failed for good this epoch (0: it did not) */
    char failed_msg[EMLIO_ERRMSG_LEN];
    emlio_buf_t scratch; /* the message being encoded */
    emlio__conn_t conn;
    emlio__inventory_t inv;
    emlio__epoch_t current;
    emlio__epoch_t ahead;
    emlio__resume_t resume;
    emlio__window_t win;
    emlio__figures_t fig;
    emlio__client_xf_t xf;
    int xf_init_rc;     /* a bad transform spec or field list, reported by
                           connect */
    char **want_fields; /* cfg.fields split: asked of the daemons in HELLO */
    size_t n_want_fields;
    /* cfg.sources copied (names and endpoints owned), the plans' view of
     * them, and every source's endpoints joined for connect; NULL/0
     * without sources. */
    emlio_source_t *src;
    emlio_plan_source_t *plan_src;
    uint32_t n_src;
    char *src_endpoints;
    uint32_t *src_of_daemon; /* daemon d (in src_endpoints' order) */
    char xf_init_err[EMLIO_ERRMSG_LEN];
};

/* client_conn.c */
int emlio__client_dial(emlio_client_t *self, const char *endpoints);

/* ---- sources (client_sources.c) ------------------------------------------ */

/* Checks and copies cfg's sources into self (and joins their endpoints).
 * Returns 0, EMLIO_EINVAL (err names the source and why) or ENOMEM. */
int emlio__sources_init(emlio_client_t *self, const emlio_client_config_t *cfg,
                        char *err);
void emlio__sources_release(emlio_client_t *self);
/* h with the sources' names and stratify folded in: part of the dataset's
 * fingerprint, so a resume state names the sources it was of (the
 * weights it records apart: they may change mid-epoch). */
uint64_t emlio__sources_fold(const emlio_client_t *self, uint64_t h);
/* Source s's own fingerprint: its daemons' dataset fingerprints, in
 * order. A resume state keeps one per source, so a
 * refusal can name the source whose data changed. */
uint64_t emlio__source_digest(const emlio_client_t *self, uint32_t s);
/* client_inventory.c: the shards of every daemon's WELCOME (msgs, one per
 * daemon) merged by name where their content is the same, the job's class
 * list, each daemon's label map, and the format. Refuses (EMLIO_EMISMATCH,
 * naming the shard and both daemons) one name with two contents unless
 * cfg.disjoint_shards, and daemons whose stored labels disagree. */
int emlio__client_merge_inventory(emlio_client_t *self,
                                  const emlio__wire_msg_t *msgs);
void emlio__client_disconnect(emlio_client_t *self);
int emlio__client_handle_events(emlio_client_t *self, uint32_t d, uint32_t s);
/* The connection room's share of the replies on a stream: a message that
 * answers a HELLO (WELCOME, or an ERROR refusing a HELLO) is handled
 * here and 1 returned; anything else (BATCH, a request's ERROR) 0, for
 * the window. */
int emlio__client_handshake_reply(emlio_client_t *self, uint32_t d,
                                  uint32_t stream,
                                  const emlio__wire_msg_t *msg);
int emlio__client_add_streams(emlio_client_t *self, uint32_t want);
int emlio__client_add_streams_each(emlio_client_t *self, const uint32_t *want);

/* client_tune.c */
void emlio__client_init_lanes(emlio_client_t *self, bool local);
int emlio__client_add_lane_streams(emlio_client_t *self, uint32_t before);
void emlio__client_sample_paths(emlio_client_t *self);
void emlio__client_plan_rcvbuf(emlio_client_t *self);
int emlio__client_tune(emlio_client_t *self, uint64_t waiting_ns);

/* client_epoch.c */
int emlio__epoch_begin(emlio_client_t *self, uint64_t epoch);
int emlio__epoch_plan(emlio_client_t *self, emlio_plan_t *plan, uint64_t epoch);
int emlio__epoch_fill_ahead(emlio_client_t *self);
void emlio__epoch_abandon(emlio_client_t *self, uint32_t keep);

/* client_window.c */
emlio_batch_t *emlio__batch_get(emlio_client_t *self, size_t n);
void emlio__batch_put(emlio_client_t *self, emlio_batch_t *b);
void emlio__batch_free(emlio_batch_t *b);
int emlio__batch_ready(emlio_client_t *self, emlio_batch_t *b);
int emlio__window_compact(emlio_client_t *self, emlio_batch_t *b);
int emlio__window_begin(emlio_client_t *self, uint64_t now);
int emlio__window_adopt(emlio_client_t *self);
void emlio__window_drop(emlio_client_t *self, uint32_t keep);
bool emlio__window_is_delivered(const emlio_client_t *self, size_t i);
int emlio__window_request(emlio_client_t *self, const emlio__epoch_t *ep,
                          size_t index);
int emlio__window_fill(emlio_client_t *self);
int emlio__window_resend(emlio_client_t *self, uint32_t d, uint32_t sock,
                         uint64_t before_ns);
int emlio__window_receive(emlio_client_t *self, uint32_t d, uint32_t stream);
emlio_batch_t *emlio__window_take(emlio_client_t *self);
void emlio__window_queue_ready(emlio_client_t *self, emlio_batch_t *b);
/* Receives the next frame of a reply after prev into b's frames: the
 * frame, or NULL when there is none (client_window.c). */
zmq_msg_t *emlio__batch_recv_frame(emlio_client_t *self, uint32_t d,
                                   uint32_t stream, emlio_batch_t *b,
                                   const zmq_msg_t *prev);
int emlio__part_match(emlio_client_t *self, uint32_t d, const emlio_batch_t *b,
                      const emlio__part_t *part, const emlio__wire_msg_t *msg,
                      size_t j, uint32_t *next, uint32_t *pos);

/* client_budget.c: the window's bounds, a batch's parts, streams' credits */
void emlio__budget_init(emlio_client_t *self);
void emlio__budget_rebound(emlio_client_t *self);
void emlio__budget_adapt(emlio_client_t *self, bool starved);
bool emlio__budget_has_credit(const emlio_client_t *self);
uint32_t emlio__budget_free_stream(const emlio_client_t *self,
                                   const emlio__cdaemon_t *daemon,
                                   uint64_t now);
void emlio__budget_make_parts(emlio_client_t *self, emlio_batch_t *b,
                              const emlio_plan_sample_t *plan, size_t n);
/* 0 when a batch of cfg.batch_size can be asked for in parts within every
 * daemon's limits (samples per GET, credits), else EMLIO_ELIMIT with the
 * reason. Sizes the parts as emlio__budget_init does. */
int emlio__budget_check_batch(emlio_client_t *self);
/* Milliseconds until a wait for streams to join ends (the longest the
 * client may sleep before asking for more), or -1 when none is going on. */
int emlio__budget_join_wait_ms(const emlio_client_t *self, uint64_t now);

/* client_tensor.c */
bool emlio__tensor_active(const emlio_client_t *self);
/* Bytes of one sample's tensor block (the transform's output). */
size_t emlio__tensor_out_bytes(const emlio_client_t *self);
int emlio__tensor_file_part(emlio_client_t *self, uint32_t d, uint32_t stream,
                            emlio_batch_t *b, emlio__part_t *part,
                            const emlio__wire_msg_t *msg, zmq_msg_t *header);
int emlio__tensor_batch_ready(emlio_client_t *self, emlio_batch_t *b);
int emlio__tensor_collect(emlio_client_t *self);
void emlio__tensor_batch_reset(emlio_batch_t *b);
bool emlio__tensor_disown(emlio_batch_t *b);
void emlio__tensor_shutdown(emlio_client_t *self);
int emlio__tensor_take_welcome(emlio_client_t *self, emlio__cdaemon_t *daemon,
                               const emlio__wire_msg_t *msg);

/* A label daemon d sent, as the job numbers its classes. */
static inline int64_t
emlio__client_label(const emlio_client_t *self, uint32_t d, int64_t label)
{
    const emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    return daemon->label_map && label >= 0 &&
                   (uint64_t)label < daemon->n_label_map
               ? daemon->label_map[label]
               : label;
}

#endif /* EMLIO_CLIENT_INTERNAL_H */
