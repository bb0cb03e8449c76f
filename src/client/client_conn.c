/* client_conn.c - the client's connections and streams: DEALER sockets and
 * their monitors, HELLO/WELCOME, the merged inventory, TCP_INFO and the
 * stream tuner's feed.
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

/* Streams per daemon the tuner starts from (cfg.streams = 0): two, or on a
 * long path as many as carry EMLIO__CLIENT_START_RATE at the measured RTT
 * and window (at most S_MAX_START_STREAMS), so that the first epoch does
 * not crawl while the tuner doubles its way up. */
#define S_AUTO_START_STREAMS 2
#define S_MAX_START_STREAMS  16

/* Closes every stream and forgets the daemons and the merged inventory, so
 * that a failed connect leaves the client as new (connect may be retried). */
void
emlio__client_disconnect(emlio_client_t *self)
{
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++) {
            emlio__cstream_t *st = &daemon->streams[s];
            if (st->sock) {
                zmq_socket_monitor(st->sock, NULL, 0);
                zmq_close(st->sock);
            }
            if (st->mon)
                zmq_close(st->mon);
        }
        emlio_free(daemon->endpoint);
        emlio_free(daemon->local_id);
        emlio_free(daemon->label_map);
    }
    for (size_t i = 0; i < self->inv.n_shards; i++) {
        emlio_free(self->inv.shards[i].name);
        emlio_free(self->inv.shards[i].holders);
    }
    emlio_free(self->inv.shards);
    for (size_t i = 0; self->inv.fields && i < self->inv.n_fields; i++)
        emlio_free(self->inv.fields[i]);
    emlio_free(self->inv.fields);
    for (size_t i = 0; i < self->inv.n_classes; i++)
        emlio_free(self->inv.classes[i]);
    emlio_free(self->inv.classes);
    self->inv.classes = NULL;
    self->inv.n_classes = 0;
    self->inv.format[0] = '\0';
    emlio_free(self->conn.daemons);
    emlio_free(self->conn.poll);
    emlio_free(self->conn.poll_daemon);
    emlio_free(self->conn.poll_stream);
    self->inv.shards = NULL;
    self->inv.n_shards = 0;
    self->conn.daemons = NULL;
    self->conn.n_daemons = 0;
    self->conn.poll = NULL;
    self->conn.poll_daemon = NULL;
    self->conn.poll_stream = NULL;
    self->conn.n_poll = 0;
    /* A retried connect may reach another path: plan anew. */
    self->conn.rcvbuf_by_rtt = false;
    emlio__netpath_plan_recv(&self->conn.limits, 0, &self->conn.rcvbuf);
}

/* ---- connecting -------------------------------------------------------- */

/* Opens stream s of daemon d: a DEALER with CURVE when configured, watched
 * by a monitor (created before connecting so the first handshake's outcome
 * is seen), then connected. Sets errno and returns -1 on failure. */
