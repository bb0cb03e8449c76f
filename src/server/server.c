/* server.c - emlio_server_t: serves the shards of one directory over ZeroMQ.
 * The public API and the lifecycle: configuration, load (the shard set and
 * its formats), bind (the ROUTER, CURVE, the connection monitor), start and
 * stop (the threads), stats. The rooms it starts are described in
 * server_internal.h.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include "emlio/energy.h"
#include "server_internal.h"
#include "store.h"

/* What a client is told of this host's power per busy core when the
 * configuration does not say: the energy model's (a labelled model). */
#define S_DEFAULT_CORE_MW ((uint32_t)(EMLIO_ENERGY_DEFAULT_CORE_W * 1000))

void
emlio_server_config_init(emlio_server_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->bytes_key = "image/encoded";
    cfg->label_key = "image/class/label";
    cfg->verify = true;
    cfg->write_index = true;
    cfg->workers = 2;
    cfg->serializers = 1;
    cfg->queue_depth = 64;
    cfg->readahead = true;
    cfg->coalesce = EMLIO_COALESCE_AUTO;
    cfg->pack = EMLIO_PACK_AUTO;
    cfg->max_batch = 4096;
    cfg->max_credit = 256;
    cfg->max_copy_bytes = EMLIO_SERVER_MAX_COPY_BYTES;
    cfg->max_copy_bytes_total = EMLIO_SERVER_MAX_COPY_BYTES_TOTAL;
    cfg->on_corrupt = EMLIO_ON_CORRUPT_FAIL;
    cfg->max_clients = 1024;
    cfg->idle_timeout_ms = 300000;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cfg->transform_threads = cpus > 0 ? (uint32_t)cpus : 1;
}

static char *
s_dup_or(const char *s, const char *fallback)
{
    return emlio_strdup(s ? s : fallback);
}

emlio_server_t *
emlio_server_new(emlio_ctx_t *ctx, const emlio_server_config_t *cfg)
{
    assert(ctx && cfg);
    emlio_server_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    char default_name[64];
    snprintf(default_name, sizeof(default_name), "emliod/%d.%d.%d",
             EMLIO_VERSION_MAJOR, EMLIO_VERSION_MINOR, EMLIO_VERSION_PATCH);
    self->ctx = ctx;
    self->cfg = *cfg;
    self->net.bound_port = -1;
    emlio__srv_admit_init(self);
    self->core = emlio_calloc(1, sizeof(*self->core));
    if (!self->core) {
        emlio_free(self);
        return NULL;
    }
    atomic_init(&self->core->refs, 1);
    atomic_init(&self->core->batches_in_flight, 0);
    emlio__srv_pack_pool_init(&self->core->pack_pool);
    pthread_mutex_init(&self->core->disk_lock, NULL);
    self->core->drop_behind = cfg->drop_behind;
    self->own.data_dir = s_dup_or(cfg->data_dir, "");
    self->own.bytes_key = s_dup_or(cfg->bytes_key, "image/encoded");
    self->own.label_key = s_dup_or(cfg->label_key, "image/class/label");
    self->own.name = s_dup_or(cfg->name, default_name);
    self->own.format = s_dup_or(cfg->format, "auto");
    self->own.field = cfg->field ? emlio_strdup(cfg->field) : NULL;
    self->own.label_field = s_dup_or(cfg->label_field, "cls");
    self->own.label_field_set = cfg->label_field != NULL;
    self->own.label_key_set = cfg->label_key != NULL;
    self->own.fields_spec = cfg->fields ? emlio_strdup(cfg->fields) : NULL;
    self->own.index_dir = cfg->index_dir ? emlio_strdup(cfg->index_dir) : NULL;
    self->own.job_weights =
        cfg->job_weights ? emlio_strdup(cfg->job_weights) : NULL;
    if ((cfg->job_weights && !self->own.job_weights) || !self->own.data_dir ||
        !self->own.bytes_key || !self->own.label_key || !self->own.name ||
        !self->own.format || !self->own.label_field ||
        (cfg->field && !self->own.field) ||
        (cfg->fields && !self->own.fields_spec) ||
        (cfg->index_dir && !self->own.index_dir)) {
        emlio_server_destroy(&self);
        return NULL;
    }
    self->cfg.data_dir = self->own.data_dir;
    self->cfg.bytes_key = self->own.bytes_key;
    self->own.bytes_key_len = strlen(self->own.bytes_key);
    self->own.label_key_len = strlen(self->own.label_key);
    self->cfg.label_key = self->own.label_key;
    self->cfg.name = self->own.name;
    self->cfg.format = self->own.format;
    self->cfg.field = self->own.field;
    self->cfg.label_field = self->own.label_field;
    self->cfg.fields = self->own.fields_spec;
    self->cfg.index_dir = self->own.index_dir;
    self->cfg.job_weights = self->own.job_weights;
    if (self->cfg.workers == 0)
        self->cfg.workers = 1;
    if (self->cfg.serializers == 0)
        self->cfg.serializers = 1;
    if (self->cfg.queue_depth == 0)
        self->cfg.queue_depth = 1;
    if (self->cfg.max_batch == 0 ||
        self->cfg.max_batch > EMLIO_WIRE_MAX_SAMPLES)
        self->cfg.max_batch = EMLIO_WIRE_MAX_SAMPLES;
    if (self->cfg.max_credit == 0)
        self->cfg.max_credit = 1;
    if (self->cfg.max_copy_bytes == 0)
        self->cfg.max_copy_bytes = EMLIO_SERVER_MAX_COPY_BYTES;
    if (self->cfg.max_copy_bytes_total == 0)
        self->cfg.max_copy_bytes_total = EMLIO_SERVER_MAX_COPY_BYTES_TOTAL;
    if (self->cfg.max_clients == 0)
        self->cfg.max_clients = 1;
    /* The key strings are borrowed by the config; keep our own copies. */
    self->cfg.authorized_keys = NULL;
    self->cfg.curve_secret_key = NULL;
    if (cfg->curve_secret_key) {
        self->own.curve_secret = emlio_strdup(cfg->curve_secret_key);
        self->cfg.curve_secret_key = self->own.curve_secret;
    }
    if (cfg->authorized_keys) {
        self->own.authorized_keys = emlio_strdup(cfg->authorized_keys);
        self->cfg.authorized_keys = self->own.authorized_keys;
    }
    if ((cfg->curve_secret_key && !self->own.curve_secret) ||
        (cfg->authorized_keys && !self->own.authorized_keys)) {
        emlio_server_destroy(&self);
        return NULL;
    }
    emlio_buf_init(&self->net.welcome);
    snprintf(self->err, sizeof(self->err), "no error");
    return self;
}

