/* relay.c - a TCP relay that holds every byte for a fixed one-way delay and
 * can cap each direction's rate: RTT emulation where the kernel has no netem.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "relay.h"

/* One read lands in one carrier: a pre-touched heap block (copy mode) or a
 * kernel pipe (splice mode). Carriers are pooled and never freed before
 * exit, because a fresh page fault costs ~16 us on our VMs. */
#define S_BLOCK_LEN  (256u * 1024u)
#define S_PIPE_LEN   (1024u * 1024u)
#define S_MIN_ROOM   (32u * 1024u) /* take a fresh carrier below this */
#define S_PREALLOC   16            /* carriers made at bind time */
#define S_READS_EACH 4             /* reads per readiness event (fairness) */
#define S_IOV_MAX    64
#define S_HIST_US    20000 /* lateness histogram: 1 us bins up to 20 ms */
#define S_TOKEN_MIN  (16u * 1024u) /* smallest rate-limited write */
#define S_BURST_MIN  (64u * 1024u)
#define S_MAX_EVENTS 256
#define S_NONE       UINT64_MAX
#define S_EV_LISTEN  (UINT64_MAX - 1)
#define S_EV_STOP    (UINT64_MAX - 2)
#define S_NO_CARRIER UINT32_MAX

typedef struct {
    char *data; /* copy mode: S_BLOCK_LEN bytes */
    int rfd;    /* splice mode: pipe ends, -1 until made */
    int wfd;
    size_t used;    /* bytes put in since it was last empty */
    size_t pending; /* bytes put in and not yet sent */
    uint32_t next_free;
    bool pooled;
} s_carrier_t;

/* A run of bytes from one read, due at due_ns. */
typedef struct {
    uint32_t carrier;
    uint32_t off; /* copy mode: offset in the block */
    uint32_t len;
    uint32_t sent;
    uint64_t due_ns;
    bool timed; /* its lateness has been recorded */
} s_seg_t;

/* One direction of a connection: reads fd[i], writes fd[1 - i]. */
typedef struct {
    s_seg_t *segs; /* ring */
    uint32_t seg_cap;
    uint32_t head;
    uint32_t count;
    uint32_t tail; /* carrier being filled, or S_NO_CARRIER */
    size_t buffered;
    bool reading;  /* wants EPOLLIN on its source */
    bool eof_in;   /* source said EOF at eof_due - delay */
    bool shut_out; /* EOF passed on with shutdown(SHUT_WR) */
    bool blocked;  /* destination returned EAGAIN; waits for EPOLLOUT */
    uint64_t eof_due;
    double tokens;
    uint64_t tok_ns;
    uint64_t wake_ns;  /* waiting for tokens until then; 0 = not */
    uint64_t ready_ns; /* when the direction last became able to send */
} s_dir_t;

typedef struct {
    int fd[2]; /* 0: accepted client, 1: upstream */
    uint32_t mask[2];
    bool registered[2];
    bool connecting;
    bool dead;
    uint32_t slot;
    uint32_t live_idx;
    s_dir_t dir[2];
} s_conn_t;

typedef struct {
    uint64_t hist[S_HIST_US + 1];
    uint64_t n;
    uint64_t max_ns;
} s_late_t;

struct relay {
    relay_opts_t opts;
    char err[512];
    char endpoint[96];
    struct sockaddr_storage connect_addr;
    unsigned connect_len;
    int lfd;
    int epfd;
    bool accepting;
    uint64_t delay_ns;
    uint64_t spin_ns;
    double rate_bps; /* bytes per second, 0 = unlimited */
    double burst;
    size_t bound;

    s_conn_t **slots; /* max_conns entries, NULL when free */
    s_conn_t **live;  /* dense list of open connections */
    uint32_t nlive;
    s_conn_t **dead; /* closed this batch, freed after it */
    uint32_t ndead;

    s_carrier_t *car;
    uint32_t ncar;
    uint32_t car_cap;
    uint32_t free_car;

    uint64_t bytes[2]; /* 0: client to server, 1: server to client */
    uint64_t chunks;
    uint64_t conns_total;
    uint64_t conns_failed;
    s_late_t late_all;
    s_late_t late_iv;
    uint64_t start_ns;
    uint64_t iv_start_ns;
    uint64_t iv_bytes;
    double cpu0;
};

static double
s_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

