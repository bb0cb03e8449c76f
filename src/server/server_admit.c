/* server_admit.c - who may talk to the daemon: connections as the ROUTER's
 * socket monitor reports them, peers (routing ids) grouped in client
 * sessions, limits, idle expiry and eviction. Frontend thread only.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <stdarg.h>

#include "server_internal.h"

/* ---- peers: client connections by routing id, grouped in sessions ----- */

/* Connections of session (0 never matches: session-less peers are each
 * their own client). */
size_t
emlio__srv_session_streams(const emlio_server_t *self, uint64_t session)
{
    size_t n = 0;
    for (size_t i = 0; session && i < self->adm.n_peers; i++)
        n += self->adm.peers[i].session == session;
    return n;
}

/* Client lines at info a window may carry; beyond, they are counted and
 * the count is said once the window ends (thousands of short connections
 * must not flood the log). */
#define S_CLIENT_LOG_LINES     20
#define S_CLIENT_LOG_WINDOW_NS 10000000000ull

/* Logs a client's arrival or departure at info, rate-limited. */
static void s_client_log(emlio_server_t *self, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
s_client_log(emlio_server_t *self, const char *fmt, ...)
{
    emlio__srv_admit_t *a = &self->adm;
    uint64_t now = emlio__now_ns();
    if (now - a->client_log_ns >= S_CLIENT_LOG_WINDOW_NS) {
        if (a->client_log_quiet)
            emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                      "%" PRIu64 " more client connects and disconnects "
                      "were not logged",
                      a->client_log_quiet);
        a->client_log_ns = now;
        a->client_log_n = 0;
        a->client_log_quiet = 0;
    }
    if (++a->client_log_n > S_CLIENT_LOG_LINES) {
        a->client_log_quiet++;
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server", "%s", msg);
}

/* "IP:PORT" of the far end (peer; NULL: unknown), or "unknown". */
static void
s_peer_addr(const struct sockaddr_storage *peer, char *out, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "unknown";
    int port = 0;
    if (peer && peer->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)peer;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (peer && peer->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)peer;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, len, "%s:%d", host, port);
}

/* Whether the connection on fd, whose far end is peer (NULL: unknown),
 * stays within this host: a Unix socket, a loopback address, or a peer at
 * this socket's own address (the kernel routes that through loopback
 * too). Unknown (inproc, or no descriptor) counts as local. */
static bool
s_fd_local(int fd, const struct sockaddr_storage *peer)
{
    struct sockaddr_storage me;
    socklen_t ml = sizeof(me);
    if (!peer || getsockname(fd, (struct sockaddr *)&me, &ml) != 0)
        return true;
    if (peer->ss_family == AF_INET && me.ss_family == AF_INET) {
        const struct in_addr *p = &((const struct sockaddr_in *)peer)->sin_addr;
        const struct in_addr *m = &((const struct sockaddr_in *)&me)->sin_addr;
        return emlio__netpath_loopback(AF_INET, p) || p->s_addr == m->s_addr;
    }
    if (peer->ss_family == AF_INET6 && me.ss_family == AF_INET6) {
        const struct in6_addr *p =
            &((const struct sockaddr_in6 *)peer)->sin6_addr;
        const struct in6_addr *m =
            &((const struct sockaddr_in6 *)&me)->sin6_addr;
        return emlio__netpath_loopback(AF_INET6, p) ||
               !memcmp(p, m, sizeof(*p));
    }
    return peer->ss_family == AF_UNIX;
}

/* The largest sample frame packed for a connection (cfg.pack): over a
 * network, packing ImageNet-sized frames spares the client a ZeroMQ
 * message, two reads and a wake-up each, and the path an ACK (at 30 ms,
 * 15% more MB/s and 15% less CPU in all); within this host, where client
 * and daemon share the CPUs, the daemon's copy from the mapping costs more
 * than that (docs/performance.md, "Packing large frames"). */
static uint32_t
s_peer_pack_max(const emlio_server_t *self, int fd,
                const struct sockaddr_storage *peer)
{
    if (self->cfg.pack == EMLIO_PACK_LARGE ||
        (self->cfg.pack == EMLIO_PACK_AUTO && !s_fd_local(fd, peer)))
        return EMLIO_SERVER_PACK_LARGE;
    return EMLIO_SERVER_PACK_SMALL;
}