static int
s_open_stream(emlio_client_t *self, emlio__cdaemon_t *daemon, uint32_t d,
              uint32_t s)
{
    void *zctx = emlio__ctx_zmq(self->ctx);
    void *sock = zmq_socket(zctx, ZMQ_DEALER);
    if (!sock)
        return -1;
    emlio__cstream_t *st = &daemon->streams[s];
    st->sock = sock;
    st->fd = -1;
    daemon->n_streams = EMLIO_MAX(daemon->n_streams, s + 1);
    /* Credits bound what can be queued, so the high-water marks never need
     * to drop or block; heartbeats notice a dead peer; reconnects back off
     * exponentially up to 2 s while a daemon restarts. */
    int zero = 0;
    int hb_ivl = 2000;
    int hb_ttl = 10000;
    int reconnect_max = 2000;
    int ipv6 = emlio__netpath_ipv6_endpoint(daemon->endpoint);
    /* Its I/O thread is fixed when it connects (iolanes.h). */
    uint64_t affinity;
    st->lane = (uint8_t)emlio__iolanes_place(&self->conn.lanes, &affinity);
    if (zmq_setsockopt(sock, ZMQ_AFFINITY, &affinity, sizeof(affinity)) != 0 ||
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_IPV6, &ipv6, sizeof(ipv6)) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof(hb_ivl)) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_ttl, sizeof(hb_ttl)) !=
            0 ||
        zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &reconnect_max,
                       sizeof(reconnect_max)) != 0)
        return -1;
    /* The receive buffer as large as the host allows (see netpath.h):
     * explicit where that beats autotuning, forced on CONNECTED where we
     * may. */
    if (self->conn.rcvbuf.zmq_value >= 0 &&
        zmq_setsockopt(sock, ZMQ_RCVBUF, &self->conn.rcvbuf.zmq_value,
                       sizeof(int)) != 0)
        return -1;
    if (self->cfg.curve_server_key) {
        if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY,
                           self->cfg.curve_server_key, 40) != 0 ||
            zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY,
                           self->cfg.curve_public_key, 40) != 0 ||
            zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY,
                           self->cfg.curve_secret_key, 40) != 0)
            return -1;
    }
    char ep[96];
    snprintf(ep, sizeof(ep), "inproc://emlio-mon-%" PRIu64 "-%u-%u",
             emlio__unique_id(), d, s);
    if (zmq_socket_monitor(sock, ep,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
        return -1;
    void *mon = zmq_socket(zctx, ZMQ_PAIR);
    if (!mon)
        return -1;
    st->mon = mon;
    if (zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0)
        return -1;
    if (zmq_connect(mon, ep) != 0)
        return -1;
    return zmq_connect(sock, daemon->endpoint);
}

/* Closes the last stream s of a daemon (one that failed to open). */
static void
s_close_stream(emlio_client_t *self, emlio__cdaemon_t *daemon, uint32_t s)
{
    emlio__cstream_t *st = &daemon->streams[s];
    if (st->sock) {
        emlio__iolanes_remove(&self->conn.lanes, st->lane);
        zmq_socket_monitor(st->sock, NULL, 0);
        zmq_close(st->sock);
    }
    if (st->mon)
        zmq_close(st->mon);
    st->sock = st->mon = NULL;
    st->ready = false;
    st->fd = -1;
    if (daemon->n_streams == s + 1)
        daemon->n_streams = s;
}

/* What a WELCOME without limits is taken to grant (docs/protocol.md:
 * conservative values). */
#define S_ASSUMED_MAX_BATCH  4096
#define S_ASSUMED_MAX_CREDIT 16

/* The id a HELLO on stream s carries: generation 0, which no GET uses. */
#define S_HELLO_ID(s) EMLIO__ID(0, s, 0)

/* Sends HELLO on stream s of daemon d: with our session, so that the
 * daemon admits our streams as one client; a stream > 0 joins the session
 * stream 0 opened. Returns 0 or -errno (nothing is lost: the caller
 * decides). */
static int
s_send_hello(emlio_client_t *self, uint32_t d, uint32_t s)
{
    emlio__wire_hello_t hello = {
        .name = self->name,
        .session = self->conn.session,
        .stream = s,
        .id = S_HELLO_ID(s),
        .job = self->job,
        .weight = self->cfg.job_weight,
        .share = self->cfg.share,
        .fields = self->want_fields,
        .n_fields = self->n_want_fields,
    };
    if (emlio__wire_encode_hello(&self->scratch, &hello) < 0)
        return -ENOMEM;
    while (zmq_send(self->conn.daemons[d].streams[s].sock, self->scratch.data,
                    self->scratch.len, ZMQ_DONTWAIT) < 0)
        if (errno != EINTR)
            return -errno;
    return 0;
}

/* Reads one monitor event if one is waiting: 1 (event and value set), 0
 * (none) or -errno. */
static int
s_read_event(void *mon, uint16_t *event, uint32_t *value)
{
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, mon, ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&frame);
        return err == EAGAIN || err == EINTR ? 0 : -err;
    }
    *event = 0;
    *value = 0;
    if (zmq_msg_size(&frame) >= 6) {
        memcpy(event, zmq_msg_data(&frame), 2);
        memcpy(value, (uint8_t *)zmq_msg_data(&frame) + 2, 4);
    }
    bool more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
    if (more) { /* the second frame is the peer's address */
        zmq_msg_init(&frame);
        zmq_msg_recv(&frame, mon, 0);
        zmq_msg_close(&frame);
    }
    return 1;
}

/* Acts on the connection events of stream s of daemon d: remembers a lost
 * connection, asks again for what was in flight once it is back, and turns
 * a failed security handshake into an error the caller can act on. */
int
emlio__client_handle_events(emlio_client_t *self, uint32_t d, uint32_t s)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    emlio__cstream_t *st = &daemon->streams[s];
    uint16_t event = 0;
    uint32_t value = 0;
    int rc;
    while ((rc = s_read_event(st->mon, &event, &value)) > 0) {
        switch (event) {
        case ZMQ_EVENT_CONNECTED:
            st->fd = (int)value; /* for TCP_INFO */
            /* A reconnected stream, or one opened before the plan knew
             * the RTT, gets the buffer of the plan now (best effort). */
            (void)emlio__netpath_apply_recv((int)value, &self->conn.rcvbuf);
            break;
        case ZMQ_EVENT_DISCONNECTED:
            st->fd = -1;
            st->down = true;
            emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
                      "lost connection %u to daemon '%s'; reconnecting", s,
                      daemon->endpoint);
            break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            if (st->down) {
                st->down = false;
                emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                          "reconnected %u to daemon '%s'; asking again for "
                          "what was in flight",
                          s, daemon->endpoint);
                /* A restarted daemon knows nothing of our session: say
                 * HELLO again first (ZeroMQ keeps the order), so the
                 * stream counts as ours, not as another client. Before
                 * WELCOME (max_batch still 0) always: a HELLO the lost
                 * connection carried went with it (a daemon out of
                 * descriptors closes fresh connections too), and the
                 * handshake would wait for its answer until it timed
                 * out. */
                if (daemon->max_streams || !daemon->max_batch)
                    s_send_hello(self, d, s);
                rc = emlio__window_resend(self, d, s, emlio__now_ns());
                if (rc < 0)
                    return rc;
            }
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            return emlio__seterr(
                self->err, EMLIO_EDENIED,
                "daemon '%s' refused this client (CURVE authentication "
                "failed, status %" PRIu32 "): is our public key in its "
                "authorized keys?",
                daemon->endpoint, value);
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
                return emlio__seterr(
                    self->err, EMLIO_EDENIED,
                    "security handshake with daemon '%s' failed: %s",
                    daemon->endpoint,
                    self->cfg.curve_server_key
                        ? "the daemon does not use CURVE"
                        : "the daemon requires CURVE (give its public key)");
            daemon->failed_handshakes++;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            /* The connection closed mid-handshake: a daemon restarting, a
             * proxy whose upstream is down, or (with CURVE) a wrong server
             * key. ZeroMQ reconnects by itself; a persistent failure ends
             * as a timeout whose message mentions these. */
            daemon->failed_handshakes++;
            break;
        default:
            break;
        }
    }
    return rc;
}

