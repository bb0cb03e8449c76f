/* client_window.c - the client's window: batches in flight, filing the
 * replies, reorder and hand-over.
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

void
emlio__batch_free(emlio_batch_t *b)
{
    emlio__tensor_batch_reset(b);
    for (size_t i = 0; i < b->n_frames; i++)
        zmq_msg_close(&b->frames[i]);
    emlio_free(b->samples);
    emlio_free(b->frames);
    emlio_free(b->fdata);
    emlio_free(b->flen);
    emlio_free(b->parts);
    emlio_free(b->positions);
    emlio_free(b->where);
    emlio_free(b);
}

/* Takes a batch object from the free list (memory already touched, which
 * matters on VMs where a fresh page fault costs ~16 us) or makes one. */
emlio_batch_t *
emlio__batch_get(emlio_client_t *self, size_t n)
{
    emlio_batch_t *b = self->win.free_list;
    if (b && b->cap >= n) {
        self->win.free_list = b->next;
    } else {
        b = emlio_calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        b->cap = EMLIO_MAX(n, self->cfg.batch_size);
        size_t nf = self->inv.n_fields ? self->inv.n_fields : 1;
        b->samples = emlio_calloc(b->cap, sizeof(*b->samples));
        b->frames = emlio_calloc(b->cap * nf, sizeof(*b->frames));
        b->fdata = emlio_calloc(b->cap * nf, sizeof(*b->fdata));
        b->flen = emlio_calloc(b->cap * nf, sizeof(*b->flen));
        b->positions = emlio_calloc(b->cap, sizeof(*b->positions));
        if (!b->samples || !b->frames || !b->positions || !b->fdata ||
            !b->flen) {
            emlio__batch_free(b);
            return NULL;
        }
    }
    /* Each daemon's share in at most parts_max parts (window_init keeps
     * the sum within the 8 bits of a request id's part number). */
    uint32_t parts = self->conn.n_daemons + EMLIO_MAX(self->win.parts_max, 1);
    if (b->cap_parts < parts) {
        emlio__part_t *p = emlio_reallocarray(b->parts, parts, sizeof(*p));
        if (!p) {
            emlio__batch_free(b);
            return NULL;
        }
        b->parts = p;
        b->cap_parts = parts;
    }
    for (size_t i = 0; b->where && i < b->cap; i++)
        b->where[i * EMLIO__WHERE_ROOM] = '\0';
    b->owner = self;
    b->n = n;
    b->n_frames = 0;
    b->n_parts = 0;
    b->parts_done = 0;
    b->ready = false;
    b->bytes = 0;
    b->disk_read = 0;
    b->shared = 0;
    b->next = NULL;
    emlio__tensor_batch_reset(b);
    return b;
}

/* Returns a batch to the free list, closing its frames (which hands the
 * received buffers back to ZeroMQ). */
void
emlio__batch_put(emlio_client_t *self, emlio_batch_t *b)
{
    emlio__tensor_batch_reset(b);
    for (size_t i = 0; i < b->n_frames; i++)
        zmq_msg_close(&b->frames[i]);
    b->n_frames = 0;
    b->next = self->win.free_list;
    self->win.free_list = b;
}

/* Drops every batch in flight or waiting except those of generation keep
 * (0: drops all), giving back the credits of their outstanding parts (late
 * replies are recognized by their generation and ignored). */
void
emlio__window_drop(emlio_client_t *self, uint32_t keep)
{
    size_t k = 0;
    for (size_t i = 0; i < self->win.n_slots; i++) {
        emlio_batch_t *b = self->win.slots[i];
        if (keep && b->gen == keep) {
            self->win.slots[k++] = b;
            continue;
        }
        for (uint32_t p = 0; p < b->n_parts; p++) {
            emlio__part_t *part = &b->parts[p];
            if (part->done)
                continue;
            uint32_t *out = &self->conn.daemons[part->daemon]
                                 .streams[part->sock]
                                 .outstanding;
            if (*out)
                (*out)--;
            if (self->win.outstanding_parts)
                self->win.outstanding_parts--;
            self->win.outstanding_samples -=
                EMLIO_MIN(self->win.outstanding_samples, part->n);
        }
        /* A batch in the decode pool comes back through it, and is put
         * back then (emlio__tensor_collect). */
        if (!emlio__tensor_disown(b))
            emlio__batch_put(self, b);
    }
    self->win.n_slots = k;
    self->win.ready_head = self->win.ready_tail = NULL;
}

