/* client_tensor.c - batches of tensors on the client: filing the daemons'
 * tensor replies (docs/protocol.md 5.6), handing batches of
 * encoded samples to the decode pool (client_xf.h) and taking them back.
 * SPDX-License-Identifier: MIT
 *
 * With a transform, every sample a batch hands over is its tensor: data
 * points at its H x W x 3 slice of the batch's one block (emlio_batch_images)
 * and len is H x W x 3, whichever side decoded it.
 */
#include "client_internal.h"

bool
emlio__tensor_active(const emlio_client_t *self)
{
    return self->xf.transform != NULL;
}

size_t
emlio__tensor_out_bytes(const emlio_client_t *self)
{
    return emlio_transform_output_bytes(self->xf.transform);
}

/* Receives the one tensor frame of a reply; checks that it is the last
 * frame and as long as the header said. 0 or EMLIO_EPROTO. */
static int
s_recv_tensor_frame(emlio_client_t *self, uint32_t d, uint32_t stream,
                    emlio_batch_t *b, const emlio__wire_msg_t *msg,
                    zmq_msg_t *header, zmq_msg_t **out)
{
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    zmq_msg_t *frame = emlio__batch_recv_frame(self, d, stream, b, header);
    if (!frame)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' announced a tensor frame for request "
                             "%" PRIu64 " and sent none",
                             daemon->endpoint, msg->id);
    size_t want = msg->batch.n_samples * emlio__tensor_out_bytes(self);
    if (zmq_msg_more(frame) || zmq_msg_size(frame) != want)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' sent a tensor frame of %zu bytes%s "
                             "for request %" PRIu64 ", where %zu samples of "
                             "%" PRIu64 " x %" PRIu64 " x 3 make %zu",
                             daemon->endpoint, zmq_msg_size(frame),
                             zmq_msg_more(frame) ? " and more frames" : "",
                             msg->id, msg->batch.n_samples, msg->batch.shape[1],
                             msg->batch.shape[2], want);
    *out = frame;
    return 0;
}

/* Checks that a reply is what this batch asked for: tensors of our shape
 * when the daemons decode it, encoded samples otherwise. */
static int
s_check_kind(emlio_client_t *self, uint32_t d, const emlio_batch_t *b,
             const emlio__wire_msg_t *msg)
{
    const char *ep = self->conn.daemons[d].endpoint;
    if (!b->xf_server)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' sent tensors for request %" PRIu64
                             ", which asked for encoded samples",
                             ep, msg->id);
    if (!msg->batch.has_shape)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' sent encoded samples for request "
                             "%" PRIu64 ", which asked for tensors (does it "
                             "speak protocol 3?)",
                             ep, msg->id);
    uint32_t h = emlio_transform_height(self->xf.transform);
    uint32_t w = emlio_transform_width(self->xf.transform);
    if (msg->batch.shape[1] != h || msg->batch.shape[2] != w ||
        msg->batch.shape[3] != 3)
        return emlio__seterr(self->err, EMLIO_EPROTO,
                             "daemon '%s' sent %" PRIu64 " x %" PRIu64
                             " x %" PRIu64 " tensors where %" PRIu32
                             " x %" PRIu32 " x 3 were asked",
                             ep, msg->batch.shape[1], msg->batch.shape[2],
                             msg->batch.shape[3], h, w);
    return 0;
}

int
emlio__tensor_file_part(emlio_client_t *self, uint32_t d, uint32_t stream,
                        emlio_batch_t *b, emlio__part_t *part,
                        const emlio__wire_msg_t *msg, zmq_msg_t *header)
{
    int rc = s_check_kind(self, d, b, msg);
    zmq_msg_t *frame = NULL;
    if (rc == 0)
        rc = s_recv_tensor_frame(self, d, stream, b, msg, header, &frame);
    if (rc < 0)
        return rc;
    emlio__cdaemon_t *daemon = &self->conn.daemons[d];
    size_t out = emlio__tensor_out_bytes(self);
    size_t nf = self->inv.n_fields ? self->inv.n_fields : 1;
    uint8_t *data = zmq_msg_data(frame);
    uint32_t next = 0;
    for (size_t j = 0; j < msg->batch.n_samples; j++) {
        uint32_t pos;
        rc = emlio__part_match(self, d, b, part, msg, j, &next, &pos);
        if (rc < 0)
            return rc;
        emlio_sample_t *s = &b->samples[pos];
        s->data = data + j * out;
        s->len = out;
        s->label = emlio__client_label(self, d, msg->batch.samples[j].label);
        b->fdata[pos * nf] = s->data;
        b->flen[pos * nf] = out;
        if (self->cfg.verify &&
            emlio_crc32c(0, s->data, out) != msg->batch.samples[j].crc)
            return emlio__seterr(self->err, EMLIO_ECORRUPT,
                                 "the tensor of sample %" PRIu64
                                 " of shard '%s' from daemon '%s' does not "
                                 "match its CRC-32C: corrupt on the way",
                                 s->record, self->inv.shards[s->shard].name,
                                 daemon->endpoint);
    }
    size_t bytes = zmq_msg_size(frame);
    b->bytes += bytes;
    daemon->streams[stream].rx_bytes += bytes;
    self->conn.total_bytes += bytes;
    emlio__client_xf_note_server(&self->xf, msg->batch.n_samples,
                                 msg->batch.xf_ns);
    return 0;
}

