/* server_pipeline.c - the daemon's pipeline behind the frontend: reader
 * threads turn a GET into views of its samples (through each shard's
 * format), serializer threads turn views into one BATCH of zero-copy frames
 * (or an ERROR), and release tokens end the frames' uses of the shards
 * once ZeroMQ lets go of them. A GET with a transform passes through the
 * transform stage (server_xf.c) between the two.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <zmq.h>

#include "server_internal.h"
#include "store.h"

/* Lives as long as ZeroMQ holds any frame of one sent batch: the mapping
 * must stay, and with drop_behind its pages are let go after the last. */
typedef struct emlio__srv_release emlio__srv_release_t;

/* The free callback's hint of a frame over a private copy: the copy, and
 * the token that counts the frame. */
typedef struct s_owned {
    emlio__srv_release_t *rel;
    uint8_t *buf;
    size_t size; /* a packed frame's pool buffer: its size; else 0 */
} s_owned_t;

struct emlio__srv_release {
    emlio__srv_core_t *core;
    atomic_uint left;
    emlio__copy_charge_t charge; /* given back with the last frame */
    s_owned_t *owned;            /* n + 1 hints (the last: the packed
                                    frame), after the items */
    size_t n;
    emlio__view_t items[]; /* only shard, record and held are used */
};

/* Drops one reference to a sent batch's release token; the last one (the
 * last frame ZeroMQ lets go of, or the sender) ends the batch's uses of
 * the shards. Runs in a ZeroMQ I/O thread: touches only the token and the
 * core, never the server, which may be gone by then. */
static void
s_release_unref(emlio__srv_release_t *rel)
{
    if (atomic_fetch_sub(&rel->left, 1) != 1)
        return;
    emlio__srv_core_t *core = rel->core;
    const emlio__view_t *advised = NULL;
    for (size_t i = 0; i < rel->n; i++) {
        const emlio__view_t *item = &rel->items[i];
        emlio__shard_t *shard = &core->set.shards[item->shard];
        if (!item->held)
            continue;
        /* Sent: not read again this epoch (advised once per sample, whose
         * fields are consecutive items). */
        if (core->drop_behind && (!advised || advised->shard != item->shard ||
                                  advised->record != item->record))
            emlio__shard_advise(shard, (size_t)item->record, 1,
                                EMLIO_ADVISE_DONTNEED);
        advised = item;
        emlio__shard_release(shard);
    }
    /* The copies are all freed: their bytes leave the budget. */
    emlio__srv_copy_release(&rel->charge);
    emlio_free(rel);
    atomic_fetch_sub(&core->batches_in_flight, 1);
    emlio__srv_core_unref(&core);
}

static void
s_frame_free(void *data, void *hint)
{
    (void)data;
    s_release_unref(hint);
}

/* Frees the private copy behind a frame, then counts the frame off its
 * batch's token. */
static void
s_owned_free(void *data, void *hint)
{
    (void)data;
    s_owned_t *owned = hint;
    emlio__iobuf_free(owned->buf);
    s_release_unref(owned->rel);
}

/* Gives a packed frame's buffer back to the pool, then counts the frame
 * off its batch's token. */
static void
s_packed_free(void *data, void *hint)
{
    (void)data;
    s_owned_t *owned = hint;
    emlio__srv_pack_put(&owned->rel->core->pack_pool, owned->buf, owned->size);
    s_release_unref(owned->rel);
}

/* Ends what a view holds: its use of the mapping or its private copy. */
void
emlio__srv_view_release(emlio_server_t *self, emlio__view_t *view)
{
    emlio__view_release(view, &self->core->set.shards[view->shard]);
}

static void
s_free_bytes(void *data, void *hint)
{
    (void)hint;
    emlio_free(data);
}

/* Moves header (detached from its buffer) into a ZeroMQ message. */
int
emlio__srv_header_msg(zmq_msg_t *msg, emlio_buf_t *header)
{
    size_t len;
    uint8_t *bytes = emlio_buf_detach(header, &len);
    if (zmq_msg_init_data(msg, bytes, len, s_free_bytes, NULL) != 0) {
        emlio_free(bytes);
        return -errno;
    }
    return 0;
}

/* Sends identity, header and n sample frames as one multipart message.
 * Every message is consumed (sent or closed) whatever happens. */
int
emlio__srv_send_parts(void *sock, zmq_msg_t *identity, zmq_msg_t *header,
                      zmq_msg_t *frames, size_t n, int flags)
{
    int rc = 0;
    zmq_msg_t *parts[2] = { identity, header };
    for (size_t i = 0; i < 2 + n; i++) {
        zmq_msg_t *part = i < 2 ? parts[i] : &frames[i - 2];
        int more = i + 1 < 2 + n ? ZMQ_SNDMORE : 0;
        if (rc == 0) {
            while (zmq_msg_send(part, sock, more | flags) < 0) {
                if (errno == EINTR)
                    continue;
                rc = -errno;
                break;
            }
            if (rc == 0)
                continue;
        }
        zmq_msg_close(part);
    }
    return rc;
}