bool
emlio__window_is_delivered(const emlio_client_t *self, size_t i)
{
    return self->win.delivered[i / 8] & (1u << (i % 8));
}

/* A new current epoch (begin_epoch): nothing of it handed over yet, the
 * window sized for what the daemons allow now. */
int
emlio__window_begin(emlio_client_t *self, uint64_t now)
{
    size_t n = self->current.n_batches;
    uint8_t *bits = emlio_realloc(self->win.delivered, n / 8 + 1);
    if (!bits)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    memset(bits, 0, n / 8 + 1);
    self->win.delivered = bits;
    if (!self->win.items) {
        self->win.items =
            emlio_calloc(self->cfg.batch_size, sizeof(*self->win.items));
        if (!self->win.items)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    }
    if (!self->win.limit) {
        emlio__budget_init(self);
    } else if (!self->cfg.inflight) {
        emlio__budget_rebound(self);
    }
    self->win.next_deliver = 0;
    self->win.n_delivered = 0;
    self->win.n_skipped = 0;
    self->win.adapt_ns = now;
    self->win.adapt_batches = 0;
    return 0;
}

/* Sends (or sends again) the GET of part p of batch b on stream sock, or on
 * the daemon's least-loaded stream when sock is UINT32_MAX; now: the time
 * it goes out (one clock reading for all parts of a batch). */
static int
s_send_part(emlio_client_t *self, emlio_batch_t *b, uint32_t p, uint32_t sock,
            uint64_t now)
{
    emlio__part_t *part = &b->parts[p];
    emlio__cdaemon_t *daemon = &self->conn.daemons[part->daemon];
    for (uint32_t i = 0; i < part->n; i++) {
        const emlio_sample_t *s = &b->samples[part->positions[i]];
        self->win.items[i].shard = daemon->local_id[s->shard];
        self->win.items[i].record = s->record;
    }
    if (sock == UINT32_MAX) {
        /* The least-loaded stream that may carry GETs: replies come back
         * out of order, so round robin alone could push one connection
         * past its credits. The caller checked that one has a credit
         * left (emlio__budget_has_credit). */
        sock = emlio__budget_free_stream(self, daemon, now);
        assert(sock != UINT32_MAX);
        daemon->streams[sock].outstanding++;
        part->sock = sock;
    }
    emlio__wire_xf_t xf = {
        .seed = self->cfg.seed,
        .epoch = b->epoch,
        .unchecked = !self->cfg.verify,
        .pipelined = daemon->streams[sock].outstanding > 1,
        .segs = self->inv.share ? self->inv.segs : 0,
        .cursor = b->cursor,
        /* Decoded here: the reply names the records, for the errors. */
        .describe = self->xf.transform && !b->xf_server,
    };
    if (b->xf_server)
        xf.spec = emlio_transform_spec(self->xf.transform);
    if (emlio__wire_encode_get(&self->scratch, EMLIO__ID(b->gen, b->index, p),
                               daemon->dataset, self->win.items, part->n,
                               &xf) < 0)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    while (zmq_send(daemon->streams[sock].sock, self->scratch.data,
                    self->scratch.len, 0) < 0) {
        if (errno != EINTR)
            return emlio__seterr(self->err, -errno,
                                 "cannot send to daemon '%s': %s",
                                 daemon->endpoint, zmq_strerror(errno));
    }
    part->sent_ns = now;
    return 0;
}

/* A stream of daemon d reconnected (after a daemon restart, say): whatever
 * it had in flight died with the old connection, so ask again. GET is a pure
 * read and replies are matched by id, so a late duplicate is harmless. */
