/* metrics.c - Prometheus text exposition, a small poll-driven HTTP endpoint
 * and emliod's exporter (GET /metrics and periodic InfluxDB pushes).
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "influx.h"
#include "metrics.h"

/* --- Prometheus text format. --- */

static bool
s_name_char(char c, bool first, bool label)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return true;
    if (c == ':')
        return !label;
    return !first && c >= '0' && c <= '9';
}

bool
tool_metrics_name_ok(const char *name, bool label)
{
    if (!name || !*name || (label && name[0] == '_' && name[1] == '_'))
        return false;
    for (size_t i = 0; name[i]; i++)
        if (!s_name_char(name[i], i == 0, label))
            return false;
    return true;
}

/* Appends s, escaping '\' and newlines, and '"' too when quote is set. */
static int
s_add_escaped(emlio_buf_t *out, const char *s, bool quote)
{
    int rc = 0;
    for (; *s && rc == 0; s++) {
        if (*s == '\\')
            rc = emlio_buf_add(out, "\\\\", 2);
        else if (*s == '\n')
            rc = emlio_buf_add(out, "\\n", 2);
        else if (*s == '"' && quote)
            rc = emlio_buf_add(out, "\\\"", 2);
        else
            rc = emlio_buf_add(out, s, 1);
    }
    return rc;
}

int
tool_metrics_family(emlio_buf_t *out, const char *name, const char *type,
                    const char *help)
{
    assert(out && name && type && help);
    if (!tool_metrics_name_ok(name, false) ||
        (strcmp(type, "counter") && strcmp(type, "gauge") &&
         strcmp(type, "untyped")))
        return EMLIO_EINVAL;
    int rc = emlio_buf_addf(out, "# HELP %s ", name);
    if (rc == 0)
        rc = s_add_escaped(out, help, false);
    if (rc == 0)
        rc = emlio_buf_addf(out, "\n# TYPE %s %s\n", name, type);
    return rc;
}

/* Appends name{labels} and a space. */
static int
s_sample_head(emlio_buf_t *out, const char *name,
              const tool_metrics_label_t *labels, size_t n)
{
    if (!tool_metrics_name_ok(name, false))
        return EMLIO_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!tool_metrics_name_ok(labels[i].name, true) || !labels[i].value)
            return EMLIO_EINVAL;
    int rc = emlio_buf_add(out, name, strlen(name));
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = emlio_buf_addf(out, "%s%s=\"", i ? "," : "{", labels[i].name);
        if (rc == 0)
            rc = s_add_escaped(out, labels[i].value, true);
        if (rc == 0)
            rc = emlio_buf_add(out, "\"", 1);
    }
    if (rc == 0 && n > 0)
        rc = emlio_buf_add(out, "}", 1);
    if (rc == 0)
        rc = emlio_buf_add(out, " ", 1);
    return rc;
}

int
tool_metrics_sample(emlio_buf_t *out, const char *name,
                    const tool_metrics_label_t *labels, size_t n, double value)
{
    assert(out && (labels || n == 0));
    int rc = s_sample_head(out, name, labels, n);
    if (rc < 0)
        return rc;
    if (isnan(value))
        return emlio_buf_addf(out, "NaN\n");
    if (isinf(value))
        return emlio_buf_addf(out, "%sInf\n", value > 0 ? "+" : "-");
    return emlio_buf_addf(out, "%.15g\n", value);
}

int
tool_metrics_sample_u64(emlio_buf_t *out, const char *name,
                        const tool_metrics_label_t *labels, size_t n,
                        uint64_t value)
{
    assert(out && (labels || n == 0));
    int rc = s_sample_head(out, name, labels, n);
    return rc < 0 ? rc : emlio_buf_addf(out, "%" PRIu64 "\n", value);
}

/* --- HTTP request parsing. --- */

static bool
s_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Finds the line that starts at buf[pos]: sets *line_len to its length
 * without the line end and returns the position after the LF, or
 * EMLIO_EINCOMPLETE. A CR anywhere but right before the LF is EMLIO_EPROTO. */
static int
s_next_line(const char *buf, size_t len, size_t pos, size_t *line_len)
{
    const char *lf = memchr(buf + pos, '\n', len - pos);
    if (!lf)
        return EMLIO_EINCOMPLETE;
    size_t end = (size_t)(lf - buf);
    size_t n = end - pos;
    if (n > 0 && buf[end - 1] == '\r')
        n--;
    if (memchr(buf + pos, '\r', n))
        return EMLIO_EPROTO;
    *line_len = n;
    return (int)(end + 1);
}