/* Receives one whole message into parts (at most max, extra frames are
 * dropped). Returns the number of frames or -errno. */
static int
s_recv_multipart(void *sock, zmq_msg_t *parts, size_t max, int flags)
{
    size_t n = 0;
    int more = 1;
    while (more) {
        zmq_msg_t scratch;
        zmq_msg_t *part = n < max ? &parts[n] : &scratch;
        zmq_msg_init(part);
        if (zmq_msg_recv(part, sock, n == 0 ? flags : 0) < 0) {
            int err = errno;
            zmq_msg_close(part);
            for (size_t i = 0; i < EMLIO_MIN(n, max); i++)
                zmq_msg_close(&parts[i]);
            return -err;
        }
        more = zmq_msg_more(part);
        if (part == &scratch)
            zmq_msg_close(part);
        n++;
    }
    return (int)n;
}

/* A daemon's error code as ours: library codes and -errno pass through,
 * anything else (a hostile or newer peer) becomes EMLIO_EPROTO. */
static int
s_remote_code(int64_t code)
{
    if ((code <= -1000 && code > -2000) || (code < 0 && code > -200))
        return (int)code;
    return EMLIO_EPROTO;
}

/* How long connect waits to learn that nothing listens at an endpoint. */
#define S_PROBE_MS 1000

/* Failed CURVE handshakes in a row after which connect gives up. */
#define S_CURVE_FAILS 3

/* Stream 0 of daemon d is connected: its TCP handshake gave the first RTT
 * sample. Sizes the receive buffers from it and opens the streams the
 * first epoch starts with now, each saying HELLO at once, so that their
 * TCP and ZeroMQ handshakes and slow starts run beside stream 0's
 * HELLO/WELCOME, not after it (two to three RTTs earlier). The window per
 * stream is taken to be our receive buffer until WELCOME says the
 * daemon's send buffer (s_init_tuning then opens more if that is
 * smaller); a daemon that allows fewer streams refuses the rest
 * (emlio__client_handshake_reply). A stream that cannot open is left to
 * emlio__client_add_streams, which says why. */
static void
s_open_early(emlio_client_t *self, uint32_t d)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    emlio__client_sample_paths(self);
    emlio__client_plan_rcvbuf(self);
    uint32_t want =
        self->cfg.streams
            ? self->cfg.streams
            : emlio__tuner_start_streams(
                  EMLIO__CLIENT_START_RATE, self->conn.rcvbuf.effective,
                  self->conn.rtt_ns, S_AUTO_START_STREAMS, S_MAX_START_STREAMS);
    while (daemon->n_streams < want) {
        uint32_t s = daemon->n_streams;
        if (s_open_stream(self, daemon, d, s) != 0 ||
            s_send_hello(self, d, s) < 0) {
            s_close_stream(self, daemon, s);
            break;
        }
        daemon->opened_ns = emlio__now_ns();
    }
    emlio_log(self->ctx, EMLIO_LOG_DEBUG, "client",
              "'%s' connected: RTT %.1f ms, receive buffer %" PRIu64
              " KiB (%s); opened %u streams during the handshake",
              daemon->endpoint, (double)self->conn.rtt_ns / 1e6,
              self->conn.rcvbuf.effective >> 10, self->conn.rcvbuf.how,
              daemon->n_streams);
}

/* The handshake's deadline passed: why, as far as the monitor tells. */
static int
s_no_answer(emlio_client_t *self, const emlio__cdaemon_t *daemon)
{
    if (daemon->failed_handshakes)
        return emlio__seterr(
            self->err, EMLIO_ETIMEDOUT,
            "no answer from daemon '%s' within %d ms: %" PRIu64
            " handshakes failed (%s)",
            daemon->endpoint, self->cfg.connect_timeout_ms,
            daemon->failed_handshakes,
            self->cfg.curve_server_key
                ? "wrong server key, or the daemon does not use CURVE?"
                : "does the daemon require CURVE?");
    return emlio__seterr(self->err, EMLIO_ETIMEDOUT,
                         "no answer from daemon '%s' within %d ms: is emliod "
                         "running there?",
                         daemon->endpoint, self->cfg.connect_timeout_ms);
}