int
emlio__srv_error_msg(zmq_msg_t *header, uint64_t id, int code, const char *text)
{
    emlio_buf_t buf = EMLIO_BUF_INIT;
    if (emlio__wire_encode_error(&buf, id, code, text) < 0 ||
        emlio__srv_header_msg(header, &buf) < 0) {
        emlio_buf_release(&buf);
        return EMLIO_ENOMEM;
    }
    return 0;
}

int
emlio__srv_send_error(void *sock, zmq_msg_t *identity, uint64_t id, int code,
                      const char *text, int flags)
{
    zmq_msg_t header;
    if (emlio__srv_error_msg(&header, id, code, text) < 0) {
        zmq_msg_close(identity);
        return EMLIO_ENOMEM;
    }
    return emlio__srv_send_parts(sock, identity, &header, NULL, 0, flags);
}

/* Counts a sample skipped under --on-corrupt skip and logs why (msg may
 * be NULL: a changed shard was logged once already). */
void
emlio__srv_skip(emlio_server_t *self, const char *msg)
{
    atomic_fetch_add(&self->count.corrupt_skipped, 1);
    if (msg)
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", msg);
}

/* Judges one sample's read verdict rc: 0 keeps it, 1 skips it (under
 * --on-corrupt skip, counted and logged), < 0 fails the job with the
 * error in job->code and job->text. */
static int
s_read_verdict(emlio_server_t *self, emlio__job_t *job, emlio__shard_t *shard,
               uint64_t record, int rc, const char *missing)
{
    bool skip = self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP;
    const emlio__format_ops_t *ops = shard->ops;
    char where[PATH_MAX + 128] = "";
    char msg[PATH_MAX + 256];
    if (rc == 0)
        return 0;
    if (rc == EMLIO_ECORRUPT && atomic_load(&shard->changed))
        rc = -ESTALE; /* changed on disk, not rotten: say so */
    /* Only after ENOTFOUND is excluded may the format describe record. */
    if (rc != EMLIO_ENOTFOUND)
        emlio__shard_describe(shard, record, where, sizeof(where));
    uint64_t offset =
        rc == EMLIO_ENOTFOUND ? 0 : emlio__shard_offset(shard, (size_t)record);
    if (rc == -ESTALE && skip) {
        emlio__srv_skip(self, NULL);
        return 1;
    }
    if (rc == -ESTALE) {
        job->code = EMLIO_ECORRUPT;
        snprintf(job->text, sizeof(job->text),
                 "record %" PRIu64 " of shard '%s' cannot be read intact: "
                 "the shard changed on disk while being served",
                 record, shard->name);
        return -1;
    }
    if (skip && ops->changed_code && rc == ops->changed_code) {
        /* A file rewritten since it was listed: like a changed shard. */
        snprintf(msg, sizeof(msg), "skipping changed %s", where);
        emlio__srv_skip(self, msg);
        return 1;
    }
    if (skip &&
        (rc == EMLIO__FORMAT_EMISSING || rc == EMLIO__FORMAT_EBADLABEL)) {
        snprintf(msg, sizeof(msg),
                 "skipping sample %" PRIu64 " of '%s' at offset %" PRIu64
                 ": %s '%s'%s",
                 record, shard->name, offset,
                 rc == EMLIO__FORMAT_EMISSING ? "no field" : "label", missing,
                 rc == EMLIO__FORMAT_EMISSING ? ""
                                              : " is not an integer, or "
                                                "missing");
        emlio__srv_skip(self, msg);
        return 1;
    }
    if (skip && rc < 0 && rc > -1000) {
        /* -errno: a file deleted or made unreadable while served. */
        snprintf(msg, sizeof(msg), "skipping unreadable %s: %s", where,
                 emlio_strerror(rc));
        emlio__srv_skip(self, msg);
        return 1;
    }
    if (skip && rc == EMLIO_ECORRUPT) {
        snprintf(msg, sizeof(msg),
                 "skipping corrupt record %" PRIu64 " of '%s' at offset "
                 "%" PRIu64,
                 record, shard->name, offset);
        emlio__srv_skip(self, msg);
        return 1;
    }
    job->code = rc == EMLIO__FORMAT_EMISSING || rc == EMLIO__FORMAT_EBADLABEL
                    ? EMLIO_EFORMAT
                    : rc;
    if (rc == EMLIO_ENOTFOUND)
        snprintf(job->text, sizeof(job->text),
                 "no record %" PRIu64 " in shard '%s' (%zu records)", record,
                 shard->name, emlio__shard_count(shard));
    else if (rc == EMLIO__FORMAT_EMISSING)
        snprintf(job->text, sizeof(job->text),
                 "sample %" PRIu64 " of shard '%s' at offset %" PRIu64
                 " has no field '%s'",
                 record, shard->name, offset, missing);
    else if (rc == EMLIO__FORMAT_EBADLABEL)
        snprintf(job->text, sizeof(job->text),
                 "label '%s' of sample %" PRIu64 " of shard '%s' at offset "
                 "%" PRIu64 " is not an integer, or missing",
                 missing, record, shard->name, offset);
    else if (rc < 0 && rc > -1000)
        snprintf(job->text, sizeof(job->text), "unreadable %s: %s", where,
                 emlio_strerror(rc));
    else
        snprintf(job->text, sizeof(job->text), "%s %s",
                 rc == EMLIO_ECORRUPT                           ? "corrupt"
                 : ops->changed_code && rc == ops->changed_code ? "changed"
                                                                : "unreadable",
                 where);
    return -1;
}