void
relay_opts_init(relay_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->max_conns = 1024;
    opts->max_buffer = 64u * 1024u * 1024u;
    opts->spin_us = 150;
    /* Copy mode by default: measured as cheap as splice here (the TCP stack
     * dominates), and it needs no pipe descriptors per held chunk. */
    opts->mode = RELAY_COPY;
    opts->log = stderr;
}

int
relay_parse_addr(const char *text, struct sockaddr_storage *addr,
                 unsigned *addr_len, char *err, size_t err_len)
{
    char host[256];
    const char *port_s;
    size_t host_len;

    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':') {
            snprintf(err, err_len, "expected [HOST]:PORT");
            return -1;
        }
        host_len = (size_t)(close - text - 1);
        memcpy(host, text + 1, TOOL_MIN(host_len, sizeof(host) - 1));
        port_s = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon) {
            snprintf(err, err_len, "expected HOST:PORT");
            return -1;
        }
        host_len = (size_t)(colon - text);
        memcpy(host, text, TOOL_MIN(host_len, sizeof(host) - 1));
        port_s = colon + 1;
    }
    if (host_len == 0 || host_len >= sizeof(host)) {
        snprintf(err, err_len,
                 host_len ? "host name too long" : "missing host");
        return -1;
    }
    host[host_len] = '\0';

    long port = 0;
    if (!*port_s || strlen(port_s) > 5)
        port = -1;
    for (const char *p = port_s; port >= 0 && *p; p++)
        port = (*p >= '0' && *p <= '9') ? port * 10 + (*p - '0') : -1;
    if (port < 0 || port > 65535) {
        snprintf(err, err_len, "invalid port");
        return -1;
    }

    struct addrinfo hints;
    struct addrinfo *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, err_len, "cannot resolve '%s': %s", host,
                 rc ? gai_strerror(rc) : "no address");
        return -1;
    }
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *addr_len = (unsigned)res->ai_addrlen;
    if (addr->ss_family == AF_INET)
        ((struct sockaddr_in *)addr)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)addr)->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

relay_t *
relay_new(const relay_opts_t *opts)
{
    relay_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->opts = *opts;
    if (self->opts.max_conns < 1)
        self->opts.max_conns = 1;
    self->lfd = -1;
    self->epfd = -1;
    self->free_car = S_NO_CARRIER;
    self->slots = calloc((size_t)self->opts.max_conns, sizeof(void *));
    self->live = calloc((size_t)self->opts.max_conns, sizeof(void *));
    self->dead = calloc((size_t)self->opts.max_conns, sizeof(void *));
    if (!self->slots || !self->live || !self->dead) {
        relay_destroy(&self);
        return NULL;
    }
    self->delay_ns = (uint64_t)(opts->delay_ms * 1e6);
    self->spin_ns = (uint64_t)opts->spin_us * 1000u;
    self->rate_bps = opts->rate_mbit * 1e6 / 8;
    if (self->rate_bps > 0) {
        /* A millisecond's worth lets writes stay large at high rates. */
        self->burst = TOOL_MAX((double)S_BURST_MIN, self->rate_bps / 1000);
        /* Hold a bit more than the bandwidth-delay product: enough to keep
         * the line full, little enough to stay bounded. */
        double bdp = self->rate_bps * (double)self->delay_ns / 1e9;
        double want = 2 * bdp + 4 * self->burst + 1024 * 1024;
        self->bound = (size_t)TOOL_MIN(want, (double)opts->max_buffer);
    } else {
        self->bound = opts->max_buffer;
    }
    if (self->bound < S_BLOCK_LEN)
        self->bound = S_BLOCK_LEN;
    return self;
}

const char *
relay_errmsg(const relay_t *self)
{
    return self->err;
}

const char *
relay_endpoint(const relay_t *self)
{
    return self->endpoint;
}

/* ---- carriers ---------------------------------------------------------- */

/* Makes carrier i usable: touches a block's pages or opens its pipe. */
static int
s_carrier_fill(relay_t *self, s_carrier_t *c)
{
    if (self->opts.mode == RELAY_COPY) {
        if (c->data)
            return 0;
        c->data = aligned_alloc(4096, S_BLOCK_LEN);
        if (!c->data)
            return -ENOMEM;
        memset(c->data, 0, S_BLOCK_LEN); /* pay the page faults once, now */
        return 0;
    }
    if (c->rfd >= 0)
        return 0;
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
        return -errno;
    /* Best effort: a smaller pipe only means smaller chunks. */
    (void)fcntl(p[1], F_SETPIPE_SZ, (int)S_PIPE_LEN);
    c->rfd = p[0];
    c->wfd = p[1];
    return 0;
}