/* Closes a socket with linger 0 (nothing we send is worth waiting for
 * after a stop) and NULLs the caller's pointer. */
static void
s_close_socket(void **sock_p)
{
    if (!*sock_p)
        return;
    int zero = 0;
    (void)zmq_setsockopt(*sock_p, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(*sock_p);
    *sock_p = NULL;
}

/* Sets one socket option; on failure fills errbuf naming the option. */
static int
s_setopt(void *sock, int option, const void *value, size_t len,
         const char *what, char *errbuf)
{
    if (zmq_setsockopt(sock, option, value, len) == 0)
        return 0;
    int err = errno;
    return emlio__seterr(errbuf, -err, "cannot set %s: %s", what,
                         zmq_strerror(err));
}

int
emlio__srv_setopt_int(void *sock, int option, int value, const char *what,
                      char *errbuf)
{
    return s_setopt(sock, option, &value, sizeof(value), what, errbuf);
}

/* Drops one reference to the core; the last one unmaps the shards. */
void
emlio__srv_core_unref(emlio__srv_core_t **core_p)
{
    emlio__srv_core_t *core = *core_p;
    *core_p = NULL;
    if (!core || atomic_fetch_sub(&core->refs, 1) != 1)
        return;
    emlio__shardset_release(&core->set);
    emlio__share_cache_destroy(&core->share);
    emlio__srv_pack_pool_release(&core->pack_pool);
    pthread_mutex_destroy(&core->disk_lock);
    emlio_free(core);
}

/* Waits (bounded) until ZeroMQ has released every zero-copy frame, so the
 * mappings go away with the server rather than with ZeroMQ's last frame. */
static bool
s_wait_batches_released(const emlio__srv_core_t *core)
{
    uint64_t deadline =
        emlio__now_ns() + EMLIO__SRV_RELEASE_WAIT_MS * 1000000ull;
    while (atomic_load(&core->batches_in_flight) > 0) {
        if (emlio__now_ns() > deadline)
            return false;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return true;
}

void
emlio_server_destroy(emlio_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_server_t *self = *self_p;
    emlio_server_stop(self);
    emlio__xfspec_stop(&self->xf); /* after a start that failed */
    /* Stop the monitor before closing its reader: libzmq would otherwise
     * keep events for a socket that is gone. */
    if (self->net.router && self->net.monitor)
        (void)zmq_socket_monitor(self->net.router, NULL, 0);
    s_close_socket(&self->net.monitor);
    s_close_socket(&self->net.work);
    s_close_socket(&self->net.done);
    s_close_socket(&self->net.router);
    emlio__queue_destroy(&self->thr.ser_queue); /* from a start that failed */
    if (self->core && !s_wait_batches_released(self->core))
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                  "%" PRIuFAST64 " sent batches still held by zeromq; the "
                  "shards stay mapped until it releases them",
                  atomic_load(&self->core->batches_in_flight));
    /* Frames still held keep their own references to the core. */
    emlio__srv_core_unref(&self->core);
    emlio__zap_stop(&self->net.zap);
    emlio_buf_release(&self->net.welcome);
    emlio__srv_admit_release(self);
    for (size_t i = 0; self->adm.ra_stamp && i < self->adm.ra_n; i++)
        emlio_free(self->adm.ra_stamp[i]);
    emlio_free(self->adm.ra_stamp);
    if (self->own.curve_secret) /* do not leave the secret in freed memory */
        memset(self->own.curve_secret, 0, strlen(self->own.curve_secret));
    emlio_free(self->own.curve_secret);
    emlio_free(self->own.authorized_keys);
    emlio__classes_free(self->own.classes, self->own.n_classes);
    emlio_free(self->thr.workers);
    emlio_free(self->own.data_dir);
    emlio_free(self->own.bytes_key);
    emlio_free(self->own.label_key);
    emlio_free(self->own.format);
    emlio_free(self->own.field);
    emlio_free(self->own.label_field);
    emlio_free(self->own.fields_spec);
    emlio_free(self->own.index_dir);
    emlio_free(self->own.job_weights);
    if (self->jobs_ready)
        emlio__srv_jobs_release(&self->jobs);
    for (size_t i = 0; i < self->own.n_fields; i++)
        emlio_free(self->own.fields[i]);
    emlio_free(self->own.fields);
    emlio__srv_fields_release(&self->fieldsets);
    emlio_free(self->own.name);
    emlio_free(self);
    *self_p = NULL;
}

void
emlio__srv_shardset_log(void *userdata, const char *msg)
{
    emlio_server_t *self = userdata;
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", msg);
}

/* Encodes the WELCOME once, when both the inventory (load) and the
 * connections' send buffer (bind) are known; every client gets these
 * bytes. */
/* The one format of the shards, or "mixed" (--mixed-formats). */
static const char *
s_format_name(const emlio__shardset_t *set)
{
    const char *name = set->n ? set->shards[0].ops->name : NULL;
    for (size_t i = 1; i < set->n; i++)
        if (set->shards[i].ops != set->shards[0].ops)
            return "mixed";
    return name;
}

int
emlio__srv_encode_welcome(emlio_server_t *self, char *const *fields,
                          size_t n_fields, emlio_buf_t *out)
{
    emlio__shardset_t *set = &self->core->set;
    emlio__wire_shard_t *inv = emlio_calloc(set->n, sizeof(*inv));
    if (!inv)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < set->n; i++) {
        inv[i].name = set->shards[i].name;
        inv[i].name_len = strlen(inv[i].name);
        inv[i].records = emlio__shard_count(&set->shards[i]);
        inv[i].bytes = emlio__shard_size(&set->shards[i]);
        inv[i].digest = emlio__shard_identity(&self->core->set, i);
    }
    uint64_t copy =
        EMLIO_MIN(self->cfg.max_copy_bytes, self->cfg.max_copy_bytes_total);
    emlio__wire_welcome_t w = {
        .name = self->own.name,
        .dataset = set->fingerprint,
        .max_batch = self->cfg.max_batch,
        .max_credit = self->cfg.max_credit,
        .max_streams = EMLIO_WIRE_MAX_STREAMS,
        .sndbuf = self->adm.sndbuf.effective,
        .shards = inv,
        .n_shards = set->n,
        .fields = fields,
        .n_fields = n_fields,
        .xf_threads = self->xf.threads,
        .core_mw = self->cfg.core_mw ? self->cfg.core_mw : S_DEFAULT_CORE_MW,
        .classes = self->own.classes,
        .n_classes = self->own.n_classes,
        .format = s_format_name(set),
        .max_copy_bytes = copy,
        .share_window = emlio__srv_share_window(self->core),
        .share_all = self->cfg.share_all && self->core->share,
    };
    int rc = emlio__wire_encode_welcome(out, &w);
    emlio_free(inv);
    if (rc < 0)
        return emlio__seterr(self->err, rc, "out of memory");
    return 0;
}