/* A batch the daemons decoded: its samples' tensors in one block. A batch
 * served by one daemon with nothing skipped already is one (its frame);
 * otherwise the slices are gathered into a pooled block. */
static int
s_gather(emlio_client_t *self, emlio_batch_t *b)
{
    size_t out = emlio__tensor_out_bytes(self);
    bool contiguous = true;
    for (size_t i = 1; i < b->n && contiguous; i++)
        contiguous = b->samples[i].data == b->samples[0].data + i * out;
    if (contiguous) {
        b->images = b->n ? b->samples[0].data : NULL;
        return 1;
    }
    uint8_t *block = emlio__xf_block_get(self->xf.blocks, b->n * out);
    if (!block)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < b->n; i++) {
        memcpy(block + i * out, b->samples[i].data, out);
        b->samples[i].data = block + i * out;
    }
    b->xf_block = block;
    b->images = block;
    return 1;
}

int
emlio__tensor_batch_ready(emlio_client_t *self, emlio_batch_t *b)
{
    if (b->xf_server)
        return s_gather(self, b);
    emlio__xf_sample_t *xs = emlio_calloc(b->n ? b->n : 1, sizeof(*xs));
    if (!xs)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < b->n; i++) {
        const emlio_sample_t *s = &b->samples[i];
        xs[i].data = s->data;
        xs[i].len = s->len;
        xs[i].key = emlio_transform_sample_key(self->inv.shards[s->shard].name,
                                               s->record);
    }
    int rc = emlio__client_xf_submit(&self->xf, b, xs, b->n, b->epoch);
    if (rc < 0) {
        emlio_free(xs);
        return emlio__seterr(self->err, rc, "cannot start decoding: %s",
                             emlio_strerror(rc));
    }
    b->xf_pending = true;
    return 0;
}

/* What a batch's decode left behind: the first failure, which fails the
 * epoch under on_corrupt fail; under skip, each failed sample is marked as
 * a hole (len SIZE_MAX, as the daemons' skips are) and logged. */
typedef struct s_decode_failures {
    emlio_client_t *self;
    int rc;
    char why[EMLIO_ERRMSG_LEN];
} s_decode_failures_t;

static void
s_decode_failed(void *userdata, void *batch, size_t i, int rc, const char *why)
{
    s_decode_failures_t *f = userdata;
    emlio_client_t *self = f->self;
    emlio_batch_t *b = batch;
    if (b->xf_disowned)
        return; /* its epoch was abandoned: nobody will see it */
    emlio_sample_t *s = &b->samples[i];
    /* The daemon's description names the file (or the shard and offset);
     * one that predates "where" leaves shard and record. */
    char fallback[256];
    const char *what = emlio__batch_where(b, i);
    if (!what) {
        snprintf(fallback, sizeof(fallback),
                 "sample %" PRIu64 " of shard '%.200s'", s->record,
                 self->inv.shards[s->shard].name);
        what = fallback;
    }
    if (self->xf.skip_corrupt) {
        emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
                  "skipping %s: cannot decode: %.280s", what, why);
        s->len = SIZE_MAX;
        return;
    }
    if (f->rc == 0) {
        f->rc = rc;
        snprintf(f->why, sizeof(f->why), "cannot decode %.220s: %.270s", what,
                 why);
    }
}

/* Moves the tensors of the samples kept to the front of the block, in the
 * order emlio__window_compact keeps the samples. */
static void
s_close_holes(emlio_batch_t *b, uint8_t *block, size_t out)
{
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->samples[i].len == SIZE_MAX)
            continue;
        if (k != i)
            memmove(block + k * out, block + i * out, out);
        k++;
    }
}

