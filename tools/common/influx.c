/* influx.c - InfluxDB line protocol, http:// URL parsing and a bounded HTTP
 * POST over plain sockets (no TLS, no library).
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <ctype.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "influx.h"

/* --- URLs. --- */

static bool
s_host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_' ||
           c == '~';
}

int
tool_influx_url_parse(tool_influx_url_t *out, const char *url, char *err)
{
    assert(out && url && err);
    memset(out, 0, sizeof(*out));
    size_t n = strnlen(url, TOOL_INFLUX_PATH_MAX + 512);
    if (n > TOOL_INFLUX_PATH_MAX + 256)
        return tool_seterr(err, EMLIO_EINVAL, "URL is too long");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= ' ' || (unsigned char)url[i] >= 0x7f)
            return tool_seterr(err, EMLIO_EINVAL,
                               "invalid URL '%.200s': white space or "
                               "control byte at %zu",
                               url, i);
    static const char scheme[] = "http://";
    if (strncasecmp(url, "https://", 8) == 0)
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': https is not supported, "
                           "use http://",
                           url);
    if (strncasecmp(url, scheme, sizeof(scheme) - 1) != 0)
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': expected http://HOST"
                           "[:PORT]/PATH",
                           url);
    const char *p = url + sizeof(scheme) - 1;
    const char *end = url + n;
    const char *auth_end = p;
    while (auth_end < end && *auth_end != '/' && *auth_end != '?' &&
           *auth_end != '#')
        auth_end++;
    if (memchr(p, '@', (size_t)(auth_end - p)))
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': user info is not "
                           "supported",
                           url);
    const char *host = p;
    const char *host_end;
    const char *port = NULL;
    if (*p == '[') {
        host = p + 1;
        host_end = memchr(host, ']', (size_t)(auth_end - host));
        if (!host_end)
            return tool_seterr(err, EMLIO_EINVAL,
                               "invalid URL '%.200s': missing ']'", url);
        for (const char *q = host; q < host_end; q++)
            if (!(isxdigit((unsigned char)*q) || *q == ':' || *q == '.'))
                return tool_seterr(err, EMLIO_EINVAL,
                                   "invalid URL '%.200s': bad IPv6 address",
                                   url);
        p = host_end + 1;
        if (p < auth_end && *p != ':')
            return tool_seterr(err, EMLIO_EINVAL,
                               "invalid URL '%.200s': junk after ']'", url);
    } else {
        while (p < auth_end && s_host_char(*p))
            p++;
        host_end = p;
        if (p < auth_end && *p != ':')
            return tool_seterr(err, EMLIO_EINVAL,
                               "invalid URL '%.200s': bad host character "
                               "'%c'",
                               url, *p);
    }
    size_t host_len = (size_t)(host_end - host);
    if (host_len == 0)
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': empty host", url);
    if (host_len > TOOL_INFLUX_HOST_MAX)
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': host is too long", url);
    out->port = 80;
    if (p < auth_end && *p == ':') {
        port = p + 1;
        unsigned long v = 0;
        if (port == auth_end)
            return tool_seterr(err, EMLIO_EINVAL,
                               "invalid URL '%.200s': empty port", url);
        for (const char *q = port; q < auth_end; q++) {
            if (*q < '0' || *q > '9' || v > 65535)
                return tool_seterr(err, EMLIO_EINVAL,
                                   "invalid URL '%.200s': bad port", url);
            v = v * 10 + (unsigned long)(*q - '0');
        }
        if (v == 0 || v > 65535)
            return tool_seterr(err, EMLIO_EINVAL,
                               "invalid URL '%.200s': port out of range", url);
        out->port = (uint16_t)v;
    }
    if (memchr(auth_end, '#', (size_t)(end - auth_end)))
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': fragments are not "
                           "supported",
                           url);
    size_t path_len = (size_t)(end - auth_end);
    if (path_len > TOOL_INFLUX_PATH_MAX - 1)
        return tool_seterr(err, EMLIO_EINVAL,
                           "invalid URL '%.200s': path is too long", url);
    memcpy(out->host, host, host_len);
    out->host[host_len] = '\0';
    if (path_len == 0 || auth_end[0] == '?')
        out->path[0] = '/';
    memcpy(out->path + strlen(out->path), auth_end, path_len);
    return 0;
}

/* --- Line protocol. --- */