static int
s_encode_welcome(emlio_server_t *self)
{
    return emlio__srv_encode_welcome(self, self->own.fields, self->own.n_fields,
                                     &self->net.welcome);
}

/* Splits cfg.fields ("jpg,cls,json") into self->own.fields and checks the
 * names against what the shards' formats can serve. */
static int
s_parse_fields(emlio_server_t *self)
{
    const char *p = self->own.fields_spec;
    if (!p)
        return 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len > EMLIO_WIRE_MAX_NAME)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "bad field list '%s': empty or long name",
                                 self->own.fields_spec);
        if (self->own.n_fields >= EMLIO_WIRE_MAX_FIELDS)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "bad field list '%s': more than %u fields",
                                 self->own.fields_spec, EMLIO_WIRE_MAX_FIELDS);
        char **fields = emlio_reallocarray(
            self->own.fields, self->own.n_fields + 1, sizeof(*fields));
        if (!fields)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        self->own.fields = fields;
        char *name = emlio__memdupz(p, len);
        if (!name)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        for (size_t i = 0; i < self->own.n_fields; i++)
            if (strcmp(self->own.fields[i], name) == 0) {
                emlio__seterr(self->err, EMLIO_EINVAL,
                              "bad field list '%s': '%s' twice",
                              self->own.fields_spec, name);
                emlio_free(name);
                return EMLIO_EINVAL;
            }
        self->own.fields[self->own.n_fields++] = name;
        p += len + (comma ? 1 : 0);
        if (comma && !*p)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "bad field list '%s': empty name",
                                 self->own.fields_spec);
    }
    return 0;
}

/* A requested field no shard can have is a configuration error found at
 * start-up, not one error per sample later. */
static int
s_check_fields(emlio_server_t *self)
{
    for (size_t f = 0; f < self->own.n_fields; f++) {
        const char *want = self->own.fields[f];
        bool found = false, unknown = false;
        for (size_t i = 0; i < self->core->set.n && !found; i++) {
            const emlio__shard_t *shard = &self->core->set.shards[i];
            int has = shard->ops->has_field(shard->impl, want);
            found = has > 0;
            unknown |= has < 0; /* Example keys: checked per record */
        }
        if (!found && !unknown)
            return emlio__seterr(
                self->err, EMLIO_ENOTFOUND,
                "no shard under '%s' has field '%s' (tar: member "
                "extensions; imagefolder: image, label)",
                self->own.data_dir, want);
    }
    return 0;
}

void
emlio_server_interrupt(emlio_server_t *self)
{
    assert(self);
    atomic_store(&self->interrupted, true);
}

