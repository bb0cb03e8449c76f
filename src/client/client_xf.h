/* client_xf.h - the client's transform stage: which batches the daemons
 * decode, decoding the others here, and what was measured on the way.
 * SPDX-License-Identifier: MIT
 *
 * decode_at (emlio/client.h):
 *   client  every batch is fetched as encoded bytes and decoded here, on
 *           transform_threads low-priority threads, as batches complete
 *           (still out of order);
 *   server  every GET carries the transform: the daemons send tensors;
 *   auto    a share f of the batches goes to the daemons, chosen per epoch
 *           by placement.h from what this stage measured (CPU per image on
 *           each side, encoded and tensor bytes, the link's rate, the
 *           consumer's pace, power per busy core). Batch i of an epoch is a
 *           daemon's when floor((i + 1) f) > floor(i f): the share spreads
 *           evenly over the epoch. The first epoch starts at f = 1/2 so
 *           both sides are measured, and is re-decided once both have been.
 * Whichever side decodes, the bytes are the same (xfstage.h).
 *
 * Completion: a batch decoded here is handed back through a done list and
 * an eventfd, which the client polls beside its sockets, so next() wakes
 * when either a reply or a decoded batch arrives.
 */
#ifndef EMLIO_CLIENT_XF_H
#define EMLIO_CLIENT_XF_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "emlio/client.h"
#include "xf.h"

typedef struct emlio__client_xf_item emlio__client_xf_item_t;

/* One batch being decoded here. */
struct emlio__client_xf_item {
    emlio__xf_job_t job;
    void *batch;    /* the client's batch (opaque here) */
    uint64_t bytes; /* encoded bytes, for the placement's figures */
    emlio__client_xf_item_t *next;
    struct emlio__client_xf *xf;
};

typedef struct emlio__client_xf {
    emlio_transform_t *transform; /* NULL: no transforms (raw bytes) */
    int decode_at;                /* enum emlio_decode_at */
    size_t threads;               /* transform_threads here */
    uint64_t ws_max_bytes;        /* what one decode here may hold */
    uint64_t seed;
    emlio__workpool_t *pool; /* started on first use */
    emlio__xf_blocks_t *blocks;
    bool inited; /* emlio__client_xf_init ran: lock and wake_fd exist */
    int wake_fd; /* eventfd: a decoded batch is on the done list */
    pthread_mutex_t lock;
    emlio__client_xf_item_t *done_head, *done_tail;
    size_t running;    /* items submitted and not yet popped */
    bool skip_corrupt; /* on_corrupt skip: leave out what fails to decode */
    /* Placement. */
    double share;                 /* f: batches the daemons decode */
    bool decided;                 /* share chosen from measurements */
    emlio__place_choice_t choice; /* the last decision */
    double server_threads;        /* sum of the daemons' xf_threads */
    double server_core_w;         /* their power per busy core (mean) */
    double client_core_w;
    /* Measured (totals since connect). */
    uint64_t here_images, here_cpu_ns, here_bytes;
    uint64_t server_images, server_cpu_ns;
    uint64_t batches_here, batches_server; /* this epoch */
} emlio__client_xf_t;

/* Parses cfg->transform (if any) and checks decode_at; errbuf
 * (EMLIO_ERRMSG_LEN) names what is wrong. 0 or EMLIO_EINVAL/ENOMEM. */
int emlio__client_xf_init(emlio__client_xf_t *xf,
                          const emlio_client_config_t *cfg, char *errbuf);
void emlio__client_xf_release(emlio__client_xf_t *xf);

/* True when this client asks daemons for transforms (HELLO v3). */
bool emlio__client_xf_wants_server(const emlio__client_xf_t *xf);

/* Whether batch `index` of the current epoch is decoded by a daemon. */
bool emlio__client_xf_at_server(const emlio__client_xf_t *xf, uint64_t index);

/* The daemons' figures from WELCOME (called once per daemon). */
void emlio__client_xf_add_daemon(emlio__client_xf_t *xf, uint64_t threads,
                                 uint64_t core_mw);

/* A tensor batch of n images arrived; the daemon spent xf_ns on it. */
void emlio__client_xf_note_server(emlio__client_xf_t *xf, size_t n,
                                  uint64_t xf_ns);

/* Decides the share for a new epoch (auto) from the figures so far;
 * link_Bps and consumer_ips as placement.h wants them (0 = unknown). */
void emlio__client_xf_begin_epoch(emlio__client_xf_t *xf, double link_Bps,
                                  double consumer_ips);

/* Starts decoding a batch here: samples[0..n) hold each sample's encoded
 * bytes and key; the stage takes ownership of samples (emlio_calloc'd) and
 * of a block it allocates. epoch keys the generator. 0 or an error. */
int emlio__client_xf_submit(emlio__client_xf_t *xf, void *batch,
                            emlio__xf_sample_t *samples, size_t n,
                            uint64_t epoch);

/* Called by emlio__client_xf_pop for each sample of batch that failed to
 * decode, in index order: i its index, rc its code, why its text. */
typedef void emlio__client_xf_failed_fn(void *userdata, void *batch, size_t i,
                                        int rc, const char *why);

/* Takes one decoded batch off the done list (NULL when none): *block_out is
 * the tensor block (return it with emlio__xf_block_put); failed, when the
 * batch has failures, is called for each failed sample before the stage
 * lets go of their texts. Clears the eventfd when the list runs empty. */
void *emlio__client_xf_pop(emlio__client_xf_t *xf, uint8_t **block_out,
                           emlio__client_xf_failed_fn *failed, void *userdata);

/* Batches submitted and not popped yet. */
size_t emlio__client_xf_pending(const emlio__client_xf_t *xf);

#endif /* EMLIO_CLIENT_XF_H */
