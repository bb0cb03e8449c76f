/* server_xfspec.c - specs and pool of the daemon's transform stage.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "server_xfspec.h"

/* Decoding is the stage that can wait: readers and senders, and so the
 * daemon's raw-byte clients, come first on a busy host. */
#define S_NICE              10
/* Tensor blocks kept for reuse between batches. */
#define S_KEEP_BLOCKS_BYTES (256u << 20)

static int s_start(emlio__xfspecs_t *xf, size_t threads, uint64_t max_pixels,
                   char *errbuf);

int
emlio__xfspec_start(emlio__xfspecs_t *xf, size_t threads, uint64_t max_pixels,
                    uint64_t memory_limit, char *errbuf)
{
    int rc = s_start(xf, threads, max_pixels, errbuf);
    /* After the start, which clears *xf: set before it, the cap was lost
     * and every decode thread held up to the library default. */
    xf->ws_max_bytes = emlio__xf_ws_cap(memory_limit, threads);
    return rc;
}

static int
s_start(emlio__xfspecs_t *xf, size_t threads, uint64_t max_pixels, char *errbuf)
{
    emlio__xfspec_stop(xf); /* a start again after a failed one */
    memset(xf, 0, sizeof(*xf));
    xf->threads = threads;
    xf->max_pixels = max_pixels;
    if (threads == 0)
        return 0;
    int rc = EMLIO_ENOMEM;
    xf->blocks = emlio__xf_blocks_new(S_KEEP_BLOCKS_BYTES);
    if (xf->blocks)
        xf->pool = emlio__xf_pool_new(threads, S_NICE, "emliod-xf", &rc);
    if (!xf->pool) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "cannot start %zu transform threads: %s", threads,
                 emlio_strerror(rc));
        emlio__xf_blocks_release(&xf->blocks);
        return rc;
    }
    return 0;
}

void
emlio__xfspec_drain(emlio__xfspecs_t *xf)
{
    emlio__workpool_destroy(&xf->pool);
}

void
emlio__xfspec_stop(emlio__xfspecs_t *xf)
{
    emlio__xfspec_drain(xf);
    emlio__xf_blocks_release(&xf->blocks);
    for (size_t i = 0; i < xf->n_specs; i++) {
        emlio_free(xf->specs[i].text);
        emlio_transform_destroy(&xf->specs[i].transform);
    }
    xf->n_specs = 0;
}

/* A slot for a new spec: a free one, else the least recently used one no
 * request uses (its pipeline is freed), else -1. */
static int
s_slot(emlio__xfspecs_t *xf)
{
    if (xf->n_specs < EMLIO__XFSPEC_MAX)
        return (int)xf->n_specs++;
    int pick = -1;
    for (int i = 0; i < EMLIO__XFSPEC_MAX; i++)
        if (atomic_load(&xf->specs[i].users) == 0 &&
            (pick < 0 || xf->specs[i].used_at < xf->specs[pick].used_at))
            pick = i;
    if (pick >= 0) {
        emlio_free(xf->specs[pick].text);
        emlio_transform_destroy(&xf->specs[pick].transform);
    }
    return pick;
}

int
emlio__xfspec_lookup(emlio__xfspecs_t *xf, const char *spec, size_t len,
                     const emlio_transform_t **out, atomic_uint **users_out,
                     char *errbuf)
{
    if (xf->threads == 0) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "this daemon does not transform (--transform-threads 0)");
        return EMLIO_EINVAL;
    }
    int k = -1;
    for (size_t i = 0; i < xf->n_specs && k < 0; i++)
        if (strlen(xf->specs[i].text) == len &&
            memcmp(xf->specs[i].text, spec, len) == 0)
            k = (int)i;
    if (k < 0) {
        if (memchr(spec, '\0', len)) {
            snprintf(errbuf, EMLIO_ERRMSG_LEN,
                     "transform spec holds a NUL byte");
            return EMLIO_EINVAL;
        }
        char *text = emlio__memdupz(spec, len);
        if (!text)
            return EMLIO_ENOMEM;
        emlio_transform_t *t = NULL;
        char err[EMLIO_ERRMSG_LEN];
        int rc = emlio_transform_parse(text, &t, err, sizeof(err));
        /* Another spelling of a spec we keep (spaces, default arguments
         * said or not) is that spec: keyed by the raw text, sixteen
         * spellings of one spec held by one client would take every
         * slot. Kept under its canonical text, which GETs normally send. */
        if (rc == 0) {
            const char *canon = emlio_transform_spec(t);
            for (size_t i = 0; i < xf->n_specs && k < 0; i++)
                if (xf->specs[i].text && !strcmp(xf->specs[i].text, canon))
                    k = (int)i;
            if (k >= 0) {
                emlio_transform_destroy(&t);
                emlio_free(text);
                goto found;
            }
            char *kept = emlio_strdup(canon);
            if (!kept) {
                emlio_transform_destroy(&t);
                emlio_free(text);
                return EMLIO_ENOMEM;
            }
            emlio_free(text);
            text = kept;
        }
        if (rc == 0 && (k = s_slot(xf)) < 0)
            rc = emlio__seterr(errbuf, EMLIO_ELIMIT,
                               "all %d transforms the daemon keeps are in use "
                               "by requests in flight",
                               EMLIO__XFSPEC_MAX);
        else if (rc < 0)
            snprintf(errbuf, EMLIO_ERRMSG_LEN, "transform: %.480s", err);
        if (rc < 0) {
            emlio_transform_destroy(&t);
            emlio_free(text);
            return rc;
        }
        if (xf->max_pixels)
            emlio_transform_set_max_pixels(t, xf->max_pixels);
        xf->specs[k].text = text;
        xf->specs[k].transform = t;
        atomic_store(&xf->specs[k].users, 0);
    }
found:
    xf->specs[k].used_at = ++xf->tick;
    atomic_fetch_add(&xf->specs[k].users, 1);
    *out = xf->specs[k].transform;
    *users_out = &xf->specs[k].users;
    return 0;
}
