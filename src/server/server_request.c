/* server_request.c - the frontend thread, the only one that touches the
 * client socket: HELLO answered with WELCOME, GET decoded and put to the
 * gate (server_gate.c), finished replies forwarded to their clients and
 * the idle expiry run between polls (shards are watched by
 * the shard cache's own thread: shard_cache.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <zmq.h>

#include "server_internal.h"

static int s_send_framed(emlio_server_t *self, emlio__peer_t *peer,
                         zmq_msg_t *part, int flags, int nodelay,
                         emlio__trainjob_t **tjob, uint64_t cost);

/* The frontend's error reply to peer (NULL: not known): framed like a
 * batch's last frame (s_send_framed), so that on a coalescing connection its
 * end is pushed rather than held for an ACK behind Nagle; as it is on any
 * other. Returns 0 or -errno. */
static int
s_send_error_reply(emlio_server_t *self, emlio__peer_t *peer,
                   zmq_msg_t *identity, uint64_t id, int code, const char *text)
{
    zmq_msg_t header;
    if (emlio__srv_error_msg(&header, id, code, text) < 0) {
        zmq_msg_close(identity);
        return EMLIO_ENOMEM;
    }
    int rc = 0;
    if (zmq_msg_send(identity, self->net.router, ZMQ_SNDMORE | ZMQ_DONTWAIT) <
        0) {
        rc = -errno;
        zmq_msg_close(identity);
        zmq_msg_close(&header);
    } else if (s_send_framed(self, peer, &header, ZMQ_DONTWAIT, 1, NULL, 0) <
               0) {
        rc = -errno;
        zmq_msg_close(&header);
    }
    return rc;
}

static void
s_frontend_reply_error(emlio_server_t *self, zmq_msg_t *identity, uint64_t id,
                       int code, const char *text)
{
    atomic_fetch_add(&self->count.errors, 1);
    /* At most 10 lines a second: a flooding peer must not fill the disk. */
    uint64_t now = emlio__now_ns();
    if (now - self->adm.err_log_ns > 1000000000ull) {
        if (self->adm.err_log_quiet)
            emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                      "%" PRIu64 " more refused requests not logged",
                      self->adm.err_log_quiet);
        self->adm.err_log_ns = now;
        self->adm.err_log_n = 0;
        self->adm.err_log_quiet = 0;
    }
    if (self->adm.err_log_n++ < 10)
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", text);
    else
        self->adm.err_log_quiet++;
    emlio__peer_t *peer = emlio__srv_peer_find(self, zmq_msg_data(identity),
                                               zmq_msg_size(identity), false);
    int rc = s_send_error_reply(self, peer, identity, id, code, text);
    if (rc == -EAGAIN && peer)
        emlio__srv_peer_flooding(self, peer);
}

/* HELLO: admits the connection (alone, or into its client's session) and
 * answers WELCOME: the whole inventory for a session's first stream, the
 * short "joined" form for its further streams. Consumes job->identity. */