static int
s_parse_request_line(tool_metrics_request_t *req, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s_tchar((unsigned char)s[i]))
        i++;
    if (i == 0 || i > 32 || i >= n || s[i] != ' ')
        return EMLIO_EPROTO;
    req->method = s;
    req->method_len = i++;
    size_t t = i;
    while (i < n && (unsigned char)s[i] > ' ' && (unsigned char)s[i] < 0x7f)
        i++;
    if (i == t || i >= n || s[i] != ' ')
        return EMLIO_EPROTO;
    req->target = s + t;
    req->target_len = i - t;
    i++;
    if (n - i != 8 || memcmp(s + i, "HTTP/1.", 7) != 0 || s[i + 7] < '0' ||
        s[i + 7] > '9')
        return EMLIO_EPROTO;
    req->minor_version = s[i + 7] - '0';
    return 0;
}

static int
s_check_header(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s_tchar((unsigned char)s[i]))
        i++;
    if (i == 0 || i >= n || s[i] != ':') /* no name, folded, or no ':' */
        return EMLIO_EPROTO;
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < ' ' && c != '\t') || c == 0x7f)
            return EMLIO_EPROTO;
    }
    return 0;
}

int
tool_metrics_parse_request(tool_metrics_request_t *req, const char *buf,
                           size_t len)
{
    assert(req && (buf || len == 0));
    memset(req, 0, sizeof(*req));
    /* Only the first MAX_REQUEST bytes may hold the head; a head that does
     * not end there is refused rather than buffered further. */
    size_t lim = TOOL_MIN(len, (size_t)TOOL_METRICS_MAX_REQUEST);
    bool capped = len >= TOOL_METRICS_MAX_REQUEST;
    size_t line_len = 0;
    int pos = s_next_line(buf, lim, 0, &line_len);
    if (pos == EMLIO_EINCOMPLETE) {
        /* Refuse garbage early instead of waiting for a line end. */
        if (lim > 0 && !s_tchar((unsigned char)buf[0]))
            return EMLIO_EPROTO;
        return capped ? EMLIO_EPROTO : EMLIO_EINCOMPLETE;
    }
    if (pos < 0)
        return pos;
    int rc = s_parse_request_line(req, buf, line_len);
    if (rc < 0)
        return rc;
    for (;;) {
        size_t start = (size_t)pos;
        pos = s_next_line(buf, lim, start, &line_len);
        if (pos == EMLIO_EINCOMPLETE)
            return capped ? EMLIO_EPROTO : EMLIO_EINCOMPLETE;
        if (pos < 0)
            return pos;
        if (line_len == 0)
            return pos;
        if ((rc = s_check_header(buf + start, line_len)) < 0)
            return rc;
    }
}

int
tool_metrics_route(const tool_metrics_request_t *req)
{
    assert(req);
    if (req->method_len != 3 || memcmp(req->method, "GET", 3) != 0)
        return 405;
    static const char path[] = "/metrics";
    size_t n = sizeof(path) - 1;
    if (req->target_len < n || memcmp(req->target, path, n) != 0 ||
        (req->target_len > n && req->target[n] != '?'))
        return 404;
    return 200;
}

/* --- The HTTP endpoint. --- */

typedef struct s_conn {
    int fd; /* -1: slot free */
    char in[TOOL_METRICS_MAX_REQUEST];
    size_t in_len;
    emlio_buf_t out;
    size_t out_off;
    bool answered; /* out holds the whole answer */
    uint64_t accepted_ns;
    uint64_t deadline_ns; /* for the head until answered, then for all */
} s_conn_t;

struct tool_metrics_http {
    tool_metrics_render_fn *fn;
    void *userdata;
    int lfd;
    int wake[2];
    pthread_t thread;
    bool started;
    atomic_bool quit;
    atomic_uint_fast64_t served;
    s_conn_t conns[TOOL_METRICS_MAX_CONNS];
    char address[80];
    char err[TOOL_ERRMSG_LEN];
};

tool_metrics_http_t *
tool_metrics_http_new(tool_metrics_render_fn *fn, void *userdata)
{
    assert(fn);
    tool_metrics_http_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->fn = fn;
    self->userdata = userdata;
    self->lfd = -1;
    self->wake[0] = self->wake[1] = -1;
    for (size_t i = 0; i < TOOL_METRICS_MAX_CONNS; i++)
        self->conns[i].fd = -1;
    atomic_init(&self->quit, false);
    atomic_init(&self->served, 0);
    return self;
}

static void
s_conn_close(s_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->in_len = 0;
    c->out_off = 0;
    c->answered = false;
    emlio_buf_release(&c->out);
}