/* Forgets peer i; the client count drops with its session's last one,
 * which is logged with what the client received. */
static void
s_peer_remove(emlio_server_t *self, size_t i)
{
    /* Jobs charged to it keep the account alive. */
    emlio__srv_copy_acct_unref(&self->adm.peers[i].copy);
    emlio__srv_jobs_detach(self, &self->adm.peers[i]);
    emlio__peer_t gone = self->adm.peers[i];
    uint64_t session = gone.session;
    /* keyindex.h's order: forget its id, point the last peer's id at its
     * slot while the last is still there, then move it. */
    size_t last = self->adm.n_peers - 1;
    emlio__keyindex_del(&self->adm.peer_index, gone.id, gone.id_len);
    if (i != last)
        /* Cannot fail: the id is there, so its value is replaced. */
        (void)emlio__keyindex_put(&self->adm.peer_index,
                                  self->adm.peers[last].id,
                                  self->adm.peers[last].id_len, (uint32_t)i);
    self->adm.peers[i] = self->adm.peers[last];
    self->adm.n_peers = last;
    if (session && emlio__srv_session_streams(self, session)) {
        /* Its session lives on: its bytes go to a remaining stream. */
        for (size_t k = 0; k < self->adm.n_peers; k++)
            if (self->adm.peers[k].session == session) {
                emlio__peer_t *heir = &self->adm.peers[k];
                heir->bytes += gone.bytes;
                if (gone.since_ns < heir->since_ns) {
                    /* The session is told by its first stream's address. */
                    heir->since_ns = gone.since_ns;
                    memcpy(heir->addr, gone.addr, sizeof(heir->addr));
                }
                break;
            }
        return;
    }
    self->adm.n_clients--;
    double s = (double)(emlio__now_ns() - gone.since_ns) / 1e9;
    s_client_log(self,
                 "client from %s left after %.1f s: %.1f MB sent, "
                 "%.1f MB/s",
                 gone.addr, s, (double)gone.bytes / 1e6,
                 s > 0 ? (double)gone.bytes / 1e6 / s : 0.0);
}

/* keyindex.h's `same` for the peers (by routing id) and the connections
 * (by descriptor). */
static bool
s_peer_has_id(const void *owner, uint32_t at, const void *id, size_t len)
{
    const emlio__peer_t *peer = &((const emlio_server_t *)owner)->adm.peers[at];
    return peer->id_len == len && !memcmp(peer->id, id, len);
}

static bool
s_conn_has_fd(const void *owner, uint32_t at, const void *fd, size_t len)
{
    const emlio__conn_t *conn = &((const emlio_server_t *)owner)->adm.conns[at];
    return len == sizeof(conn->fd) && !memcmp(&conn->fd, fd, len);
}

void
emlio__srv_admit_init(emlio_server_t *self)
{
    emlio__keyindex_init(&self->adm.peer_index, self, s_peer_has_id);
    emlio__keyindex_init(&self->adm.conn_index, self, s_conn_has_fd);
}

void
emlio__srv_admit_release(emlio_server_t *self)
{
    for (size_t i = 0; i < self->adm.n_peers; i++)
        emlio__srv_copy_acct_unref(&self->adm.peers[i].copy);
    emlio_free(self->adm.peers);
    emlio_free(self->adm.conns);
    emlio__keyindex_release(&self->adm.peer_index);
    emlio__keyindex_release(&self->adm.conn_index);
}

emlio__conn_t *
emlio__srv_conn_find(emlio_server_t *self, int fd)
{
    uint32_t at;
    if (!emlio__keyindex_get(&self->adm.conn_index, &fd, sizeof(fd), &at))
        return NULL;
    return &self->adm.conns[at];
}