static size_t
s_carrier_cap(const relay_t *self)
{
    return self->opts.mode == RELAY_COPY ? S_BLOCK_LEN : S_PIPE_LEN;
}

/* Returns a pooled carrier's index, or S_NO_CARRIER with errno set. */
static uint32_t
s_carrier_get(relay_t *self)
{
    uint32_t i = self->free_car;
    if (i == S_NO_CARRIER) {
        if (self->ncar == self->car_cap) {
            uint32_t cap = self->car_cap ? self->car_cap * 2 : 64;
            s_carrier_t *car = reallocarray(self->car, cap, sizeof(*car));
            if (!car) {
                errno = ENOMEM;
                return S_NO_CARRIER;
            }
            self->car = car;
            self->car_cap = cap;
        }
        i = self->ncar++;
        memset(&self->car[i], 0, sizeof(self->car[i]));
        self->car[i].rfd = -1;
        self->car[i].wfd = -1;
    } else {
        self->free_car = self->car[i].next_free;
    }
    s_carrier_t *c = &self->car[i];
    c->pooled = false;
    c->used = 0;
    c->pending = 0;
    int rc = s_carrier_fill(self, c);
    if (rc < 0) {
        c->pooled = true;
        c->next_free = self->free_car;
        self->free_car = i;
        errno = -rc;
        return S_NO_CARRIER;
    }
    return i;
}

/* Returns carrier i to the pool. A pipe that may still hold bytes (its
 * connection was torn down) is closed and remade on next use. */
static void
s_carrier_put(relay_t *self, uint32_t i, bool dirty)
{
    s_carrier_t *c = &self->car[i];
    if (c->pooled)
        return;
    if (dirty && c->rfd >= 0) {
        close(c->rfd);
        close(c->wfd);
        c->rfd = -1;
        c->wfd = -1;
    }
    c->pooled = true;
    c->used = 0;
    c->pending = 0;
    c->next_free = self->free_car;
    self->free_car = i;
}

/* ---- stats ------------------------------------------------------------- */

static void
s_late_add(s_late_t *l, uint64_t ns)
{
    uint64_t us = ns / 1000;
    l->hist[us > S_HIST_US ? S_HIST_US : us]++;
    l->n++;
    if (ns > l->max_ns)
        l->max_ns = ns;
}

/* The q-quantile in microseconds (upper edge of its 1 us bin). */
static double
s_late_quantile(const s_late_t *l, double q)
{
    if (!l->n)
        return 0;
    uint64_t want = (uint64_t)(q * (double)l->n);
    if (want < 1)
        want = 1;
    uint64_t sum = 0;
    for (size_t i = 0; i <= S_HIST_US; i++) {
        sum += l->hist[i];
        if (sum >= want)
            return i == S_HIST_US ? (double)l->max_ns / 1e3 : (double)i + 1;
    }
    return (double)l->max_ns / 1e3;
}

static void
s_stats_line(relay_t *self, FILE *out, const char *what, const s_late_t *l,
             double secs, uint64_t bytes)
{
    double cpu = s_cpu_s() - self->cpu0;
    double gb = (double)(self->bytes[0] + self->bytes[1]) / 1e9;
    fprintf(out,
            "emlio-relay: %s: %.1f s, conns %u open %" PRIu64 " total %" PRIu64
            " failed, bytes c->s %" PRIu64 " s->c %" PRIu64
            ", %.1f MB/s, chunks %" PRIu64 ", late p50 %.0f p99 %.0f max %.0f"
            " us, cpu %.3f s (%.3f s/GB)\n",
            what, secs, self->nlive, self->conns_total, self->conns_failed,
            self->bytes[0], self->bytes[1],
            secs > 0 ? (double)bytes / 1e6 / secs : 0.0, l->n,
            s_late_quantile(l, 0.5), s_late_quantile(l, 0.99),
            (double)l->max_ns / 1e3, cpu, gb > 0 ? cpu / gb : 0.0);
    fflush(out);
}

void
relay_print_stats(relay_t *self, FILE *out)
{
    double secs = (double)(tool_now_ns() - self->start_ns) / 1e9;
    s_stats_line(self, out, "total", &self->late_all, secs,
                 self->bytes[0] + self->bytes[1]);
}

/* ---- connections ------------------------------------------------------- */

/* Brings fd side's epoll registration in line with what its two directions
 * want. A socket with nothing to wait for is removed, because epoll reports
 * EPOLLHUP even on an empty mask. */
