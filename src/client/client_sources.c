/* client_sources.c - a job's sources: the copy of the caller's list, its
 * checks, the daemons each one names, and what a resume state must match
 * (docs/planner.md, "Sources").
 * SPDX-License-Identifier: MIT
 *
 * The client connects to every source's daemons as one list, each daemon
 * tagged with its source; the inventory keeps shards of one name in two
 * sources apart, and the planner blends the sources in exact quotas.
 */
#include "client_internal.h"

#include <math.h>

#define S_MAX_NAME 64

/* Printable ASCII: the name goes into --ids lines and JSON as it is. */
static bool
s_printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

/* Whether endpoint lists a and b name one endpoint in common; *which
 * receives it (at most cap - 1 bytes). */
static bool
s_share_endpoint(const char *a, const char *b, char *which, size_t cap)
{
    for (const char *p = a; *p;) {
        size_t len = strcspn(p, ",");
        for (const char *q = b; *q;) {
            size_t qlen = strcspn(q, ",");
            if (len && qlen == len && !memcmp(p, q, len)) {
                snprintf(which, cap, "%.*s", (int)len, p);
                return true;
            }
            q += qlen + (q[qlen] == ',');
        }
        p += len + (p[len] == ',');
    }
    return false;
}

static int
s_check_source(const emlio_source_t *src, size_t i, char *err)
{
    if (!src->name || !*src->name || strlen(src->name) > S_MAX_NAME ||
        !s_printable(src->name))
        return emlio__seterr(err, EMLIO_EINVAL,
                             "source %zu: a name of 1 to %d printable ASCII "
                             "bytes "
                             "is needed",
                             i, S_MAX_NAME);
    if (!src->endpoints || !*src->endpoints)
        return emlio__seterr(err, EMLIO_EINVAL, "source '%s' names no daemon",
                             src->name);
    if (!src->samples && !(isfinite(src->weight) && src->weight > 0))
        return emlio__seterr(err, EMLIO_EINVAL,
                             "source '%s': weight %g is not a positive, "
                             "finite number",
                             src->name, src->weight);
    return 0;
}

/* Checks the configuration's sources against each other and the options
 * that do not go with them. */
static int
s_check_sources(const emlio_client_config_t *cfg, char *err)
{
    if (!cfg->n_sources) {
        if (cfg->stratify || cfg->epoch_samples)
            return emlio__seterr(err, EMLIO_EINVAL,
                                 "stratified batches and an epoch size "
                                 "need sources");
        return 0;
    }
    if (!cfg->sources)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "%" PRIu32 " sources, but no "
                             "source list",
                             cfg->n_sources);
    if (cfg->n_sources > EMLIO_PLAN_MAX_SOURCES)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "too many sources: %" PRIu32 " (at most %d)",
                             cfg->n_sources, EMLIO_PLAN_MAX_SOURCES);
    if (cfg->window_shards || cfg->share)
        return emlio__seterr(err, EMLIO_EINVAL,
                             "sources are mixed whole: shuffle windows and "
                             "shared reads do not go with them");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        int rc = s_check_source(&cfg->sources[i], i, err);
        if (rc < 0)
            return rc;
        for (size_t j = 0; j < i; j++) {
            const emlio_source_t *a = &cfg->sources[j];
            const emlio_source_t *b = &cfg->sources[i];
            char ep[256];
            if (!strcmp(a->name, b->name))
                return emlio__seterr(err, EMLIO_EINVAL,
                                     "two sources are named '%s'", a->name);
            if (s_share_endpoint(a->endpoints, b->endpoints, ep, sizeof(ep)))
                return emlio__seterr(err, EMLIO_EINVAL,
                                     "sources '%s' and '%s' both name daemon "
                                     "'%s': a daemon serves one source of a "
                                     "job",
                                     a->name, b->name, ep);
        }
    }
    return 0;
}