/* Label mistakes are found at start-up, not as every label -1: a
 * --label-field no shard has, and a label member that is not an integer
 * (checked on the first sample of the first shard that has one: a wrong
 * field, say "json", reads as a non-number everywhere; a later broken
 * label fails or is skipped like a corrupt record). One sample only, so
 * that a start reads no more of the data than that (docs/design.md,
 * "Start-up"). */
static int
s_check_labels(emlio_server_t *self)
{
    emlio__shardset_t *set = &self->core->set;
    const char *want = self->own.label_field;
    bool found = false, unknown = false;
    for (size_t i = 0; i < set->n && self->own.label_field_set; i++) {
        int has = set->shards[i].ops->has_field(set->shards[i].impl, want);
        found |= has > 0;
        unknown |= has < 0;
    }
    if (self->own.label_field_set && !found && !unknown)
        return emlio__seterr(self->err, EMLIO_ENOTFOUND,
                             "no shard under '%s' has label member '%s' "
                             "(--label-field)",
                             self->own.data_dir, want);
    size_t per = self->own.n_fields ? self->own.n_fields : 1;
    size_t i = 0;
    while (i < set->n && !emlio__shard_count(&set->shards[i]))
        i++;
    if (i == set->n)
        return 0;
    emlio__shard_t *shard = &set->shards[i];
    _Static_assert(EMLIO__FORMAT_MAX_FIELDS == EMLIO_WIRE_MAX_FIELDS,
                   "a sample's fields: the store's limit is the wire's");
    emlio__view_t views[EMLIO_WIRE_MAX_FIELDS];
    memset(views, 0, per * sizeof(views[0]));
    const char *missing = "";
    int rc = emlio__shard_read(shard, 0, &self->rd, views, &missing);
    for (size_t f = 0; f < per; f++)
        emlio__view_release(&views[f], shard);
    if (rc == EMLIO__FORMAT_EBADLABEL)
        return emlio__seterr(self->err, EMLIO_EFORMAT,
                             "label '%s' of the first sample of shard '%s' "
                             "is not an integer, or missing (check "
                             "--label-field or --label-key)",
                             missing, shard->name);
    return 0;
}

/* The formats the shards are in, as the start log names them: "tfrecord",
 * or "tfrecord 20, tar 7" for a mixed directory. */
static void
s_format_names(const emlio__shardset_t *set, char *out, size_t len)
{
    out[0] = 0;
    size_t used = 0;
    for (size_t k = 0; emlio__formats[k]; k++) {
        size_t n = 0;
        for (size_t i = 0; i < set->n; i++)
            n += set->shards[i].ops == emlio__formats[k];
        if (!n)
            continue;
        int w = n == set->n
                    ? snprintf(out + used, len - used, "%s",
                               emlio__formats[k]->name)
                    : snprintf(out + used, len - used, "%s%s %zu",
                               used ? ", " : "", emlio__formats[k]->name, n);
        if (w < 0 || (size_t)w >= len - used)
            break;
        used += (size_t)w;
    }
}

/* The descriptors of the shards and of the connections: logs how many
 * mapped shards are open now, against what budget and limit (what an
 * operator checks first when reads fail with "too many open files"), and
 * caps connections at what that budget leaves (adm.max_conns). */
static void
s_descriptor_budget(emlio_server_t *self)
{
    const emlio__shardset_t *set = &self->core->set;
    if (!set->cache || !set->mapped)
        return;
    emlio__shard_cache_stats_t st;
    emlio__shard_cache_stats(set->cache, &st);
    struct rlimit lim = { 0, 0 };
    (void)getrlimit(RLIMIT_NOFILE, &lim);
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "%zu mapped shards, at most %zu open at once (%s; open-file "
              "limit %llu): %zu open now, the rest opened on demand; lease "
              "breaks watched by signal",
              set->mapped, st.budget,
              self->cfg.max_open_shards ? "--max-open-shards"
                                        : "derived from the limit",
              (unsigned long long)lim.rlim_cur, st.open);
    /* What the limit leaves once the shards have their budget and the
     * daemon its own descriptors (ZeroMQ's, logs, the index): for
     * connections. */
    uint64_t used = st.budget + EMLIO__SHARD_CACHE_RESERVE / 2;
    self->adm.max_conns =
        lim.rlim_cur > used + 8 && lim.rlim_cur != RLIM_INFINITY
            ? (size_t)(lim.rlim_cur - used)
            : 0;
}

