/* metrics.h - Prometheus text exposition, a small HTTP endpoint that serves
 * it, and emliod's exporter (metrics endpoint + InfluxDB pushes).
 * Internal to libemlio; emliod and `emlio fetch` use it.
 * SPDX-License-Identifier: MIT
 *
 * The exporter, as emliod uses it:
 *
 *   tool_metrics_t *m = tool_metrics_new(ctx, srv);
 *   tool_metrics_set_powercap_root(m, getenv("EMLIO_POWERCAP_ROOT"));
 *   if (tool_metrics_listen(m, "127.0.0.1:0") < 0 ||
 *       tool_metrics_set_influx(m, url, 10.0) < 0 ||
 *       tool_metrics_start(m) < 0)
 *       ... tool_metrics_errmsg(m) ...
 *   printf("metrics on http://%s/metrics\n", tool_metrics_address(m));
 *   ...
 *   tool_metrics_destroy(&m);   // before the server it reads
 *
 * Threads: the HTTP endpoint runs one thread (poll over the listening socket,
 * at most TOOL_METRICS_MAX_CONNS connections and a wake-up pipe) and calls
 * its render function there. The exporter adds one thread for InfluxDB
 * pushes. The exporter's energy meter is shared by both under a lock. The
 * functions below are called from one controlling thread. Nothing prints;
 * failures to push go to the context's log (module "metrics").
 */
#ifndef TOOL_METRICS_H
#define TOOL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emlio/buf.h"

/* Limits of the HTTP endpoint. */
#define TOOL_METRICS_MAX_REQUEST 8192 /* bytes of request line + headers */
#define TOOL_METRICS_MAX_CONNS   8    /* connections served at once */
#define TOOL_METRICS_READ_MS     1000 /* to send the request head */
#define TOOL_METRICS_CONN_MS     5000 /* a connection's whole life */
/* A connection beyond TOOL_METRICS_MAX_CONNS is still accepted: the one
 * that has waited longest for its request head is closed for it (or, when
 * every one is being answered, the oldest). So peers that connect and say
 * nothing cannot keep a scrape waiting: it is answered within about one
 * poll round however many of them there are. */

/* --- Prometheus text format 0.0.4. --- */

/* The Content-Type of the text format. */
#define TOOL_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct tool_metrics_label {
    const char *name;  /* [a-zA-Z_][a-zA-Z0-9_]* */
    const char *value; /* any UTF-8; escaped on output */
} tool_metrics_label_t;

/* Whether name is a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), or, with
 * label true, a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not "__"...). */
bool tool_metrics_name_ok(const char *name, bool label);

/* Appends "# HELP name help" and "# TYPE name type" (type is counter, gauge
 * or untyped). In help, '\' and newlines are escaped. Returns 0, EMLIO_EINVAL
 * (bad name or type) or EMLIO_ENOMEM. */
int tool_metrics_family(emlio_buf_t *out, const char *name, const char *type,
                        const char *help);

/* Appends one sample line: name{l1="v1",...} value. Label values have '\',
 * '"' and newlines escaped. Values print with %.15g; NaN and infinities as
 * NaN, +Inf and -Inf. Returns 0, EMLIO_EINVAL (bad metric or label name) or
 * EMLIO_ENOMEM. */
int tool_metrics_sample(emlio_buf_t *out, const char *name,
                        const tool_metrics_label_t *labels, size_t n,
                        double value);

/* The same for an exact unsigned integer (counters beyond 2^53). */
int tool_metrics_sample_u64(emlio_buf_t *out, const char *name,
                            const tool_metrics_label_t *labels, size_t n,
                            uint64_t value);

/* --- HTTP requests. --- */

typedef struct tool_metrics_request {
    const char *method; /* points into the parsed bytes; not NUL-ended */
    size_t method_len;
    const char *target; /* the request target, query included */
    size_t target_len;
    int minor_version; /* HTTP/1.x */
} tool_metrics_request_t;

/* Parses a request line and headers from buf (len bytes, not NUL-ended),
 * picohttpparser-style. Returns the bytes consumed up to and including the
 * empty line; EMLIO_EINCOMPLETE when more bytes are needed; EMLIO_EPROTO
 * for anything that is not HTTP/1.x (bad tokens, control bytes, folded
 * headers, header lines without ':') or when the head would exceed
 * TOOL_METRICS_MAX_REQUEST. Bare LF line ends are accepted. Never reads past
 * len. */