/* Joins the sources' endpoints into one list, each daemon tagged. */
static int
s_join(emlio_client_t *self, char *err)
{
    size_t len = 0, daemons = 0;
    for (uint32_t i = 0; i < self->n_src; i++) {
        len += strlen(self->src[i].endpoints) + 1;
        for (const char *p = self->src[i].endpoints; *p; p++)
            daemons += *p == ',';
        daemons++;
    }
    self->src_endpoints = emlio_malloc(len);
    self->src_of_daemon = emlio_calloc(daemons, sizeof(uint32_t));
    if (!self->src_endpoints || !self->src_of_daemon)
        return emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
    char *out = self->src_endpoints;
    size_t d = 0;
    for (uint32_t i = 0; i < self->n_src; i++) {
        const char *eps = self->src[i].endpoints;
        if (i)
            *out++ = ',';
        memcpy(out, eps, strlen(eps));
        out += strlen(eps);
        self->src_of_daemon[d++] = i;
        for (const char *p = eps; *p; p++)
            if (*p == ',')
                self->src_of_daemon[d++] = i;
    }
    *out = '\0';
    return 0;
}

int
emlio__sources_init(emlio_client_t *self, const emlio_client_config_t *cfg,
                    char *err)
{
    int rc = s_check_sources(cfg, err);
    self->cfg.sources = NULL; /* borrowed: the copy below is kept */
    if (rc < 0 || !cfg->n_sources)
        return rc;
    self->src = emlio_calloc(cfg->n_sources, sizeof(*self->src));
    self->plan_src = emlio_calloc(cfg->n_sources, sizeof(*self->plan_src));
    if (!self->src || !self->plan_src)
        return emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < cfg->n_sources; i++) {
        const emlio_source_t *in = &cfg->sources[i];
        emlio_source_t *src = &self->src[self->n_src++];
        *src = *in;
        src->name = emlio_strdup(in->name);
        src->endpoints = emlio_strdup(in->endpoints);
        if (!src->name || !src->endpoints)
            return emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
        self->plan_src[i] =
            (emlio_plan_source_t){ in->samples ? 0 : in->weight, in->samples };
    }
    return s_join(self, err);
}

void
emlio__sources_release(emlio_client_t *self)
{
    for (uint32_t i = 0; i < self->n_src; i++) {
        emlio_free((char *)self->src[i].name);
        emlio_free((char *)self->src[i].endpoints);
    }
    emlio_free(self->src);
    emlio_free(self->plan_src);
    emlio_free(self->src_endpoints);
    emlio_free(self->src_of_daemon);
    self->src = NULL;
    self->plan_src = NULL;
    self->src_endpoints = NULL;
    self->src_of_daemon = NULL;
    self->n_src = 0;
}

static uint64_t
s_fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

uint64_t
emlio__sources_fold(const emlio_client_t *self, uint64_t h)
{
    if (!self->n_src)
        return h;
    /* Not the weights, counts or epoch size: a resume state records
     * those, and they may change in the middle of an epoch. */
    for (uint32_t i = 0; i < self->n_src; i++)
        h = s_fnv(h, self->src[i].name, strlen(self->src[i].name) + 1);
    uint8_t strat = self->cfg.stratify;
    return s_fnv(h, &strat, 1);
}

uint64_t
emlio__source_digest(const emlio_client_t *self, uint32_t s)
{
    /* Not its name: a renamed source is refused as such (the names are
     * in the dataset fingerprint), not as other data. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        if (self->conn.daemons[d].source == s)
            h = s_fnv(h, self->conn.daemons[d].dataset,
                      strlen(self->conn.daemons[d].dataset) + 1);
    return h;
}

size_t
emlio_client_source_count(const emlio_client_t *self)
{
    assert(self);
    return self->n_src;
}

const char *
emlio_client_source_name(const emlio_client_t *self, size_t s)
{
    assert(self);
    return s < self->n_src ? self->src[s].name : NULL;
}

uint32_t
emlio_client_shard_source(const emlio_client_t *self, size_t i)
{
    assert(self);
    return i < self->inv.n_shards ? self->inv.shards[i].source : 0;
}

uint64_t
emlio_client_source_quota(const emlio_client_t *self, size_t s)
{
    assert(self);
    return emlio_plan_source_quota(self->current.plan, s);
}