/* The reader stage: checks the request against the dataset, finds and
 * verifies every sample through its shard's format, and leaves views (or
 * an error) in the job: per views for each sample kept, in request order. */
/* How far ahead of the item being read the reader prefetches the index
 * entries and then the records of a request: a shuffled request reads
 * records all over the shards, and at small samples the cache misses on
 * the index and on each record's stored CRC were a fifth of the daemon's
 * time. */
#define S_PREFETCH_INDEX 8
#define S_PREFETCH_DATA  4

static void
s_prefetch(emlio_server_t *self, const emlio__msg_get_t *get, size_t i,
           bool data)
{
    if (i >= get->n_items || get->items[i].shard >= self->core->set.n)
        return;
    emlio__shard_t *shard = &self->core->set.shards[get->items[i].shard];
    /* Only a shard the cache has open now, held meanwhile: a closed shard
     * has no mapping worth fetching into the cache. */
    if (!shard->ops->prefetch || get->items[i].record >= SIZE_MAX ||
        !emlio__shard_try_use(shard))
        return;
    if (emlio__shard_maps(shard)) /* a copying shard's mapping is not read */
        shard->ops->prefetch(shard->impl, (size_t)get->items[i].record, data);
    emlio__shard_release(shard);
}

/* Copies the small sample frames of a packed job into one
 * pooled buffer, up to job->pack.cap bytes, right after reading them while
 * they are in cache, and ends the views' holds on the shards: the batch
 * then goes as one frame and a table instead of a ZeroMQ message per
 * sample. Without a buffer the views stay frames of their own. */
static void
s_pack_job(emlio_server_t *self, emlio__job_t *job)
{
    size_t nf = job->n_views * job->per;
    size_t want = 0;
    for (size_t i = 0; i < nf; i++) {
        size_t len = job->views[i].len;
        if (len <= job->pack.max && want + len <= job->pack.cap)
            want += len;
    }
    if (want == 0)
        return;
    job->pack.buf =
        emlio__srv_pack_get(&self->core->pack_pool, want, &job->pack.size);
    if (!job->pack.buf)
        return;
    const emlio__view_t *advised = NULL;
    for (size_t i = 0; i < nf; i++) {
        emlio__view_t *v = &job->views[i];
        if (v->len > job->pack.max || job->pack.len + v->len > want)
            continue;
        memcpy(job->pack.buf + job->pack.len, v->data, v->len);
        emlio__shard_t *shard = &self->core->set.shards[v->shard];
        /* Copied: with drop_behind not read again this epoch (once per
         * sample, whose fields are consecutive views). */
        if (v->held && self->core->drop_behind &&
            (!advised || advised->shard != v->shard ||
             advised->record != v->record))
            emlio__shard_advise(shard, (size_t)v->record, 1,
                                EMLIO_ADVISE_DONTNEED);
        advised = v;
        emlio__view_release(v, shard);
        v->data = job->pack.buf + job->pack.len;
        v->packed = true;
        job->pack.len += v->len;
    }
}

emlio__wire_io_t
emlio__srv_job_io(emlio__srv_core_t *core, const emlio__job_t *job)
{
    return (emlio__wire_io_t){ emlio__srv_disk_share(core), job->io.bytes,
                               job->io.shared_bytes, NULL };
}

int
emlio__srv_disk_share(emlio__srv_core_t *core)
{
    if (!core->io_engine || !atomic_load(&core->io_reading))
        return EMLIO_WIRE_NO_DISK;
    uint64_t now = emlio__now_ns();
    pthread_mutex_lock(&core->disk_lock);
    if (now - core->disk_at_ns >= 250000000ull) {
        emlio__io_counters_t io;
        emlio__io_counters(&io);
        uint64_t dt = (now - core->disk_at_ns) * EMLIO_MAX(core->readers, 1);
        uint64_t dw = io.wait_ns - core->disk_wait_ns;
        core->disk_pct =
            core->disk_at_ns && dt ? (int)EMLIO_MIN(100, dw * 100 / dt) : 0;
        core->disk_at_ns = now;
        core->disk_wait_ns = io.wait_ns;
    }
    int pct = core->disk_pct;
    pthread_mutex_unlock(&core->disk_lock);
    return pct;
}

/* A tree format's record (an ImageFolder file) as a staged read: its file
 * opened here and closed by the engine, past the page cache when the
 * shard's first file allowed it (probed once per shard). A file that will
 * not open is left to the read, which reports it. */
static bool
s_stage_file(emlio__shard_t *shard, size_t record, emlio__io_req_t *r)
{
    const void *key;
    size_t len;
    int fd = shard->ops->open_record(shard->impl, record, &key, &len);
    if (fd < 0)
        return false;
    *r = (emlio__io_req_t){ .owner = key,
                            .fd = fd,
                            .offset = 0,
                            .len = len,
                            .align = emlio__shard_io_align_file(shard, fd),
                            .owns_fd = true };
    return true;
}