static int
s_update(relay_t *self, s_conn_t *c, int side)
{
    uint32_t want = 0;
    if (c->dir[side].reading && !(c->connecting && side == 1))
        want |= EPOLLIN;
    if ((c->connecting && side == 1) || c->dir[1 - side].blocked)
        want |= EPOLLOUT;
    if (c->registered[side] ? want == c->mask[side] : want == 0)
        return 0;
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = want;
    ev.data.u64 = ((uint64_t)c->slot << 1) | (uint64_t)side;
    int rc;
    if (!want) {
        rc = epoll_ctl(self->epfd, EPOLL_CTL_DEL, c->fd[side], NULL);
        c->registered[side] = false;
    } else if (!c->registered[side]) {
        rc = epoll_ctl(self->epfd, EPOLL_CTL_ADD, c->fd[side], &ev);
        c->registered[side] = rc == 0;
    } else {
        rc = epoll_ctl(self->epfd, EPOLL_CTL_MOD, c->fd[side], &ev);
    }
    c->mask[side] = want;
    return rc == 0 ? 0 : -errno;
}

/* Closes both sockets. With reset, SO_LINGER 0 sends RST so that a failure
 * on one side shows up on the other instead of a clean EOF. */
static void
s_conn_close(relay_t *self, s_conn_t *c, bool reset)
{
    if (c->dead)
        return;
    c->dead = true;
    for (int side = 0; side < 2; side++) {
        s_dir_t *d = &c->dir[side];
        for (uint32_t k = 0; k < d->count; k++) {
            s_seg_t *s = &d->segs[(d->head + k) % d->seg_cap];
            self->car[s->carrier].pending -= s->len - s->sent;
            if (self->car[s->carrier].pending == 0)
                s_carrier_put(self, s->carrier, s->sent < s->len);
        }
        if (d->tail != S_NO_CARRIER)
            s_carrier_put(self, d->tail, self->car[d->tail].pending != 0);
        d->count = 0;
        d->tail = S_NO_CARRIER;
        if (c->fd[side] >= 0) {
            if (reset) {
                struct linger lg = { 1, 0 };
                (void)setsockopt(c->fd[side], SOL_SOCKET, SO_LINGER, &lg,
                                 sizeof(lg));
            }
            close(c->fd[side]); /* also drops it from the epoll set */
            c->fd[side] = -1;
        }
    }
    /* Unlink from the live list now; the slot stays taken until the event
     * batch ends so a stale event cannot reach a new connection. */
    s_conn_t *last = self->live[--self->nlive];
    self->live[c->live_idx] = last;
    last->live_idx = c->live_idx;
    self->dead[self->ndead++] = c;
}

static void
s_conn_free_dead(relay_t *self)
{
    for (uint32_t i = 0; i < self->ndead; i++) {
        s_conn_t *c = self->dead[i];
        self->slots[c->slot] = NULL;
        free(c->dir[0].segs);
        free(c->dir[1].segs);
        free(c);
    }
    self->ndead = 0;
    if (!self->accepting && self->lfd >= 0 &&
        self->nlive < (uint32_t)self->opts.max_conns) {
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = S_EV_LISTEN };
        if (epoll_ctl(self->epfd, EPOLL_CTL_MOD, self->lfd, &ev) == 0)
            self->accepting = true;
    }
}

static int
s_seg_push(s_dir_t *d, s_seg_t seg)
{
    if (d->count == d->seg_cap) {
        uint32_t cap = d->seg_cap ? d->seg_cap * 2 : 16;
        s_seg_t *segs = reallocarray(NULL, cap, sizeof(*segs));
        if (!segs)
            return -ENOMEM;
        for (uint32_t k = 0; k < d->count; k++)
            segs[k] = d->segs[(d->head + k) % d->seg_cap];
        free(d->segs);
        d->segs = segs;
        d->seg_cap = cap;
        d->head = 0;
    }
    d->segs[(d->head + d->count) % d->seg_cap] = seg;
    d->count++;
    return 0;
}

/* Pops n sent bytes off the front of d, returning emptied carriers. */
static void
s_dir_consume(relay_t *self, s_dir_t *d, size_t n)
{
    d->buffered -= n;
    while (n > 0) {
        s_seg_t *s = &d->segs[d->head];
        size_t take = TOOL_MIN(n, (size_t)(s->len - s->sent));
        s->sent += (uint32_t)take;
        n -= take;
        s_carrier_t *car = &self->car[s->carrier];
        car->pending -= take;
        if (s->sent < s->len)
            break;
        if (car->pending == 0) {
            if (s->carrier == d->tail)
                car->used = 0; /* empty again: refill from the start */
            else
                s_carrier_put(self, s->carrier, false);
        }
        d->head = (d->head + 1) % d->seg_cap;
        d->count--;
    }
}