/* The HELLO on stream 0 found no connection to go to: ZeroMQ already
 * tore it down, which it does when the security handshake fails (CURVE on
 * one side only) during the probe that precedes the HELLO. The monitor
 * holds the reason, so that is what the caller hears. */
static int
s_closed_before_hello(emlio_client_t *self, emlio__cdaemon_t *daemon,
                      uint32_t d)
{
    zmq_pollitem_t mon = { daemon->streams[0].mon, 0, ZMQ_POLLIN, 0 };
    while (zmq_poll(&mon, 1, S_PROBE_MS) > 0) {
        int rc = emlio__client_handle_events(self, d, 0);
        if (rc < 0)
            return rc;
    }
    return emlio__seterr(self->err, EMLIO_ECLOSED,
                         "daemon '%s' closed the connection before our "
                         "HELLO (%s)",
                         daemon->endpoint,
                         self->cfg.curve_server_key
                             ? "wrong server key, or the daemon does not use "
                               "CURVE?"
                             : "does the daemon require CURVE?");
}

/* HELLO -> WELCOME with one daemon; fills its inventory. */
static int
s_handshake(emlio_client_t *self, emlio__cdaemon_t *daemon,
            emlio__wire_msg_t *msg, zmq_msg_t *frame, uint64_t deadline_ns)
{
    void *sock = daemon->streams[0].sock;
    uint64_t t0 = emlio__now_ns();
    bool early = false; /* the first epoch's streams are open */
    /* ZeroMQ retries a refused connect quietly until connect_timeout_ms;
     * a user who got the port wrong should hear it at once. */
    if (emlio__netpath_probe(daemon->endpoint, S_PROBE_MS) == -ECONNREFUSED)
        return emlio__seterr(self->err, -ECONNREFUSED,
                             "connection refused by '%s': is emliod running "
                             "there, on that port?",
                             daemon->endpoint);
    uint32_t d = (uint32_t)(daemon - self->conn.daemons);
    int sent = s_send_hello(self, d, 0);
    if (sent == -EAGAIN)
        return s_closed_before_hello(self, daemon, d);
    if (sent < 0)
        return emlio__seterr(self->err, sent, "cannot send to '%s': %s",
                             daemon->endpoint, zmq_strerror(-sent));
    for (;;) {
        uint64_t now = emlio__now_ns();
        int left =
            now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000);
        zmq_pollitem_t items[2] = { { sock, 0, ZMQ_POLLIN, 0 },
                                    { daemon->streams[0].mon, 0, ZMQ_POLLIN,
                                      0 } };
        int ready = 0;
        if (left > 0)
            while ((ready = zmq_poll(items, 2, left)) < 0 && errno == EINTR)
                ;
        if (ready > 0 && (items[1].revents & ZMQ_POLLIN)) {
            int rc = emlio__client_handle_events(self, d, 0);
            if (rc < 0)
                return rc;
            if (!early && daemon->streams[0].fd >= 0) {
                early = true;
                s_open_early(self, d);
            }
            /* With CURVE, a daemon that closes every handshake (about one
             * per 100 ms reconnect) almost surely cannot decrypt ours: a
             * wrong server key. Say so now, not after the whole timeout. */
            if (self->cfg.curve_server_key &&
                daemon->failed_handshakes >= S_CURVE_FAILS)
                return emlio__seterr(
                    self->err, EMLIO_EDENIED,
                    "security handshake with daemon '%s' failed %" PRIu64
                    " times in %.1f s: wrong server key, or the daemon "
                    "does not use CURVE?",
                    daemon->endpoint, daemon->failed_handshakes,
                    (double)(emlio__now_ns() - t0) / 1e9);
            continue;
        }
        if (ready <= 0)
            return s_no_answer(self, daemon);
        int n = s_recv_multipart(sock, frame, 1, ZMQ_DONTWAIT);
        if (n == -EAGAIN)
            continue;
        if (n < 0)
            return emlio__seterr(self->err, n, "cannot receive from '%s': %s",
                                 daemon->endpoint, zmq_strerror(-n));
        char why[EMLIO_ERRMSG_LEN];
        int rc = emlio__wire_decode(msg, zmq_msg_data(frame),
                                    zmq_msg_size(frame), 0, why);
        if (rc < 0) {
            zmq_msg_close(frame);
            return emlio__seterr(self->err, rc, "daemon '%s' sent a %s",
                                 daemon->endpoint, why);
        }
        if (msg->type == EMLIO_MSG_ERROR) {
            int code = s_remote_code(msg->error.code);
            emlio__seterr(self->err, code, "daemon '%s' refused us: %.*s",
                          daemon->endpoint, (int)msg->error.text_len,
                          msg->error.text);
            emlio__wire_msg_release(msg);
            zmq_msg_close(frame);
            return code;
        }
        if (msg->type != EMLIO_MSG_WELCOME) {
            emlio__wire_msg_release(msg);
            zmq_msg_close(frame);
            continue; /* a stale reply from an earlier session */
        }
        if (msg->welcome.version != EMLIO_WIRE_VERSION) {
            uint64_t version = msg->welcome.version; /* release zeroes it */
            emlio__wire_msg_release(msg);
            zmq_msg_close(frame);
            return emlio__seterr(self->err, EMLIO_EVERSION,
                                 "daemon '%s' speaks protocol %" PRIu64
                                 ", we speak %d",
                                 daemon->endpoint, version, EMLIO_WIRE_VERSION);
        }
        self->win.min_latency_ns = emlio__now_ns() - t0;
        return 0;
    }
}