/* The inode of the socket on fd (sockfs numbers every socket), 0 if none. */
static ino_t
s_fd_ino(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* Registers (or, for a reused descriptor, renews) the connection on fd. */
emlio__conn_t *
emlio__srv_conn_add(emlio_server_t *self, int fd, uint64_t now)
{
    emlio__conn_t *conn = emlio__srv_conn_find(self, fd);
    if (!conn) {
        if (emlio__grow(&self->adm.conns, &self->adm.cap_conns,
                        self->adm.n_conns, sizeof(*self->adm.conns), 64) < 0)
            return NULL;
        conn = &self->adm.conns[self->adm.n_conns];
        conn->fd = fd;
        if (emlio__keyindex_put(&self->adm.conn_index, &fd, sizeof(fd),
                                (uint32_t)self->adm.n_conns) < 0)
            return NULL;
        self->adm.n_conns++;
    }
    conn->fd = fd;
    conn->ino = s_fd_ino(fd);
    conn->last_seen_ns = now;
    conn->closing = false;
    return conn;
}

bool
emlio__srv_conn_same(const emlio__conn_t *conn)
{
    return s_fd_ino(conn->fd) == conn->ino;
}

/* The connection on fd is gone: its slot and credits are freed now, not
 * after an idle timeout. */
static void
s_conn_closed(emlio_server_t *self, int fd)
{
    emlio__conn_t *conn = emlio__srv_conn_find(self, fd);
    if (conn) {
        size_t at = (size_t)(conn - self->adm.conns);
        size_t last = self->adm.n_conns - 1;
        emlio__keyindex_del(&self->adm.conn_index, &fd, sizeof(fd));
        if (at != last) /* the order keyindex.h asks for; cannot fail */
            (void)emlio__keyindex_put(
                &self->adm.conn_index, &self->adm.conns[last].fd,
                sizeof(self->adm.conns[last].fd), (uint32_t)at);
        *conn = self->adm.conns[last];
        self->adm.n_conns = last;
    }
    for (size_t i = 0; i < self->adm.n_peers;) {
        if (self->adm.peers[i].fd == fd)
            s_peer_remove(self, i);
        else
            i++;
    }
    atomic_store(&self->count.active_clients, self->adm.n_clients);
}

/* Whether fd is one of our ROUTER's accepted connections (and not, after a
 * reuse of the number, some other descriptor of this process). */
static bool
s_fd_is_ours(const emlio_server_t *self, int fd)
{
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (getsockname(fd, (struct sockaddr *)&addr, &len) != 0)
        return false;
    if (self->net.bound_port < 0)
        return addr.ss_family == AF_UNIX;
    int port = -1;
    if (addr.ss_family == AF_INET)
        port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    else if (addr.ss_family == AF_INET6)
        port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    return port == self->net.bound_port;
}

/* Closes one connection for a reason that is logged. ZeroMQ has no call to
 * drop one peer of a ROUTER, so its socket is shut down under it: ZeroMQ
 * then closes the connection as if the peer had, and the monitor reports
 * it (s_conn_closed). */
static void
s_conn_shutdown(emlio_server_t *self, emlio__conn_t *conn, int level,
                const char *why)
{
    if (conn->closing)
        return;
    if (!emlio__srv_conn_same(conn)) {
        /* A record whose events were lost: the descriptor is closed (the
         * record is forgotten) or another connection's now, which must
         * not be shut down for it. */
        int fd = conn->fd;
        if (fcntl(fd, F_GETFD) < 0)
            s_conn_closed(self, fd);
        else
            (void)emlio__srv_conn_add(self, fd, emlio__now_ns());
        return;
    }
    conn->closing = true;
    if (!s_fd_is_ours(self, conn->fd))
        return;
    emlio_log(self->ctx, level, "server", "closing connection %d: %s", conn->fd,
              why);
    (void)shutdown(conn->fd, SHUT_RDWR);
}

/* Closes the connection that has been silent longest and has nothing
 * outstanding; returns whether there was one. */
static bool
s_conn_evict_idlest(emlio_server_t *self, uint64_t now, uint64_t min_idle_ns,
                    int level, const char *why)
{
    emlio__conn_t *idlest = NULL;
    for (size_t i = 0; i < self->adm.n_conns; i++) {
        emlio__conn_t *conn = &self->adm.conns[i];
        if (conn->closing || now - conn->last_seen_ns < min_idle_ns)
            continue;
        bool busy = false;
        for (size_t k = 0; k < self->adm.n_peers && !busy; k++)
            busy = self->adm.peers[k].fd == conn->fd &&
                   self->adm.peers[k].outstanding;
        if (!busy && (!idlest || conn->last_seen_ns < idlest->last_seen_ns))
            idlest = conn;
    }
    if (!idlest)
        return false;
    char text[160];
    snprintf(text, sizeof(text), "%s (silent for %.1f s)", why,
             (double)(now - idlest->last_seen_ns) / 1e9);
    s_conn_shutdown(self, idlest, level, text);
    return true;
}

/* Whether a rate-limited line is due (one per EMLIO__SRV_FD_LOG_MS,
 * counted from *last_ns, which it then moves to now). */
static bool
s_log_due(uint64_t *last_ns, uint64_t now)
{
    if (now - *last_ns < EMLIO__SRV_FD_LOG_MS * 1000000ull)
        return false;
    *last_ns = now;
    return true;
}

/* An accept failed. Out of file descriptors, libzmq retries at once and
 * spins until one is free: say so (rate-limited) and free one, the idlest
 * connection, so that clients that do talk can get in. */
static void
s_accept_failed(emlio_server_t *self, int err, uint64_t now)
{
    self->adm.accept_failed++;
    bool no_fds =
        err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
    if (s_log_due(&self->adm.fd_log_ns, now)) {
        struct rlimit lim = { 0, 0 };
        (void)getrlimit(RLIMIT_NOFILE, &lim);
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "cannot accept connections: %s (%" PRIu64 " refused; "
                  "descriptor limit %llu, %zu connections open)%s",
                  strerror(err), self->adm.accept_failed,
                  (unsigned long long)lim.rlim_cur, self->adm.n_conns,
                  no_fds ? "; closing the idlest connections" : "");
        self->adm.accept_failed = 0;
    }
    if (no_fds)
        (void)s_conn_evict_idlest(self, now, 1000000000ull, EMLIO_LOG_WARN,
                                  "out of file descriptors");
}

