/* server_xf.c - the daemon's transform stage: a GET that names a
 * transform (docs/protocol.md 5.6) is read as usual, then its
 * samples are decoded and augmented on the transform pool into one block,
 * and the reply is one tensor frame.
 * SPDX-License-Identifier: MIT
 *
 * Where it sits (server_internal.h): frontend (emlio__srv_xf_admit finds
 * the parsed spec) -> reader (views) -> emlio__srv_xf_start (one unit per
 * sample on the pool, niced below readers and senders) -> the last unit
 * (s_xf_done: failures judged, kept samples packed, views released) pushes
 * the job to ser_queue -> serializer (emlio__srv_xf_serialize: header and
 * one zero-copy frame of the pooled block). A job keeps its credit all the
 * way, so a client's window bounds the daemon's decode memory as it bounds
 * its read memory.
 */
#include "base.h"

#include <zmq.h>

#include "server_internal.h"

int
emlio__srv_xf_admit(emlio_server_t *self, emlio__job_t *job, char *text)
{
    const emlio__msg_get_t *get = &job->msg.get;
    if (!get->xf_spec)
        return 0;
    if (self->own.n_fields)
        return emlio__seterr(text, EMLIO_EINVAL,
                             "transforms decode one field per sample; this "
                             "daemon serves several (--fields %s)",
                             self->own.fields_spec);
    const emlio_transform_t *t = NULL;
    int rc = emlio__xfspec_lookup(&self->xf, get->xf_spec, get->xf_spec_len, &t,
                                  &job->xf.users, text);
    if (rc < 0)
        return rc;
    job->xf.spec = t;
    job->srv = self;
    return 0;
}

static void
s_block_free(void *data, void *hint)
{
    (void)hint;
    emlio__xf_block_put(data);
}

/* Judges the failed samples (skipped under --on-corrupt skip, else the
 * first fails the GET), packs the kept ones to the front of the block with
 * their quadruples, and lets go of the encoded bytes. */
static void
s_xf_judge(emlio_server_t *self, emlio__job_t *job)
{
    emlio__xf_job_t *xj = &job->xf.run;
    size_t out = emlio_transform_output_bytes(job->xf.spec);
    bool skip = self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP;
    size_t k = 0;
    for (size_t i = 0; i < xj->n; i++) {
        const emlio__xf_sample_t *s = &xj->samples[i];
        const emlio__wire_sample_t *w = &job->xf.wire[i];
        const emlio__shard_t *shard = &self->core->set.shards[w->shard];
        if (s->rc == 0) {
            if (k != i)
                memmove(xj->block + k * out, xj->block + i * out, out);
            job->xf.wire[k] = *w;
            job->xf.wire[k].crc = s->crc;
            k++;
            continue;
        }
        /* Each sample in its own words: the skip lines kept only the
         * first failure's text (issue 34). */
        const char *why = emlio__xf_job_error(xj, i);
        /* Where it is, as the format says it: an ImageFolder's file
         * ("file 'cat/x.jpg' (record 7)"), a shard's record and offset. */
        char where[EMLIO_ERRMSG_LEN / 2];
        if (shard->ops)
            emlio__shard_describe(shard, w->record, where, sizeof(where));
        else
            snprintf(where, sizeof(where), "record %" PRIu64 " of '%s'",
                     w->record, shard->name);
        if (skip) {
            char msg[EMLIO_ERRMSG_LEN];
            snprintf(msg, sizeof(msg), "skipping %.200s: cannot decode: %.280s",
                     where, why);
            emlio__srv_skip(self, msg);
        } else if (job->code == 0) {
            job->code = s->rc;
            snprintf(job->text, sizeof(job->text),
                     "cannot decode %.200s: %.280s", where, why);
        }
    }
    job->xf.kept = k;
    for (size_t i = 0; i < job->n_views * job->per; i++)
        emlio__srv_view_release(self, &job->views[i]);
    job->n_views = 0;
}

/* The last unit of a job: runs on a transform thread. */
static void
s_xf_done(emlio__xf_job_t *xj)
{
    emlio__job_t *job = xj->userdata;
    emlio_server_t *self = job->srv;
    s_xf_judge(self, job);
    emlio__xf_job_cleanup(xj); /* the units; this one returns right after */
    if (emlio__queue_push(self->thr.ser_queue, job) < 0)
        emlio__srv_job_drop(self, job);
}