static void
s_frontend_hello(emlio_server_t *self, emlio__job_t *job)
{
    const emlio__msg_hello_t *hello = &job->msg.hello;
    const uint8_t *id = zmq_msg_data(&job->identity);
    size_t id_len = zmq_msg_size(&job->identity);
    emlio__peer_t *peer = emlio__srv_peer_find(self, id, id_len, false);
    if (!peer) {
        bool joining = hello->session &&
                       emlio__srv_session_streams(self, hello->session) > 0;
        peer = emlio__srv_peer_add(self, id, id_len, true, hello->session);
        if (!peer) {
            char text[160];
            if (joining)
                snprintf(text, sizeof(text),
                         "too many streams in one client session (limit %u)",
                         EMLIO_WIRE_MAX_STREAMS);
            else
                snprintf(text, sizeof(text),
                         "too many clients (limit %" PRIu32 ")",
                         self->cfg.max_clients);
            s_frontend_reply_error(self, &job->identity, job->msg.id,
                                   EMLIO_ELIMIT, text);
            return;
        }
    } else if (hello->session && peer->session != hello->session) {
        /* A connection says HELLO again under a session (a client that
         * reconnected its stream 0 first): it becomes part of it. */
        uint64_t old = peer->session;
        if (emlio__srv_session_streams(self, hello->session) > 0 &&
            (!old || emlio__srv_session_streams(self, old) == 1))
            self->adm.n_clients--;
        peer->session = hello->session;
    }
    const emlio__fieldset_t *fields = NULL;
    char ftext[EMLIO_ERRMSG_LEN];
    int frc = emlio__srv_fields_resolve(self, hello, &fields, ftext);
    if (frc < 0) {
        s_frontend_reply_error(self, &job->identity, job->msg.id, frc, ftext);
        return;
    }
    peer->fields = fields;
    peer->share = hello->share;
    char why[160];
    int jrc = emlio__srv_jobs_attach(self, peer, hello->job, hello->job_len,
                                     hello->weight, why, sizeof(why));
    if (jrc < 0) {
        s_frontend_reply_error(self, &job->identity, job->msg.id, jrc, why);
        return;
    }
    /* Copies: a zero-copy WELCOME could outlive the server in a ZeroMQ
     * queue. It is sent once per connection. */
    zmq_msg_t welcome;
    emlio_buf_t joined = EMLIO_BUF_INIT;
    const emlio_buf_t *reply = NULL;
    if (hello->session && hello->stream > 0) {
        if (emlio__wire_encode_joined(&joined, job->msg.id,
                                      self->core->set.fingerprint) < 0) {
            emlio_buf_release(&joined);
            zmq_msg_close(&job->identity);
            return;
        }
        reply = &joined;
    } else {
        /* The WELCOME of this session's fields. */
        reply = emlio__srv_fields_welcome(self, fields);
        if (!reply) {
            zmq_msg_close(&job->identity);
            return; /* out of memory: the client times out, says HELLO
                       again */
        }
        atomic_fetch_add(&self->count.clients, 1);
        uint64_t segs, cursor;
        if (self->core->share && (hello->share || self->cfg.share_all) &&
            emlio__srv_jobs_join(self, peer, &segs, &cursor)) {
            if (emlio__wire_welcome_add_cursor(&joined, reply, segs, cursor) <
                0) {
                emlio_buf_release(&joined);
                zmq_msg_close(&job->identity);
                return;
            }
            reply = &joined;
        }
    }
    if (zmq_msg_init_size(&welcome, reply->len) != 0) {
        emlio_buf_release(&joined);
        zmq_msg_close(&job->identity);
        return;
    }
    memcpy(zmq_msg_data(&welcome), reply->data, reply->len);
    emlio_buf_release(&joined);
    emlio__srv_send_parts(self->net.router, &job->identity, &welcome, NULL, 0,
                          ZMQ_DONTWAIT);
}

/* Which connection the request came on (libzmq sets the source
 * descriptor on the frames it received, not on the routing id it
 * prepends): its activity keeps it from the idle timeout. False for one
 * that we are closing: nothing more is done for it. */
static bool
s_request_source(emlio_server_t *self, emlio__job_t *job)
{
    self->adm.cur_fd = zmq_msg_get(&job->header, ZMQ_SRCFD);
    if (self->adm.cur_fd < 0)
        return true;
    emlio__conn_t *conn = emlio__srv_conn_find(self, self->adm.cur_fd);
    if (!conn) { /* its ACCEPTED event may still be queued */
        emlio__srv_monitor_drain(self);
        conn = emlio__srv_conn_find(self, self->adm.cur_fd);
    }
    /* A connection we shut down cannot send any more; a request on its
     * descriptor comes from a new connection whose events were lost. */
    if (!conn || (conn->closing && !emlio__srv_conn_same(conn)))
        conn = emlio__srv_conn_add(self, self->adm.cur_fd, emlio__now_ns());
    else
        conn->last_seen_ns = emlio__now_ns();
    return !(conn && conn->closing);
}

/* Whether a HELLO's protocol version can be served; if not, the client is
 * told why (consuming job->identity). There is one version. */
static bool
s_hello_version_ok(emlio_server_t *self, emlio__job_t *job)
{
    if (job->msg.hello.version == EMLIO_WIRE_VERSION)
        return true;
    char text[EMLIO_ERRMSG_LEN];
    snprintf(text, sizeof(text),
             "protocol version %" PRIu64 " not supported: this daemon "
             "speaks version %d only; upgrade the client",
             job->msg.hello.version, EMLIO_WIRE_VERSION);
    s_frontend_reply_error(self, &job->identity, 0, EMLIO_EVERSION, text);
    return false;
}