void
tool_metrics_http_stop(tool_metrics_http_t *self)
{
    assert(self);
    if (!self->started)
        return;
    atomic_store(&self->quit, true);
    ssize_t n;
    do
        n = write(self->wake[1], "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(self->thread, NULL);
    self->started = false;
    for (size_t i = 0; i < TOOL_METRICS_MAX_CONNS; i++)
        s_conn_close(&self->conns[i]);
}

void
tool_metrics_http_destroy(tool_metrics_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tool_metrics_http_t *self = *self_p;
    tool_metrics_http_stop(self);
    if (self->lfd >= 0)
        close(self->lfd);
    for (int i = 0; i < 2; i++)
        if (self->wake[i] >= 0)
            close(self->wake[i]);
    free(self);
    *self_p = NULL;
}

/* Splits "HOST:PORT" or "[V6]:PORT" into host and port. 0 or EMLIO_EINVAL. */
static int
s_split_hostport(const char *hp, char *host, size_t host_cap, char *port,
                 size_t port_cap)
{
    const char *colon;
    const char *h = hp;
    size_t hn;
    if (hp[0] == '[') {
        const char *close_br = strchr(hp, ']');
        if (!close_br || close_br[1] != ':')
            return EMLIO_EINVAL;
        h = hp + 1;
        hn = (size_t)(close_br - h);
        colon = close_br + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || memchr(hp, ':', (size_t)(colon - hp)))
            return EMLIO_EINVAL;
        hn = (size_t)(colon - hp);
    }
    const char *p = colon + 1;
    size_t pn = strlen(p);
    if (hn == 0 || hn >= host_cap || pn == 0 || pn >= port_cap ||
        strspn(p, "0123456789") != pn || strtoul(p, NULL, 10) > 65535)
        return EMLIO_EINVAL;
    memcpy(host, h, hn);
    host[hn] = '\0';
    memcpy(port, p, pn + 1);
    return 0;
}

int
tool_metrics_http_bind(tool_metrics_http_t *self, const char *hostport)
{
    assert(self && hostport);
    if (self->lfd >= 0)
        return tool_seterr(self->err, EMLIO_ESTATE,
                           "cannot bind '%s': already bound", hostport);
    char host[256];
    char port[8];
    if (s_split_hostport(hostport, host, sizeof(host), port, sizeof(port)) < 0)
        return tool_seterr(self->err, EMLIO_EINVAL,
                           "invalid metrics address '%s': expected "
                           "HOST:PORT",
                           hostport);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    struct addrinfo *res = NULL;
    int grc = getaddrinfo(host, port, &hints, &res);
    if (grc != 0)
        return tool_seterr(self->err, EMLIO_ENOTFOUND,
                           "cannot resolve '%s': %s", host, gai_strerror(grc));
    int rc = -EADDRNOTAVAIL;
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family,
                    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 512) < 0) {
            rc = -errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return tool_seterr(self->err, rc, "cannot bind '%s': %s", hostport,
                           emlio_strerror(rc));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char text[INET6_ADDRSTRLEN] = "?";
    unsigned bound_port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
            bound_port = ntohs(a->sin6_port);
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
            bound_port = ntohs(a->sin_port);
        }
    }
    bool v6 = ss.ss_family == AF_INET6;
    snprintf(self->address, sizeof(self->address), "%s%s%s:%u", v6 ? "[" : "",
             text, v6 ? "]" : "", bound_port);
    self->lfd = fd;
    return 0;
}

const char *
tool_metrics_http_address(const tool_metrics_http_t *self)
{
    assert(self);
    return self->address;
}

uint64_t
tool_metrics_http_served(const tool_metrics_http_t *self)
{
    assert(self);
    return atomic_load(&((tool_metrics_http_t *)self)->served);
}

const char *
tool_metrics_http_errmsg(const tool_metrics_http_t *self)
{
    assert(self);
    return self->err;
}

static const char *
s_reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 431:
        return "Request Header Fields Too Large";
    default:
        return "Internal Server Error";
    }
}

/* Builds the whole answer into c->out. */
static void
s_answer(tool_metrics_http_t *self, s_conn_t *c, int status)
{
    emlio_buf_t body = EMLIO_BUF_INIT;
    if (status == 200 && self->fn(self->userdata, &body) < 0) {
        emlio_buf_clear(&body);
        status = 500;
    }
    if (status != 200 &&
        emlio_buf_addf(&body, "%d %s\n", status, s_reason(status)) < 0)
        status = 500;
    emlio_buf_clear(&c->out);
    int rc = emlio_buf_addf(
        &c->out,
        "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
        "%sConnection: close\r\n\r\n",
        status, s_reason(status),
        status == 200 ? TOOL_METRICS_CONTENT_TYPE : "text/plain; charset=utf-8",
        body.len, status == 405 ? "Allow: GET\r\n" : "");
    if (rc == 0 && body.len)
        rc = emlio_buf_add(&c->out, body.data, body.len);
    emlio_buf_release(&body);
    if (rc < 0)
        emlio_buf_clear(&c->out); /* nothing to say; the close says it */
    c->out_off = 0;
    c->answered = true;
    atomic_fetch_add(&self->served, 1);
}

/* Reads what the peer sent and answers once the head is in. Returns false
 * when the connection is to be closed. */
static bool
s_on_readable(tool_metrics_http_t *self, s_conn_t *c)
{
    for (;;) {
        if (c->in_len == sizeof(c->in)) {
            s_answer(self, c, 431);
            return true;
        }
        ssize_t n =
            recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
        if (n == 0)
            return false;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK;
        }
        c->in_len += (size_t)n;
        tool_metrics_request_t req;
        int rc = tool_metrics_parse_request(&req, c->in, c->in_len);
        if (rc == EMLIO_EINCOMPLETE)
            continue;
        if (rc < 0)
            s_answer(self, c,
                     c->in_len >= TOOL_METRICS_MAX_REQUEST ? 431 : 400);
        else
            s_answer(self, c, tool_metrics_route(&req));
        return true;
    }
}