int
emlio__window_resend(emlio_client_t *self, uint32_t d, uint32_t sock,
                     uint64_t before_ns)
{
    uint64_t now = emlio__now_ns();
    for (size_t i = 0; i < self->win.n_slots; i++) {
        emlio_batch_t *b = self->win.slots[i];
        for (uint32_t p = 0; p < b->n_parts; p++) {
            emlio__part_t *part = &b->parts[p];
            if (part->done || part->daemon != d || part->sock != sock ||
                part->sent_ns >= before_ns)
                continue;
            int rc = s_send_part(self, b, p, sock, now);
            if (rc < 0)
                return rc;
            self->fig.retries++;
        }
    }
    return 0;
}

/* Sends the GETs of batch `index` of epoch ep (the current one or the one
 * ahead): each daemon's share of its samples in parts
 * (emlio__budget_make_parts). */
int
emlio__window_request(emlio_client_t *self, const emlio__epoch_t *ep,
                      size_t index)
{
    size_t n;
    const emlio_plan_sample_t *plan = emlio_plan_batch(ep->plan, index, &n);
    emlio_batch_t *b = emlio__batch_get(self, n);
    if (!b)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    b->epoch = ep->number;
    b->index = index;
    b->gen = ep->gen;
    b->xf_server = emlio__client_xf_at_server(&self->xf, index);
    b->cursor = emlio_plan_batch_cursor(ep->plan, index);
    for (size_t i = 0; i < n; i++) {
        b->samples[i] =
            (emlio_sample_t){ NULL,          SIZE_MAX,       -1,
                              plan[i].shard, plan[i].record, plan[i].pad,
                              plan[i].source };
        for (size_t f = 0; f < self->inv.n_fields; f++) {
            b->fdata[i * self->inv.n_fields + f] = NULL; /* until it arrives */
            b->flen[i * self->inv.n_fields + f] = 0;
        }
    }
    emlio__budget_make_parts(self, b, plan, n);
    self->win.slots[self->win.n_slots++] = b;
    uint64_t now = emlio__now_ns();
    for (uint32_t p = 0; p < b->n_parts; p++) {
        int rc = s_send_part(self, b, p, UINT32_MAX, now);
        if (rc < 0)
            return rc;
        self->win.outstanding_parts++;
        self->win.outstanding_samples += b->parts[p].n;
    }
    return 0;
}

/* Keeps the window full: requests plan batches until `window` are out. */
int
emlio__window_fill(emlio_client_t *self)
{
    if (self->win.cap_slots < self->win.max) {
        emlio_batch_t **slots =
            emlio_reallocarray(self->win.slots, self->win.max, sizeof(*slots));
        if (!slots)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        self->win.slots = slots;
        self->win.cap_slots = self->win.max;
    }
    while (self->win.n_slots < self->win.limit &&
           self->current.next_to_send < self->current.n_batches &&
           emlio__budget_has_credit(self)) {
        size_t i = self->current.next_to_send++;
        if (emlio__window_is_delivered(self, i))
            continue; /* resumed from saved state */
        int rc = emlio__window_request(self, &self->current, i);
        if (rc < 0)
            return rc;
    }
    if (self->win.n_slots < self->win.limit &&
        self->current.next_to_send >= self->current.n_batches)
        return emlio__epoch_fill_ahead(self);
    return 0;
}

static emlio_batch_t *
s_find_slot(emlio_client_t *self, uint32_t gen, uint64_t index, size_t *pos)
{
    for (size_t i = 0; i < self->win.n_slots; i++)
        if (self->win.slots[i]->index == index &&
            self->win.slots[i]->gen == gen) {
            if (pos)
                *pos = i;
            return self->win.slots[i];
        }
    return NULL;
}

/* Removes holes (len SIZE_MAX) left by samples skipped as corrupt, by
 * the daemons or by this client's decode, and remembers them so the caller
 * can report every one. */
