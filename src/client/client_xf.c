/* client_xf.c - the client's transform stage (see client_xf.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "client_xf.h"
#include "emlio/energy.h"
#include "store.h"

/* Decoded blocks kept for reuse: a window's worth of 256 x 224^2 x 3. */
#define S_KEEP_BLOCKS_BYTES (512u << 20)
/* Decode threads run this much nicer than the thread calling next(), whose
 * receive path must not starve behind them. */
#define S_NICE              5

int
emlio__client_xf_init(emlio__client_xf_t *xf, const emlio_client_config_t *cfg,
                      char *errbuf)
{
    memset(xf, 0, sizeof(*xf));
    xf->wake_fd = -1;
    pthread_mutex_init(&xf->lock, NULL);
    xf->inited = true;
    xf->seed = cfg->seed;
    xf->decode_at = cfg->decode_at;
    if (cfg->decode_at < EMLIO_DECODE_AUTO ||
        cfg->decode_at > EMLIO_DECODE_SERVER) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "decode_at %d: expected auto (0), client (1) or server (2)",
                 (int)cfg->decode_at);
        return EMLIO_EINVAL;
    }
    if (cfg->on_corrupt != EMLIO_ON_CORRUPT_FAIL &&
        cfg->on_corrupt != EMLIO_ON_CORRUPT_SKIP) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "on_corrupt %d: expected fail (0) or skip (1)",
                 (int)cfg->on_corrupt);
        return EMLIO_EINVAL;
    }
    xf->skip_corrupt = cfg->on_corrupt == EMLIO_ON_CORRUPT_SKIP;
    if (!cfg->transform || !cfg->transform[0])
        return 0;
    char err[EMLIO_ERRMSG_LEN];
    int rc =
        emlio_transform_parse(cfg->transform, &xf->transform, err, sizeof(err));
    if (rc < 0) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN, "transform: %.480s", err);
        return rc;
    }
    if (cfg->max_pixels)
        emlio_transform_set_max_pixels(xf->transform, cfg->max_pixels);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    xf->threads = cfg->transform_threads ? cfg->transform_threads
                  : cpus > 0             ? (size_t)cpus
                                         : 1;
    /* Sized at start, as the daemon sizes its own: the memory this
     * process may use then, over the threads that may decode at once. */
    xf->ws_max_bytes =
        emlio__xf_ws_cap(emlio__io_memory_limit(NULL), xf->threads);
    xf->client_core_w = EMLIO_ENERGY_DEFAULT_CORE_W;
    xf->share = cfg->decode_at == EMLIO_DECODE_SERVER   ? 1.0
                : cfg->decode_at == EMLIO_DECODE_CLIENT ? 0.0
                                                        : 0.5;
    xf->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    xf->blocks = emlio__xf_blocks_new(S_KEEP_BLOCKS_BYTES);
    if (xf->wake_fd < 0 || !xf->blocks) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN, "transform stage: %s",
                 xf->wake_fd < 0 ? strerror(errno) : "out of memory");
        return xf->wake_fd < 0 ? -errno : EMLIO_ENOMEM;
    }
    return 0;
}

void
emlio__client_xf_release(emlio__client_xf_t *xf)
{
    if (!xf->inited)
        return; /* a client destroyed before its stage was set up */
    /* Joining the pool runs what is queued; their done callbacks only
     * queue items, which are freed below with their blocks. */
    emlio__workpool_destroy(&xf->pool);
    emlio__client_xf_item_t *item = xf->done_head;
    while (item) {
        emlio__client_xf_item_t *next = item->next;
        emlio__xf_block_put(item->job.block);
        emlio__xf_job_cleanup(&item->job);
        emlio_free(item->job.samples);
        emlio_free(item);
        item = next;
    }
    emlio__xf_blocks_release(&xf->blocks);
    if (xf->wake_fd >= 0)
        close(xf->wake_fd);
    emlio_transform_destroy(&xf->transform);
    pthread_mutex_destroy(&xf->lock);
    memset(xf, 0, sizeof(*xf));
    xf->wake_fd = -1;
}

bool
emlio__client_xf_wants_server(const emlio__client_xf_t *xf)
{
    return xf->transform && xf->decode_at != EMLIO_DECODE_CLIENT;
}

bool
emlio__client_xf_at_server(const emlio__client_xf_t *xf, uint64_t index)
{
    if (!xf->transform || xf->share <= 0)
        return false;
    if (xf->share >= 1)
        return true;
    /* Spread the share evenly: batch i goes to the daemons when the
     * running total floor(i * f) steps up at i + 1. */
    return (uint64_t)((double)(index + 1) * xf->share) >
           (uint64_t)((double)index * xf->share);
}

void
emlio__client_xf_add_daemon(emlio__client_xf_t *xf, uint64_t threads,
                            uint64_t core_mw)
{
    double before = xf->server_threads;
    xf->server_threads += (double)threads;
    if (core_mw && threads) {
        /* Mean power per core, weighted by the threads each daemon has. */
        xf->server_core_w = (xf->server_core_w * before +
                             (double)core_mw / 1000.0 * (double)threads) /
                            xf->server_threads;
    }
}