/* Records next to each other in a file (a plan without shuffling, a tar
 * sample's neighbour past its padding) become one read of up to
 * S_MERGE_MAX bytes, at the device's sequential rate rather than one
 * request each; the readers then take each record's part of it, a
 * reference to the one buffer (ioengine.h), which lives until the reply
 * is sent. S_MERGE_MAX leaves room for the direct read's alignment on
 * both ends inside 4 MiB, a size class of the buffer pool (iobuf.h): a
 * span just over it would take a 5 MiB buffer, a quarter more memory than
 * the copy budget charged for it. Returns how many requests are left in
 * reqs. */
#define S_MERGE_MAX (((size_t)4 << 20) - 2 * EMLIO__IOBUF_ALIGN)
#define S_MERGE_GAP ((uint64_t)4096)

static size_t
s_merge_reads(emlio__io_req_t *reqs, size_t n)
{
    size_t m = 0;
    for (size_t i = 1; i < n; i++) {
        emlio__io_req_t *last = &reqs[m];
        uint64_t end = last->offset + last->len;
        if (!last->owns_fd && !reqs[i].owns_fd &&
            reqs[i].owner == last->owner && reqs[i].fd == last->fd &&
            reqs[i].align == last->align && reqs[i].offset >= end &&
            reqs[i].offset - end <= S_MERGE_GAP &&
            reqs[i].offset + reqs[i].len - last->offset <= S_MERGE_MAX) {
            last->len = (size_t)(reqs[i].offset + reqs[i].len - last->offset);
            continue;
        }
        reqs[++m] = reqs[i];
    }
    return n ? m + 1 : 0;
}

/* A sharing GET whose job was refused the cache (s_check_share_use)
 * after the GET was admitted is read as any other: the refusal takes
 * effect for the GETs already queued and read ahead, not only for those
 * that arrive later, so a client's deep window of random GETs cannot keep
 * the device reading a chunk per record for it meanwhile. */
static void
s_share_recheck(emlio__job_t *job)
{
    if (job->io.share && job->sched.tjob &&
        atomic_load(&job->sched.tjob->share_refused))
        job->io.share = false;
}

/* --io read: the records of a job's request go to the device at once, in
 * request order (io_uring keeps them in flight), into buffers the
 * format's copying reads then take (ioengine.h). Each staged record's
 * shard stays used until s_unstage, so its descriptor cannot close and
 * be reused under the read. What is not staged (a format without
 * extents, a shard that will not open) is read one by one as before. */
static void
s_stage_reads(emlio_server_t *self, emlio__job_t *job)
{
    const emlio__msg_get_t *get = &job->msg.get;
    s_share_recheck(job);
    if (!self->core->io_engine || !get->n_items)
        return;
    emlio__ioengine_t *eng = emlio__ioengine_thread(self->core->io_depth);
    if (!eng)
        return;
    emlio__io_req_t *reqs = emlio_calloc(get->n_items, sizeof(*reqs));
    job->io.holds = emlio_calloc(get->n_items, sizeof(*job->io.holds));
    size_t n = 0;
    for (size_t i = 0; reqs && job->io.holds && i < get->n_items; i++) {
        const emlio__wire_item_t *item = &get->items[i];
        if (item->shard >= self->core->set.n)
            continue;
        emlio__shard_t *shard = &self->core->set.shards[item->shard];
        if (!emlio__shard_reads_io(shard) || item->record >= SIZE_MAX)
            continue;
        /* A sharing job's records of mapped shards come out of the shared
         * cache's chunks (s_read_job), not from reads of their own. */
        if (job->io.share && !shard->ops->open_record)
            continue;
        if (shard->ops->open_record) {
            if (s_stage_file(shard, (size_t)item->record, &reqs[n]))
                job->io.holds[n++] = NULL; /* a file of its own: no hold */
            continue;
        }
        if (!shard->ops->extent || emlio__shard_acquire(shard) < 0)
            continue;
        emlio__io_req_t *r = &reqs[n];
        if (shard->fd >= 0 &&
            shard->ops->extent(shard->impl, (size_t)item->record, &r->offset,
                               &r->len) == 0) {
            r->owner = shard;
            r->fd = shard->fd;
            r->align = emlio__shard_io_align(shard);
            job->io.holds[n++] = shard;
        } else {
            emlio__shard_release(shard);
        }
    }
    job->io.n_holds = n;
    size_t merged = s_merge_reads(reqs, n);
    size_t staged = emlio__ioengine_stage(eng, job, reqs, merged);
    /* The rest are read one by one when taken. What the staged ones take
     * from the file system, aligned as the direct reads go (the device's
     * bytes past the page cache), is the reply's "rd". */
    for (size_t i = 0; i < staged; i++) {
        uint64_t a = reqs[i].align ? reqs[i].align : 1;
        uint64_t lo = reqs[i].offset / a * a;
        uint64_t hi = (reqs[i].offset + reqs[i].len + a - 1) / a * a;
        job->io.bytes += hi - lo;
    }
    emlio_free(reqs);
}