int
emlio__window_compact(emlio_client_t *self, emlio_batch_t *b)
{
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->samples[i].len != SIZE_MAX) {
            b->samples[k++] = b->samples[i];
            continue;
        }
        if (emlio__grow(&self->win.skipped, &self->win.cap_skipped,
                        self->win.n_skipped, sizeof(*self->win.skipped),
                        16) < 0)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        emlio_sample_t *s = &self->win.skipped[self->win.n_skipped++];
        *s = b->samples[i];
        s->data = NULL;
        s->len = 0;
    }
    b->n = k;
    return 0;
}

/* Appends b to the out-of-order delivery queue. */
void
emlio__window_queue_ready(emlio_client_t *self, emlio_batch_t *b)
{
    b->next = NULL;
    if (self->win.ready_tail)
        self->win.ready_tail->next = b;
    else
        self->win.ready_head = b;
    self->win.ready_tail = b;
}

/* THE SEAM: complete -> ready. b is complete (every part received, every
 * sample matched to its request and its CRC checked) and belongs to the
 * current epoch; this is the one place where it becomes ready for the
 * hand-over. Called once per batch, from emlio__window_receive when its
 * last part arrives, or from emlio__window_adopt when the epoch it was
 * requested ahead for becomes current. A batch completed ahead waits here
 * until then, so that its holes go to its own epoch's skipped list.
 *
 * With a transform (client_tensor.c), a batch the daemons decoded has its
 * tensors gathered into one block here; a batch of encoded samples goes to
 * the decode pool instead of becoming ready: the pool works out of order,
 * and the wait loop in next(), on hearing from the pool (one more poll
 * item), marks each decoded batch ready and queues it as below
 * (emlio__tensor_collect). in_order takes a batch only once it is ready;
 * abandoning an epoch disowns the batches the pool holds (window_drop). */
int
emlio__batch_ready(emlio_client_t *self, emlio_batch_t *b)
{
    int rc = emlio__window_compact(self, b);
    if (rc < 0)
        return rc;
    if (emlio__tensor_active(self)) {
        /* 0: it went to the decode pool, and becomes ready when it comes
         * back (emlio__tensor_collect). */
        rc = emlio__tensor_batch_ready(self, b);
        if (rc <= 0)
            return rc;
    }
    b->ready = true;
    if (!self->cfg.in_order)
        emlio__window_queue_ready(self, b);
    return 0;
}

/* begin_epoch took over the epoch requested ahead: its batches that
 * completed meanwhile become ready now (in_order finds them in the slots). */
int
emlio__window_adopt(emlio_client_t *self)
{
    for (size_t i = 0; i < self->win.n_slots; i++) {
        emlio_batch_t *b = self->win.slots[i];
        if (b->parts_done != b->n_parts)
            continue;
        int rc = emlio__batch_ready(self, b);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Finds sample j of a reply to part among the part's samples from *next on
 * (the daemon may have left out records it skipped as corrupt, never added
 * or reordered any): 0 with *pos its position in the batch, or
 * EMLIO_EPROTO. */
int
emlio__part_match(emlio_client_t *self, uint32_t d, const emlio_batch_t *b,
                  const emlio__part_t *part, const emlio__wire_msg_t *msg,
                  size_t j, uint32_t *next, uint32_t *pos)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    const emlio__wire_sample_t *ws = &msg->batch.samples[j];
    while (*next < part->n) {
        const emlio_sample_t *s = &b->samples[part->positions[*next]];
        if (daemon->local_id[s->shard] == ws->shard && s->record == ws->record)
            break;
        (*next)++;
    }
    if (*next == part->n)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' answered request %" PRIu64
                             " with a sample it did not ask for",
                             daemon->endpoint, msg->id);
    *pos = part->positions[(*next)++];
    return 0;
}

const char *
emlio__batch_where(const emlio_batch_t *b, size_t pos)
{
    if (!b->where || pos >= b->cap || !b->where[pos * EMLIO__WHERE_ROOM])
        return NULL;
    return &b->where[pos * EMLIO__WHERE_ROOM];
}