bool
emlio__srv_xf_start(emlio_server_t *self, emlio__job_t *job)
{
    size_t n = job->n_views;
    size_t per = job->per;
    size_t out = emlio_transform_output_bytes(job->xf.spec);
    job->xf.samples = emlio_calloc(n ? n : 1, sizeof(*job->xf.samples));
    job->xf.wire = emlio_calloc(n ? n : 1, sizeof(*job->xf.wire));
    uint8_t *block = job->xf.samples && job->xf.wire
                         ? emlio__xf_block_get(self->xf.blocks, n * out)
                         : NULL;
    if (!block) {
        job->code = EMLIO_ENOMEM;
        snprintf(job->text, sizeof(job->text), "out of memory");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const emlio__view_t *v = &job->views[i * per];
        const char *name = self->core->set.shards[v->shard].name;
        job->xf.samples[i] = (emlio__xf_sample_t){
            v->data, v->len, emlio_transform_sample_key(name, v->record), 0, 0
        };
        job->xf.wire[i] =
            (emlio__wire_sample_t){ v->shard, v->record, v->label, 0 };
    }
    job->xf.run = (emlio__xf_job_t){ .transform = job->xf.spec,
                                     .ws_max_bytes = self->xf.ws_max_bytes,
                                     .seed = job->msg.get.xf_seed,
                                     .epoch = job->msg.get.xf_epoch,
                                     .samples = job->xf.samples,
                                     .n = n,
                                     .block = block,
                                     .want_crc = true,
                                     .done = s_xf_done,
                                     .userdata = job };
    int rc = emlio__xf_job_start(&job->xf.run, self->xf.pool);
    if (rc < 0) {
        job->code = rc;
        snprintf(job->text, sizeof(job->text), "cannot transform: %s",
                 emlio_strerror(rc));
        return false; /* the block goes with the job */
    }
    return true;
}

bool
emlio__srv_xf_serialize(emlio_server_t *self, void *done, emlio__job_t *job)
{
    size_t n = job->xf.kept;
    size_t out = emlio_transform_output_bytes(job->xf.spec);
    emlio__wire_tensor_t shape = { emlio_transform_height(job->xf.spec),
                                   emlio_transform_width(job->xf.spec), 3,
                                   (uint64_t)atomic_load(&job->xf.run.cpu_ns) };
    emlio_buf_t buf = EMLIO_BUF_INIT;
    zmq_msg_t header, frame;
    if (emlio__wire_encode_batch_tensor(
            &buf, job->msg.id, job->xf.wire, n, &shape,
            emlio__srv_job_io(self->core, job)) < 0 ||
        emlio__srv_header_msg(&header, &buf) < 0) {
        emlio_buf_release(&buf);
        job->code = EMLIO_ENOMEM;
        snprintf(job->text, sizeof(job->text), "out of memory");
        return false;
    }
    /* Zero-copy: the frame gives the block back to its pool when ZeroMQ
     * is done with it (the pool outlives the server if need be). */
    (void)zmq_msg_init_data(&frame, job->xf.run.block, n * out, s_block_free,
                            NULL);
    job->xf.run.block = NULL;
    /* Counted before the send, as plain batches are (server_pipeline.c). */
    atomic_fetch_add(&self->count.requests, 1);
    atomic_fetch_add(&self->count.samples, n);
    atomic_fetch_add(&self->count.bytes, n * out);
    emlio__srv_send_parts(done, &job->identity, &header, &frame, 1, 0);
    return true;
}

uint64_t
emlio__srv_xf_bytes(const emlio__job_t *job)
{
    if (!job->xf.spec)
        return 0;
    return (uint64_t)job->msg.get.n_items *
           emlio_transform_output_bytes(job->xf.spec);
}

void
emlio__srv_xf_job_free(emlio__job_t *job)
{
    if (job->xf.users) /* the spec may be evicted once nobody uses it */
        atomic_fetch_sub(job->xf.users, 1);
    job->xf.users = NULL;
    emlio__xf_block_put(job->xf.run.block);
    job->xf.run.block = NULL;
    emlio__xf_job_cleanup(&job->xf.run);
    emlio_free(job->xf.samples);
    emlio_free(job->xf.wire);
    job->xf.samples = NULL;
    job->xf.wire = NULL;
}