/* Frees what was staged for job and not taken, then ends its holds. */
static void
s_unstage(emlio_server_t *self, emlio__job_t *job)
{
    if (!job->io.holds)
        return;
    emlio__ioengine_release(emlio__ioengine_thread(self->core->io_depth), job);
    for (size_t i = 0; i < job->io.n_holds; i++)
        if (job->io.holds[i])
            emlio__shard_release(job->io.holds[i]);
    emlio_free(job->io.holds);
    job->io.holds = NULL;
    job->io.n_holds = 0;
}

static void
s_read_items(emlio_server_t *self, emlio__job_t *job)
{
    const emlio__msg_get_t *get = &job->msg.get;
    size_t n = get->n_items;
    size_t per = emlio__srv_fields_per(self, job->fields); /* frames/sample */
    job->per = per;
    job->views = emlio_calloc(n ? n * per : 1, sizeof(*job->views));
    if (!job->views) {
        job->code = EMLIO_ENOMEM;
        snprintf(job->text, sizeof(job->text), "out of memory");
        return;
    }
    if (get->dataset &&
        (get->dataset_len != strlen(self->core->set.fingerprint) ||
         memcmp(get->dataset, self->core->set.fingerprint, get->dataset_len))) {
        job->code = EMLIO_EMISMATCH;
        snprintf(job->text, sizeof(job->text),
                 "dataset changed: client expects '%.*s', server has '%s'",
                 (int)EMLIO_MIN(get->dataset_len, 64), get->dataset,
                 self->core->set.fingerprint);
        return;
    }
    emlio__read_opts_t rd = self->rd;
    if (job->fields) {
        /* The session's own list: the formats read these, in its order. */
        rd.fields = job->fields->names;
        rd.n_fields = job->fields->n;
    }
    /* A derived CRC leaves the stored checksum to the client's check: not
     * when the bytes are decoded here (checked before decoding) or when
     * the client does not check at all. */
    if (job->xf.spec || get->flags.unchecked)
        rd.derive_crc_min = 0;
    for (size_t i = 0; i < n; i++) {
        const emlio__wire_item_t *item = &get->items[i];
        s_prefetch(self, get, i + S_PREFETCH_INDEX, false);
        s_prefetch(self, get, i + S_PREFETCH_DATA, true);
        if (item->shard >= self->core->set.n) {
            job->code = EMLIO_ENOTFOUND;
            snprintf(job->text, sizeof(job->text),
                     "no shard %" PRIu32 " (server has %zu)", item->shard,
                     self->core->set.n);
            return;
        }
        emlio__shard_t *shard = &self->core->set.shards[item->shard];
        emlio__view_t *view = &job->views[job->n_views * per];
        for (size_t f = 0; f < per; f++) {
            view[f].shard = item->shard;
            view[f].record = item->record;
        }
        const char *missing = self->own.field ? self->own.field : "(image)";
        int rc = emlio__shard_read(shard, item->record, &rd, view, &missing);
        if (rc < 0)
            for (size_t f = 0; f < per; f++)
                emlio__srv_view_release(self, &view[f]);
        rc = s_read_verdict(self, job, shard, item->record, rc, missing);
        if (rc < 0)
            return;
        job->n_views += rc == 0;
    }
    if (job->pack.on && job->pack.cap)
        s_pack_job(self, job);
}

/* A sharing job that reads more than S_SHARE_WASTE times the bytes it
 * uses, beyond twice the cache (what a window's first reads may load
 * ahead of their use), is not following the shared schedule: its GETs
 * are served with exact reads from then on (server_jobs.c), so no client
 * can make the device read a chunk per record. */
#define S_SHARE_WASTE 4

static void
s_check_share_use(emlio_server_t *self, emlio__trainjob_t *j,
                  const emlio__share_tally_t *t)
{
    if (!j)
        return;
    uint64_t loaded = atomic_fetch_add(&j->share_loaded, t->loaded) + t->loaded;
    uint64_t used = atomic_fetch_add(&j->share_used, t->shared + t->own) +
                    t->shared + t->own;
    emlio__share_stats_t st;
    emlio__share_cache_stats(self->core->share, &st);
    if (loaded <= S_SHARE_WASTE * used + 2 * st.capacity ||
        atomic_exchange(&j->share_refused, true))
        return;
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
              "job %s: its shared reads loaded %" PRIu64 " MB for %" PRIu64
              " MB it used (not the shared schedule's order?): it is served "
              "with exact reads from now on",
              j->name, loaded >> 20, used >> 20);
}

/* Reads a job's records; a job that shares reads (sharecache.h) copies
 * them out of the chunks read for every sharing job, and its reply says
 * what came from another's read ("sh") and what it read itself ("rd"). */
static void
s_read_job(emlio_server_t *self, emlio__job_t *job)
{
    s_share_recheck(job);
    if (!job->io.share) {
        s_read_items(self, job);
        return;
    }
    emlio__share_tally_t tally = { 0 };
    emlio__share_scope_set(self->core->share,
                           (uint64_t)(uintptr_t)job->sched.tjob, &tally);
    s_read_items(self, job);
    emlio__share_scope_set(NULL, 0, NULL);
    if (job->msg.get.segs)
        emlio__srv_jobs_note_cursor(&self->jobs, job->sched.tjob,
                                    job->msg.get.segs, job->msg.get.cursor);
    job->io.bytes += tally.loaded;
    job->io.shared_bytes += tally.shared;
    s_check_share_use(self, job->sched.tjob, &tally);
}