/* Keeps what the daemon said sample j of its reply is (BATCH "where") for
 * position pos, with control characters made '?': the text comes from
 * the network and goes into logs. Without memory for it, the messages
 * name shard and record only. */
static void
s_note_where(emlio_batch_t *b, const emlio__wire_msg_t *msg, size_t j,
             uint32_t pos)
{
    if (!msg->batch.where || j >= msg->batch.n_where)
        return;
    if (!b->where) {
        b->where = emlio_calloc(b->cap, EMLIO__WHERE_ROOM);
        if (!b->where)
            return;
    }
    const emlio__wire_str_t *w = &msg->batch.where[j];
    char *out = &b->where[(size_t)pos * EMLIO__WHERE_ROOM];
    size_t len = EMLIO_MIN(w->len, (size_t)EMLIO_WIRE_MAX_WHERE);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)w->s[i];
        out[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    out[len] = '\0';
}

/* Receives the next frame of the message whose last frame so far is prev
 * from stream `stream` of daemon d into b's frames: the frame, or NULL when
 * prev was the last one or the receive failed (the caller says why). */
zmq_msg_t *
emlio__batch_recv_frame(emlio_client_t *self, uint32_t d, uint32_t stream,
                        emlio_batch_t *b, const zmq_msg_t *prev)
{
    /* b->frames holds cap x n_fields frames: what a batch's parts need at
     * most (a sample's fields each in a frame of its own, or several
     * samples in one packed frame); a daemon that sends more gets no room. */
    size_t nf = self->inv.n_fields ? self->inv.n_fields : 1;
    if (b->n_frames >= b->cap * nf)
        return NULL;
    zmq_msg_t *frame = &b->frames[b->n_frames];
    zmq_msg_init(frame);
    if (!zmq_msg_more((zmq_msg_t *)prev) ||
        zmq_msg_recv(frame, self->conn.daemons[d].streams[stream].sock, 0) <
            0) {
        zmq_msg_close(frame);
        return NULL;
    }
    b->n_frames++;
    return frame;
}

/* Finishes sample pos of b, whose frames are filed: its view, label and
 * CRC check (crc over its sample_len bytes when verifying), and the byte
 * counts. Returns 0 or EMLIO_ECORRUPT. */
static int
s_sample_done(emlio_client_t *self, uint32_t d, uint32_t stream,
              emlio_batch_t *b, uint32_t pos, const emlio__wire_sample_t *ws,
              uint32_t crc, size_t sample_len)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    size_t nf = self->inv.n_fields;
    emlio_sample_t *s = &b->samples[pos];
    s->data = b->fdata[pos * nf];
    s->len = b->flen[pos * nf];
    s->label = emlio__client_label(self, d, ws->label);
    /* The daemon may have derived ws->crc from the record's CRC stored on
     * disk without reading the bytes (large TFRecord samples), so a
     * mismatch is a flip in the shard as much as one on the way. */
    if (self->cfg.verify && crc != ws->crc)
        return emlio__seterr(self->err, EMLIO_ECORRUPT,
                             "sample %" PRIu64 " of shard '%s' from daemon "
                             "'%s' does not match its CRC-32C: corrupt in "
                             "the shard on disk or on the way",
                             s->record, self->inv.shards[s->shard].name,
                             daemon->endpoint);
    b->bytes += sample_len;
    daemon->streams[stream].rx_bytes += sample_len;
    self->conn.total_bytes += sample_len;
    return 0;
}

/* Files sample j of a raw reply to part (the daemon may have left out
 * records it skipped as corrupt, never added or reordered any): its frames are
 * spans of the packed frame or, per the offset table, frames of their own
 * received after *prev; checks its CRC. */
