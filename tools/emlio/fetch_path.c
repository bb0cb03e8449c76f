/* fetch_path.c - the network path in `emlio fetch`'s output.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include "cli.h"
#include "fetch_path.h"

#include <inttypes.h>

#define MAX_REPORTED_STREAMS 256

void
fetch_path_json(FILE *out, const emlio_client_t *client,
                const fetch_path_totals_t *run)
{
    emlio_client_stats_t st;
    emlio_client_stats(client, &st);
    if (run) {
        st.bytes = run->bytes;
        st.disk_read_bytes = run->disk_read_bytes;
        st.shared_bytes = run->shared_bytes;
    }
    fprintf(
        out,
        ", \"rtt_ms\": %.3f, \"streams\": %u, \"io_threads\": %u"
        ", \"limit\": \"%s\", \"disk_pct\": %u, \"disk_read_bytes\": %" PRIu64
        ", \"read_amp\": %.3f, \"shared_bytes\": %" PRIu64
        ", \"share_join\": %" PRIu64 ", \"window_kib\": %" PRIu64
        ", \"path_mb_per_s\": %.2f, \"stream_mb_per_s\": [",
        st.rtt_ms, st.streams, st.io_threads, emlio_limit_name(st.limit),
        st.disk_pct, st.disk_read_bytes,
        st.bytes ? (double)st.disk_read_bytes / (double)st.bytes : 0.0,
        st.shared_bytes, st.share_join, st.window >> 10, st.mb_per_s);
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
            ", \"client_decode_max_bytes\": %" PRIu64 ", \"why\": ",
            emlio_decode_at_name(x.decode_at), x.server_share,
            x.decided ? "true" : "false", x.batches_server, x.batches_client,
            x.client_ms_per_image, x.server_ms_per_image, x.client_threads,
            x.server_threads, x.predicted_ips, x.predicted_j_per_image,
            x.fastest_ips, x.bound, x.client_ws_bytes);
    cli_json_string(out, x.why);
    fputc('}', out);
}

int
fetch_ramp_add(fetch_ramp_t *self, double t, uint64_t bytes)
{
    size_t bin = t > 0 ? (size_t)(t / FETCH_RAMP_BIN_S) : 0;
    if (bin >= self->cap) {
        size_t cap = self->cap ? self->cap : 1024;
        while (cap <= bin)
            cap *= 2;
        uint64_t *bins = realloc(self->bins, cap * sizeof(*bins));
        if (!bins)
            return -1;
        memset(bins + self->cap, 0, (cap - self->cap) * sizeof(*bins));
        self->bins = bins;
        self->cap = cap;
    }
    self->bins[bin] += bytes;
    self->n = bin + 1 > self->n ? bin + 1 : self->n;
    return 0;
}

double
fetch_ramp_seconds(const fetch_ramp_t *self, double seconds)
{
    /* Bins of a fortieth of the run smooth out batches that arrive in
     * bursts, and stay short enough to time a ramp of a few RTTs. */
    double width_s = seconds / 40;
    width_s = width_s < FETCH_RAMP_BIN_S ? FETCH_RAMP_BIN_S
              : width_s > 0.25           ? 0.25
                                         : width_s;
    size_t w = (size_t)(width_s / FETCH_RAMP_BIN_S + 0.5);
    size_t full = self->n / w; /* the last bin may be partial: not used */
    if (w == 0 || full < 4)
        return 0;
    uint64_t late = 0;
    size_t n_late = 0;
    for (size_t i = full / 2; i < full; i++, n_late++)
        for (size_t k = 0; k < w; k++)
            late += self->bins[i * w + k];
    double steady = (double)late / (double)n_late; /* bytes per wide bin */
    for (size_t i = 0; i < full; i++) {
        uint64_t sum = 0;
        for (size_t k = 0; k < w; k++)
            sum += self->bins[i * w + k];
        if ((double)sum >= FETCH_RAMP_SHARE * steady)
            return (double)((i + 1) * w) * FETCH_RAMP_BIN_S;
    }
    return seconds;
}

void
fetch_ramp_release(fetch_ramp_t *self)
{
    free(self->bins);
    *self = (fetch_ramp_t){ 0 };
}