/* Sends what is left of the answer. Returns false when done or failed. */
static bool
s_on_writable(s_conn_t *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_off,
                         c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    shutdown(c->fd, SHUT_WR);
    return false;
}

/* The slot for a new connection: a free one, else the one that has
 * waited longest for its request (else the oldest), closed. */
static s_conn_t *
s_slot(tool_metrics_http_t *self)
{
    s_conn_t *victim = NULL;
    for (size_t i = 0; i < TOOL_METRICS_MAX_CONNS; i++) {
        s_conn_t *c = &self->conns[i];
        if (c->fd < 0)
            return c;
        bool better = !victim || (victim->answered && !c->answered) ||
                      (victim->answered == c->answered &&
                       c->accepted_ns < victim->accepted_ns);
        if (better)
            victim = c;
    }
    s_conn_close(victim);
    return victim;
}

/* Accepts what is waiting (a bounded number per round, so the thread
 * keeps serving): peers that only connect cannot fill the endpoint. */
static void
s_accept(tool_metrics_http_t *self)
{
    for (int k = 0; k < 4 * TOOL_METRICS_MAX_CONNS; k++) {
        int fd = accept4(self->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or a transient error: poll again */
        s_conn_t *c = s_slot(self);
        uint64_t now = tool_now_ns();
        c->fd = fd;
        c->in_len = 0;
        c->answered = false;
        c->accepted_ns = now;
        c->deadline_ns = now + (uint64_t)TOOL_METRICS_READ_MS * 1000000u;
        /* A scraper sends its request with the connection: read and
         * answer it now, before later arrivals of this batch could take
         * its slot. */
        bool keep = s_on_readable(self, c);
        if (keep && c->answered) {
            c->deadline_ns = now + (uint64_t)TOOL_METRICS_CONN_MS * 1000000u;
            keep = s_on_writable(c);
        }
        if (!keep)
            s_conn_close(c);
    }
}

static void *
s_http_main(void *arg)
{
    tool_metrics_http_t *self = arg;
    struct pollfd pfd[2 + TOOL_METRICS_MAX_CONNS];
    size_t slot[2 + TOOL_METRICS_MAX_CONNS];
    while (!atomic_load(&self->quit)) {
        size_t n = 0;
        pfd[n++] = (struct pollfd){ .fd = self->wake[0], .events = POLLIN };
        uint64_t now = tool_now_ns();
        uint64_t next = now + 1000000000u;
        for (size_t i = 0; i < TOOL_METRICS_MAX_CONNS; i++) {
            s_conn_t *c = &self->conns[i];
            if (c->fd < 0)
                continue;
            if (now >= c->deadline_ns) {
                s_conn_close(c);
                continue;
            }
            next = TOOL_MIN(next, c->deadline_ns);
            slot[n] = i;
            pfd[n++] =
                (struct pollfd){ .fd = c->fd,
                                 .events = c->answered ? POLLOUT : POLLIN };
        }
        size_t lidx = n;
        /* A full endpoint still accepts (s_slot). */
        pfd[n++] = (struct pollfd){ .fd = self->lfd, .events = POLLIN };
        int ms = (int)((next - now) / 1000000u) + 1;
        int rc = poll(pfd, n, ms);
        if (rc < 0 && errno != EINTR)
            break; /* cannot happen with valid descriptors */
        if (rc <= 0)
            continue;
        if (pfd[0].revents) {
            char drain[16];
            while (read(self->wake[0], drain, sizeof(drain)) > 0)
                ;
        }
        for (size_t k = 1; k < lidx; k++) {
            if (!pfd[k].revents)
                continue;
            s_conn_t *c = &self->conns[slot[k]];
            bool keep;
            if (!c->answered) {
                keep = (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)) &&
                       s_on_readable(self, c);
                if (keep && c->answered) {
                    /* Answered: the rest of its life to read it. */
                    c->deadline_ns = c->accepted_ns +
                                     (uint64_t)TOOL_METRICS_CONN_MS * 1000000u;
                    keep = s_on_writable(c);
                }
            } else {
                keep = s_on_writable(c);
            }
            if (!keep)
                s_conn_close(c);
        }
        if (lidx < n && (pfd[lidx].revents & POLLIN))
            s_accept(self);
    }
    return NULL;
}

