/* fetch_metrics.c - the training side's Prometheus endpoint (see .h).
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include "fetch_metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define MAX_STREAMS 256

struct fetch_metrics {
    tool_metrics_http_t *http;
    pthread_mutex_t lock;
    /* The snapshot, under lock. */
    emlio_client_stats_t st;
    emlio_client_xf_stats_t xf;
    emlio_stream_stats_t streams[MAX_STREAMS];
    char endpoints[MAX_STREAMS][96];
    size_t n_streams;
    uint64_t samples, bytes;
};

/* One labelled gauge family: name, help, and a sample per label set. */
static int
s_gauge(emlio_buf_t *out, const char *name, const char *help, double v)
{
    return tool_metrics_family(out, name, "gauge", help) |
           tool_metrics_sample(out, name, NULL, 0, v);
}

/* A gauge with one sample per stream, labelled by daemon and stream: the
 * double at `field` of each stream's figures, times scale. */
static int
s_per_stream(const fetch_metrics_t *self, emlio_buf_t *out, const char *name,
             const char *help, size_t field, double scale)
{
    int rc = tool_metrics_family(out, name, "gauge", help);
    for (size_t i = 0; i < self->n_streams; i++) {
        char stream[16];
        snprintf(stream, sizeof(stream), "%" PRIu32, self->streams[i].stream);
        tool_metrics_label_t l[2] = { { "daemon", self->endpoints[i] },
                                      { "stream", stream } };
        double v;
        memcpy(&v, (const char *)&self->streams[i] + field, sizeof(v));
        rc |= tool_metrics_sample(out, name, l, 2, v * scale);
    }
    return rc;
}

/* Where the transforms run and why (a client with a transform). */
static int
s_render_xf(const emlio_client_xf_stats_t *x, emlio_buf_t *out)
{
    static const char *const sides[] = { "server", "client" };
    int rc = 0;
    rc |= tool_metrics_family(out, "emlio_transform_info", "gauge",
                              "Where transforms run: decode_at as "
                              "configured, and what bounds the chosen "
                              "placement's rate (1).");
    tool_metrics_label_t info[2] = { { "decode_at",
                                       emlio_decode_at_name(x->decode_at) },
                                     { "bound", x->bound } };
    rc |= tool_metrics_sample(out, "emlio_transform_info", info, 2, 1);
    rc |= s_gauge(out, "emlio_transform_server_share",
                  "Share of this epoch's batches the daemons decode.",
                  x->server_share);
    rc |= s_gauge(out, "emlio_transform_predicted_images_per_second",
                  "decode_at=auto: the chosen share's predicted rate.",
                  x->predicted_ips);
    rc |= s_gauge(out, "emlio_transform_predicted_joules_per_image",
                  "decode_at=auto: the chosen share's predicted energy per "
                  "image (energy model or RAPL power per busy core).",
                  x->predicted_j_per_image);
    const double ms[2] = { x->server_ms_per_image, x->client_ms_per_image };
    const double batches[2] = { (double)x->batches_server,
                                (double)x->batches_client };
    rc |= tool_metrics_family(out, "emlio_transform_cpu_seconds_per_image",
                              "gauge",
                              "CPU seconds one decode and transform takes, "
                              "by side (measured).");
    for (int i = 0; i < 2; i++) {
        tool_metrics_label_t l = { "side", sides[i] };
        rc |= tool_metrics_sample(out, "emlio_transform_cpu_seconds_per_image",
                                  &l, 1, ms[i] / 1e3);
    }
    rc |= tool_metrics_family(out, "emlio_transform_batches", "gauge",
                              "Batches of this epoch decoded, by side.");
    for (int i = 0; i < 2; i++) {
        tool_metrics_label_t l = { "side", sides[i] };
        rc |= tool_metrics_sample(out, "emlio_transform_batches", &l, 1,
                                  batches[i]);
    }
    return rc;
}