static void s_dir_flush(relay_t *self, s_conn_t *c, int i, uint64_t now);

/* Reads what fd[i] has into direction i, timestamps it, and stops reading
 * when the direction holds its bound (backpressure). */
static void
s_dir_read(relay_t *self, s_conn_t *c, int i)
{
    s_dir_t *d = &c->dir[i];
    size_t cap = s_carrier_cap(self);
    int reads = 0;
    bool retried = false;

    while (d->reading && reads < S_READS_EACH && d->buffered < self->bound) {
        if (d->tail != S_NO_CARRIER &&
            cap - self->car[d->tail].used < S_MIN_ROOM) {
            if (self->car[d->tail].pending == 0)
                s_carrier_put(self, d->tail, false);
            d->tail = S_NO_CARRIER;
        }
        if (d->tail == S_NO_CARRIER) {
            d->tail = s_carrier_get(self);
            if (d->tail == S_NO_CARRIER) {
                if (self->opts.log)
                    fprintf(self->opts.log,
                            "emlio-relay: cannot get a buffer: %s\n",
                            strerror(errno));
                s_conn_close(self, c, true);
                return;
            }
        }
        s_carrier_t *car = &self->car[d->tail];
        size_t room = cap - car->used;
        ssize_t n;
        if (self->opts.mode == RELAY_COPY)
            n = read(c->fd[i], car->data + car->used, room);
        else
            n = splice(c->fd[i], NULL, car->wfd, NULL, room,
                       SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n > 0) {
            s_seg_t seg = { .carrier = d->tail,
                            .off = (uint32_t)car->used,
                            .len = (uint32_t)n,
                            .due_ns = tool_now_ns() + self->delay_ns };
            if (s_seg_push(d, seg) < 0) {
                s_conn_close(self, c, true);
                return;
            }
            car->used += (size_t)n;
            car->pending += (size_t)n;
            d->buffered += (size_t)n;
            self->bytes[i] += (uint64_t)n;
            reads++;
            continue;
        }
        if (n == 0) {
            d->eof_in = true;
            d->eof_due = tool_now_ns() + self->delay_ns;
            d->reading = false;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN) {
            /* A splice into a part-full pipe can fail for want of pipe
             * slots while the socket still has data: try a fresh pipe. */
            if (self->opts.mode == RELAY_SPLICE && car->used > 0 && !retried) {
                retried = true;
                car->used = cap;
                continue;
            }
            break;
        }
        s_conn_close(self, c, true);
        return;
    }
    if (d->buffered >= self->bound)
        d->reading = false;
    if (s_update(self, c, i) < 0) {
        s_conn_close(self, c, true);
        return;
    }
    s_dir_flush(self, c, i, tool_now_ns());
}

/* Sends whatever of direction i is due by now, within the rate limit, and
 * passes EOF on once everything before it has gone. */
