/* server_xf.c - specs and pool of the daemon's transform stage.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "server_xf.h"

/* Decoding is the stage that can wait: readers and senders, and so the
 * daemon's raw-byte clients, come first on a busy host. */
#define S_NICE              10
/* Tensor blocks kept for reuse between batches. */
#define S_KEEP_BLOCKS_BYTES (256u << 20)

int
emlio__server_xf_start(emlio__server_xf_t *xf, size_t threads,
                       uint64_t max_pixels, char *errbuf)
{
    emlio__server_xf_stop(xf); /* a start again after a failed one */
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
emlio__server_xf_stop(emlio__server_xf_t *xf)
{
    emlio__workpool_destroy(&xf->pool);
    emlio__xf_blocks_release(&xf->blocks);
    for (size_t i = 0; i < xf->n_specs; i++) {
        emlio_free(xf->specs[i].text);
        emlio_transform_free(&xf->specs[i].transform);
    }
    xf->n_specs = 0;
}

int
emlio__server_xf_lookup(emlio__server_xf_t *xf, const char *spec, size_t len,
                        const emlio_transform_t **out, char *errbuf)
{
    if (xf->threads == 0) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "this daemon does not transform (--transform-threads 0)");
        return EMLIO_EINVAL;
    }
    for (size_t i = 0; i < xf->n_specs; i++) {
        if (strlen(xf->specs[i].text) == len &&
            memcmp(xf->specs[i].text, spec, len) == 0) {
            *out = xf->specs[i].transform;
            return 0;
        }
    }
    if (xf->n_specs == EMLIO_SERVER_XF_MAX_SPECS) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "too many distinct transforms (limit %d)",
                 EMLIO_SERVER_XF_MAX_SPECS);
        return EMLIO_ELIMIT;
    }
    char *text = emlio_malloc(len + 1);
    if (!text)
        return EMLIO_ENOMEM;
    memcpy(text, spec, len);
    text[len] = '\0';
    if (memchr(spec, '\0', len)) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN, "transform spec holds a NUL byte");
        emlio_free(text);
        return EMLIO_EINVAL;
    }
    emlio_transform_t *t = NULL;
    char err[EMLIO_ERRMSG_LEN];
    int rc = emlio_transform_parse(text, &t, err, sizeof(err));
    if (rc < 0) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN, "transform: %.480s", err);
        emlio_free(text);
        return rc;
    }
    if (xf->max_pixels)
        emlio_transform_set_max_pixels(t, xf->max_pixels);
    xf->specs[xf->n_specs].text = text;
    xf->specs[xf->n_specs].transform = t;
    xf->n_specs++;
    *out = t;
    return 0;
}