static int
s_render(void *userdata, emlio_buf_t *out)
{
    fetch_metrics_t *self = userdata;
    static const int limits[] = { EMLIO_LIMIT_UNKNOWN, EMLIO_LIMIT_CONSUMER,
                                  EMLIO_LIMIT_WINDOW,  EMLIO_LIMIT_NETWORK,
                                  EMLIO_LIMIT_DAEMON,  EMLIO_LIMIT_CPU };
    int rc = 0;
    pthread_mutex_lock(&self->lock);
    const emlio_client_stats_t *st = &self->st;
    rc |= tool_metrics_family(out, "emlio_client_samples_total", "counter",
                              "Samples delivered to the caller.");
    rc |= tool_metrics_sample_u64(out, "emlio_client_samples_total", NULL, 0,
                                  self->samples);
    rc |= tool_metrics_family(out, "emlio_client_bytes_total", "counter",
                              "Sample bytes delivered to the caller.");
    rc |= tool_metrics_sample_u64(out, "emlio_client_bytes_total", NULL, 0,
                                  self->bytes);
    rc |= s_gauge(out, "emlio_client_epoch", "The current epoch.",
                  (double)st->epoch);
    rc |= s_gauge(out, "emlio_client_epoch_wait_seconds",
                  "Time the caller waited for batches this epoch.", st->wait_s);
    rc |= s_gauge(out, "emlio_client_rtt_seconds",
                  "The path's RTT floor over the streams (TCP_INFO).",
                  st->rtt_ms / 1e3);
    rc |= s_gauge(out, "emlio_client_streams", "TCP streams per daemon in use.",
                  (double)st->streams);
    rc |=
        s_gauge(out, "emlio_client_io_threads",
                "ZeroMQ I/O threads the streams use.", (double)st->io_threads);
    rc |= s_gauge(out, "emlio_client_window_bytes",
                  "Bytes one stream may have in flight (the smaller of the "
                  "daemons' send buffer and our receive buffer).",
                  (double)st->window);
    rc |= s_gauge(out, "emlio_client_rate_bytes_per_second",
                  "Delivery rate over the stream tuner's last tick.",
                  st->mb_per_s * 1e6);
    rc |= s_gauge(out, "emlio_client_inflight_batches",
                  "Batches the client keeps requested.", st->inflight);
    rc |= tool_metrics_family(out, "emlio_client_limit", "gauge",
                              "What limits the rate now: 1 for the "
                              "current reason, 0 for the others.");
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        tool_metrics_label_t l = { "limit", emlio_limit_name(limits[i]) };
        rc |= tool_metrics_sample(out, "emlio_client_limit", &l, 1,
                                  st->limit == limits[i]);
    }
    if (self->xf.client_threads)
        rc |= s_render_xf(&self->xf, out);
    rc |= s_per_stream(self, out, "emlio_client_stream_rate_bytes_per_second",
                       "Sample bytes per second of each stream over the "
                       "tuner's last tick.",
                       offsetof(emlio_stream_stats_t, mb_per_s), 1e6);
    rc |= s_per_stream(self, out, "emlio_client_stream_rtt_seconds",
                       "Smoothed RTT of each stream (TCP_INFO).",
                       offsetof(emlio_stream_stats_t, rtt_ms), 1e-3);
    pthread_mutex_unlock(&self->lock);
    return rc ? EMLIO_ENOMEM : 0;
}

fetch_metrics_t *
fetch_metrics_start(const char *hostport)
{
    fetch_metrics_t *self = calloc(1, sizeof(*self));
    if (!self) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->http = tool_metrics_http_new(s_render, self);
    int rc = self->http ? tool_metrics_http_bind(self->http, hostport)
                        : EMLIO_ENOMEM;
    if (rc == 0)
        rc = tool_metrics_http_start(self->http);
    if (rc < 0) {
        fprintf(stderr, "emlio fetch: cannot serve metrics on '%s': %s\n",
                hostport,
                self->http ? tool_metrics_http_errmsg(self->http)
                           : "out of memory");
        fetch_metrics_stop(&self);
        return NULL;
    }
    return self;
}

const char *
fetch_metrics_address(const fetch_metrics_t *self)
{
    return tool_metrics_http_address(self->http);
}

void
fetch_metrics_update(fetch_metrics_t *self, const emlio_client_t *client,
                     uint64_t samples, uint64_t bytes)
{
    emlio_stream_stats_t streams[MAX_STREAMS];
    size_t n = emlio_client_streams(client, streams, MAX_STREAMS);
    if (n > MAX_STREAMS)
        n = MAX_STREAMS;
    pthread_mutex_lock(&self->lock);
    emlio_client_stats(client, &self->st);
    emlio_client_xf_stats(client, &self->xf);
    for (size_t i = 0; i < n; i++) {
        self->streams[i] = streams[i];
        const char *ep =
            emlio_client_daemon_endpoint(client, streams[i].daemon);
        snprintf(self->endpoints[i], sizeof(self->endpoints[i]), "%s",
                 ep ? ep : "");
    }
    self->n_streams = n;
    self->samples = samples;
    self->bytes = bytes;
    pthread_mutex_unlock(&self->lock);
}

void
fetch_metrics_stop(fetch_metrics_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    fetch_metrics_t *self = *self_p;
    tool_metrics_http_destroy(&self->http);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}