/* A new connection on fd: registered; beyond max_conns the idlest silent
 * connection, or else this one, is closed (see adm.max_conns). */
static void
s_conn_accepted(emlio_server_t *self, int fd, uint64_t now)
{
    emlio__conn_t *conn = emlio__srv_conn_add(self, fd, now);
    if (!conn || !self->adm.max_conns ||
        self->adm.n_conns <= self->adm.max_conns)
        return;
    char why[160];
    snprintf(why, sizeof(why),
             "%zu connections, the most the descriptor limit leaves beside "
             "the shards' budget",
             self->adm.max_conns);
    /* One warning per interval with a count: a flood of connections
     * must not flood the log too. */
    self->adm.conns_closed++;
    if (s_log_due(&self->adm.conns_log_ns, now)) {
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                  "closing connections beyond %s (%" PRIu64
                  " since the last such line)",
                  why, self->adm.conns_closed);
        self->adm.conns_closed = 0;
    }
    if (!s_conn_evict_idlest(self, now, 1000000000ull, EMLIO_LOG_DEBUG, why))
        s_conn_shutdown(self, conn, EMLIO_LOG_DEBUG, why);
}

/* Handles every connection event the monitor has queued. */
void
emlio__srv_monitor_drain(emlio_server_t *self)
{
    for (;;) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, self->net.monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
        }
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more)
            emlio__zmq_drain(self->net.monitor); /* the endpoint frame */
        uint64_t now = emlio__now_ns();
        emlio_log(self->ctx, EMLIO_LOG_DEBUG, "server",
                  "connection event 0x%x on %" PRIu32, event, value);
        if (event == ZMQ_EVENT_ACCEPTED && self->adm.sndbuf.force_value) {
            int rc = emlio__netpath_force((int)value, true,
                                          self->adm.sndbuf.force_value);
            /* EBADF: the connection is gone already (a client's probe
             * connects and closes at once), nothing to warn about. */
            if (rc < 0)
                emlio_log(self->ctx,
                          rc == -EBADF ? EMLIO_LOG_DEBUG : EMLIO_LOG_WARN,
                          "server",
                          "cannot force the send buffer of a connection: %s",
                          strerror(-rc));
        }
        if (event == ZMQ_EVENT_ACCEPTED)
            s_conn_accepted(self, (int)value, now);
        else if (event == ZMQ_EVENT_DISCONNECTED)
            s_conn_closed(self, (int)value);
        else if (event == ZMQ_EVENT_ACCEPT_FAILED)
            s_accept_failed(self, (int)value, now);
    }
}

/* Shuts down connections silent for idle_timeout_ms with nothing
 * outstanding (ZeroMQ clients answer heartbeats, so those alone never close
 * them), including ones that never said HELLO. */