/* Appends s with a backslash before every byte in specials; newlines and
 * carriage returns, which line protocol cannot carry, become spaces (and
 * are escaped if a space is special). */
static void
s_put_escaped(tool_influx_point_t *p, const char *s, const char *specials)
{
    for (; *s && p->rc == 0; s++) {
        char c = (*s == '\n' || *s == '\r') ? ' ' : *s;
        if (strchr(specials, c) && (p->rc = emlio_buf_add(p->out, "\\", 1)) < 0)
            break;
        p->rc = emlio_buf_add(p->out, &c, 1);
    }
}

static void
s_put(tool_influx_point_t *p, const char *s)
{
    if (p->rc == 0)
        p->rc = emlio_buf_add(p->out, s, strlen(s));
}

void
tool_influx_begin(tool_influx_point_t *p, emlio_buf_t *out,
                  const char *measurement)
{
    assert(p && out && measurement && *measurement);
    p->out = out;
    p->start = out->len;
    p->fields = 0;
    p->rc = 0;
    s_put_escaped(p, measurement, ", ");
}

void
tool_influx_tag(tool_influx_point_t *p, const char *key, const char *value)
{
    assert(p && key && *key && value && p->fields == 0);
    if (!*value)
        return;
    s_put(p, ",");
    s_put_escaped(p, key, ",= ");
    s_put(p, "=");
    s_put_escaped(p, value, ",= ");
}

/* Writes the separator and "key=" of the next field. */
static void
s_field_key(tool_influx_point_t *p, const char *key)
{
    assert(key && *key);
    s_put(p, p->fields++ ? "," : " ");
    s_put_escaped(p, key, ",= ");
    s_put(p, "=");
}

void
tool_influx_float(tool_influx_point_t *p, const char *key, double v)
{
    assert(p);
    if (!isfinite(v) || p->rc < 0)
        return;
    s_field_key(p, key);
    if (p->rc == 0)
        p->rc = emlio_buf_addf(p->out, "%.17g", v);
}

void
tool_influx_int(tool_influx_point_t *p, const char *key, int64_t v)
{
    assert(p);
    s_field_key(p, key);
    if (p->rc == 0)
        p->rc = emlio_buf_addf(p->out, "%" PRId64 "i", v);
}

void
tool_influx_str(tool_influx_point_t *p, const char *key, const char *v)
{
    assert(p && v);
    s_field_key(p, key);
    s_put(p, "\"");
    for (; *v && p->rc == 0; v++) {
        char c = (*v == '\n' || *v == '\r') ? ' ' : *v;
        if ((c == '"' || c == '\\') &&
            (p->rc = emlio_buf_add(p->out, "\\", 1)) < 0)
            break;
        p->rc = emlio_buf_add(p->out, &c, 1);
    }
    s_put(p, "\"");
}

int
tool_influx_end(tool_influx_point_t *p, int64_t ts_ns)
{
    assert(p);
    if (p->rc == 0 && p->fields == 0)
        p->rc = EMLIO_EINVAL;
    if (p->rc == 0 && ts_ns > 0)
        p->rc = emlio_buf_addf(p->out, " %" PRId64, ts_ns);
    s_put(p, "\n");
    if (p->rc < 0)
        p->out->len = p->start;
    return p->rc;
}

/* --- HTTP POST. --- */

static int
s_ms_left(uint64_t deadline_ns)
{
    uint64_t now = tool_now_ns();
    if (now >= deadline_ns)
        return 0;
    return (int)TOOL_MIN((deadline_ns - now) / 1000000u + 1, (uint64_t)INT_MAX);
}

/* Waits for events on fd until the deadline. 0, EMLIO_ETIMEDOUT or -errno. */
static int
s_wait(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        int ms = s_ms_left(deadline_ns);
        if (ms == 0)
            return EMLIO_ETIMEDOUT;
        struct pollfd pfd = { .fd = fd, .events = events };
        int n = poll(&pfd, 1, ms);
        if (n > 0)
            return 0;
        if (n == 0)
            return EMLIO_ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

/* Connects to one address without blocking past the deadline. Returns the
 * socket or < 0. */
static int
s_connect(const struct addrinfo *ai, uint64_t deadline_ns)
{
    int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai->ai_protocol);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS && errno != EINTR)
            rc = -errno;
        else if ((rc = s_wait(fd, POLLOUT, deadline_ns)) == 0) {
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                rc = -errno;
            else if (soerr)
                rc = -soerr;
        }
    }
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