static void
s_dir_flush(relay_t *self, s_conn_t *c, int i, uint64_t now)
{
    s_dir_t *d = &c->dir[i];
    int dst = c->fd[1 - i];

    if (c->dead || c->connecting || d->blocked || d->shut_out)
        return;
    if (d->wake_ns) {
        if (now < d->wake_ns)
            return;
        d->ready_ns = d->wake_ns;
        d->wake_ns = 0;
    }
    while (d->count && d->segs[d->head].due_ns <= now) {
        size_t allow = SIZE_MAX;
        if (self->rate_bps > 0) {
            d->tokens += (double)(now - d->tok_ns) * self->rate_bps / 1e9;
            if (d->tokens > self->burst)
                d->tokens = self->burst;
            d->tok_ns = now;
            s_seg_t *h = &d->segs[d->head];
            double need =
                TOOL_MIN((double)(h->len - h->sent), (double)S_TOKEN_MIN);
            if (d->tokens < need) {
                d->wake_ns =
                    now +
                    (uint64_t)((need - d->tokens) / self->rate_bps * 1e9) + 1;
                return;
            }
            allow = (size_t)d->tokens;
        }

        size_t want = 0;
        ssize_t n;
        struct iovec iov[S_IOV_MAX];
        int niov = 0;
        for (uint32_t k = 0; k < d->count && want < allow; k++) {
            s_seg_t *s = &d->segs[(d->head + k) % d->seg_cap];
            if (s->due_ns > now)
                break;
            if (!s->timed) {
                s->timed = true;
                uint64_t from = TOOL_MAX(s->due_ns, d->ready_ns);
                uint64_t late = now > from ? now - from : 0;
                s_late_add(&self->late_all, late);
                s_late_add(&self->late_iv, late);
                self->chunks++;
            }
            size_t len = TOOL_MIN((size_t)(s->len - s->sent), allow - want);
            if (self->opts.mode == RELAY_SPLICE) {
                want = len; /* one pipe at a time */
                break;
            }
            iov[niov].iov_base = self->car[s->carrier].data + s->off + s->sent;
            iov[niov].iov_len = len;
            niov++;
            want += len;
            if (niov == S_IOV_MAX)
                break;
        }
        if (self->opts.mode == RELAY_SPLICE) {
            s_seg_t *h = &d->segs[d->head];
            n = splice(self->car[h->carrier].rfd, NULL, dst, NULL, want,
                       SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        } else {
            struct msghdr msg;
            memset(&msg, 0, sizeof(msg));
            msg.msg_iov = iov;
            msg.msg_iovlen = (size_t)niov;
            n = sendmsg(dst, &msg, MSG_NOSIGNAL);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                d->blocked = true;
                break;
            }
            s_conn_close(self, c, true);
            return;
        }
        s_dir_consume(self, d, (size_t)n);
        if (self->rate_bps > 0)
            d->tokens -= (double)n;
        if ((size_t)n < want) {
            /* A short write means the socket buffer is full; waiting for
             * EPOLLOUT saves a syscall that would return EAGAIN. */
            d->blocked = true;
            break;
        }
    }

    if (d->blocked) {
        if (s_update(self, c, 1 - i) < 0)
            s_conn_close(self, c, true);
        return;
    }
    if (!d->reading && !d->eof_in && d->buffered < self->bound) {
        d->reading = true;
        if (s_update(self, c, i) < 0) {
            s_conn_close(self, c, true);
            return;
        }
    }
    if (d->eof_in && d->count == 0 && now >= d->eof_due) {
        d->shut_out = true;
        if (shutdown(dst, SHUT_WR) != 0 && errno != ENOTCONN) {
            s_conn_close(self, c, true);
            return;
        }
        if (c->dir[1 - i].shut_out)
            s_conn_close(self, c, false); /* both halves done */
        else if (s_update(self, c, i) < 0)
            s_conn_close(self, c, true);
    }
}

/* When direction i next needs the loop's attention without a socket event;
 * S_NONE when it waits for a socket. */
static uint64_t
s_dir_deadline(const s_conn_t *c, int i)
{
    const s_dir_t *d = &c->dir[i];
    if (c->connecting || d->blocked || d->shut_out)
        return S_NONE;
    if (d->wake_ns)
        return d->wake_ns;
    if (d->count)
        return d->segs[d->head].due_ns;
    if (d->eof_in)
        return d->eof_due;
    return S_NONE;
}

static void
s_conn_connected(relay_t *self, s_conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err == EINPROGRESS || err == EALREADY)
        return;
    if (err) {
        if (self->opts.log)
            fprintf(self->opts.log, "emlio-relay: cannot connect to '%s': %s\n",
                    self->opts.connect, strerror(err));
        self->conns_failed++;
        s_conn_close(self, c, true);
        return;
    }
    c->connecting = false;
    c->dir[1].reading = true;
    uint64_t now = tool_now_ns();
    c->dir[0].ready_ns = now;
    c->dir[1].ready_ns = now;
    if (s_update(self, c, 1) < 0 || s_update(self, c, 0) < 0) {
        s_conn_close(self, c, true);
        return;
    }
    s_dir_flush(self, c, 0, now);
}