int
tool_metrics_http_start(tool_metrics_http_t *self)
{
    assert(self);
    if (self->lfd < 0 || self->started)
        return tool_seterr(self->err, EMLIO_ESTATE,
                           "cannot start the metrics endpoint: %s",
                           self->started ? "it already runs" : "not bound");
    if (self->wake[0] < 0 && pipe2(self->wake, O_NONBLOCK | O_CLOEXEC) < 0)
        return tool_seterr(self->err, -errno, "cannot create a pipe: %s",
                           strerror(errno));
    atomic_store(&self->quit, false);
    int rc = pthread_create(&self->thread, NULL, s_http_main, self);
    if (rc != 0)
        return tool_seterr(self->err, -rc,
                           "cannot start the metrics thread: %s", strerror(rc));
    self->started = true;
    return 0;
}

/* --- Process figures. --- */

double
tool_metrics_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

uint64_t
tool_metrics_rss_bytes(void)
{
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[128];
    ssize_t n;
    do
        n = read(fd, buf, sizeof(buf) - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    unsigned long long size = 0;
    unsigned long long resident = 0;
    if (sscanf(buf, "%llu %llu", &size, &resident) != 2)
        return 0;
    long page = sysconf(_SC_PAGESIZE);
    return (uint64_t)resident * (uint64_t)(page > 0 ? page : 4096);
}

/* --- emliod's exporter. --- */

struct tool_metrics {
    emlio_ctx_t *ctx;
    emlio_server_t *srv;
    tool_metrics_http_t *http;
    uint64_t t0_ns;
    char host[256];

    /* The meter runs from start to destroy; lock serialises its use by the
     * endpoint and the pusher (a meter is used by one thread at a time). */
    emlio_energy_t *meter;
    bool meter_ok;
    uint64_t disk_metered; /* device bytes already given to its disk term */
    pthread_mutex_t lock;

    bool influx;
    tool_influx_url_t url;
    char *url_text;
    double interval_s;
    pthread_t pusher;
    bool pusher_started;
    pthread_mutex_t plock;
    pthread_cond_t pwake;
    bool pquit;
    bool push_failing;

    char err[TOOL_ERRMSG_LEN];
};

static int
s_render_cb(void *userdata, emlio_buf_t *out)
{
    return tool_metrics_render(userdata, out);
}

tool_metrics_t *
tool_metrics_new(emlio_ctx_t *ctx, emlio_server_t *srv)
{
    assert(ctx && srv);
    tool_metrics_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->ctx = ctx;
    self->srv = srv;
    self->meter = emlio_energy_new();
    pthread_condattr_t ca;
    bool ca_ok = pthread_condattr_init(&ca) == 0;
    if (ca_ok)
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (!self->meter || !ca_ok || pthread_mutex_init(&self->lock, NULL) != 0) {
        if (ca_ok)
            pthread_condattr_destroy(&ca);
        emlio_energy_destroy(&self->meter);
        free(self);
        return NULL;
    }
    pthread_mutex_init(&self->plock, NULL);
    pthread_cond_init(&self->pwake, &ca);
    pthread_condattr_destroy(&ca);
    if (gethostname(self->host, sizeof(self->host) - 1) != 0)
        snprintf(self->host, sizeof(self->host), "unknown");
    self->t0_ns = tool_now_ns();
    return self;
}

void
tool_metrics_destroy(tool_metrics_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tool_metrics_t *self = *self_p;
    tool_metrics_http_destroy(&self->http);
    if (self->pusher_started) {
        pthread_mutex_lock(&self->plock);
        self->pquit = true;
        pthread_cond_signal(&self->pwake);
        pthread_mutex_unlock(&self->plock);
        pthread_join(self->pusher, NULL);
    }
    emlio_energy_destroy(&self->meter);
    pthread_mutex_destroy(&self->lock);
    pthread_mutex_destroy(&self->plock);
    pthread_cond_destroy(&self->pwake);
    free(self->url_text);
    free(self);
    *self_p = NULL;
}

int
tool_metrics_set_powercap_root(tool_metrics_t *self, const char *root)
{
    assert(self);
    return emlio_energy_set_powercap_root(self->meter, root);
}

int
tool_metrics_listen(tool_metrics_t *self, const char *hostport)
{
    assert(self && hostport);
    if (!self->http && !(self->http = tool_metrics_http_new(s_render_cb, self)))
        return tool_seterr(self->err, EMLIO_ENOMEM, "out of memory");
    int rc = tool_metrics_http_bind(self->http, hostport);
    if (rc < 0)
        return tool_seterr(self->err, rc, "%s",
                           tool_metrics_http_errmsg(self->http));
    return 0;
}

int
tool_metrics_set_influx(tool_metrics_t *self, const char *url,
                        double interval_s)
{
    assert(self && url);
    if (!(interval_s >= 0.05 && interval_s <= 86400))
        return tool_seterr(self->err, EMLIO_EINVAL,
                           "invalid influx interval %g: expected 0.05 to "
                           "86400 seconds",
                           interval_s);
    int rc = tool_influx_url_parse(&self->url, url, self->err);
    if (rc < 0)
        return rc;
    free(self->url_text);
    if (!(self->url_text = strdup(url)))
        return tool_seterr(self->err, EMLIO_ENOMEM, "out of memory");
    self->influx = true;
    self->interval_s = interval_s;
    return 0;
}

const char *
tool_metrics_address(const tool_metrics_t *self)
{
    assert(self);
    return self->http ? tool_metrics_http_address(self->http) : "";
}

const char *
tool_metrics_errmsg(const tool_metrics_t *self)
{
    assert(self);
    return self->err;
}

/* What one scrape or push reports. */
typedef struct s_snapshot {
    emlio_server_stats_t st;
    double cpu_s;
    uint64_t rss;
    double uptime_s;
    bool energy;
    emlio_energy_report_t rep;
} s_snapshot_t;

static void
s_snapshot(tool_metrics_t *self, s_snapshot_t *s)
{
    emlio_server_stats(self->srv, &s->st);
    s->cpu_s = tool_metrics_cpu_s();
    s->rss = tool_metrics_rss_bytes();
    s->uptime_s = (double)(tool_now_ns() - self->t0_ns) / 1e9;
    pthread_mutex_lock(&self->lock);
    /* What the block layer read for the daemon since the last look goes
     * to the meter's disk term (a labelled estimate: docs/energy.md). */
    if (self->meter_ok && s->st.disk_read_bytes > self->disk_metered) {
        emlio_energy_add_disk_bytes(self->meter,
                                    s->st.disk_read_bytes - self->disk_metered);
        self->disk_metered = s->st.disk_read_bytes;
    }
    s->energy = self->meter_ok && emlio_energy_read(self->meter, &s->rep) == 0;
    pthread_mutex_unlock(&self->lock);
}

/* One metric family with one unlabelled sample. */
static int
s_family_u64(emlio_buf_t *out, const char *name, const char *type,
             const char *help, uint64_t v)
{
    int rc = tool_metrics_family(out, name, type, help);
    return rc < 0 ? rc : tool_metrics_sample_u64(out, name, NULL, 0, v);
}

static int
s_family_f64(emlio_buf_t *out, const char *name, const char *type,
             const char *help, double v)
{
    int rc = tool_metrics_family(out, name, type, help);
    return rc < 0 ? rc : tool_metrics_sample(out, name, NULL, 0, v);
}

/* The per-job families (docs/fairness.md): one sample per job known now,
 * labelled job="NAME" (names are printable: the label escapes the rest). */
static int
s_render_jobs(tool_metrics_t *self, emlio_buf_t *out)
{
    size_t cap = 64, n;
    emlio_server_job_t *jobs = NULL;
    for (;;) {
        emlio_server_job_t *grown = realloc(jobs, cap * sizeof(*jobs));
        if (!grown) {
            free(jobs);
            return -1;
        }
        jobs = grown;
        n = emlio_server_jobs(self->srv, jobs, cap);
        if (n <= cap)
            break;
        cap = n + 16; /* more arrived: room for them and a few more */
    }

    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        { "emlio_job_bytes_total", "counter", "Reply bytes sent to the job" },
        { "emlio_job_requests_total", "counter", "GETs admitted for the job" },
        { "emlio_job_samples_total", "counter", "Samples the job asked for" },
        { "emlio_job_disk_read_bytes_total", "counter",
          "Bytes read from the file system for the job (--io read)" },
        { "emlio_job_shared_bytes_total", "counter",
          "Of the job's bytes, those copied from reads other jobs made" },
        { "emlio_job_wait_seconds_total", "counter",
          "Time the job's GETs waited for their turn (--schedule fair)" },
        { "emlio_job_weight", "gauge", "The job's weight in force" },
        { "emlio_job_streams", "gauge", "Connections of the job" },
        { "emlio_job_queued", "gauge",
          "The job's GETs waiting for their turn" },
    };

    int rc = 0;
    for (size_t f = 0; f < TOOL_ARRAY_SIZE(fam) && rc == 0 && n; f++) {
        rc = tool_metrics_family(out, fam[f].name, fam[f].type, fam[f].help);
        for (size_t i = 0; i < n && rc == 0; i++) {
            const emlio_server_job_t *j = &jobs[i];
            const tool_metrics_label_t l[] = { { "job", j->name } };
            double v[] = { (double)j->bytes,        (double)j->requests,
                           (double)j->samples,      (double)j->disk_bytes,
                           (double)j->shared_bytes, (double)j->wait_ns / 1e9,
                           (double)j->weight,       (double)j->streams,
                           (double)j->queued };
            rc = tool_metrics_sample(out, fam[f].name, l, 1, v[f]);
        }
    }
    free(jobs);
    return rc;
}

