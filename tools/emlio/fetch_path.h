/* fetch_path.h - how `emlio fetch` reports the network path: RTT, streams,
 * rate per stream and what limits the rate.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_FETCH_PATH_H
#define EMLIO_TOOLS_FETCH_PATH_H

#include <stdio.h>

#include "emlio.h"

/* Appends `, "rtt_ms": .., "streams": .., "limit": "..", "window_kib": ..,
 * "path_mb_per_s": .., "stream_mb_per_s": [..]` to a JSON object being
 * written to out. */
void fetch_path_json(FILE *out, const emlio_client_t *client);

/* Appends `, "transform": {decode_at, server_share, decided, batches on
 * each side, CPU ms per image on each side, threads, the placement's
 * prediction and why}` when the client has a transform; nothing else. */
void fetch_path_xf_json(FILE *out, const emlio_client_t *client);

/* A short form for the progress line: "rtt 30.1 ms, 8 streams, window". */
void fetch_path_brief(char *buf, size_t len, const emlio_client_t *client);

#endif /* EMLIO_TOOLS_FETCH_PATH_H */