int
emlio_server_load(emlio_server_t *self)
{
    assert(self);
    if (self->loaded)
        return emlio__seterr(self->err, EMLIO_EINVAL, "server already loaded");
    if (self->cfg.coalesce < EMLIO_COALESCE_AUTO ||
        self->cfg.coalesce > EMLIO_COALESCE_NEVER)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "bad coalesce mode %d (EMLIO_COALESCE_AUTO, "
                             "_ALWAYS or _NEVER)",
                             self->cfg.coalesce);
    if (self->cfg.pack < EMLIO_PACK_AUTO || self->cfg.pack > EMLIO_PACK_SMALL)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "bad pack mode %d (EMLIO_PACK_AUTO, _LARGE or "
                             "_SMALL)",
                             self->cfg.pack);
    /* Each decode thread may hold a decode's memory (transform_ws.h): a
     * count far above any host's cores is a typo, not a wish. */
    if (self->cfg.transform_threads > EMLIO_SERVER_MAX_TRANSFORM_THREADS)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "transform_threads %u is above the "
                             "limit of %d (one per core is the default)",
                             (unsigned)self->cfg.transform_threads,
                             EMLIO_SERVER_MAX_TRANSFORM_THREADS);
    if (!self->jobs_ready) {
        int jrc = emlio__srv_jobs_init(&self->jobs, self->cfg.job_weights,
                                       self->cfg.schedule, self->cfg.max_jobs,
                                       self->err);
        self->jobs_ready = true; /* released by destroy even when refused */
        if (jrc < 0)
            return jrc;
        emlio__srv_jobs_size_window(&self->jobs,
                                    self->cfg.read_ahead_bytes
                                        ? self->cfg.read_ahead_bytes
                                        : EMLIO_SERVER_READ_AHEAD_BYTES);
    }
    if (self->cfg.on_corrupt != EMLIO_ON_CORRUPT_FAIL &&
        self->cfg.on_corrupt != EMLIO_ON_CORRUPT_SKIP)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "bad on_corrupt mode %d (EMLIO_ON_CORRUPT_FAIL "
                             "or _SKIP)",
                             self->cfg.on_corrupt);
    /* With --on-corrupt skip a record whose data is corrupt must not stop
     * the daemon from starting: the scan checks the framing only; the data
     * CRC is checked on every read, and each skipped record is logged. */
    bool skip = self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP;
    emlio__shardset_opts_t opts = {
        .format = self->cfg.format,
        .mixed_formats = self->cfg.mixed_formats,
        .verify_data = self->cfg.verify && !skip,
        .write_index = self->cfg.write_index,
        .index_dir = self->own.index_dir,
        .lease = true,
        .max_open_shards = self->cfg.max_open_shards,
        .grace_ms = EMLIO__SRV_LEASE_GRACE_MS,
        .follow_symlinks = self->cfg.follow_symlinks,
        .cancel = &self->interrupted,
    };
    int rc = s_parse_fields(self);
    if (rc < 0)
        return rc;
    /* Samples without the field served (or one of --fields: the list,
     * canonical once parsed) are left out, logged, rather than served as
     * something else or failing every request that names them: one rule
     * with and without --fields (issue 34: a stray README.txt in a tar). */
    opts.prune = true;
    opts.prune_field =
        self->own.n_fields ? self->own.fields_spec : self->own.field;
    self->rd = (emlio__read_opts_t){
        .field = self->own.field,
        .label_field = self->own.label_field,
        .bytes_key = self->own.bytes_key,
        .bytes_key_len = self->own.bytes_key_len,
        .label_key = self->own.label_key,
        .label_key_len = self->own.label_key_len,
        .fields = self->own.fields,
        .n_fields = self->own.n_fields,
        .raw = self->cfg.raw,
        .label_required = self->own.label_key_set,
        .verify = self->cfg.verify,
        /* Samples above 16 KiB (sent zero-copy from the mapping, or
         * packed by a copy the client's check covers) get a CRC derived
         * from the record's stored one, with no CRC pass over their bytes,
         * when nothing here acts on corruption: under
         * `fail` the client's check of the bytes fails the fetch as the
         * daemon's would (the daemon can no longer name the record as
         * corrupt), under `skip` the daemon must see it to leave the
         * sample out. Transforms decode here: s_read_job turns it off. */
        .derive_crc_min = self->cfg.verify && !skip ? EMLIO__SRV_DERIVE_MIN : 0,
        .log = emlio__srv_shardset_log,
        .userdata = self,
    };
    rc = emlio__shardset_load(&self->core->set, self->own.data_dir, &opts,
                              emlio__srv_shardset_log, self, self->err);
    if (rc < 0)
        return rc;
    rc = s_check_fields(self);
    if (rc == 0)
        rc = s_check_labels(self);
    if (rc >= 0)
        rc = emlio__classes_load(&self->core->set, self->own.data_dir,
                                 &self->own.classes, emlio__srv_shardset_log,
                                 self);
    if (rc < 0) {
        emlio__shardset_release(&self->core->set);
        return rc == EMLIO_ENOMEM
                   ? emlio__seterr(self->err, rc, "out of memory")
                   : rc;
    }
    self->own.n_classes = (size_t)rc;
    const emlio__shardset_t *set = &self->core->set;
    /* Shards served from the dataset index were not opened at all: the
     * cache leases them when it opens them. */
    if (set->leased < set->opened)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "%zu of the %zu shards opened at load could not be leased "
                  "(open for writing elsewhere, or no lease support): they "
                  "are read by copying while so",
                  set->opened - set->leased, set->opened);
    rc = emlio__srv_io_choose(self);
    if (rc < 0) {
        emlio__shardset_release(&self->core->set);
        return rc;
    }
    self->loaded = true;
    char formats[128];
    s_format_names(&self->core->set, formats, sizeof(formats));
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "loaded %zu shards (%s), %" PRIu64 " records, %" PRIu64
              " bytes from '%s' (dataset %s)",
              self->core->set.n, formats, self->core->set.records,
              self->core->set.bytes, self->own.data_dir,
              self->core->set.fingerprint);
    s_descriptor_budget(self);
    return (int)self->core->set.n;
}

/* Whether endpoint may be reachable from other hosts: anything but TCP on
 * a loopback address, ipc:// or inproc://. */
static bool
s_is_public(const char *endpoint)
{
    static const char *const local[] = {
        "tcp://127.", "tcp://localhost:", "tcp://[::1]:", "ipc://", "inproc://"
    };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(local); i++)
        if (!strncmp(endpoint, local[i], strlen(local[i])))
            return false;
    return true;
}