/* Handles one client message: HELLO answered here, GET passed to a reader. */
static void
s_frontend_request(emlio_server_t *self, void *work)
{
    emlio__job_t *job = emlio_calloc(1, sizeof(*job));
    if (!job) {
        emlio__zmq_drain(self->net.router);
        return;
    }
    zmq_msg_init(&job->identity);
    zmq_msg_init(&job->header);
    if (zmq_msg_recv(&job->identity, self->net.router, ZMQ_DONTWAIT) < 0)
        goto drop;
    if (!zmq_msg_more(&job->identity) ||
        zmq_msg_recv(&job->header, self->net.router, 0) < 0)
        goto drop;
    if (!s_request_source(self, job)) {
        emlio__zmq_drain(self->net.router);
        goto drop;
    }
    if (zmq_msg_more(&job->header)) {
        emlio__zmq_drain(self->net.router);
        s_frontend_reply_error(self, &job->identity, 0, EMLIO_EPROTO,
                               "requests are a single header frame");
        goto drop_header;
    }
    /* A connection that stopped reading (a reply to it could not even be
     * queued) and is at its credit limit gets its requests dropped before
     * any decoding and without a reply: a flood then costs the frontend
     * almost nothing and cannot outrun it (the receive queue is unbounded:
     * see emlio_server_bind). A reading client is never affected: it always
     * gets one reply per request. */
    if (emlio__srv_gate_unread(self, &job->identity)) {
        atomic_fetch_add(&self->count.errors, 1);
        goto drop;
    }
    char err[EMLIO_ERRMSG_LEN];
    int rc = emlio__wire_decode(&job->msg, zmq_msg_data(&job->header),
                                zmq_msg_size(&job->header), self->cfg.max_batch,
                                err);
    if (rc < 0) {
        char text[EMLIO_ERRMSG_LEN + 32];
        snprintf(text, sizeof(text), "bad request: %s", err);
        s_frontend_reply_error(self, &job->identity, 0, EMLIO_EPROTO, text);
        goto drop_header;
    }
    if (job->msg.type == EMLIO_MSG_HELLO) {
        if (s_hello_version_ok(self, job))
            s_frontend_hello(self, job);
        goto drop_header;
    }
    if (job->msg.type != EMLIO_MSG_GET) {
        s_frontend_reply_error(self, &job->identity, job->msg.id, EMLIO_EPROTO,
                               "unexpected message type from a client");
        goto drop_header;
    }
    emlio__peer_t *peer;
    emlio__refusal_t why;
    switch (emlio__srv_gate_get(self, job, &peer, &why)) {
    case EMLIO__GATE_GO:
        (void)emlio__srv_gate_dispatch(self, work, job, peer);
        return; /* the scheduler or a worker owns the job now (or it went) */
    case EMLIO__GATE_PARK:
        return; /* the gate holds it until the copy budget has room */
    case EMLIO__GATE_REFUSE:
        s_frontend_reply_error(self, &job->identity, job->msg.id, why.code,
                               why.text);
        goto drop_header;
    }
drop:
    zmq_msg_close(&job->identity);
drop_header:
    emlio__srv_job_free(self, job);
}

int
emlio__srv_send_work(emlio_server_t *self, void *work, emlio__job_t *job)
{
    /* The send waits while no reader is connected (one that could not
     * start, say, when memory ran out): in steps of the socket's
     * EMLIO__SRV_POLL_MS timeout, so that a stop is never stuck here. */
    while (zmq_send(work, &job, sizeof(job), 0) != (int)sizeof(job))
        if ((errno != EAGAIN && errno != EINTR) ||
            atomic_load(&self->thr.stopping))
            return -1;
    return 0;
}

/* A reply's frames as ZeroMQ's I/O thread writes them, on a connection
 * that coalesces (emlio__srv_peer_coalesce): its first and last frames are
 * wrapped, and the wrapper's free callback, which the I/O thread runs when
 * it moves past the frame, sets TCP_NODELAY: off after the first (the rest
 * of the reply fills whole segments), on after the last, which sends what
 * waits and lets the last bytes leave at once even where they are written
 * just after the callback (frames under 8 KiB are copied into ZeroMQ's
 * write buffer and written after it moves on). Both toggles run on the
 * thread that writes, in the order it writes: the frontend, running ahead,
 * could not time them. */