/* Each sample's record described by its format (a file's name for an
 * ImageFolder, shard and offset for TFRecord and tar), for a GET that
 * asked ("describe": the client decodes, and names the file when it
 * cannot). One block: n pointers, then n strings of at most
 * EMLIO_WIRE_MAX_WHERE bytes. NULL when out of memory. */
static char **
s_describe_views(emlio_server_t *self, const emlio__job_t *job)
{
    size_t n = job->n_views;
    size_t room = EMLIO_WIRE_MAX_WHERE + 1;
    char **where = emlio_malloc((n ? n : 1) * (sizeof(char *) + room));
    if (!where)
        return NULL;
    char *text = (char *)(where + n);
    for (size_t i = 0; i < n; i++) {
        const emlio__view_t *v = &job->views[i * job->per];
        const emlio__shard_t *shard = &self->core->set.shards[v->shard];
        where[i] = text + i * room;
        where[i][0] = '\0';
        if (shard->ops)
            emlio__shard_describe(shard, v->record, where[i], room);
    }
    return where;
}

/* The BATCH header of a job's views: the quadruples, the offset table
 * (views not packed: in their own frames), and the records' descriptions
 * when the GET asked. Returns 0 or EMLIO_ENOMEM. */
static int
s_batch_header(emlio_server_t *self, emlio__job_t *job, size_t nf,
               emlio__wire_io_t io, emlio_buf_t *buf)
{
    size_t n = job->n_views;
    emlio__wire_sample_t *samples = emlio_calloc(n ? n : 1, sizeof(*samples));
    emlio__wire_span_t *spans = emlio_calloc(nf ? nf : 1, sizeof(*spans));
    char **where =
        job->msg.get.flags.describe ? s_describe_views(self, job) : NULL;
    int rc = EMLIO_ENOMEM;
    io.where = where;
    if (samples && spans && (where || !job->msg.get.flags.describe)) {
        for (size_t i = 0; i < n; i++) {
            const emlio__view_t *v = &job->views[i * job->per];
            samples[i] =
                (emlio__wire_sample_t){ v->shard, v->record, v->label, v->crc };
        }
        for (size_t i = 0; i < nf; i++) {
            const emlio__view_t *v = &job->views[i];
            spans[i].off = v->packed ? (uint64_t)(v->data - job->pack.buf)
                                     : EMLIO_WIRE_PACK_OWN;
            spans[i].len = v->len;
        }

        rc = emlio__wire_encode_batch(buf, job->msg.id, samples, n, spans, nf,
                                      io);
    }
    emlio_free(where);
    emlio_free(spans);
    emlio_free(samples);
    return rc;
}

/* Moves the job's views into frames[] (the packed frame first, if any,
 * then one zero-copy frame per view not packed), each holding a reference
 * to rel. Returns the number of frames. Cannot fail. */
static size_t
s_batch_frames(emlio__job_t *job, emlio__srv_release_t *rel, size_t nf,
               zmq_msg_t *frames, uint64_t *bytes)
{
    size_t k = 0;
    if (job->pack.len) {
        rel->owned[nf] = (s_owned_t){ rel, job->pack.buf, job->pack.size };
        (void)zmq_msg_init_data(&frames[k++], job->pack.buf, job->pack.len,
                                s_packed_free, &rel->owned[nf]);
        job->pack.buf = NULL; /* now the frame's */
        *bytes += job->pack.len;
    }
    for (size_t i = 0; i < nf; i++) {
        emlio__view_t *v = &job->views[i];
        rel->items[i] = *v;
        rel->items[i].owned = NULL;
        if (v->packed)
            continue;
        /* Zero-copy: the frame points into the mapping or the copy.
         * zmq_msg_init_data cannot fail for a non-NULL free function. */
        assert(v->owned || v->held);
        rel->owned[i] = (s_owned_t){ rel, v->owned, 0 };
        if (v->owned)
            (void)zmq_msg_init_data(&frames[k++], (void *)v->data, v->len,
                                    s_owned_free, &rel->owned[i]);
        else
            (void)zmq_msg_init_data(&frames[k++], (void *)v->data, v->len,
                                    s_frame_free, rel);
        v->owned = NULL; /* now the frame's */
        v->held = false; /* now the token's */
        *bytes += v->len;
    }
    return k;
}

/* The serializer stage: turns the reader's views into the BATCH header and
 * its frames (one zero-copy frame per sample frame, or for a packed job
 * one frame of the small ones and the table), or the ERROR, and hands the
 * reply to the frontend. Consumes job->identity. */