/* Makes router a CURVE server with our secret key, behind a ZAP handler
 * that admits the authorized client keys (or any CURVE client when no
 * directory is configured). */
static int
s_setup_curve(emlio_server_t *self, void *router)
{
    int rc = 0;
    if (emlio_curve_public(self->net.curve_public, self->cfg.curve_secret_key) <
        0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "the curve secret key is not a valid Z85 key");
    if (!self->net.zap) {
        size_t n_keys = 0;
        self->net.zap = emlio__zap_start(self->ctx, self->cfg.authorized_keys,
                                         &rc, &n_keys, self->err);
        if (!self->net.zap)
            return rc;
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "curve on, public key %s; %s%zu authorized client keys",
                  self->net.curve_public,
                  self->cfg.authorized_keys ? "" : "any client key (no list); ",
                  n_keys);
    }
    int one = 1;
    if (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, self->cfg.curve_secret_key,
                       40) != 0 ||
        zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, "emlio", 5) != 0)
        return emlio__seterr(self->err, -errno, "cannot enable curve: %s",
                             zmq_strerror(errno));
    self->net.curve = true;
    return 0;
}

/* Sizes the send buffer of every client connection (see
 * emlio_server_config_t.sndbuf): through ZMQ_SNDBUF where an explicit size
 * beats autotuning, or, with CAP_NET_ADMIN, by forcing it on each accepted
 * connection, whose descriptors the ROUTER's monitor reports (see
 * emlio__srv_monitor_drain). */
static int
s_setup_sndbuf(emlio_server_t *self, void *router)
{
    emlio__netpath_limits_t limits;
    emlio__netpath_limits(&limits);
    emlio__netpath_plan(&limits, true, self->cfg.sndbuf, &self->adm.sndbuf);
    if (self->adm.sndbuf.zmq_value >= 0) {
        int rc = emlio__srv_setopt_int(router, ZMQ_SNDBUF,
                                       self->adm.sndbuf.zmq_value, "ZMQ_SNDBUF",
                                       self->err);
        if (rc < 0)
            return rc;
    }
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "send buffer per connection: %" PRIu64 " KiB (%s; "
              "net.ipv4.tcp_wmem max %" PRIu64
              " KiB, net.core.wmem_max %" PRIu64 " KiB%s)",
              self->adm.sndbuf.effective >> 10, self->adm.sndbuf.how,
              limits.tcp_wmem_max >> 10, limits.wmem_max >> 10,
              limits.net_admin ? ", CAP_NET_ADMIN" : "");
    return 0;
}

int
emlio_server_bind(emlio_server_t *self, const char *endpoint)
{
    assert(self && endpoint);
    if (self->net.router)
        return emlio__seterr(self->err, EMLIO_EINVAL, "server already bound");
    void *router = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_ROUTER);
    if (!router)
        return emlio__seterr(self->err, -errno, "cannot create socket: %s",
                             zmq_strerror(errno));
    /* Credits bound what a well-behaved connection can have queued, so the
     * send high-water mark (EMLIO__SRV_SNDHWM: twice the credits, because
     * libzmq sees its queue shrink only in steps of half the mark) only
     * ever stops a peer that sends without reading: its extra replies are
     * dropped (non-blocking sends) instead of growing our memory. The
     * receive side stays unbounded on purpose: libzmq 4.3.4 aborts
     * (assertion !_io_error in stream_engine_base.cpp) when a peer whose
     * input was stopped at the receive mark disconnects, so a finite mark
     * would let any client crash the daemon. The frontend drains requests
     * faster than one client can send them (see tests/integration/
     * test_load.sh). Mandatory routing reports vanished peers instead of
     * silently discarding their batches. */
    int sndhwm = (int)EMLIO_MIN(EMLIO__SRV_SNDHWM(self->cfg.max_credit),
                                (uint64_t)INT_MAX);
    /* Requests are small; refuse (disconnect) anything larger before libzmq
     * buffers it, so a hostile peer cannot make us hold huge frames. */
    int64_t max_msg = EMLIO_SERVER_MAX_REQUEST(self->cfg.max_batch);
    char *e = self->err;
    int rc = 0;
    if ((rc = emlio__srv_setopt_int(router, ZMQ_SNDHWM, sndhwm, "ZMQ_SNDHWM",
                                    e)) < 0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM", e)) <
            0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_ROUTER_MANDATORY, 1,
                                    "ZMQ_ROUTER_MANDATORY", e)) < 0 ||
        (rc = s_setopt(router, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg),
                       "ZMQ_MAXMSGSIZE", e)) < 0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_HEARTBEAT_IVL, 2000,
                                    "ZMQ_HEARTBEAT_IVL", e)) < 0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_HEARTBEAT_TTL, 10000,
                                    "ZMQ_HEARTBEAT_TTL", e)) < 0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_HEARTBEAT_TIMEOUT, 10000,
                                    "ZMQ_HEARTBEAT_TIMEOUT", e)) < 0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_HANDSHAKE_IVL, 10000,
                                    "ZMQ_HANDSHAKE_IVL", e)) < 0 ||
        (rc = emlio__srv_setopt_int(router, ZMQ_IPV6,
                                    emlio__netpath_ipv6_endpoint(endpoint),
                                    "ZMQ_IPV6", e)) < 0 ||
        (rc = s_setup_sndbuf(self, router)) < 0) {
        zmq_close(router);
        return rc;
    }
    if (self->cfg.curve_secret_key) {
        rc = s_setup_curve(self, router);
        if (rc < 0) {
            zmq_close(router);
            return rc;
        }
    } else if (s_is_public(endpoint)) {
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                  "serving '%s' without CURVE: data travels unencrypted "
                  "and any client may read it",
                  endpoint);
    }
    /* Bind before the monitor exists: a failed bind (a port in use) then
     * closes a socket that was never monitored. Closing a monitored socket
     * races libzmq's monitor teardown and could hang the context's
     * termination (libzmq issues 1279, 2083). Nothing is served before
     * start, and the port is announced only after this returns. */
    if (zmq_bind(router, endpoint) != 0) {
        int err = errno;
        zmq_close(router);
        return emlio__seterr(self->err, -err, "cannot bind '%s': %s", endpoint,
                             zmq_strerror(err));
    }
    /* Connection events drive the accounting of connections: a slot is
     * freed the moment its connection closes, idle ones are shut down, and
     * running out of file descriptors is seen. */
    snprintf(self->net.inproc_monitor, sizeof(self->net.inproc_monitor),
             "inproc://emlio-monitor-%p-%" PRIu64, (void *)self,
             emlio__now_ns());
    int events =
        ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPT_FAILED;
    self->net.monitor = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PAIR);
    if (!self->net.monitor ||
        zmq_socket_monitor(router, self->net.inproc_monitor, events) != 0 ||
        zmq_connect(self->net.monitor, self->net.inproc_monitor) != 0) {
        int err = errno;
        if (self->net.monitor)
            (void)zmq_socket_monitor(router, NULL, 0);
        s_close_socket(&self->net.monitor);
        zmq_close(router);
        return emlio__seterr(self->err, -err,
                             "cannot monitor the connections of '%s': %s",
                             endpoint, zmq_strerror(err));
    }
    size_t len = sizeof(self->net.endpoint);
    if (zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, self->net.endpoint, &len) !=
        0)
        snprintf(self->net.endpoint, sizeof(self->net.endpoint), "%s",
                 endpoint);
    const char *colon = strrchr(self->net.endpoint, ':');
    if (!strncmp(self->net.endpoint, "tcp://", 6) && colon)
        self->net.bound_port = atoi(colon + 1);
    self->net.router = router;
    return 0;
}