void
emlio__client_xf_note_server(emlio__client_xf_t *xf, size_t n, uint64_t xf_ns)
{
    xf->server_images += n;
    xf->server_cpu_ns += xf_ns;
    xf->batches_server++;
}

static double
s_per_image(uint64_t ns, uint64_t images)
{
    return images ? (double)ns / 1e9 / (double)images : 0;
}

void
emlio__client_xf_begin_epoch(emlio__client_xf_t *xf, double link_Bps,
                             double consumer_ips)
{
    xf->batches_here = xf->batches_server = 0;
    if (!xf->transform || xf->decode_at != EMLIO_DECODE_AUTO)
        return;
    emlio__place_input_t in = { 0 };
    in.client.threads = (double)xf->threads;
    in.client.cpu_s = s_per_image(xf->here_cpu_ns, xf->here_images);
    in.client.core_w = xf->client_core_w;
    in.server.threads = xf->server_threads;
    in.server.cpu_s = s_per_image(xf->server_cpu_ns, xf->server_images);
    in.server.core_w = xf->server_core_w;
    in.link_Bps = link_Bps;
    in.encoded_B = xf->here_images
                       ? (double)xf->here_bytes / (double)xf->here_images
                       : 110000.0; /* an ImageNet JPEG until measured */
    in.tensor_B = (double)emlio_transform_output_bytes(xf->transform);
    in.consumer_ips = consumer_ips;
    emlio__place_choose(&in, &xf->choice);
    /* Until both sides have been measured, keep sampling both. */
    bool measured =
        xf->here_images && (xf->server_images || !in.server.threads);
    xf->decided = measured;
    xf->share = measured                ? xf->choice.server_share
                : in.server.threads > 0 ? 0.5
                                        : 0.0;
}

static void
s_item_done(emlio__xf_job_t *job)
{
    emlio__client_xf_item_t *item = job->userdata;
    emlio__client_xf_t *xf = item->xf;
    pthread_mutex_lock(&xf->lock);
    item->next = NULL;
    if (xf->done_tail)
        xf->done_tail->next = item;
    else
        xf->done_head = item;
    xf->done_tail = item;
    pthread_mutex_unlock(&xf->lock);
    uint64_t one = 1;
    /* Cannot fail short of an overflow of 2^64 - 1 wake-ups. */
    ssize_t w = write(xf->wake_fd, &one, sizeof(one));
    (void)w;
}

int
emlio__client_xf_submit(emlio__client_xf_t *xf, void *batch,
                        emlio__xf_sample_t *samples, size_t n, uint64_t epoch)
{
    int rc = EMLIO_ENOMEM;
    if (!xf->pool) {
        xf->pool = emlio__xf_pool_new(xf->threads, S_NICE, "emlio-xf", &rc);
        if (!xf->pool)
            return rc;
    }
    emlio__client_xf_item_t *item = emlio_calloc(1, sizeof(*item));
    size_t out = emlio_transform_output_bytes(xf->transform);
    uint8_t *block =
        item ? emlio__xf_block_get(xf->blocks, n ? n * out : 1) : NULL;
    if (!block) {
        emlio_free(item);
        return EMLIO_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        item->bytes += samples[i].len;
    item->batch = batch;
    item->xf = xf;
    item->job = (emlio__xf_job_t){ .transform = xf->transform,
                                   .seed = xf->seed,
                                   .epoch = epoch,
                                   .samples = samples,
                                   .n = n,
                                   .block = block,
                                   .ws_max_bytes = xf->ws_max_bytes,
                                   .done = s_item_done,
                                   .userdata = item };
    xf->running++;
    xf->batches_here++;
    rc = emlio__xf_job_start(&item->job, xf->pool);
    if (rc < 0) {
        xf->running--;
        xf->batches_here--;
        emlio__xf_block_put(block);
        emlio_free(item);
    }
    return rc;
}

void *
emlio__client_xf_pop(emlio__client_xf_t *xf, uint8_t **block_out,
                     emlio__client_xf_failed_fn *failed, void *userdata)
{
    pthread_mutex_lock(&xf->lock);
    emlio__client_xf_item_t *item = xf->done_head;
    if (item) {
        xf->done_head = item->next;
        if (!xf->done_head)
            xf->done_tail = NULL;
    } else {
        uint64_t count;
        ssize_t r = read(xf->wake_fd, &count, sizeof(count));
        (void)r; /* EAGAIN when already clear */
    }
    pthread_mutex_unlock(&xf->lock);
    if (!item)
        return NULL;
    xf->running--;
    emlio__xf_job_t *job = &item->job;
    xf->here_images += job->n;
    xf->here_cpu_ns += atomic_load(&job->cpu_ns);
    xf->here_bytes += item->bytes;
    *block_out = job->block;
    if (atomic_load(&job->failed))
        for (size_t i = 0; i < job->n; i++)
            if (job->samples[i].rc != 0)
                failed(userdata, item->batch, i, job->samples[i].rc,
                       emlio__xf_job_error(job, i));
    void *batch = item->batch;
    emlio__xf_job_cleanup(job);
    emlio_free(job->samples);
    emlio_free(item);
    return batch;
}

size_t
emlio__client_xf_pending(const emlio__client_xf_t *xf)
{
    return xf->running;
}