static void
s_serialize_job(emlio_server_t *self, void *done, emlio__job_t *job)
{
    size_t n = job->n_views;
    size_t nf = n * job->per;
    zmq_msg_t *frames = NULL;
    emlio__srv_release_t *rel = NULL;
    uint64_t bytes = 0;
    if (job->code == 0 && job->xf.spec &&
        emlio__srv_xf_serialize(self, done, job))
        return; /* a tensor batch, sent */
    if (job->code == 0) {
        frames = emlio_calloc(nf + 1, sizeof(*frames));
        rel = emlio_malloc(sizeof(*rel) + nf * sizeof(rel->items[0]) +
                           (nf + 1) * sizeof(s_owned_t));
        if (!frames || !rel) {
            job->code = EMLIO_ENOMEM;
            snprintf(job->text, sizeof(job->text), "out of memory");
        }
    }
    /* The header is built before any frame, so nothing after it can fail
     * and every view's hold moves into a frame exactly once. */
    emlio_buf_t buf = EMLIO_BUF_INIT;
    zmq_msg_t header;
    if (job->code == 0 &&
        (s_batch_header(self, job, nf, emlio__srv_job_io(self->core, job),
                        &buf) < 0 ||
         emlio__srv_header_msg(&header, &buf) < 0)) {
        job->code = EMLIO_ENOMEM;
        snprintf(job->text, sizeof(job->text), "out of memory");
    }
    if (job->code == 0) {
        /* One reference per frame plus the sender's own: a mapped frame
         * ends its use of the shard, a frame of a copy frees its copy, the
         * packed frame goes back to the pool, and the last one gives the
         * job's copy charge back. */
        rel->core = self->core;
        rel->n = nf;
        rel->owned = (s_owned_t *)(void *)(rel->items + nf);
        rel->charge = job->copy.charge;
        job->copy.charge = (emlio__copy_charge_t){ 0 };
        size_t frames_n = 0;
        for (size_t i = 0; i < nf; i++)
            frames_n += !job->views[i].packed;
        frames_n += job->pack.len != 0;
        atomic_init(&rel->left, (unsigned)frames_n + 1);
        atomic_fetch_add(&self->core->refs, 1);
        atomic_fetch_add(&self->core->batches_in_flight, 1);
        size_t k = s_batch_frames(job, rel, nf, frames, &bytes);
        assert(k == frames_n);
        /* Counted before the send, so that a client that has its reply
         * finds it in the daemon's figures. */
        atomic_fetch_add(&self->count.requests, 1);
        atomic_fetch_add(&self->count.samples, n);
        atomic_fetch_add(&self->count.bytes, bytes);
        atomic_fetch_add(&self->count.packed_bytes, job->pack.len);
        emlio__srv_send_parts(done, &job->identity, &header, frames, k, 0);
        s_release_unref(rel); /* the sender's reference */
        emlio_free(frames);
        return;
    }
    emlio_buf_release(&buf);
    emlio_free(rel);
    atomic_fetch_add(&self->count.errors, 1);
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "request %" PRIu64 ": %s",
              job->msg.id, job->text);
    emlio__srv_send_error(done, &job->identity, job->msg.id, job->code,
                          job->text, 0);
    emlio_free(frames);
}

void
emlio__srv_job_free(emlio_server_t *self, emlio__job_t *job)
{
    if (!job)
        return;
    emlio__srv_jobs_get_freed(job);
    /* Views a batch did not take (an error reply): every frame of every
     * sample read so far. */
    for (size_t i = 0; job->views && i < job->n_views * job->per; i++)
        emlio__srv_view_release(self, &job->views[i]);
    emlio_free(job->views);
    if (job->pack.buf) /* no batch took the packed buffer */
        emlio__srv_pack_put(&self->core->pack_pool, job->pack.buf,
                            job->pack.size);
    /* A job that ends without a batch (an error, a tensor, a drop) gives
     * its copy charge back here; a batch's token took it over. */
    emlio__srv_copy_release(&job->copy.charge);
    emlio__srv_copy_acct_unref(&job->copy.waits_on);
    emlio__srv_xf_job_free(job);
    emlio__wire_msg_release(&job->msg);
    zmq_msg_close(&job->header);
    emlio_free(job);
}

void
emlio__srv_job_drop(emlio_server_t *self, emlio__job_t *job)
{
    if (job->sched.dispatched) /* its window slot, given back without a reply */
        emlio__srv_jobs_reply_left(job->sched.tjob, job->sched.fq.cost);
    zmq_msg_close(&job->identity);
    emlio__srv_job_free(self, job);
}

/* Hands a job the read stage has finished (views, or an error) to the next
 * stage: the transform stage for a GET with a transform (server_xf.c: the
 * pool, niced below the readers, makes one block of its samples and pushes
 * the job on to ser_queue), else the serializers. A job with an error
 * skips the transform and goes straight to the serializer, which answers
 * ERROR. Blocking on a full queue is the daemon's backpressure. */
static void
s_read_done(emlio_server_t *self, emlio__job_t *job)
{
    /* A GET with a transform goes to the transform pool, which pushes it
     * on to ser_queue when its last sample is done. */
    if (job->code == 0 && job->xf.spec && emlio__srv_xf_start(self, job))
        return;
    if (emlio__queue_push(self->thr.ser_queue, job) < 0)
        emlio__srv_job_drop(self, job);
}

/* --io read: jobs a reader has taken off its queue ahead of the one it
 * serves, their reads already with the device, oldest first. */