typedef struct emlio__nagle_frame {
    zmq_msg_t frame; /* the frame itself, closed by the callback */
    int fd;
    ino_t ino;   /* the connection's socket: fd may name another by now */
    int nodelay; /* the TCP_NODELAY value once the frame is written; -1:
                    leave it */
    /* The last frame of a scheduled reply: once written, its job's slot
     * is given back (server_jobs.c), and the reference dropped. */
    emlio__trainjob_t *tjob;
    uint64_t cost; /* of its slot */
} emlio__nagle_frame_t;

static void
s_nagle_frame_free(void *data, void *hint)
{
    (void)data;
    emlio__nagle_frame_t *w = hint;
    struct stat st;
    if (w->nodelay >= 0 && fstat(w->fd, &st) == 0 && st.st_ino == w->ino)
        (void)setsockopt(w->fd, IPPROTO_TCP, TCP_NODELAY, &w->nodelay,
                         sizeof(w->nodelay));
    zmq_msg_close(&w->frame);
    if (w->tjob) {
        emlio__srv_jobs_reply_left(w->tjob, w->cost);
        emlio__srv_jobs_unref(w->tjob);
    }
    emlio_free(w);
}

/* Sends one frame of a reply to peer (flags as zmq_msg_send); on a
 * coalescing connection the first (nodelay 0) or last (nodelay 1) frame is
 * wrapped as above, others (nodelay -1) go as they are. A last frame given
 * *tjob is wrapped too, and takes over *tjob's reference (set to NULL):
 * its callback gives the job's slot back, even when the send fails. The
 * frame is the caller's to close on failure, as with zmq_msg_send. */
static int
s_send_framed(emlio_server_t *self, emlio__peer_t *peer, zmq_msg_t *part,
              int flags, int nodelay, emlio__trainjob_t **tjob, uint64_t cost)
{
    /* Empty frames too (an empty last sample): with a free function,
     * ZeroMQ keeps even a zero-length frame as data it calls back for. */
    size_t len = zmq_msg_size(part);
    bool toggle = nodelay >= 0 && peer && peer->coalescing;
    bool count = nodelay == 1 && tjob && *tjob;
    emlio__nagle_frame_t *w = toggle || count ? emlio_malloc(sizeof(*w)) : NULL;
    if (!w) /* out of memory: this reply's segments stay as they come */
        return zmq_msg_send(part, self->net.router, flags);
    zmq_msg_init(&w->frame);
    zmq_msg_move(&w->frame, part);
    w->fd = peer ? peer->fd : -1;
    w->ino = peer ? peer->ino : 0;
    w->nodelay = toggle ? nodelay : -1;
    w->tjob = NULL;
    zmq_msg_t wrapped;
    if (zmq_msg_init_data(&wrapped, zmq_msg_data(&w->frame), len,
                          s_nagle_frame_free, w) != 0) {
        zmq_msg_move(part, &w->frame);
        emlio_free(w);
        return zmq_msg_send(part, self->net.router, flags);
    }
    if (count) {
        /* The frame may be written after the server is gone: it holds
         * the job (and so its ledger) until then. */
        atomic_fetch_add(&(*tjob)->refs, 1);
        w->tjob = *tjob;
        w->cost = cost;
        *tjob = NULL;
    }
    int rc = zmq_msg_send(&wrapped, self->net.router, flags);
    if (rc < 0)
        zmq_msg_close(&wrapped); /* the callback closes the frame */
    return rc;
}