/* Keeps the field names of the first daemon's WELCOME; every other daemon
 * must serve the same fields, or samples would differ by daemon. */
static int
s_take_fields(emlio_client_t *self, const emlio__cdaemon_t *daemon,
              const emlio__wire_msg_t *msg, bool first)
{
    /* The fields asked for come back as asked, or the daemon ignored
     * them (it predates them): its samples would not be what the caller
     * named. */
    bool as_asked =
        !self->n_want_fields || msg->welcome.n_fields == self->n_want_fields;
    for (size_t i = 0; as_asked && i < self->n_want_fields; i++)
        as_asked = strlen(self->want_fields[i]) == msg->welcome.fields[i].len &&
                   !memcmp(self->want_fields[i], msg->welcome.fields[i].s,
                           msg->welcome.fields[i].len);
    if (!as_asked)
        return emlio__seterr(self->err, EMLIO_EMISMATCH,
                             "daemon '%s' did not serve the fields asked for "
                             "(it predates client-named fields: start it "
                             "with --fields instead)",
                             daemon->endpoint);
    if (first) {
        self->inv.n_fields = msg->welcome.n_fields ? msg->welcome.n_fields : 1;
        if (!msg->welcome.n_fields)
            return 0;
        self->inv.fields =
            emlio_calloc(msg->welcome.n_fields, sizeof(*self->inv.fields));
        if (!self->inv.fields)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        for (size_t i = 0; i < msg->welcome.n_fields; i++) {
            self->inv.fields[i] = emlio__memdupz(msg->welcome.fields[i].s,
                                                 msg->welcome.fields[i].len);
            if (!self->inv.fields[i])
                return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        }
        return 0;
    }
    bool same = (msg->welcome.n_fields ? msg->welcome.n_fields : 1) ==
                self->inv.n_fields;
    for (size_t i = 0; same && i < msg->welcome.n_fields; i++)
        same = self->inv.fields &&
               strlen(self->inv.fields[i]) == msg->welcome.fields[i].len &&
               !memcmp(self->inv.fields[i], msg->welcome.fields[i].s,
                       msg->welcome.fields[i].len);
    if (!same)
        return emlio__seterr(self->err, EMLIO_EMISMATCH,
                             "daemon '%s' serves other fields than '%s'",
                             daemon->endpoint, self->conn.daemons[0].endpoint);
    return 0;
}

/* Rebuilds the poll set after streams were added: one item per stream, in
 * daemon order, then one per monitor. */
static int
s_rebuild_poll(emlio_client_t *self)
{
    size_t n = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        n += self->conn.daemons[d].n_streams;
    /* One more slot: the decode pool's eventfd (client.c, s_poll_items). */
    zmq_pollitem_t *poll = emlio_calloc(2 * n + 1, sizeof(*poll));
    uint32_t *pd = emlio_calloc(n, sizeof(*pd));
    uint32_t *ps = emlio_calloc(n, sizeof(*ps));
    if (!poll || !pd || !ps) {
        emlio_free(poll);
        emlio_free(pd);
        emlio_free(ps);
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    }
    size_t i = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (uint32_t s = 0; s < self->conn.daemons[d].n_streams; s++, i++) {
            poll[i] = (zmq_pollitem_t){ self->conn.daemons[d].streams[s].sock,
                                        0, ZMQ_POLLIN, 0 };
            poll[n + i] =
                (zmq_pollitem_t){ self->conn.daemons[d].streams[s].mon, 0,
                                  ZMQ_POLLIN, 0 };
            pd[i] = d;
            ps[i] = s;
        }
    emlio_free(self->conn.poll);
    emlio_free(self->conn.poll_daemon);
    emlio_free(self->conn.poll_stream);
    self->conn.poll = poll;
    self->conn.poll_daemon = pd;
    self->conn.poll_stream = ps;
    self->conn.n_poll = n;
    return 0;
}

/* Opens streams on every daemon d until it has want[d] (within its
 * session limit). A new stream says HELLO to join our session and carries
 * GETs once the daemon answered (emlio__client_handshake_reply marks it ready);
 * a daemon without sessions takes GETs at once. */