#define S_AHEAD_MAX 16

typedef struct s_ahead {
    emlio__job_t *jobs[S_AHEAD_MAX];
    size_t n;
} s_ahead_t;

static emlio__job_t *
s_ahead_pop(s_ahead_t *ahead)
{
    if (!ahead->n)
        return NULL;
    emlio__job_t *job = ahead->jobs[0];
    memmove(ahead->jobs, ahead->jobs + 1, --ahead->n * sizeof(*ahead->jobs));
    return job;
}

/* Takes the jobs already queued for this reader, and stages their reads,
 * while what it holds staged is under its share of --read-ahead-bytes:
 * the device then reads the next requests while this one is checked and
 * sent, in the order they will be served. Never waits for a job. */
static void
s_read_ahead(emlio_server_t *self, void *work, s_ahead_t *ahead)
{
    if (!self->core->io_engine)
        return;
    emlio__ioengine_t *eng = emlio__ioengine_thread(self->core->io_depth);
    while (ahead->n < S_AHEAD_MAX &&
           emlio__ioengine_pending(eng) < self->core->read_ahead) {
        emlio__job_t *job;
        if (zmq_recv(work, &job, sizeof(job), ZMQ_DONTWAIT) != (int)sizeof(job))
            return;
        s_stage_reads(self, job);
        ahead->jobs[ahead->n++] = job;
    }
}

/* A reader thread: jobs from the frontend (over inproc), views into the
 * serializers' bounded queue. Blocking on a full queue is the daemon's
 * backpressure. */
void *
emlio__srv_reader_main(void *arg)
{
    emlio_server_t *self = arg;
    void *work = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PULL);
    char err[EMLIO_ERRMSG_LEN];
    if (!work ||
        emlio__srv_setopt_int(work, ZMQ_RCVTIMEO, EMLIO__SRV_POLL_MS,
                              "ZMQ_RCVTIMEO", err) < 0 ||
        zmq_connect(work, self->net.inproc_work) != 0) {
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "a reader thread cannot start: %s", zmq_strerror(errno));
        goto out;
    }
    s_ahead_t ahead = { 0 };
    while (!atomic_load(&self->thr.stopping)) {
        emlio__job_t *job = s_ahead_pop(&ahead);
        if (!job) {
            int n = zmq_recv(work, &job, sizeof(job), 0);
            if (n != (int)sizeof(job))
                continue; /* timeout or EINTR: look at the stop flag again */
            s_stage_reads(self, job);
        }
        s_read_ahead(self, work, &ahead);
        s_read_job(self, job);
        s_unstage(self, job);
        s_read_done(self, job);
    }
    for (emlio__job_t *job; (job = s_ahead_pop(&ahead));) {
        s_unstage(self, job);
        emlio__srv_job_drop(self, job);
    }
    /* Free the jobs still queued for us, and those the frontend sends
     * until it has stopped: we may see the stop before its last send, and
     * a job left in our queue when the socket closes is lost with its
     * memory (test_faults under ASan saw one in ten runs). Their clients
     * ask again. */
    for (;;) {
        emlio__job_t *job;
        bool last = atomic_load(&self->thr.frontend_stopped);
        if (zmq_recv(work, &job, sizeof(job), last ? ZMQ_DONTWAIT : 0) ==
            (int)sizeof(job))
            emlio__srv_job_drop(self, job);
        else if (last)
            break;
    }
out:
    if (work)
        zmq_close(work);
    return NULL;
}

/* A serializer thread: views from the queue, replies to the frontend. */
void *
emlio__srv_serializer_main(void *arg)
{
    emlio_server_t *self = arg;
    void *done = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PUSH);
    char err[EMLIO_ERRMSG_LEN];
    /* A reply that cannot be handed over while stopping is dropped rather
     * than blocking the join. Without a socket the jobs are still popped
     * (and dropped), so the readers never block on a full queue. */
    bool connected =
        done &&
        emlio__srv_setopt_int(done, ZMQ_SNDTIMEO, EMLIO__SRV_POLL_MS,
                              "ZMQ_SNDTIMEO", err) == 0 &&
        emlio__srv_setopt_int(done, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM", err) == 0 &&
        emlio__srv_setopt_int(done, ZMQ_LINGER, 0, "ZMQ_LINGER", err) == 0 &&
        zmq_connect(done, self->net.inproc_done) == 0;
    if (!connected)
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "a serializer thread cannot start: %s", zmq_strerror(errno));
    void *item;
    while (emlio__queue_pop(self->thr.ser_queue, &item) == 0) {
        emlio__job_t *job = item;
        if (!connected || atomic_load(&self->thr.stopping)) {
            emlio__srv_job_drop(self, job);
            continue;
        }
        /* The reply says whose it is, so that its slot is given back
         * when it leaves (server_jobs.c). */
        if (emlio__srv_jobs_tag(job) < 0) {
            emlio__srv_job_drop(self, job);
            continue;
        }
        s_serialize_job(self, done, job); /* consumes job->identity */
        emlio__srv_job_free(self, job);
    }
    if (done)
        zmq_close(done);
    return NULL;
}