const char *
emlio_server_endpoint(const emlio_server_t *self)
{
    return self->net.endpoint;
}

/* Creates and binds the frontend's two internal sockets here, before its
 * thread starts, so that start can report a failure (the thread then only
 * uses them; pthread_create is the memory barrier ZeroMQ asks for). */
static int
s_bind_internal(emlio_server_t *self)
{
    void *zctx = emlio__ctx_zmq(self->ctx);
    char *e = self->err;
    int rc;
    self->net.work = zmq_socket(zctx, ZMQ_PUSH);
    self->net.done = zmq_socket(zctx, ZMQ_PULL);
    if (!self->net.work || !self->net.done)
        return emlio__seterr(e, -errno, "cannot create internal sockets: %s",
                             zmq_strerror(errno));
    if ((rc = emlio__srv_setopt_int(self->net.work, ZMQ_LINGER, 0, "ZMQ_LINGER",
                                    e)) < 0 ||
        (rc = emlio__srv_setopt_int(self->net.done, ZMQ_LINGER, 0, "ZMQ_LINGER",
                                    e)) < 0 ||
        (rc = emlio__srv_setopt_int(self->net.done, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM",
                                    e)) < 0 ||
        (rc = emlio__srv_setopt_int(self->net.work, ZMQ_SNDTIMEO,
                                    EMLIO__SRV_POLL_MS, "ZMQ_SNDTIMEO",
                                    self->err)) < 0 ||
        (rc = emlio__srv_setopt_int(self->net.work, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM",
                                    e)) < 0)
        return rc;
    if (zmq_bind(self->net.work, self->net.inproc_work) != 0 ||
        zmq_bind(self->net.done, self->net.inproc_done) != 0)
        return emlio__seterr(e, -errno, "cannot bind internal sockets: %s",
                             zmq_strerror(errno));
    return 0;
}

