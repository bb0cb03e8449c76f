/* influx.h - InfluxDB line protocol, http:// URLs and a bounded HTTP POST.
 * Internal to libemlio; emliod's exporter and `emlio fetch --influx` use it.
 * SPDX-License-Identifier: MIT
 *
 *   tool_influx_url_t url;
 *   char err[TOOL_ERRMSG_LEN];
 *   if (tool_influx_url_parse(&url, "http://127.0.0.1:8086/write?db=x",
 *                               err) < 0) ... err ...
 *   emlio_buf_t body = EMLIO_BUF_INIT;
 *   tool_influx_point_t p;
 *   tool_influx_begin(&p, &body, "emlio_epoch");
 *   tool_influx_tag(&p, "rank", "0");
 *   tool_influx_float(&p, "seconds", 1.5);
 *   tool_influx_str(&p, "energy_source", "model");
 *   if (tool_influx_end(&p, now_ns) == 0)
 *       rc = tool_influx_post(&url, body.data, body.len, 2000, err);
 *
 * Everything here is reentrant; the functions share no state.
 */
#ifndef TOOL_INFLUX_H
#define TOOL_INFLUX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emlio/buf.h"

#define TOOL_INFLUX_HOST_MAX 255
#define TOOL_INFLUX_PATH_MAX 2048

/* A parsed http:// URL. host is a name, an IPv4 address or an IPv6 address
 * (without its brackets); path starts with '/' and keeps the query. */
typedef struct tool_influx_url {
    char host[TOOL_INFLUX_HOST_MAX + 1];
    uint16_t port; /* 80 when the URL names none */
    char path[TOOL_INFLUX_PATH_MAX + 1];
} tool_influx_url_t;

/* Parses "http://HOST[:PORT][/PATH[?QUERY]]". Refuses other schemes
 * (https included: there is no TLS here), user info, fragments, empty hosts,
 * ports outside 1..65535, white space, control bytes and anything longer than
 * the limits above. Returns 0, or EMLIO_EINVAL with the reason in err
 * (TOOL_ERRMSG_LEN bytes). Never reads past the NUL. */
int tool_influx_url_parse(tool_influx_url_t *out, const char *url, char *err);

/* One point of line protocol being written into a buffer:
 *   measurement[,tag=value...] field=value[,field=value...] timestamp\n
 * Escaping: measurement ',' and ' '; tag keys and values and field keys ','
 * '=' and ' '; string values '"' and '\'. Newlines cannot be escaped in line
 * protocol, so they become spaces. Tags with an empty value and float fields
 * that are NaN or infinite are left out (InfluxDB refuses them). */
typedef struct tool_influx_point {
    emlio_buf_t *out;
    size_t start;  /* out->len at begin, for rolling back a failed point */
    size_t fields; /* fields written so far */
    int rc;        /* first failure (EMLIO_ENOMEM), sticky */
} tool_influx_point_t;

void tool_influx_begin(tool_influx_point_t *p, emlio_buf_t *out,
                       const char *measurement);
/* Tags must all come before the first field. */
void tool_influx_tag(tool_influx_point_t *p, const char *key,
                     const char *value);
void tool_influx_float(tool_influx_point_t *p, const char *key, double v);
/* Integers are written with InfluxDB 1.x's 'i' suffix (signed 64-bit). */
void tool_influx_int(tool_influx_point_t *p, const char *key, int64_t v);
void tool_influx_str(tool_influx_point_t *p, const char *key, const char *v);
/* Ends the point with a timestamp in nanoseconds (0: none, the server's
 * clock) and a newline. Returns 0, EMLIO_ENOMEM, or EMLIO_EINVAL when the
 * point has no field; on failure the buffer is rolled back to begin. */
int tool_influx_end(tool_influx_point_t *p, int64_t ts_ns);

/* POSTs body to url (Content-Type text/plain) over a fresh TCP connection
 * and reads the status line. Blocks for at most about timeout_ms in connect,
 * send and receive together (name resolution through getaddrinfo is not
 * bounded; numeric hosts do not resolve). Returns 0 for a 2xx answer,
 * EMLIO_ETIMEDOUT, -errno (ECONNREFUSED, ...), EMLIO_ENOTFOUND (the host
 * does not resolve), EMLIO_EPROTO (not an HTTP answer, or not 2xx: err
 * quotes the status and the start of the body) or EMLIO_ENOMEM. Sends with
 * MSG_NOSIGNAL: a closed peer never raises SIGPIPE. */
int tool_influx_post(const tool_influx_url_t *url, const void *body, size_t len,
                     int timeout_ms, char *err);

#endif /* TOOL_INFLUX_H */