static int
s_file_packed_sample(emlio_client_t *self, uint32_t d, uint32_t stream,
                     emlio_batch_t *b, emlio__part_t *part,
                     const emlio__wire_msg_t *msg, size_t j, uint32_t *next,
                     const uint8_t *packed, zmq_msg_t **prev)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    uint32_t pos;
    int rc = emlio__part_match(self, d, b, part, msg, j, next, &pos);
    if (rc < 0)
        return rc;
    s_note_where(b, msg, j, pos);
    size_t nf = self->inv.n_fields;
    uint32_t crc = 0;
    size_t sample_len = 0;
    for (size_t f = 0; f < nf; f++) {
        const emlio__wire_span_t *span = &msg->batch.spans[j * nf + f];
        const uint8_t *data;
        if (span->off != EMLIO_WIRE_PACK_OWN) {
            data = packed + span->off; /* checked: inside the frame */
        } else {
            zmq_msg_t *frame =
                emlio__batch_recv_frame(self, d, stream, b, *prev);
            if (!frame || zmq_msg_size(frame) != span->len)
                return emlio__seterr(self->err, EMLIO_EPROTO,
                                     "daemon '%s' sent a batch whose frames "
                                     "do not match its pack table (sample "
                                     "frame %zu)",
                                     daemon->endpoint, j * nf + f);
            *prev = frame;
            data = zmq_msg_data(frame);
        }
        b->fdata[pos * nf + f] = data;
        b->flen[pos * nf + f] = (size_t)span->len;
        if (self->cfg.verify)
            crc = emlio_crc32c(crc, data, (size_t)span->len);
        sample_len += (size_t)span->len;
    }
    return s_sample_done(self, d, stream, b, pos, &msg->batch.samples[j], crc,
                         sample_len);
}

/* Files the samples of a raw reply: receives the packed
 * frame when the offset table puts any sample frame in it, checks the
 * table against it (emlio__wire_pack_check), then files each sample.
 * Returns 0 or < 0 (the caller gives the frames back). */
static int
s_file_packed(emlio_client_t *self, uint32_t d, uint32_t stream,
              emlio_batch_t *b, emlio__part_t *part,
              const emlio__wire_msg_t *msg, zmq_msg_t *header)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    bool any = false;
    for (size_t i = 0; i < msg->batch.n_spans && !any; i++)
        any = msg->batch.spans[i].off != EMLIO_WIRE_PACK_OWN;
    zmq_msg_t *prev = header;
    const uint8_t *packed = NULL;
    size_t packed_len = 0;
    if (any) {
        zmq_msg_t *frame = emlio__batch_recv_frame(self, d, stream, b, header);
        if (!frame)
            return emlio__seterr(self->err, EMLIO_EPROTO,
                                 "daemon '%s' sent a packed batch without "
                                 "its packed frame",
                                 daemon->endpoint);
        prev = frame;
        packed = zmq_msg_data(frame);
        packed_len = zmq_msg_size(frame);
    }
    char why[EMLIO_ERRMSG_LEN];
    int rc = emlio__wire_pack_check(msg->batch.spans, msg->batch.n_spans,
                                    msg->batch.n_samples * self->inv.n_fields,
                                    any, packed_len, why);
    if (rc < 0)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' sent a bad batch for request "
                             "%" PRIu64 ": %s",
                             daemon->endpoint, msg->id, why);
    uint32_t next = 0;
    for (size_t j = 0; j < msg->batch.n_samples && rc >= 0; j++)
        rc = s_file_packed_sample(self, d, stream, b, part, msg, j, &next,
                                  packed, &prev);
    return rc < 0 ? rc : 0;
}

/* Files the reply msg (its header frame: header) to part of batch b: every
 * sample matched to the request in order and checked. A part that fails
 * half-way gives its frames back, so that a resend or a late duplicate
 * files into the same places, never past them. Returns 1 or < 0. */