int
tool_metrics_render(tool_metrics_t *self, emlio_buf_t *out)
{
    assert(self && out);
    s_snapshot_t s;
    s_snapshot(self, &s);
    char version[32];
    snprintf(version, sizeof(version), "%d.%d.%d", EMLIO_VERSION_MAJOR,
             EMLIO_VERSION_MINOR, EMLIO_VERSION_PATCH);
    const tool_metrics_label_t info[] = {
        { "version", version },
        { "endpoint", emlio_server_endpoint(self->srv) },
        { "dataset", emlio_server_dataset(self->srv) },
    };
    int rc = tool_metrics_family(out, "emlio_info", "gauge",
                                 "Build and dataset of this emliod");
    if (rc == 0)
        rc = tool_metrics_sample(out, "emlio_info", info, TOOL_ARRAY_SIZE(info),
                                 1);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_requests_total", "counter",
                          "GET requests answered with a batch", s.st.requests);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_errors_total", "counter",
                          "Requests answered with an error", s.st.errors);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_samples_total", "counter", "Samples sent",
                          s.st.samples);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_sent_bytes_total", "counter",
                          "Sample bytes sent", s.st.bytes);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_packed_bytes_total", "counter",
                          "Sample bytes sent inside packed frames (--pack)",
                          s.st.packed_bytes);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_disk_read_bytes_total", "counter",
                          "Bytes emliod caused the block layer to read "
                          "(/proc/self/io read_bytes)",
                          s.st.disk_read_bytes);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_reads_total", "counter",
                          "Exact-size record reads staged (--io read)",
                          s.st.io_reads);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_read_bytes_total", "counter",
                          "Bytes of the exact-size record reads (--io read)",
                          s.st.io_read_bytes);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_errors_total", "counter",
                          "Exact-size reads that failed or came short",
                          s.st.io_errors);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_ahead_bytes_total", "counter",
                          "Bytes read ahead for requests queued behind the "
                          "one being served (--io read)",
                          s.st.io_ahead_bytes);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_direct_reads_total", "counter",
                          "Exact-size reads past the page cache (O_DIRECT)",
                          s.st.io_direct_reads);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_fixed_reads_total", "counter",
                          "Exact-size reads into buffers registered with "
                          "io_uring (no page pinning per read)",
                          s.st.io_fixed_reads);
    if (rc == 0)
        rc =
            s_family_f64(out, "emlio_server_io_wait_seconds_total", "counter",
                         "Reader time spent waiting for the device (--io "
                         "read); its rate over readers is the disk-bound share",
                         (double)s.st.io_wait_ns / 1e9);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_read_mode", "gauge",
                          "1 when records are read with exact-size reads "
                          "(--io read or auto for a dataset larger than "
                          "memory), 0 when served from the mappings",
                          s.st.io_read);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_mapped_shards", "gauge",
                          "Shards served from their mappings while the "
                          "dataset is read (--io auto: their pages are "
                          "resident in the page cache)",
                          s.st.io_mapped_shards);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_server_io_switches_total", "counter",
                          "Changes between map and read made by --io auto "
                          "while serving (the memory the daemon may use "
                          "changed)",
                          s.st.io_switches);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_corrupt_skipped_total", "counter",
                          "Corrupt records left out (--on-corrupt skip)",
                          s.st.corrupt_skipped);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_clients_total", "counter",
                          "Client connections (HELLOs answered)", s.st.clients);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_clients", "gauge",
                          "Clients known now (a client's streams join its "
                          "session and count once)",
                          s.st.active_clients);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_streams", "gauge",
                          "Client connections (TCP streams) known now",
                          s.st.active_streams);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_shards", "gauge", "Shards served",
                          emlio_server_shard_count(self->srv));
    if (rc == 0)
        rc = s_family_u64(out, "emlio_records", "gauge", "Records served",
                          emlio_server_record_count(self->srv));
    if (rc == 0)
        rc = s_family_f64(out, "emlio_process_cpu_seconds_total", "counter",
                          "User and system CPU time of emliod", s.cpu_s);
    if (rc == 0)
        rc = s_family_u64(out, "emlio_process_resident_memory_bytes", "gauge",
                          "Resident set size of emliod", s.rss);
    if (rc == 0)
        rc = s_family_f64(out, "emlio_uptime_seconds", "gauge",
                          "Seconds since the exporter started", s.uptime_s);
    if (rc == 0 && s.energy) {
        const tool_metrics_label_t src[] = { { "source", s.rep.source } };
        rc = tool_metrics_family(
            out, "emlio_energy_joules_total", "counter",
            "Energy since emliod started (source model is an estimate)");
        if (rc == 0)
            rc = tool_metrics_sample(out, "emlio_energy_joules_total", src, 1,
                                     s.rep.energy_j);
        if (rc == 0)
            rc = tool_metrics_family(out, "emlio_energy_domain_joules_total",
                                     "counter",
                                     "Energy per domain since emliod started");
        for (size_t i = 0; i < s.rep.n_domains && rc == 0; i++) {
            const emlio_energy_domain_t *d = &s.rep.domains[i];
            const tool_metrics_label_t dl[] = {
                { "domain", d->name },
                { "source", d->source },
                { "in_total", d->in_total ? "true" : "false" },
            };
            rc = tool_metrics_sample(out, "emlio_energy_domain_joules_total",
                                     dl, TOOL_ARRAY_SIZE(dl), d->joules);
        }
    }
    if (rc == 0)
        rc = s_render_jobs(self, out);
    return rc;
}

