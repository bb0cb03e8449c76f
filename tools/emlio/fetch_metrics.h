/* fetch_metrics.h - `emlio fetch --metrics HOST:PORT`: the training side's
 * Prometheus endpoint. It reports what the client sees of the network path
 * (RTT, streams, rate per stream, what limits the rate) next to the
 * delivery totals, so a dashboard shows why a job waits for data.
 * SPDX-License-Identifier: MIT
 *
 * The client belongs to fetch's thread; the endpoint's thread only reads a
 * snapshot that fetch_metrics_update copies under a lock.
 */
#ifndef EMLIO_TOOLS_FETCH_METRICS_H
#define EMLIO_TOOLS_FETCH_METRICS_H

#include "emlio.h"

typedef struct fetch_metrics fetch_metrics_t;

/* Binds hostport ("127.0.0.1:0" picks a port) and starts serving GET
 * /metrics. NULL after printing why as "emlio fetch: ...". */
fetch_metrics_t *fetch_metrics_start(const char *hostport);

/* "127.0.0.1:41237". Borrowed. */
const char *fetch_metrics_address(const fetch_metrics_t *self);

/* Copies the client's figures for the endpoint: call from the client's
 * thread (cheap; fetch calls it at most ten times a second). */
void fetch_metrics_update(fetch_metrics_t *self, const emlio_client_t *client,
                          uint64_t samples, uint64_t bytes);

/* Stops serving and frees. Accepts NULL. */
void fetch_metrics_stop(fetch_metrics_t **self_p);

#endif /* EMLIO_TOOLS_FETCH_METRICS_H */