static int
s_file_part(emlio_client_t *self, uint32_t d, uint32_t stream, emlio_batch_t *b,
            emlio__part_t *part, const emlio__wire_msg_t *msg,
            zmq_msg_t *header)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    size_t frames0 = b->n_frames;
    uint64_t bytes0 = b->bytes;
    /* Samples, not frames: with several fields, or own frames beside a
     * packed one, a batch's earlier parts hold more frames than samples. */
    if (msg->batch.n_samples > part->n)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' answered request %" PRIu64
                             " with %zu samples, more than asked",
                             daemon->endpoint, msg->id, msg->batch.n_samples);
    uint64_t now = emlio__now_ns();
    if (now - part->sent_ns < self->win.min_latency_ns ||
        !self->win.min_latency_ns)
        self->win.min_latency_ns = now - part->sent_ns;
    int rc = 1;
    if (msg->batch.has_shape || b->xf_server)
        rc = emlio__tensor_file_part(self, d, stream, b, part, msg, header);
    else if (msg->batch.packed)
        rc = s_file_packed(self, d, stream, b, part, msg, header);
    else
        rc = emlio__seterr(self->err, EMLIO_EPROTO,
                           "daemon '%s' sent a batch of raw samples without "
                           "its offset table (\"pack\")",
                           daemon->endpoint);
    if (rc >= 0) {
        self->win.refused_since_ns = 0;
        part->done = true;
        daemon->streams[part->sock].outstanding--;
        self->win.outstanding_parts--;
        self->win.outstanding_samples -= part->n;
        rc = 1;
        /* A batch of the epoch requested ahead, complete, waits in its slot
         * until begin_epoch takes that epoch (emlio__window_adopt). */
        if (++b->parts_done == b->n_parts && b->gen == self->current.gen)
            rc = emlio__batch_ready(self, b);
    }
    if (rc < 0) {
        for (size_t i = frames0; i < b->n_frames; i++)
            zmq_msg_close(&b->frames[i]);
        for (uint32_t i = 0; i < part->n; i++) {
            b->samples[part->positions[i]].data = NULL;
            b->samples[part->positions[i]].len = 0;
        }
        b->n_frames = frames0;
        b->bytes = bytes0;
    }
    return rc;
}

/* The part a BATCH or ERROR reply from daemon d answers: one of a batch
 * of the current epoch or the one ahead, from that daemon, not yet done;
 * NULL for a stale, duplicate or unsolicited reply. */
static emlio__part_t *
s_match_part(emlio_client_t *self, uint32_t d, const emlio__wire_msg_t *msg,
             emlio_batch_t **batch)
{
    uint64_t part_no = EMLIO__ID_PART(msg->id);
    uint64_t gen = EMLIO__ID_GEN(msg->id);
    emlio_batch_t *b = NULL;
    if (gen == self->current.gen ||
        (self->ahead.live && gen == self->ahead.gen))
        b = s_find_slot(self, (uint32_t)gen, EMLIO__ID_BATCH(msg->id), NULL);
    if (!b || part_no >= b->n_parts || b->parts[part_no].daemon != d ||
        b->parts[part_no].done)
        return NULL;
    *batch = b;
    return &b->parts[part_no];
}

/* Whether msg refuses a GET for want of credit on its connection (the
 * daemon's own words, docs/protocol.md section 7). */
static bool
s_refused_for_credit(const emlio__wire_msg_t *msg)
{
    return msg->type == EMLIO_MSG_ERROR && msg->error.code == EMLIO_ECREDIT;
}

/* The daemon refused part of b for credit although we keep within its
 * credits: it still counts GETs of ours that we no longer do, the
 * duplicates of a resend after a reconnect (GETs that waited in the
 * stream's queue reach the new connection, and so do their resends) or
 * the parts of an abandoned epoch it is still serving. Those answers free
 * its credits within a round trip or so, so ask again on the same stream
 * (the part stays counted there); fail only when refusals alone go on for
 * S_REFUSED_NS. */
#define S_REFUSED_NS (5000000000ull)