int
emlio_server_start(emlio_server_t *self)
{
    assert(self);
    if (!self->loaded || !self->net.router)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "server must be loaded and bound before start");
    if (self->thr.frontend_started)
        return emlio__seterr(self->err, EMLIO_EINVAL, "server already started");
    int rc = emlio__xfspec_start(&self->xf, self->cfg.transform_threads,
                                 self->cfg.max_pixels,
                                 emlio__io_memory_limit(NULL), self->err);
    if (rc < 0)
        return rc;
    rc = s_encode_welcome(self);
    if (rc < 0) {
        emlio__xfspec_stop(&self->xf);
        return rc;
    }
    snprintf(self->net.inproc_work, sizeof(self->net.inproc_work),
             "inproc://emlio-work-%p-%" PRIu64, (void *)self, emlio__now_ns());
    snprintf(self->net.inproc_done, sizeof(self->net.inproc_done),
             "inproc://emlio-done-%p-%" PRIu64, (void *)self, emlio__now_ns());
    atomic_store(&self->thr.stopping, false);
    atomic_store(&self->thr.frontend_stopped, false);
    uint32_t n = self->cfg.workers + self->cfg.serializers;
    if (!self->thr.workers)
        self->thr.workers = emlio_calloc(n, sizeof(*self->thr.workers));
    if (!self->thr.ser_queue)
        self->thr.ser_queue = emlio__queue_new(self->cfg.queue_depth);
    if (!self->thr.workers || !self->thr.ser_queue)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    s_close_socket(&self->net.work); /* from an earlier failed start */
    s_close_socket(&self->net.done);
    rc = s_bind_internal(self);
    if (rc < 0) {
        s_close_socket(&self->net.work);
        s_close_socket(&self->net.done);
        return rc;
    }
    rc = pthread_create(&self->thr.frontend, NULL, emlio__srv_frontend_main,
                        self);
    if (rc != 0)
        return emlio__seterr(self->err, -rc, "cannot start frontend thread: %s",
                             strerror(rc));
    self->thr.frontend_started = true;
    for (uint32_t i = 0; i < n; i++) {
        bool reader = i < self->cfg.workers;
        rc = pthread_create(
            &self->thr.workers[i], NULL,
            reader ? emlio__srv_reader_main : emlio__srv_serializer_main, self);
        if (rc != 0) {
            emlio_server_stop(self);
            return emlio__seterr(self->err, -rc, "cannot start %s thread: %s",
                                 reader ? "reader" : "serializer",
                                 strerror(rc));
        }
        self->thr.n_workers_started++;
    }
    rc = emlio__srv_io_watch_start(self);
    if (rc < 0) {
        emlio_server_stop(self);
        return rc;
    }
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "serving on %s with %" PRIu32 " readers, %" PRIu32
              " serializers, %zu transform threads (%" PRIu64
              " MiB each at most)%s%s",
              self->net.endpoint, self->cfg.workers, self->cfg.serializers,
              self->xf.threads, self->xf.ws_max_bytes >> 20,
              self->cfg.readahead ? ", readahead" : "",
              self->cfg.drop_behind ? ", drop-behind" : "");
    return 0;
}

void
emlio_server_stop(emlio_server_t *self)
{
    if (!self || !self->thr.frontend_started)
        return;
    atomic_store(&self->thr.stopping, true);
    emlio__srv_io_watch_stop(self);
    /* The frontend goes first so that no new job reaches a reader after the
     * reader has drained its inproc queue; readers next, so that nothing
     * is pushed after the serializers' queue closes. */
    pthread_join(self->thr.frontend, NULL);
    atomic_store(&self->thr.frontend_stopped, true);
    uint32_t readers =
        EMLIO_MIN(self->thr.n_workers_started, self->cfg.workers);
    for (uint32_t i = 0; i < readers; i++)
        pthread_join(self->thr.workers[i], NULL);
    /* Transforms in progress finish and push their jobs to the serializers
     * (which drop them while stopping) before the queue closes. */
    emlio__xfspec_drain(&self->xf);
    emlio__queue_close(self->thr.ser_queue);
    for (uint32_t i = readers; i < self->thr.n_workers_started; i++)
        pthread_join(self->thr.workers[i], NULL);
    /* Jobs no serializer took (one that never started, after a failed
     * start): a closed queue hands out what it still holds, then ends. */
    void *left;
    while (self->thr.ser_queue &&
           emlio__queue_pop(self->thr.ser_queue, &left) == 0)
        emlio__srv_job_drop(self, left);
    emlio__queue_destroy(&self->thr.ser_queue);
    /* Only now that no serializer can read a job's pipeline. */
    emlio__xfspec_stop(&self->xf);
    /* Replies still queued inside are dropped with their frames. */
    s_close_socket(&self->net.work);
    s_close_socket(&self->net.done);
    self->thr.n_workers_started = 0;
    self->thr.frontend_started = false;
}

void
emlio_server_stats(const emlio_server_t *self, emlio_server_stats_t *out)
{
    out->requests = atomic_load(&self->count.requests);
    out->errors = atomic_load(&self->count.errors);
    out->samples = atomic_load(&self->count.samples);
    out->bytes = atomic_load(&self->count.bytes);
    out->corrupt_skipped = atomic_load(&self->count.corrupt_skipped);
    out->clients = atomic_load(&self->count.clients);
    out->active_clients = atomic_load(&self->count.active_clients);
    out->active_streams = atomic_load(&self->count.active_streams);
    out->packed_bytes = atomic_load(&self->count.packed_bytes);
    out->auth_refused = emlio__zap_refused(self->net.zap);
    emlio__io_counters_t io;
    emlio__io_counters(&io);
    out->disk_read_bytes = emlio__io_device_read_bytes();
    out->io_reads = io.reads;
    out->io_read_bytes = io.bytes;
    out->io_errors = io.errors;
    out->io_ahead_bytes = io.ahead;
    out->io_direct_reads = io.direct;
    out->io_fixed_reads = io.fixed;
    out->io_wait_ns = io.wait_ns;
    out->io_read = atomic_load(&self->core->io_reading);
    out->io_mapped_shards = atomic_load(&self->core->io_mapped);
    out->io_switches = atomic_load(&self->core->io_switches);
}

size_t
emlio_server_shard_count(const emlio_server_t *self)
{
    return self->core->set.n;
}

uint64_t
emlio_server_record_count(const emlio_server_t *self)
{
    return self->core->set.records;
}

const char *
emlio_server_dataset(const emlio_server_t *self)
{
    return self->core->set.fingerprint;
}

const char *
emlio_server_errmsg(const emlio_server_t *self)
{
    return self->err;
}