static int
s_send_all(int fd, const uint8_t *data, size_t len, uint64_t deadline_ns)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int rc = s_wait(fd, POLLOUT, deadline_ns);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Reads the answer (at most cap - 1 bytes) until the peer closes, the
 * buffer fills or the headers of a 2xx answer are in. Returns the length
 * or < 0. */
static int
s_recv_answer(int fd, char *buf, size_t cap, uint64_t deadline_ns)
{
    size_t len = 0;
    while (len < cap - 1) {
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return len ? (int)len : -errno;
            int rc = s_wait(fd, POLLIN, deadline_ns);
            if (rc < 0)
                return len ? (int)len : rc;
            continue;
        }
        len += (size_t)n;
        buf[len] = '\0';
        if (len >= 12 && buf[9] == '2' && strstr(buf, "\r\n\r\n"))
            break;
    }
    buf[len] = '\0';
    return (int)len;
}

int
tool_influx_post(const tool_influx_url_t *url, const void *body, size_t len,
                 int timeout_ms, char *err)
{
    assert(url && (body || len == 0) && err);
    uint64_t deadline_ns =
        tool_now_ns() + (uint64_t)TOOL_MAX(timeout_ms, 1) * 1000000u;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)url->port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    struct addrinfo *res = NULL;
    int grc = getaddrinfo(url->host, port, &hints, &res);
    if (grc != 0)
        return tool_seterr(err, EMLIO_ENOTFOUND, "cannot resolve '%s': %s",
                           url->host, gai_strerror(grc));
    int fd = -1;
    int rc = -ECONNREFUSED;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = s_connect(ai, deadline_ns);
        if (fd < 0)
            rc = fd;
    }
    freeaddrinfo(res);
    bool v6 = strchr(url->host, ':') != NULL;
    if (fd < 0)
        return tool_seterr(err, rc, "cannot connect to '%s%s%s:%u': %s",
                           v6 ? "[" : "", url->host, v6 ? "]" : "",
                           (unsigned)url->port, emlio_strerror(rc));

    emlio_buf_t req = EMLIO_BUF_INIT;
    rc = emlio_buf_addf(&req,
                        "POST %s HTTP/1.1\r\nHost: %s%s%s:%u\r\n"
                        "User-Agent: emlio/%d.%d.%d\r\n"
                        "Content-Type: text/plain; charset=utf-8\r\n"
                        "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                        url->path, v6 ? "[" : "", url->host, v6 ? "]" : "",
                        (unsigned)url->port, EMLIO_VERSION_MAJOR,
                        EMLIO_VERSION_MINOR, EMLIO_VERSION_PATCH, len);
    if (rc == 0)
        rc = emlio_buf_add(&req, body, len);
    if (rc < 0) {
        emlio_buf_release(&req);
        close(fd);
        return tool_seterr(err, EMLIO_ENOMEM, "out of memory");
    }
    rc = s_send_all(fd, req.data, req.len, deadline_ns);
    emlio_buf_release(&req);
    char answer[1024];
    if (rc == 0)
        rc = s_recv_answer(fd, answer, sizeof(answer), deadline_ns);
    close(fd);
    if (rc < 0)
        return tool_seterr(err, rc, "cannot post to '%s:%u%s': %s", url->host,
                           (unsigned)url->port, url->path, emlio_strerror(rc));
    int status = 0;
    if (rc < 12 || strncmp(answer, "HTTP/1.", 7) != 0 || answer[8] != ' ' ||
        sscanf(answer + 9, "%3d", &status) != 1 || status < 100)
        return tool_seterr(err, EMLIO_EPROTO,
                           "'%s:%u%s' did not answer in HTTP", url->host,
                           (unsigned)url->port, url->path);
    if (status >= 200 && status < 300)
        return 0;
    /* Quote the body (InfluxDB explains itself there), on one line. */
    const char *text = strstr(answer, "\r\n\r\n");
    text = text ? text + 4 : "";
    char quoted[160];
    size_t q = 0;
    for (; *text && q < sizeof(quoted) - 1; text++)
        quoted[q++] = (*text == '\r' || *text == '\n') ? ' ' : *text;
    quoted[q] = '\0';
    return tool_seterr(err, EMLIO_EPROTO, "'%s:%u%s' answered %d%s%s",
                       url->host, (unsigned)url->port, url->path, status,
                       q ? ": " : "", quoted);
}