static int
s_ask_again(emlio_client_t *self, uint32_t d, emlio_batch_t *b,
            emlio__part_t *part, const emlio__wire_msg_t *msg)
{
    uint64_t now = emlio__now_ns();
    if (!self->win.refused_since_ns)
        self->win.refused_since_ns = now;
    if (now - self->win.refused_since_ns > S_REFUSED_NS)
        return emlio__seterr(self->err, EMLIO_ELIMIT,
                             "daemon '%s' failed a request: %.*s",
                             self->conn.daemons[d].endpoint,
                             (int)msg->error.text_len, msg->error.text);
    self->fig.retries++;
    int rc = s_send_part(self, b, (uint32_t)(part - b->parts), part->sock, now);
    return rc < 0 ? rc : 1;
}

/* Receives and files one reply from daemon d's socket. Returns 1 when a
 * message was handled, 0 when none was waiting, < 0 on failure. */
int
emlio__window_receive(emlio_client_t *self, uint32_t d, uint32_t stream)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    void *sock = daemon->streams[stream].sock;
    zmq_msg_t header;
    zmq_msg_init(&header);
    if (zmq_msg_recv(&header, sock, ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&header);
        if (err == EAGAIN || err == EINTR)
            return 0;
        return emlio__seterr(self->err, -err, "cannot receive from '%s': %s",
                             daemon->endpoint, zmq_strerror(err));
    }
    emlio__wire_msg_t msg;
    char why[EMLIO_ERRMSG_LEN];
    int rc =
        emlio__wire_decode(&msg, zmq_msg_data(&header), zmq_msg_size(&header),
                           self->cfg.batch_size, why);
    if (rc < 0) {
        emlio__zmq_drain(sock);
        zmq_msg_close(&header);
        return emlio__seterr(self->err, EMLIO_EPROTO, "daemon '%s' sent a %s",
                             daemon->endpoint, why);
    }
    rc = 1;
    emlio_batch_t *b = NULL;
    emlio__part_t *part = NULL;
    /* The answers to HELLOs are the connection room's; the window sees
     * BATCH and the requests' ERRORs. */
    if (emlio__client_handshake_reply(self, d, stream, &msg)) {
        rc = 1;
    } else {
        if (msg.type == EMLIO_MSG_BATCH || msg.type == EMLIO_MSG_ERROR)
            part = s_match_part(self, d, &msg, &b);
        if (part && s_refused_for_credit(&msg)) {
            rc = s_ask_again(self, d, b, part, &msg);
        } else if (msg.type == EMLIO_MSG_ERROR && (part || msg.id == 0)) {
            int code = msg.error.code <= -1000 && msg.error.code > -2000
                           ? (int)msg.error.code
                           : EMLIO_EPROTO;
            rc = emlio__seterr(
                self->err, code, "daemon '%s' failed a request: %.*s",
                daemon->endpoint, (int)msg.error.text_len, msg.error.text);
        } else if (part) {
            if (msg.batch.has_disk) {
                daemon->disk = msg.batch.disk;
                daemon->disk_at_ns = emlio__now_ns();
            }
            b->disk_read += msg.batch.read;
            b->shared += msg.batch.shared;
            rc = s_file_part(self, d, stream, b, part, &msg, &header);
        } /* else stale, duplicate or unsolicited: ignore */
    }
    emlio__zmq_drain(sock);
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    return rc;
}

emlio_batch_t *
emlio__window_take(emlio_client_t *self)
{
    emlio_batch_t *b = NULL;
    size_t pos = 0;
    if (self->cfg.in_order) {
        while (self->win.next_deliver < self->current.n_batches &&
               emlio__window_is_delivered(self, self->win.next_deliver))
            self->win.next_deliver++;
        b = s_find_slot(self, self->current.gen, self->win.next_deliver, &pos);
        if (!b || !b->ready)
            return NULL;
    } else {
        b = self->win.ready_head;
        if (!b)
            return NULL;
        self->win.ready_head = b->next;
        if (!self->win.ready_head)
            self->win.ready_tail = NULL;
        emlio_batch_t *slot = s_find_slot(self, b->gen, b->index, &pos);
        assert(slot == b);
        (void)slot;
    }
    self->win.slots[pos] = self->win.slots[--self->win.n_slots];
    return b;
}