int
emlio__tensor_collect(emlio_client_t *self)
{
    int got = 0;
    size_t out = self->xf.transform ? emlio__tensor_out_bytes(self) : 0;
    for (;;) {
        uint8_t *block = NULL;
        s_decode_failures_t f = { .self = self };
        emlio_batch_t *b =
            emlio__client_xf_pop(&self->xf, &block, s_decode_failed, &f);
        if (!b)
            return got;
        got = 1;
        b->xf_pending = false;
        b->xf_block = block;
        b->images = block;
        if (b->xf_disowned) {
            emlio__batch_put(self, b); /* gives the block back too */
            continue;
        }
        if (f.rc != 0)
            return emlio__seterr(self->err, f.rc, "%s", f.why);
        s_close_holes(b, block, out);
        int rc = emlio__window_compact(self, b);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < b->n; i++) {
            b->samples[i].data = block + i * out;
            b->samples[i].len = out;
        }
        b->ready = true;
        if (!self->cfg.in_order)
            emlio__window_queue_ready(self, b);
    }
}

void
emlio__tensor_batch_reset(emlio_batch_t *b)
{
    emlio__xf_block_put(b->xf_block);
    b->xf_block = NULL;
    b->images = NULL;
    b->xf_server = false;
    b->xf_pending = false;
    b->xf_disowned = false;
}

bool
emlio__tensor_disown(emlio_batch_t *b)
{
    if (!b->xf_pending)
        return false;
    b->xf_disowned = true;
    return true;
}

void
emlio__tensor_shutdown(emlio_client_t *self)
{
    /* Joining the pool runs what is queued; then every batch it held is
     * back on the done list, disowned by the abandon before this. */
    emlio__workpool_destroy(&self->xf.pool);
    (void)emlio__tensor_collect(self);
}

int
emlio__tensor_take_welcome(emlio_client_t *self, emlio__cdaemon_t *daemon,
                           const emlio__wire_msg_t *msg)
{
    if (!emlio__tensor_active(self))
        return 0;
    uint64_t threads = msg->welcome.xf_threads;
    emlio__client_xf_add_daemon(&self->xf, threads, msg->welcome.core_mw);
    if (self->xf.decode_at == EMLIO_DECODE_SERVER && threads == 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "daemon '%s' does not decode (it runs with "
                             "--transform-threads 0, or predates protocol "
                             "3); use decode_at client or auto",
                             daemon->endpoint);
    return 0;
}

/* ---- public ------------------------------------------------------------ */

const uint8_t *
emlio_batch_images(const emlio_batch_t *b, size_t *n, uint32_t *height,
                   uint32_t *width)
{
    const emlio_client_t *self = b->owner;
    if (!self->xf.transform) {
        *n = 0;
        *height = *width = 0;
        return NULL;
    }
    *n = b->n;
    *height = emlio_transform_height(self->xf.transform);
    *width = emlio_transform_width(self->xf.transform);
    return b->images;
}

void
emlio_client_xf_stats(const emlio_client_t *self, emlio_client_xf_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->bound = "";
    const emlio__client_xf_t *xf = &self->xf;
    if (!xf->transform)
        return;
    out->decode_at = xf->decode_at;
    out->server_share = xf->share;
    out->decided = xf->decided || xf->decode_at != EMLIO_DECODE_AUTO;
    out->batches_server = xf->batches_server;
    out->batches_client = xf->batches_here;
    out->client_ms_per_image = xf->here_images ? (double)xf->here_cpu_ns / 1e6 /
                                                     (double)xf->here_images
                                               : 0;
    out->server_ms_per_image =
        xf->server_images
            ? (double)xf->server_cpu_ns / 1e6 / (double)xf->server_images
            : 0;
    out->client_threads = (uint32_t)xf->threads;
    out->client_ws_bytes = xf->ws_max_bytes;
    out->server_threads = (uint32_t)xf->server_threads;
    if (xf->decode_at == EMLIO_DECODE_AUTO && xf->choice.bound) {
        out->predicted_ips = xf->choice.images_per_s;
        out->predicted_j_per_image = xf->choice.j_per_image;
        out->fastest_ips = xf->choice.best_ips;
        out->bound = xf->choice.bound;
        snprintf(out->why, sizeof(out->why), "%.280s%s", xf->choice.why,
                 xf->decided ? "" : " (still measuring: share 0.5)");
    }
}

const char *
emlio_decode_at_name(int decode_at)
{
    switch (decode_at) {
    case EMLIO_DECODE_AUTO:
        return "auto";
    case EMLIO_DECODE_CLIENT:
        return "client";
    case EMLIO_DECODE_SERVER:
        return "server";
    default:
        return NULL;
    }
}

int
emlio_decode_at_parse(const char *name)
{
    for (int v = EMLIO_DECODE_AUTO; v <= EMLIO_DECODE_SERVER; v++)
        if (name && strcmp(name, emlio_decode_at_name(v)) == 0)
            return v;
    return EMLIO_EINVAL;
}