/* Forwards one finished reply from a worker to its client. */
static void
s_frontend_reply(emlio_server_t *self, void *done)
{
    zmq_msg_t identity;
    zmq_msg_init(&identity);
    if (zmq_msg_recv(&identity, done, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&identity);
        return;
    }
    /* Its job, whose slot it holds (NULL: the tag could not be read, or
     * an unscheduled GET's). */
    emlio__trainjob_t *tjob = NULL;
    uint64_t cost = 0;
    (void)emlio__srv_jobs_untag(&identity, &tjob, &cost); /* see below */
    emlio__peer_t *peer = emlio__srv_peer_find(self, zmq_msg_data(&identity),
                                               zmq_msg_size(&identity), false);
    bool lost = false;
    bool first = true;
    int more = 1;
    if (zmq_msg_send(&identity, self->net.router, ZMQ_SNDMORE | ZMQ_DONTWAIT) <
        0) {
        /* EHOSTUNREACH: the client went away; a reconnecting client asks
         * again (GET is idempotent). EAGAIN: its queue is full, which a
         * client within its credits never causes, so it sends without
         * reading: the credit stays used up, and once all are, its further
         * requests are dropped before any work is done for them. */
        if (errno == EAGAIN && peer) {
            emlio__srv_peer_flooding(self, peer);
            peer = NULL;
        }
        zmq_msg_close(&identity);
        lost = true;
    }
    if (peer && peer->outstanding)
        peer->outstanding--;
    emlio__trainjob_t *owner = tjob; /* for its bytes */
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, done, 0) < 0) {
            zmq_msg_close(&part);
            break;
        }
        more = zmq_msg_more(&part);
        if (!lost && peer)
            peer->bytes += zmq_msg_size(&part);
        if (!lost && owner)
            atomic_fetch_add(&owner->bytes, zmq_msg_size(&part));
        int rc = -1;
        if (!lost)
            rc = s_send_framed(self, peer, &part,
                               (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT,
                               !more   ? 1
                               : first ? 0
                                       : -1,
                               &tjob, cost);
        first = false;
        if (rc < 0) {
            lost = true;
            zmq_msg_close(&part);
        }
    }
    if (tjob) { /* not handed to a frame: the reply is lost, or unwrapped */
        emlio__srv_jobs_reply_left(tjob, cost);
        emlio__srv_jobs_kick(self, self->net.work);
    }
}

void *
emlio__srv_frontend_main(void *arg)
{
    emlio_server_t *self = arg;
    void *work = self->net.work;
    void *done = self->net.done;
    int wake_fd = emlio__srv_jobs_wake_fd(&self->jobs);
    zmq_pollitem_t items[4] = {
        { self->net.router, 0, ZMQ_POLLIN, 0 },
        { done, 0, ZMQ_POLLIN, 0 },
        { self->net.monitor, 0, ZMQ_POLLIN, 0 },
        { NULL, wake_fd, ZMQ_POLLIN, 0 }, /* a job's slot is free */
    };
    int n_items = wake_fd >= 0 ? 4 : 3;
    uint64_t last_expire = emlio__now_ns();
    while (!atomic_load(&self->thr.stopping)) {
        uint64_t now = emlio__now_ns();
        if (now - last_expire > 1000000000ull) {
            emlio__srv_monitor_drain(self);
            emlio__srv_conns_expire(self, now);
            emlio__srv_peers_expire(self, now);
            emlio__srv_jobs_tick(self, work);
            atomic_store(&self->count.active_clients, self->adm.n_clients);
            atomic_store(&self->count.active_streams, self->adm.n_peers);
            last_expire = now;
        }
        if (zmq_poll(items, n_items, EMLIO__SRV_POLL_MS) < 0) {
            if (errno == EINTR)
                continue;
            emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                      "frontend stops: cannot poll: %s", zmq_strerror(errno));
            break;
        }
        /* Connection events first: a closed connection frees its slot
         * before the next HELLO is looked at. */
        if (items[2].revents & ZMQ_POLLIN)
            emlio__srv_monitor_drain(self);
        /* Replies next: finished batches free credits and memory. */
        for (int i = 0; i < 256 && (items[1].revents & ZMQ_POLLIN); i++) {
            s_frontend_reply(self, done);
            int events = 0;
            size_t len = sizeof(events);
            if (zmq_getsockopt(done, ZMQ_EVENTS, &events, &len) != 0)
                events = 0;
            items[1].revents = (short)(events & ZMQ_POLLIN);
        }
        if (n_items == 4 && (items[3].revents & ZMQ_POLLIN))
            emlio__srv_jobs_kick(self, work);
        /* Replies freed budget: parked GETs go first, in order. */
        if (self->adm.n_parked)
            emlio__srv_gate_parked_run(self, work);
        for (int i = 0; i < 256 && (items[0].revents & ZMQ_POLLIN); i++) {
            s_frontend_request(self, work);
            int events = 0;
            size_t len = sizeof(events);
            if (zmq_getsockopt(self->net.router, ZMQ_EVENTS, &events, &len) !=
                0)
                events = 0;
            items[0].revents = (short)(events & ZMQ_POLLIN);
        }
    }
    emlio__srv_gate_parked_drop(self);
    emlio__srv_jobs_drop_queued(self);
    return NULL;
}