int
emlio__client_add_streams_each(emlio_client_t *self, const uint32_t *want)
{
    bool added = false;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        uint32_t limit = daemon->max_streams ? daemon->max_streams
                                             : EMLIO__CLIENT_MAX_STREAMS;
        while (daemon->n_streams < EMLIO_MIN(want[d], limit)) {
            uint32_t s = daemon->n_streams;
            int rc = s_open_stream(self, daemon, d, s) != 0 ? -errno : 0;
            if (rc == 0 && daemon->max_streams)
                rc = s_send_hello(self, d, s);
            if (rc < 0) {
                /* Out of descriptors, say: the streams we have carry on;
                 * this daemon gets no more. */
                s_close_stream(self, daemon, s);
                daemon->max_streams = EMLIO_MAX(s, 1);
                emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
                          "cannot open stream %u to '%s': %s; staying at %u", s,
                          daemon->endpoint, zmq_strerror(-rc), s);
                break;
            }
            if (!daemon->max_streams)
                daemon->streams[s].ready = true;
            daemon->opened_ns = emlio__now_ns();
            added = true;
        }
    }
    return added || !self->conn.poll ? s_rebuild_poll(self) : 0;
}

/* The same number of streams on every daemon. */
int
emlio__client_add_streams(emlio_client_t *self, uint32_t want)
{
    uint32_t each[EMLIO__CLIENT_MAX_DAEMONS];
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        each[d] = want;
    return emlio__client_add_streams_each(self, each);
}

/* The per-stream window the path allows: the smaller of the daemons' send
 * buffers and the receive buffer this host autotunes to; and the streams
 * to start with. */
static void
s_init_tuning(emlio_client_t *self)
{
    emlio__client_sample_paths(
        self); /* the RTT of the streams' TCP handshakes */
    emlio__client_plan_rcvbuf(self);
    uint64_t rcv = self->conn.rcvbuf.effective;
    uint64_t snd = UINT64_MAX;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        snd = EMLIO_MIN(
            snd, self->conn.daemons[d].sndbuf
                     ? self->conn.daemons[d].sndbuf
                     : EMLIO_MAX(self->conn.limits.tcp_wmem_max, 4u << 20));
    self->conn.window_bytes = EMLIO_MIN(snd, rcv ? rcv : snd);
    uint64_t rtt =
        self->conn.rtt_ns ? self->conn.rtt_ns : self->win.min_latency_ns;
    uint32_t start = self->cfg.streams
                         ? self->cfg.streams
                         : emlio__tuner_start_streams(EMLIO__CLIENT_START_RATE,
                                                      self->conn.window_bytes,
                                                      rtt, S_AUTO_START_STREAMS,
                                                      S_MAX_START_STREAMS);
    if (!self->cfg.streams && start > S_AUTO_START_STREAMS)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                  "RTT %.1f ms with a %" PRIu64 " KiB window: starting "
                  "with %u streams per daemon",
                  (double)rtt / 1e6, self->conn.window_bytes >> 10, start);
    emlio__tuner_init(&self->conn.tuner, start, EMLIO__CLIENT_MAX_STREAMS,
                      self->cfg.streams != 0, emlio__now_ns());
}

/* Checks the CURVE keys, splits the comma-separated endpoint list and
 * opens stream 0 to each daemon (it says HELLO; the others join once we
 * know the daemon admits them into our session: emlio__client_add_streams). */
static int
s_open_daemons(emlio_client_t *self, const char *endpoints)
{
    const emlio_client_config_t *keycfg = &self->cfg;
    int keys = !!keycfg->curve_server_key + !!keycfg->curve_public_key +
               !!keycfg->curve_secret_key;
    if (keys != 0 && keys != 3)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "curve needs the server key and our key pair");
    if (keys && (strlen(keycfg->curve_server_key) != 40 ||
                 strlen(keycfg->curve_public_key) != 40 ||
                 strlen(keycfg->curve_secret_key) != 40))
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "curve keys must be 40 Z85 characters");
    /* Count and split the endpoint list. */
    size_t count = 1;
    for (const char *p = endpoints; *p; p++)
        count += *p == ',';
    if (count > EMLIO__CLIENT_MAX_DAEMONS)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "too many daemons (at most %d)",
                             EMLIO__CLIENT_MAX_DAEMONS);
    self->conn.daemons = emlio_calloc(count, sizeof(*self->conn.daemons));
    if (!self->conn.daemons)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    const char *p = endpoints;
    bool local = true; /* every daemon on this host */
    for (size_t i = 0; i < count; i++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "empty endpoint in '%s'", endpoints);
        emlio__cdaemon_t *daemon = &self->conn.daemons[self->conn.n_daemons++];
        daemon->endpoint = emlio__memdupz(p, len);
        if (!daemon->endpoint)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        daemon->source = self->src_of_daemon ? self->src_of_daemon[i] : 0;
        char why[512];
        if (emlio__netpath_resolve(daemon->endpoint, why, sizeof(why)) < 0)
            return emlio__seterr(self->err, EMLIO_ENOTFOUND, "%s", why);
        local &= emlio__netpath_local_endpoint(daemon->endpoint);
        p = end ? end + 1 : p + len;
    }
    emlio__client_init_lanes(self, local);
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        if (s_open_stream(self, daemon, d, 0) != 0)
            return emlio__seterr(self->err, -errno,
                                 "cannot connect to '%s': %s", daemon->endpoint,
                                 zmq_strerror(errno));
        daemon->streams[0].ready = true;
    }
    return 0;
}