static void
s_set_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void
s_accept(relay_t *self)
{
    while (self->nlive + self->ndead < (uint32_t)self->opts.max_conns) {
        int fd = accept4(self->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && self->opts.log)
                fprintf(self->opts.log, "emlio-relay: cannot accept: %s\n",
                        strerror(errno));
            return;
        }
        s_set_nodelay(fd);
        int up = socket(self->connect_addr.ss_family,
                        SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        s_conn_t *c = up >= 0 ? calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            if (up >= 0)
                close(up);
            close(fd);
            self->conns_failed++;
            continue;
        }
        s_set_nodelay(up);
        uint32_t slot = 0;
        while (self->slots[slot])
            slot++; /* nlive + ndead < max_conns, so one is free */
        c->slot = slot;
        c->fd[0] = fd;
        c->fd[1] = up;
        c->connecting = true;
        for (int i = 0; i < 2; i++) {
            c->dir[i].tail = S_NO_CARRIER;
            c->dir[i].tokens = self->burst;
            c->dir[i].tok_ns = tool_now_ns();
        }
        c->dir[0].reading = true;
        self->slots[slot] = c;
        c->live_idx = self->nlive;
        self->live[self->nlive++] = c;
        self->conns_total++;
        int rc = connect(up, (struct sockaddr *)&self->connect_addr,
                         self->connect_len);
        if (rc != 0 && errno != EINPROGRESS) {
            if (self->opts.log)
                fprintf(self->opts.log,
                        "emlio-relay: cannot connect to '%s': %s\n",
                        self->opts.connect, strerror(errno));
            self->conns_failed++;
            s_conn_close(self, c, true);
            continue;
        }
        if (s_update(self, c, 0) < 0 || s_update(self, c, 1) < 0)
            s_conn_close(self, c, true);
    }
    /* At the limit: stop accepting until a connection closes. The slot
     * table also holds this batch's dead connections, so count them. */
    struct epoll_event ev = { .events = 0, .data.u64 = S_EV_LISTEN };
    if (epoll_ctl(self->epfd, EPOLL_CTL_MOD, self->lfd, &ev) == 0)
        self->accepting = false;
}

/* ---- bind and run ------------------------------------------------------ */

int
relay_bind(relay_t *self)
{
    char why[256];
    struct sockaddr_storage la;
    unsigned la_len;

    if (relay_parse_addr(self->opts.listen, &la, &la_len, why, sizeof(why)) < 0)
        return tool_seterr(self->err, -1, "cannot listen on '%s': %s",
                           self->opts.listen, why);
    if (relay_parse_addr(self->opts.connect, &self->connect_addr,
                         &self->connect_len, why, sizeof(why)) < 0)
        return tool_seterr(self->err, -1, "cannot connect to '%s': %s",
                           self->opts.connect, why);

    /* Two descriptors per connection, two per pipe: ask for the hard cap. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }

    self->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (self->epfd < 0)
        return tool_seterr(self->err, -1, "cannot create epoll: %s",
                           strerror(errno));
    self->lfd =
        socket(la.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (self->lfd < 0)
        return tool_seterr(self->err, -1, "cannot listen on '%s': %s",
                           self->opts.listen, strerror(errno));
    int one = 1;
    (void)setsockopt(self->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(self->lfd, (struct sockaddr *)&la, la_len) != 0 ||
        listen(self->lfd, 1024) != 0)
        return tool_seterr(self->err, -1, "cannot listen on '%s': %s",
                           self->opts.listen, strerror(errno));
    socklen_t len = sizeof(la);
    if (getsockname(self->lfd, (struct sockaddr *)&la, &len) != 0)
        return tool_seterr(self->err, -1, "cannot listen on '%s': %s",
                           self->opts.listen, strerror(errno));
    char host[INET6_ADDRSTRLEN];
    if (la.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&la;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(self->endpoint, sizeof(self->endpoint), "%s:%u", host,
                 ntohs(a->sin_port));
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&la;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(self->endpoint, sizeof(self->endpoint), "[%s]:%u", host,
                 ntohs(a->sin6_port));
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = S_EV_LISTEN };
    if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->lfd, &ev) != 0)
        return tool_seterr(self->err, -1, "cannot watch '%s': %s",
                           self->endpoint, strerror(errno));
    self->accepting = true;

    /* Warm the pool so the first connections pay no page faults. */
    uint32_t warm[S_PREALLOC];
    uint32_t nwarm = 0;
    while (nwarm < S_PREALLOC) {
        warm[nwarm] = s_carrier_get(self);
        if (warm[nwarm] == S_NO_CARRIER)
            break;
        nwarm++;
    }
    if (nwarm == 0 && self->opts.mode == RELAY_SPLICE) {
        /* No pipes here (seccomp, old kernel): fall back to copying. */
        self->opts.mode = RELAY_COPY;
    }
    while (nwarm > 0)
        s_carrier_put(self, warm[--nwarm], false);
    return 0;
}