void
emlio__srv_conns_expire(emlio_server_t *self, uint64_t now)
{
    uint64_t idle = (uint64_t)self->cfg.idle_timeout_ms * 1000000ull;
    char why[96];
    snprintf(why, sizeof(why), "idle for more than %" PRIu32 " ms",
             self->cfg.idle_timeout_ms);
    while (s_conn_evict_idlest(self, now, idle, EMLIO_LOG_INFO, why))
        ;
}

/* Forgets peers that have nothing outstanding and were not heard from for
 * idle_timeout_ms (peers whose connection the monitor does not report,
 * such as inproc ones); connected ones are closed by emlio__srv_conns_expire.
 */
void
emlio__srv_peers_expire(emlio_server_t *self, uint64_t now)
{
    uint64_t idle = (uint64_t)self->cfg.idle_timeout_ms * 1000000ull;
    for (size_t i = 0; i < self->adm.n_peers;) {
        emlio__peer_t *peer = &self->adm.peers[i];
        if (!peer->outstanding && now - peer->last_seen_ns > idle)
            s_peer_remove(self, i);
        else
            i++;
    }
}

/* Whether the peer on fd has closed its end (our socket in CLOSE_WAIT),
 * or fd is another socket by now. */
static bool
s_fd_hung_up(const emlio__conn_t *conn)
{
    struct tcp_info info;
    socklen_t len = sizeof(info);
    if (!emlio__srv_conn_same(conn))
        return true;
    return getsockopt(conn->fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
           (info.tcpi_state == TCP_CLOSE_WAIT || info.tcpi_state == TCP_CLOSE);
}

/* Forgets the peers whose connection the client has closed although
 * ZeroMQ's I/O thread has not reported it yet: a client that closes and
 * connects again at once (a short fetch in a loop) must find its slot
 * free, however busy the machine. Only when the slots are full. */
static void
s_peers_hung_up(emlio_server_t *self)
{
    for (size_t i = 0; i < self->adm.n_peers;) {
        const emlio__peer_t *peer = &self->adm.peers[i];
        const emlio__conn_t *conn =
            peer->fd >= 0 ? emlio__srv_conn_find(self, peer->fd) : NULL;
        if (conn && s_fd_hung_up(conn))
            s_peer_remove(self, i);
        else
            i++;
    }
}

/* The bookkeeping of one client connection (a ZeroMQ routing id). With add,
 * an unknown connection is registered, as part of `session` when that
 * session is known (a client's extra stream: admitted with it, up to
 * EMLIO_WIRE_MAX_STREAMS), else as a new client unless max_clients are
 * already known; NULL then means "refuse it". */
emlio__peer_t *
emlio__srv_peer_add(emlio_server_t *self, const uint8_t *id, size_t len,
                    bool add, uint64_t session)
{
    uint64_t now = emlio__now_ns();
    uint32_t at;
    if (emlio__keyindex_get(&self->adm.peer_index, id, len, &at)) {
        self->adm.peers[at].last_seen_ns = now;
        return &self->adm.peers[at];
    }
    if (!add || len > EMLIO__SRV_MAX_IDENTITY)
        return NULL;
    size_t streams = emlio__srv_session_streams(self, session);
    if (streams >= EMLIO_WIRE_MAX_STREAMS)
        return NULL;
    if (!streams && self->adm.n_clients >= self->cfg.max_clients) {
        emlio__srv_monitor_drain(
            self); /* connections that closed free their slot */
        s_peers_hung_up(self);
        emlio__srv_peers_expire(self, now);
        if (self->adm.n_clients >= self->cfg.max_clients)
            return NULL;
    }
    if (emlio__grow(&self->adm.peers, &self->adm.cap_peers, self->adm.n_peers,
                    sizeof(*self->adm.peers), 16) < 0)
        return NULL;
    emlio__peer_t *peer = &self->adm.peers[self->adm.n_peers];
    memcpy(peer->id, id, len);
    peer->id_len = (uint8_t)len;
    if (emlio__keyindex_put(&self->adm.peer_index, id, len,
                            (uint32_t)self->adm.n_peers) < 0)
        return NULL;
    self->adm.n_peers++;
    if (!streams)
        self->adm.n_clients++;
    peer->outstanding = 0;
    peer->last_seen_ns = now;
    peer->fd = self->adm.cur_fd;
    peer->ino = peer->fd >= 0 ? s_fd_ino(peer->fd) : 0;
    peer->session = session;
    peer->stalled = false;
    peer->coalescing = false; /* ZeroMQ set TCP_NODELAY */
    peer->no_coalesce = false;
    peer->bytes = 0;
    peer->since_ns = now;
    /* Where it connects from, asked once: for the log and for packing. */
    struct sockaddr_storage far;
    socklen_t far_len = sizeof(far);
    bool known = peer->fd >= 0 &&
                 getpeername(peer->fd, (struct sockaddr *)&far, &far_len) == 0;
    s_peer_addr(known ? &far : NULL, peer->addr, sizeof(peer->addr));
    peer->pack_max = s_peer_pack_max(self, peer->fd, known ? &far : NULL);
    if (!streams)
        s_client_log(self, "client connected from %s%s", peer->addr,
                     session ? ""
                             : " (no session: each of its connections "
                               "counts as a client)");
    peer->tjob = NULL;
    peer->share = false;                     /* until its HELLO says */
    peer->fields = NULL;                     /* the daemon's, until then */
    peer->copy = emlio__srv_copy_acct_new(); /* NULL: daemon budget only */
    return peer;
}

emlio__peer_t *
emlio__srv_peer_find(emlio_server_t *self, const uint8_t *id, size_t len,
                     bool add)
{
    return emlio__srv_peer_add(self, id, len, add, 0);
}

/* A reply to peer could not even be queued: its send queue (credits plus
 * room for errors) is full, which a client that reads never causes. It
 * floods requests without reading: close its connection with a logged
 * reason, rather than leave it wedged with credits that never return. */
void
emlio__srv_peer_flooding(emlio_server_t *self, emlio__peer_t *peer)
{
    peer->stalled = true;
    emlio__conn_t *conn =
        peer->fd >= 0 ? emlio__srv_conn_find(self, peer->fd) : NULL;
    if (!conn || conn->closing)
        return;
    char why[160];
    snprintf(why, sizeof(why),
             "the client sends requests without reading the replies "
             "(%" PRIu32 " outstanding, send queue full)",
             peer->outstanding);
    s_conn_shutdown(self, conn, EMLIO_LOG_WARN, why);
}

/* Segment sizes on a connection that carries a pipeline of replies.
 * ZeroMQ sets TCP_NODELAY, so every write whose end does not fill a
 * segment is pushed at once as a short one when the window has room: a
 * 110 KB sample is written as its frame header with the first 8 KiB and
 * then the rest, and the segments of a 30 ms path averaged 40-44 KB
 * instead of the 64 KB that a TUN/loopback MTU allows (iperf3 sends
 * 63 KB). Each segment costs both ends' TCP and every hop per packet: 6-13%
 * of the rate of a CPU-bound path (docs/performance.md). So once a client
 * pipelines (two of its GETs unanswered at once) on a path that qualifies,
 * its replies are sent with Nagle on from their first frame to their last,
 * and pushed at the end (server_request.c, s_send_framed): short writes
 * inside a reply wait for the next write of the same reply, never for an
 * ACK, and no reply's tail waits a round trip, not even the last of a
 * burst. Decided once per connection; nothing per reply here. */
void
emlio__srv_peer_coalesce(emlio_server_t *self, emlio__peer_t *peer)
{
    if (self->cfg.coalesce == EMLIO_COALESCE_NEVER || !peer || peer->fd < 0 ||
        peer->no_coalesce || peer->coalescing || peer->outstanding < 2)
        return;
    /* Its own socket still: once the connection closed, its number may
     * name another client's (the connection record, which the monitor's
     * events keep, may already be that one's when events were lost). */
    if (s_fd_ino(peer->fd) != peer->ino) {
        peer->no_coalesce = true;
        return;
    }
    if (self->cfg.coalesce == EMLIO_COALESCE_AUTO) {
        /* The path's RTT (the handshake gave it): over loopback or a LAN
         * the tails leave full anyway or cost nothing. */
        emlio__netpath_info_t info;
        if (emlio__netpath_info(peer->fd, &info) != 0 ||
            (info.min_rtt_us ? info.min_rtt_us : info.rtt_us) <
                EMLIO_COALESCE_MIN_RTT_US) {
            peer->no_coalesce = true;
            return;
        }
    }
    /* A TCP socket (an IPC one has no TCP_NODELAY: nothing to coalesce). */
    int nodelay;
    socklen_t len = sizeof(nodelay);
    if (getsockopt(peer->fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len) == 0)
        peer->coalescing = true;
    else
        peer->no_coalesce = true;
}