int tool_metrics_parse_request(tool_metrics_request_t *req, const char *buf,
                               size_t len);

/* The status for a parsed request: 200 for GET /metrics (a query is
 * allowed), 405 for another method, 404 for another path. */
int tool_metrics_route(const tool_metrics_request_t *req);

/* --- The HTTP endpoint. --- */

/* Appends the body of a 200 answer to out. Called on the endpoint's thread.
 * Returns 0 or < 0 (the client gets a 500). */
typedef int tool_metrics_render_fn(void *userdata, emlio_buf_t *out);

typedef struct tool_metrics_http tool_metrics_http_t;

/* Allocates an endpoint. NULL only when out of memory. */
tool_metrics_http_t *tool_metrics_http_new(tool_metrics_render_fn *fn,
                                           void *userdata);

/* Stops the thread, closes every socket and frees. Accepts NULL. */
void tool_metrics_http_destroy(tool_metrics_http_t **self_p);

/* Binds and listens on "HOST:PORT" ("[V6]:PORT" for IPv6; port 0 picks a
 * free one). Returns 0, EMLIO_EINVAL (bad address), EMLIO_ENOTFOUND (host
 * does not resolve) or -errno (EADDRINUSE, ...). */
int tool_metrics_http_bind(tool_metrics_http_t *self, const char *hostport);

/* The address bound, "127.0.0.1:41237" or "[::1]:41237"; "" before bind.
 * Borrowed. */
const char *tool_metrics_http_address(const tool_metrics_http_t *self);

/* Starts the thread. 0, EMLIO_ESTATE (not bound, or running) or -errno. */
int tool_metrics_http_start(tool_metrics_http_t *self);

/* Stops and joins the thread; open connections are closed. Idempotent. */
void tool_metrics_http_stop(tool_metrics_http_t *self);

/* Requests answered (any status) since start; for tests. */
uint64_t tool_metrics_http_served(const tool_metrics_http_t *self);

const char *tool_metrics_http_errmsg(const tool_metrics_http_t *self);

/* --- Process figures. --- */

/* CPU seconds (user + system) of this process so far. */
double tool_metrics_cpu_s(void);

/* Resident set size in bytes (from /proc/self/statm), 0 when unknown. */
uint64_t tool_metrics_rss_bytes(void);

/* --- emliod's exporter. --- */

typedef struct emlio_ctx emlio_ctx_t;
typedef struct emlio_server emlio_server_t;
typedef struct tool_metrics tool_metrics_t;

/* Allocates an exporter for srv (borrowed: destroy the exporter first).
 * NULL only when out of memory. */
tool_metrics_t *tool_metrics_new(emlio_ctx_t *ctx, emlio_server_t *srv);

/* Stops the threads (pushing a last point to InfluxDB, bounded by the push
 * timeout), stops the meter and frees. Accepts NULL. */
void tool_metrics_destroy(tool_metrics_t **self_p);

/* Passed to emlio_energy_set_powercap_root. 0 or EMLIO_ENOMEM. */
int tool_metrics_set_powercap_root(tool_metrics_t *self, const char *root);

/* Serves GET /metrics on hostport (see tool_metrics_http_bind). Binds at
 * once; serving starts with tool_metrics_start. */
int tool_metrics_listen(tool_metrics_t *self, const char *hostport);

/* Pushes an emlio_server point to url every interval_s seconds (0.05 to
 * 86400) once started, and a last one at destroy. Returns 0 or EMLIO_EINVAL
 * (bad URL or interval, see errmsg). */
int tool_metrics_set_influx(tool_metrics_t *self, const char *url,
                            double interval_s);

/* Starts the energy meter (AUTO backend; a meter that cannot start is
 * logged and its metrics left out), the endpoint and the pusher. Returns 0,
 * or < 0 with errmsg set. */
int tool_metrics_start(tool_metrics_t *self);

/* The endpoint's address ("" when not listening). Borrowed. */
const char *tool_metrics_address(const tool_metrics_t *self);

/* Renders the exposition (what GET /metrics answers). Thread-safe with
 * respect to the exporter's own threads. 0 or EMLIO_ENOMEM. */
int tool_metrics_render(tool_metrics_t *self, emlio_buf_t *out);

/* Appends the emlio_server line-protocol point. 0 or < 0. */
int tool_metrics_point(tool_metrics_t *self, emlio_buf_t *out);

const char *tool_metrics_errmsg(const tool_metrics_t *self);

#endif /* TOOL_METRICS_H */