/* The shards per window the plans use: the job's window_shards, or for a
 * job that shares reads without one, the shared schedule's: as many of the
 * largest shard as the smallest "share_window" of the daemons holds (at
 * least one), so a window fits the share of the daemons' caches it is
 * meant to take, and every sharing job of the dataset gets the same. */
static void
s_plan_window(emlio_client_t *self)
{
    self->inv.window = self->cfg.window_shards;
    self->inv.share = self->cfg.share;
    /* Sources are mixed whole: a daemon that shares every job's reads
     * still serves a blend's picks one by one. */
    for (uint32_t d = 0; d < self->conn.n_daemons && !self->n_src; d++)
        self->inv.share |= self->conn.daemons[d].share_all;
    if (!self->inv.share || self->cfg.window_shards)
        return;
    uint64_t win = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        uint64_t w = self->conn.daemons[d].share_window;
        if (w && (!win || w < win))
            win = w;
    }
    uint64_t biggest = 1;
    for (size_t i = 0; i < self->inv.n_shards; i++)
        biggest = EMLIO_MAX(biggest, self->inv.shards[i].bytes);
    if (win)
        self->inv.window =
            (uint32_t)EMLIO_MIN(EMLIO_MAX(win / biggest, 1), UINT32_MAX);
}

/* Where a sharing job's epoch 0 begins in the shared schedule
 * (docs/planner.md, "Joining"): asked, or the daemons' cursor, the lowest
 * that any daemon said for these segments (each daemon tells every rank
 * of a named job the same, so all ranks agree whatever their order of
 * endpoints). A job of several ranks without a name starts at 0: its
 * ranks are separate jobs to the daemons and could be told different
 * cursors. */
static void
s_plan_join(emlio_client_t *self)
{
    self->inv.segs =
        self->inv.share
            ? emlio_plan_shared_segments(self->inv.n_shards, self->inv.window)
            : 0;
    self->inv.join = 0;
    if (!self->inv.share)
        return;
    if (self->cfg.share_join_mode == EMLIO_SHARE_JOIN_AT) {
        self->inv.join = self->cfg.share_join;
        return;
    }
    if (self->cfg.world > 1 && !self->cfg.job)
        return;
    bool found = false;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        const emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        if (daemon->share_segs != self->inv.segs)
            continue;
        if (!found || daemon->share_cursor < self->inv.join)
            self->inv.join = daemon->share_cursor;
        found = true;
    }
}

/* Connects to every daemon of the list: stream 0 each, HELLO/WELCOME, the
 * merged inventory, then the streams the tuner starts with. Leaves what it
 * opened for emlio__client_disconnect on failure. */
int
emlio__client_dial(emlio_client_t *self, const char *endpoints)
{
    int rc = s_open_daemons(self, endpoints);
    if (rc < 0)
        return rc;
    /* Handshake with every daemon; the inventories' strings are borrowed
     * from the WELCOME frames, kept until the merge is done. */
    zmq_msg_t *frames = emlio_calloc(self->conn.n_daemons, sizeof(*frames));
    emlio__wire_msg_t *msgs = emlio_calloc(self->conn.n_daemons, sizeof(*msgs));
    uint32_t got = 0;
    if (!frames || !msgs) {
        rc = emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        goto out;
    }
    uint64_t deadline =
        emlio__now_ns() +
        (uint64_t)EMLIO_MAX(self->cfg.connect_timeout_ms, 1) * 1000000ull;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        rc = s_handshake(self, &self->conn.daemons[d], &msgs[d], &frames[d],
                         deadline);
        if (rc < 0)
            goto out;
        got++;
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        snprintf(daemon->dataset, sizeof(daemon->dataset), "%.*s",
                 (int)EMLIO_MIN(msgs[d].welcome.dataset_len,
                                sizeof(daemon->dataset) - 1),
                 msgs[d].welcome.dataset);
        daemon->max_batch = msgs[d].welcome.max_batch
                                ? msgs[d].welcome.max_batch
                                : S_ASSUMED_MAX_BATCH;
        daemon->max_credit = msgs[d].welcome.max_credit
                                 ? msgs[d].welcome.max_credit
                                 : S_ASSUMED_MAX_CREDIT;
        daemon->max_copy = msgs[d].welcome.max_copy_bytes;
        daemon->share_window = msgs[d].welcome.share_window;
        daemon->share_all = msgs[d].welcome.share;
        daemon->share_segs = msgs[d].welcome.share_segs;
        daemon->share_cursor = msgs[d].welcome.share_cursor;
        daemon->max_streams = (uint32_t)EMLIO_MIN(msgs[d].welcome.max_streams,
                                                  EMLIO__CLIENT_MAX_STREAMS);
        daemon->sndbuf = msgs[d].welcome.sndbuf;
        rc = s_take_fields(self, daemon, &msgs[d], d == 0);
        if (rc == 0)
            rc = emlio__tensor_take_welcome(self, daemon, &msgs[d]);
        if (rc < 0)
            goto out;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (const char *c = self->conn.daemons[d].dataset; *c; c++)
            h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    h = emlio__sources_fold(self, h);
    snprintf(self->inv.dataset, sizeof(self->inv.dataset), "%016" PRIx64, h);
    rc = emlio__client_merge_inventory(self, msgs);
    if (rc < 0)
        goto out;
    s_plan_window(self);
    s_plan_join(self);
    s_init_tuning(self);
    rc = emlio__client_add_streams(self, self->conn.tuner.min_streams);
    if (rc < 0)
        goto out;
    rc = (int)self->conn.n_daemons;
out:
    for (uint32_t d = 0; d < got; d++) {
        emlio__wire_msg_release(&msgs[d]);
        zmq_msg_close(&frames[d]);
    }
    emlio_free(frames);
    emlio_free(msgs);
    return rc;
}

