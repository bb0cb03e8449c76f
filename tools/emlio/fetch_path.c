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

/* Writes s as a JSON string body: quotes, backslashes and control
 * characters escaped. */
static void
s_json_str(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(out, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(out, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, out);
    }
}

void
fetch_path_xf_json(FILE *out, const emlio_client_t *client)
{
    emlio_client_xf_stats_t x;
    emlio_client_xf_stats(client, &x);
    if (!emlio_decode_at_name(x.decode_at) ||
        (!x.client_threads && !x.server_threads && !x.batches_client &&
         !x.batches_server))
        return; /* no transform */
    fprintf(out,
            ", \"transform\": {\"decode_at\": \"%s\", \"server_share\": %.3f"
            ", \"decided\": %s, \"batches_server\": %" PRIu64
            ", \"batches_client\": %" PRIu64
            ", \"client_ms_per_image\": %.4f, \"server_ms_per_image\": %.4f"
            ", \"client_threads\": %u, \"server_threads\": %u"
            ", \"predicted_images_per_s\": %.1f, \"predicted_j_per_image\": "
            "%.6f, \"fastest_images_per_s\": %.1f, \"bound\": \"%s\""
            ", \"why\": \"",
            emlio_decode_at_name(x.decode_at), x.server_share,
            x.decided ? "true" : "false", x.batches_server, x.batches_client,
            x.client_ms_per_image, x.server_ms_per_image, x.client_threads,
            x.server_threads, x.predicted_ips, x.predicted_j_per_image,
            x.fastest_ips, x.bound);
    s_json_str(out, x.why);
    fprintf(out, "\"}");
}
