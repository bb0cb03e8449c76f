/* fetch_path.h - how `emlio fetch` reports the network path: RTT, streams,
 * rate per stream and what limits the rate.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_FETCH_PATH_H
#define EMLIO_TOOLS_FETCH_PATH_H

#include <stdio.h>

#include "emlio.h"

/* Figures of a whole run, for its summary line: the client's stats hold
 * the current epoch's. */
typedef struct fetch_path_totals {
    uint64_t bytes;           /* delivered */
    uint64_t disk_read_bytes; /* the daemons' device reads for them */
    uint64_t shared_bytes;    /* of bytes, from other jobs' shared reads */
} fetch_path_totals_t;

/* Appends `, "rtt_ms": .., "streams": .., "limit": "..", "window_kib": ..,
 * "path_mb_per_s": .., "stream_mb_per_s": [..]` to a JSON object being
 * written to out. disk_read_bytes, read_amp and shared_bytes are the
 * current epoch's, or run's when given (the summary line). */
void fetch_path_json(FILE *out, const emlio_client_t *client,
                     const fetch_path_totals_t *run);

/* Appends `, "transform": {decode_at, server_share, decided, batches on
 * each side, CPU ms per image on each side, threads, the placement's
 * prediction and why}` when the client has a transform; nothing else. */
void fetch_path_xf_json(FILE *out, const emlio_client_t *client);

/* A short form for the progress line: "rtt 30.1 ms, 8 streams, window". */
void fetch_path_brief(char *buf, size_t len, const emlio_client_t *client);

/* The ramp: how long after the first request the delivery rate first
 * reaches FETCH_RAMP_SHARE of the steady rate (the rate over the
 * second half of the run). Bytes are counted into FETCH_RAMP_BIN_S bins as
 * batches are handed over. */
#define FETCH_RAMP_SHARE 0.8
#define FETCH_RAMP_BIN_S 0.01

typedef struct fetch_ramp {
    uint64_t *bins; /* bytes handed over in each bin since the start */
    size_t n;       /* bins used */
    size_t cap;
} fetch_ramp_t;

/* Counts bytes handed over at t seconds after the first request. Returns
 * 0 or -1 (out of memory: the ramp is then unknown). */
int fetch_ramp_add(fetch_ramp_t *self, double t, uint64_t bytes);

/* Seconds from the first request until the rate over a bin of about a
 * fortieth of the run (10 to 250 ms) first reached FETCH_RAMP_SHARE of the
 * rate over the run's second half, counted to that bin's end; 0 when the
 * run is too short to tell (under four such bins). */
double fetch_ramp_seconds(const fetch_ramp_t *self, double seconds);

void fetch_ramp_release(fetch_ramp_t *self);

#endif /* EMLIO_TOOLS_FETCH_PATH_H */