/* A WELCOME's limits (requests per connection, samples per request) may
 * differ from what the first one said: a daemon restarted with other
 * settings says HELLO's answer again on every stream that reconnects. The
 * window and the parts are sized from them (client_budget.c), so they are
 * sized again; GETs already sent past a smaller limit are refused and
 * asked again as credits free (s_ask_again). */
static void
s_take_limits(emlio_client_t *self, emlio__cdaemon_t *daemon,
              const emlio__wire_msg_t *msg)
{
    /* The short WELCOME of a session's further streams carries no limits
     * (nor do old daemons'): what we have stands. */
    if (msg->welcome.max_copy_bytes)
        daemon->max_copy = msg->welcome.max_copy_bytes;
    if (!msg->welcome.max_credit && !msg->welcome.max_batch)
        return;
    uint64_t credit = msg->welcome.max_credit ? msg->welcome.max_credit
                                              : S_ASSUMED_MAX_CREDIT;
    uint64_t batch =
        msg->welcome.max_batch ? msg->welcome.max_batch : S_ASSUMED_MAX_BATCH;
    if (credit == daemon->max_credit && batch == daemon->max_batch)
        return;
    emlio_log(
        self->ctx, EMLIO_LOG_INFO, "client",
        "daemon '%s' now grants %" PRIu64 " requests per stream (was %" PRIu64
        ") and %" PRIu64 " samples per request (was %" PRIu64 ")",
        daemon->endpoint, credit, daemon->max_credit, batch, daemon->max_batch);
    daemon->max_credit = credit;
    daemon->max_batch = batch;
    if (self->current.n_batches)
        emlio__budget_rebound(self);
}

/* The daemon's answer to a stream's HELLO (ids of generation 0, or a
 * version refusal with id 0 on `stream`, which received it): WELCOME lets
 * the stream carry GETs; an ERROR (the session has all the streams the
 * daemon allows) caps the streams of that daemon where they are. */
static int
s_joined(emlio_client_t *self, uint32_t d, uint32_t stream,
         const emlio__wire_msg_t *msg)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    uint64_t s = msg->id ? EMLIO__ID_BATCH(msg->id) : stream;
    if (s >= daemon->n_streams)
        return 1; /* not ours: ignore */
    if (msg->type == EMLIO_MSG_WELCOME) {
        s_take_limits(self, daemon, msg);
        if (!daemon->streams[s].ready) {
            daemon->streams[s].ready = true;
            emlio_log(self->ctx, EMLIO_LOG_DEBUG, "client",
                      "stream %" PRIu64 " of '%s' joined", s, daemon->endpoint);
            if (self->current.n_batches && !self->cfg.inflight)
                emlio__budget_rebound(self); /* more streams, more credits */
        }
        return 1;
    }
    emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
              "daemon '%s' refused stream %" PRIu64
              ": %.*s; staying at %" PRIu64 " streams",
              daemon->endpoint, s, (int)msg->error.text_len, msg->error.text,
              s);
    daemon->max_streams = (uint32_t)EMLIO_MAX(s, 1);
    return 1;
}

int
emlio__client_handshake_reply(emlio_client_t *self, uint32_t d, uint32_t stream,
                              const emlio__wire_msg_t *msg)
{
    /* By id (stream 0's is 0: its WELCOME after a reconnect); a version
     * refusal (id 0) on a stream still waiting for one is its HELLO's
     * too. */
    bool hello_id = EMLIO__ID_GEN(msg->id) == 0 && msg->id != 0;
    bool answer = (hello_id && (msg->type == EMLIO_MSG_WELCOME ||
                                msg->type == EMLIO_MSG_ERROR)) ||
                  (msg->id == 0 && msg->type == EMLIO_MSG_WELCOME) ||
                  (msg->id == 0 && msg->type == EMLIO_MSG_ERROR &&
                   msg->error.code == EMLIO_EVERSION &&
                   !self->conn.daemons[d].streams[stream].ready);
    return answer ? s_joined(self, d, stream, msg) : 0;
}
