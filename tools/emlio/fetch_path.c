/* fetch_path.c - the network path in `emlio fetch`'s output.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include "fetch_path.h"

#include <inttypes.h>

#define MAX_REPORTED_STREAMS 256

void
fetch_path_json(FILE *out, const emlio_client_t *client)
{
    emlio_client_stats_t st;
    emlio_client_stats(client, &st);
    fprintf(out,
            ", \"rtt_ms\": %.3f, \"streams\": %u, \"limit\": \"%s\""
            ", \"window_kib\": %" PRIu64 ", \"path_mb_per_s\": %.2f"
            ", \"stream_mb_per_s\": [",
            st.rtt_ms, st.streams, emlio_limit_name(st.limit), st.window >> 10,
            st.mb_per_s);
    emlio_stream_stats_t streams[MAX_REPORTED_STREAMS];
    size_t n = emlio_client_streams(client, streams, MAX_REPORTED_STREAMS);
    for (size_t i = 0; i < n && i < MAX_REPORTED_STREAMS; i++)
        fprintf(out, "%s%.2f", i ? ", " : "", streams[i].mb_per_s);
    fprintf(out, "]");
}

void
fetch_path_brief(char *buf, size_t len, const emlio_client_t *client)
{
    emlio_client_stats_t st;
    emlio_client_stats(client, &st);
    snprintf(buf, len, "rtt %.1f ms, %u streams, limit %s", st.rtt_ms,
             st.streams, emlio_limit_name(st.limit));
}