static int
s_wait(relay_t *self, struct epoll_event *evs, uint64_t deadline, uint64_t now)
{
    struct timespec ts = { 0, 0 };
    struct timespec *tsp = &ts;
    if (deadline == S_NONE) {
        tsp = NULL;
    } else if (deadline > now + self->spin_ns) {
        /* Sleep until spin_ns before the deadline, then busy-poll: timer
         * wake-ups on these VMs are late by tens of microseconds. */
        uint64_t ns = deadline - now - self->spin_ns;
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
    }
    return epoll_pwait2(self->epfd, evs, S_MAX_EVENTS, tsp, NULL);
}

int
relay_run(relay_t *self, int stop_fd)
{
    struct epoll_event evs[S_MAX_EVENTS];

    assert(self->epfd >= 0);
    if (stop_fd >= 0) {
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = S_EV_STOP };
        if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, stop_fd, &ev) != 0)
            return tool_seterr(self->err, -1, "cannot watch stop fd: %s",
                               strerror(errno));
    }
    /* The default 50 us timer slack would show up as lateness. */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    self->start_ns = tool_now_ns();
    self->iv_start_ns = self->start_ns;
    self->cpu0 = s_cpu_s();
    uint64_t stats_ns = self->opts.stats_interval_s > 0
                            ? (uint64_t)(self->opts.stats_interval_s * 1e9)
                            : 0;

    for (;;) {
        uint64_t now = tool_now_ns();
        uint64_t deadline = S_NONE;
        for (uint32_t k = 0; k < self->nlive; k++) {
            s_conn_t *c = self->live[k];
            for (int i = 0; i < 2 && !c->dead; i++) {
                uint64_t t = s_dir_deadline(c, i);
                if (t <= now) {
                    s_dir_flush(self, c, i, now);
                    if (!c->dead)
                        t = s_dir_deadline(c, i);
                }
                if (!c->dead && t < deadline)
                    deadline = t;
            }
            if (c->dead)
                k--; /* the list was compacted into slot k */
        }
        s_conn_free_dead(self);
        if (stats_ns) {
            uint64_t next = self->iv_start_ns + stats_ns;
            if (now >= next) {
                uint64_t total = self->bytes[0] + self->bytes[1];
                if (self->opts.log)
                    s_stats_line(self, self->opts.log, "interval",
                                 &self->late_iv,
                                 (double)(now - self->iv_start_ns) / 1e9,
                                 total - self->iv_bytes);
                memset(&self->late_iv, 0, sizeof(self->late_iv));
                self->iv_bytes = total;
                self->iv_start_ns = now;
                next = now + stats_ns;
            }
            if (next < deadline)
                deadline = next;
        }

        int n = s_wait(self, evs, deadline, now);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return tool_seterr(self->err, -1, "cannot wait for events: %s",
                               strerror(errno));
        }
        for (int e = 0; e < n; e++) {
            uint64_t tag = evs[e].data.u64;
            uint32_t what = evs[e].events;
            if (tag == S_EV_STOP)
                return 0;
            if (tag == S_EV_LISTEN) {
                s_accept(self);
                continue;
            }
            s_conn_t *c = self->slots[tag >> 1];
            int side = (int)(tag & 1);
            if (!c || c->dead)
                continue;
            if (side == 1 && c->connecting) {
                s_conn_connected(self, c);
                continue;
            }
            if (what & EPOLLOUT) {
                s_dir_t *d = &c->dir[1 - side];
                if (d->blocked) {
                    d->blocked = false;
                    d->ready_ns = tool_now_ns();
                    s_dir_flush(self, c, 1 - side, d->ready_ns);
                }
                if (c->dead)
                    continue;
                if (!d->blocked && s_update(self, c, side) < 0) {
                    s_conn_close(self, c, true);
                    continue;
                }
            }
            if (what & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                if (c->dir[side].reading)
                    s_dir_read(self, c, side);
                else if (what & EPOLLERR)
                    s_conn_close(self, c, true);
            }
        }
        s_conn_free_dead(self);
    }
}

void
relay_destroy(relay_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    relay_t *self = *self_p;
    while (self->nlive > 0)
        s_conn_close(self, self->live[0], true);
    s_conn_free_dead(self);
    for (uint32_t i = 0; i < self->ncar; i++) {
        free(self->car[i].data); /* aligned_alloc memory */
        if (self->car[i].rfd >= 0) {
            close(self->car[i].rfd);
            close(self->car[i].wfd);
        }
    }
    free(self->car);
    if (self->lfd >= 0)
        close(self->lfd);
    if (self->epfd >= 0)
        close(self->epfd);
    free(self->slots);
    free(self->live);
    free(self->dead);
    free(self);
    *self_p = NULL;
}