static int64_t
s_i64(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

int
tool_metrics_point(tool_metrics_t *self, emlio_buf_t *out)
{
    assert(self && out);
    s_snapshot_t s;
    s_snapshot(self, &s);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tool_influx_point_t p;
    tool_influx_begin(&p, out, "emlio_server");
    tool_influx_tag(&p, "host", self->host);
    tool_influx_tag(&p, "endpoint", emlio_server_endpoint(self->srv));
    tool_influx_int(&p, "requests", s_i64(s.st.requests));
    tool_influx_int(&p, "errors", s_i64(s.st.errors));
    tool_influx_int(&p, "samples", s_i64(s.st.samples));
    tool_influx_int(&p, "bytes", s_i64(s.st.bytes));
    tool_influx_int(&p, "corrupt_skipped", s_i64(s.st.corrupt_skipped));
    tool_influx_int(&p, "packed_bytes", s_i64(s.st.packed_bytes));
    tool_influx_int(&p, "clients", s_i64(s.st.clients));
    tool_influx_float(&p, "cpu_s", s.cpu_s);
    tool_influx_int(&p, "rss_bytes", s_i64(s.rss));
    tool_influx_float(&p, "uptime_s", s.uptime_s);
    if (s.energy)
        tool_influx_float(&p, "energy_j", s.rep.energy_j);
    tool_influx_str(&p, "energy_source", s.energy ? s.rep.source : "none");
    return tool_influx_end(&p, (int64_t)ts.tv_sec * 1000000000 +
                                   (int64_t)ts.tv_nsec);
}

/* Pushes one point; logs the first failure and the recovery, not every
 * failure of an InfluxDB that stays down. */
static void
s_push(tool_metrics_t *self)
{
    emlio_buf_t body = EMLIO_BUF_INIT;
    char err[TOOL_ERRMSG_LEN] = "out of memory";
    int timeout_ms =
        (int)TOOL_MIN(TOOL_MAX(self->interval_s * 1000, 200), 5000);
    int rc = tool_metrics_point(self, &body);
    if (rc == 0)
        rc = tool_influx_post(&self->url, body.data, body.len, timeout_ms, err);
    emlio_buf_release(&body);
    if (rc < 0 && !self->push_failing)
        tool_log(self->ctx, EMLIO_LOG_WARN, "metrics",
                 "cannot push to '%s': %s (will retry every %gs)",
                 self->url_text, err, self->interval_s);
    else if (rc == 0 && self->push_failing)
        tool_log(self->ctx, EMLIO_LOG_INFO, "metrics", "pushing to '%s' again",
                 self->url_text);
    else if (rc < 0)
        tool_log(self->ctx, EMLIO_LOG_DEBUG, "metrics",
                 "cannot push to '%s': %s", self->url_text, err);
    self->push_failing = rc < 0;
}

static void *
s_pusher_main(void *arg)
{
    tool_metrics_t *self = arg;
    uint64_t step = (uint64_t)(self->interval_s * 1e9);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&self->plock);
    while (!self->pquit) {
        uint64_t ns = (uint64_t)next.tv_nsec + step;
        next.tv_sec += (time_t)(ns / 1000000000u);
        next.tv_nsec = (long)(ns % 1000000000u);
        int rc = 0;
        while (!self->pquit && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&self->pwake, &self->plock, &next);
        if (self->pquit)
            break;
        pthread_mutex_unlock(&self->plock);
        s_push(self);
        pthread_mutex_lock(&self->plock);
        /* After a slow push, skip the missed ticks instead of bursting. */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec ||
            (now.tv_sec == next.tv_sec && now.tv_nsec > next.tv_nsec))
            next = now;
    }
    pthread_mutex_unlock(&self->plock);
    s_push(self); /* the figures of the last interval */
    return NULL;
}

int
tool_metrics_start(tool_metrics_t *self)
{
    assert(self);
    self->t0_ns = tool_now_ns();
    int rc = emlio_energy_start(self->meter);
    self->meter_ok = rc == 0;
    if (rc < 0)
        tool_log(self->ctx, EMLIO_LOG_WARN, "metrics",
                 "cannot measure energy, leaving it out: %s",
                 emlio_energy_errmsg(self->meter));
    else if (*emlio_energy_notes(self->meter))
        tool_log(self->ctx, EMLIO_LOG_INFO, "metrics", "energy: %s",
                 emlio_energy_notes(self->meter));
    if (self->http && (rc = tool_metrics_http_start(self->http)) < 0)
        return tool_seterr(self->err, rc, "%s",
                           tool_metrics_http_errmsg(self->http));
    if (self->influx && !self->pusher_started) {
        rc = pthread_create(&self->pusher, NULL, s_pusher_main, self);
        if (rc != 0)
            return tool_seterr(self->err, -rc,
                               "cannot start the influx thread: %s",
                               strerror(rc));
        self->pusher_started = true;
    }
    return 0;
}
