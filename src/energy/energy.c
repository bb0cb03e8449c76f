/* energy.c - the energy meter: backend selection, the sampler thread, wrap
 * accounting, the model and the report.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "energy.h"

#define S_DEFAULT_POWERCAP "/sys/class/powercap"
#define S_DEFAULT_PERF     "/sys/bus/event_source/devices/power"
#define S_DEFAULT_NVML     "libnvidia-ml.so.1"
#define S_NOTES_LEN        1024
#define S_MAX_INTERVAL_MS  3600000u

struct emlio_energy {
    /* Configuration, copied by the setters. */
    int backend;
    int gpu;
    int scope;
    uint32_t interval_ms;
    char *powercap_root;
    char *perf_root;
    char *nvml_path;
    double idle_w;
    double core_w;
    double j_per_byte;
    double disk_j_per_byte;

    /* One measurement. */
    bool running;
    const char *cpu_source; /* "rapl", "perf", "model" or NULL */
    emlio__energy_set_t set;
    emlio__nvml_t *nvml;
    uint64_t t0_ns;
    double user0_s;
    double sys0_s;
    uint64_t bytes;
    uint64_t disk_bytes; /* read from storage devices (the disk term) */
    atomic_uint_fast64_t samples;

    /* The sampler thread; lock guards set and quit. */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    bool thread_started;
    bool quit;

    char notes[S_NOTES_LEN];
    char err[EMLIO_ERRMSG_LEN];
};

emlio__energy_counter_t *
emlio__energy_set_add(emlio__energy_set_t *set)
{
    if (emlio__grow(&set->v, &set->cap, set->n, sizeof(*set->v), 8) < 0)
        return NULL;
    emlio__energy_counter_t *c = &set->v[set->n++];
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    return c;
}

void
emlio__energy_set_release(emlio__energy_set_t *set)
{
    for (size_t i = 0; i < set->n; i++) {
        emlio_free(set->v[i].path);
        if (set->v[i].fd >= 0)
            close(set->v[i].fd);
    }
    emlio_free(set->v);
    memset(set, 0, sizeof(*set));
}

int
emlio__energy_read(emlio__nvml_t *nvml, const emlio__energy_counter_t *c,
                   uint64_t *raw)
{
    switch (c->kind) {
    case EMLIO__ENERGY_RAPL: {
        char buf[64];
        int n = emlio__energy_read_small(c->path, buf, sizeof(buf));
        if (n < 0)
            return n;
        return emlio__energy_parse_u64(buf, (size_t)n, raw);
    }
    case EMLIO__ENERGY_PERF: {
        uint64_t v = 0;
        ssize_t n;
        do
            n = read(c->fd, &v, sizeof(v));
        while (n < 0 && errno == EINTR);
        if (n < 0)
            return -errno;
        if (n != (ssize_t)sizeof(v))
            return EMLIO_EFORMAT;
        *raw = v;
        return 0;
    }
    case EMLIO__ENERGY_NVML:
        return emlio__energy_nvml_read(nvml, c->device, raw);
    default:
        return EMLIO_EINVAL;
    }
}

void
emlio__energy_fold(emlio__energy_counter_t *c, uint64_t raw)
{
    bool wrapped = false;
    uint64_t delta = emlio__energy_wrap_delta(c->prev, raw, c->max, &wrapped);
    if (wrapped)
        c->wraps++;
    c->total += delta;
    c->prev = raw;
}

double
emlio_energy_model_j(double idle_w, double core_w, double j_per_byte,
                     double wall_s, double cpu_s, uint64_t bytes)
{
    return idle_w * wall_s + core_w * cpu_s + j_per_byte * (double)bytes;
}

emlio_energy_t *
emlio_energy_new(void)
{
    emlio_energy_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->powercap_root = emlio_strdup(S_DEFAULT_POWERCAP);
    self->perf_root = emlio_strdup(S_DEFAULT_PERF);
    self->nvml_path = emlio_strdup(S_DEFAULT_NVML);
    if (!self->powercap_root || !self->perf_root || !self->nvml_path)
        goto fail;
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        goto fail;
    /* The sampler's deadlines follow the monotonic clock, so a change of
     * the wall clock neither stalls nor rushes it. */
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&self->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        goto fail;
    if (pthread_mutex_init(&self->lock, NULL) != 0) {
        pthread_cond_destroy(&self->wake);
        goto fail;
    }
    self->backend = EMLIO_ENERGY_AUTO;
    self->gpu = EMLIO_ENERGY_GPU_AUTO;
    self->scope = EMLIO_ENERGY_CPU_SELF;
    self->interval_ms = EMLIO_ENERGY_DEFAULT_INTERVAL_MS;
    self->idle_w = EMLIO_ENERGY_DEFAULT_IDLE_W;
    self->core_w = EMLIO_ENERGY_DEFAULT_CORE_W;
    self->j_per_byte = EMLIO_ENERGY_DEFAULT_J_PER_BYTE;
    self->disk_j_per_byte = EMLIO_ENERGY_DEFAULT_DISK_J_PER_BYTE;
    atomic_init(&self->samples, 0);
    return self;

fail:
    emlio_free(self->powercap_root);
    emlio_free(self->perf_root);
    emlio_free(self->nvml_path);
    emlio_free(self);
    return NULL;
}

static void s_halt(emlio_energy_t *self);

void
emlio_energy_destroy(emlio_energy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_energy_t *self = *self_p;
    if (self->running)
        s_halt(self);
    pthread_mutex_destroy(&self->lock);
    pthread_cond_destroy(&self->wake);
    emlio_free(self->powercap_root);
    emlio_free(self->perf_root);
    emlio_free(self->nvml_path);
    emlio_free(self);
    *self_p = NULL;
}

/* Replaces a string setting; NULL or "" restores the default. */
static int
s_set_str(emlio_energy_t *self, char **field, const char *value,
          const char *dflt)
{
    if (self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot change the meter while it runs");
    char *copy = emlio_strdup(value && value[0] ? value : dflt);
    if (!copy)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    emlio_free(*field);
    *field = copy;
    return 0;
}

/* Replaces an enum setting after a range check. */
static int
s_set_enum(emlio_energy_t *self, int *field, int value, int max,
           const char *what)
{
    if (self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot change the meter while it runs");
    if (value < 0 || value > max)
        return emlio__seterr(self->err, EMLIO_EINVAL, "invalid %s %d", what,
                             value);
    *field = value;
    return 0;
}

int
emlio_energy_set_backend(emlio_energy_t *self, int backend)
{
    assert(self);
    return s_set_enum(self, &self->backend, backend, EMLIO_ENERGY_NONE,
                      "backend");
}

int
emlio_energy_set_gpu(emlio_energy_t *self, int gpu)
{
    assert(self);
    return s_set_enum(self, &self->gpu, gpu, EMLIO_ENERGY_GPU_REQUIRE,
                      "gpu policy");
}

int
emlio_energy_set_cpu_scope(emlio_energy_t *self, int scope)
{
    assert(self);
    return s_set_enum(self, &self->scope, scope, EMLIO_ENERGY_CPU_BOTH,
                      "cpu scope");
}

int
emlio_energy_set_interval_ms(emlio_energy_t *self, uint32_t interval_ms)
{
    assert(self);
    if (self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot change the meter while it runs");
    if (interval_ms > S_MAX_INTERVAL_MS)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "invalid interval %" PRIu32 " ms: above %u",
                             interval_ms, S_MAX_INTERVAL_MS);
    self->interval_ms = interval_ms;
    return 0;
}

int
emlio_energy_set_powercap_root(emlio_energy_t *self, const char *root)
{
    assert(self);
    return s_set_str(self, &self->powercap_root, root, S_DEFAULT_POWERCAP);
}

int
emlio_energy_set_perf_root(emlio_energy_t *self, const char *root)
{
    assert(self);
    return s_set_str(self, &self->perf_root, root, S_DEFAULT_PERF);
}

int
emlio_energy_set_nvml_path(emlio_energy_t *self, const char *path)
{
    assert(self);
    return s_set_str(self, &self->nvml_path, path, S_DEFAULT_NVML);
}

int
emlio_energy_set_model(emlio_energy_t *self, double idle_w, double core_w,
                       double j_per_byte)
{
    assert(self);
    if (self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot change the meter while it runs");
    if (!isfinite(idle_w) || !isfinite(core_w) || !isfinite(j_per_byte) ||
        idle_w < 0 || core_w < 0 || j_per_byte < 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "invalid model parameters: each must be a "
                             "finite number >= 0");
    self->idle_w = idle_w;
    self->core_w = core_w;
    self->j_per_byte = j_per_byte;
    return 0;
}

/* Appends "what: text" to the notes. */
static void
s_note(emlio_energy_t *self, const char *what, const char *text)
{
    size_t used = strlen(self->notes);
    if (!text[0] || used + 4 >= sizeof(self->notes))
        return;
    snprintf(self->notes + used, sizeof(self->notes) - used, "%s%s: %s",
             used ? "; " : "", what, text);
}

static double
s_tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* CPU times of the configured scope. */
static void
s_cpu_times(int scope, double *user_s, double *sys_s)
{
    struct rusage ru;
    *user_s = 0;
    *sys_s = 0;
    if (scope != EMLIO_ENERGY_CPU_CHILDREN &&
        getrusage(RUSAGE_SELF, &ru) == 0) {
        *user_s += s_tv_s(ru.ru_utime);
        *sys_s += s_tv_s(ru.ru_stime);
    }
    if (scope != EMLIO_ENERGY_CPU_SELF &&
        getrusage(RUSAGE_CHILDREN, &ru) == 0) {
        *user_s += s_tv_s(ru.ru_utime);
        *sys_s += s_tv_s(ru.ru_stime);
    }
}

/* Reads every counter once. The caller holds the lock or is the only
 * thread that touches the set. */
static void
s_sample_locked(emlio_energy_t *self)
{
    for (size_t i = 0; i < self->set.n; i++) {
        emlio__energy_counter_t *c = &self->set.v[i];
        uint64_t raw = 0;
        if (emlio__energy_read(self->nvml, c, &raw) < 0 ||
            (c->max && raw > c->max))
            c->read_errors++;
        else
            emlio__energy_fold(c, raw);
    }
    atomic_fetch_add(&self->samples, 1);
}

static void *
s_sampler(void *arg)
{
    emlio_energy_t *self = arg;
    pthread_mutex_lock(&self->lock);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (!self->quit) {
        uint64_t ns =
            (uint64_t)next.tv_nsec + (uint64_t)self->interval_ms * 1000000u;
        next.tv_sec += (time_t)(ns / 1000000000u);
        next.tv_nsec = (long)(ns % 1000000000u);
        int rc = 0;
        while (!self->quit && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&self->wake, &self->lock, &next);
        if (self->quit)
            break;
        s_sample_locked(self);
    }
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

/* Picks and probes the CPU-side backend. 0 or < 0 with errmsg set. */
static int
s_start_cpu(emlio_energy_t *self)
{
    char why[EMLIO_ERRMSG_LEN] = "";
    int rc;
    int b = self->backend;

    self->cpu_source = NULL;
    if (b == EMLIO_ENERGY_NONE)
        return 0;
    if (b == EMLIO_ENERGY_AUTO || b == EMLIO_ENERGY_RAPL) {
        rc = emlio__energy_rapl_probe(self->powercap_root, &self->set, why);
        if (rc > 0) {
            s_note(self, "rapl", why); /* zones skipped, if any */
            self->cpu_source = "rapl";
            return 0;
        }
        if (b == EMLIO_ENERGY_RAPL || rc == EMLIO_ENOMEM)
            return emlio__seterr(self->err, rc ? rc : EMLIO_ENOTFOUND,
                                 "rapl: %s", why);
        s_note(self, "rapl", why);
    }
    if (b == EMLIO_ENERGY_AUTO || b == EMLIO_ENERGY_PERF) {
        why[0] = '\0';
        rc = emlio__energy_perf_probe(self->perf_root, &self->set, why);
        if (rc > 0) {
            s_note(self, "perf", why);
            self->cpu_source = "perf";
            return 0;
        }
        if (b == EMLIO_ENERGY_PERF || rc == EMLIO_ENOMEM)
            return emlio__seterr(self->err, rc ? rc : EMLIO_ENOTFOUND,
                                 "perf: %s", why);
        s_note(self, "perf", why);
    }
    self->cpu_source = "model";
    return 0;
}

/* Probes NVML per the GPU policy. 0 or < 0 with errmsg set. */
static int
s_start_gpu(emlio_energy_t *self)
{
    if (self->gpu == EMLIO_ENERGY_GPU_OFF)
        return 0;
    char why[EMLIO_ERRMSG_LEN] = "";
    int rc =
        emlio__energy_nvml_probe(self->nvml_path, &self->nvml, &self->set, why);
    if (rc > 0) {
        s_note(self, "nvml", why);
        return 0;
    }
    if (self->gpu == EMLIO_ENERGY_GPU_REQUIRE || rc == EMLIO_ENOMEM)
        return emlio__seterr(self->err, rc ? rc : EMLIO_ENOTFOUND, "nvml: %s",
                             why);
    s_note(self, "nvml", why);
    return 0;
}

/* Releases what start acquired, without a report. */
static void
s_halt(emlio_energy_t *self)
{
    if (self->thread_started) {
        pthread_mutex_lock(&self->lock);
        self->quit = true;
        pthread_cond_signal(&self->wake);
        pthread_mutex_unlock(&self->lock);
        pthread_join(self->thread, NULL);
        self->thread_started = false;
    }
    emlio__energy_set_release(&self->set);
    emlio__energy_nvml_close(&self->nvml);
    self->running = false;
}

int
emlio_energy_start(emlio_energy_t *self)
{
    assert(self);
    if (self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot start the meter: it already runs");
    self->err[0] = '\0';
    self->notes[0] = '\0';
    self->bytes = 0;
    self->disk_bytes = 0;
    self->quit = false;
    atomic_store(&self->samples, 0);
    self->running = true; /* so that s_halt cleans up on failure */

    int rc = s_start_cpu(self);
    if (rc == 0)
        rc = s_start_gpu(self);
    if (rc < 0) {
        s_halt(self);
        return rc;
    }
    /* The probes read every counter once; rebase them to now. */
    s_sample_locked(self);
    for (size_t i = 0; i < self->set.n; i++) {
        self->set.v[i].total = 0;
        self->set.v[i].wraps = 0;
    }
    s_cpu_times(self->scope, &self->user0_s, &self->sys0_s);
    self->t0_ns = emlio__now_ns();

    if (self->interval_ms > 0 && self->set.n > 0) {
        rc = pthread_create(&self->thread, NULL, s_sampler, self);
        if (rc != 0) {
            s_halt(self);
            return emlio__seterr(self->err, -rc,
                                 "cannot start the sampler thread: %s",
                                 emlio_strerror(-rc));
        }
        self->thread_started = true;
    }
    return 0;
}

int
emlio_energy_sample(emlio_energy_t *self)
{
    assert(self);
    if (!self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot sample: the meter is not running");
    pthread_mutex_lock(&self->lock);
    s_sample_locked(self);
    pthread_mutex_unlock(&self->lock);
    return 0;
}

void
emlio_energy_add_bytes(emlio_energy_t *self, uint64_t n)
{
    assert(self);
    self->bytes += n;
}

void
emlio_energy_add_disk_bytes(emlio_energy_t *self, uint64_t n)
{
    assert(self);
    self->disk_bytes += n;
}

int
emlio_energy_set_disk_model(emlio_energy_t *self, double j_per_byte)
{
    assert(self);
    if (!isfinite(j_per_byte) || j_per_byte < 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "the disk term's joules per byte must be finite "
                             "and >= 0");
    self->disk_j_per_byte = j_per_byte;
    return 0;
}

/* Adds a domain to the report, if there is room. */
static void
s_report_add(emlio_energy_report_t *out, const char *name, const char *source,
             double joules, bool in_total, uint32_t wraps, uint32_t errors)
{
    if (in_total)
        out->energy_j += joules;
    if (out->n_domains == EMLIO_ENERGY_MAX_DOMAINS)
        return;
    emlio_energy_domain_t *d = &out->domains[out->n_domains++];
    snprintf(d->name, sizeof(d->name), "%s", name);
    snprintf(d->source, sizeof(d->source), "%s", source);
    d->joules = joules;
    d->in_total = in_total;
    d->wraps = wraps;
    d->read_errors = errors;
}

/* Fills *out with the figures from start to now from the counters as they
 * stand. final adds the note about counters that never moved, which only
 * makes sense for a whole run. The caller holds the lock or is the only
 * thread that touches the set. */
static void
s_report(emlio_energy_t *self, emlio_energy_report_t *out, bool final)
{
    uint64_t t1_ns = emlio__now_ns();
    double user1_s = 0;
    double sys1_s = 0;
    s_cpu_times(self->scope, &user1_s, &sys1_s);

    memset(out, 0, sizeof(*out));
    out->wall_s = (double)(t1_ns - self->t0_ns) / 1e9;
    out->user_s = EMLIO_MAX(0.0, user1_s - self->user0_s);
    out->sys_s = EMLIO_MAX(0.0, sys1_s - self->sys0_s);
    out->cpu_s = out->user_s + out->sys_s;
    out->samples = atomic_load(&self->samples);

    bool measured_cpu_moved = false;
    bool has_gpu = false;
    for (size_t i = 0; i < self->set.n; i++) {
        const emlio__energy_counter_t *c = &self->set.v[i];
        double j = (double)c->total * c->unit_j;
        if (c->kind == EMLIO__ENERGY_NVML)
            has_gpu = true;
        else if (c->total > 0)
            measured_cpu_moved = true;
        s_report_add(out, c->name, c->source, j, c->in_total, c->wraps,
                     c->read_errors);
    }
    const char *cpu = self->cpu_source;
    if (cpu && !strcmp(cpu, "model")) {
        emlio_energy_report_t *r = out;
        s_report_add(r, "model-idle", "model",
                     emlio_energy_model_j(self->idle_w, 0, 0, r->wall_s, 0, 0),
                     true, 0, 0);
        s_report_add(r, "model-cpu", "model",
                     emlio_energy_model_j(0, self->core_w, 0, 0, r->cpu_s, 0),
                     true, 0, 0);
        if (self->j_per_byte > 0)
            s_report_add(
                r, "model-io", "model",
                emlio_energy_model_j(0, 0, self->j_per_byte, 0, 0, self->bytes),
                true, 0, 0);
        out->modelled = true;
    } else if (final && cpu && !measured_cpu_moved && out->wall_s > 0.1) {
        s_note(self, cpu,
               "the counters did not advance during the run; the figure is "
               "suspect");
    }
    /* After the CPU's domains: an estimate is added only to an estimate. */
    if (self->disk_j_per_byte > 0 && self->disk_bytes > 0)
        s_report_add(out, "model-disk", "model",
                     self->disk_j_per_byte * (double)self->disk_bytes,
                     out->modelled, 0, 0);
    snprintf(out->source, sizeof(out->source), "%s%s%s", cpu ? cpu : "",
             cpu && has_gpu ? "+" : "", has_gpu ? "nvml" : (cpu ? "" : "none"));
}

int
emlio_energy_stop(emlio_energy_t *self, emlio_energy_report_t *out)
{
    assert(self && out);
    if (!self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot stop: the meter is not running");
    if (self->thread_started) {
        pthread_mutex_lock(&self->lock);
        self->quit = true;
        pthread_cond_signal(&self->wake);
        pthread_mutex_unlock(&self->lock);
        pthread_join(self->thread, NULL);
        self->thread_started = false;
    }
    s_sample_locked(self);
    s_report(self, out, true);
    emlio__energy_set_release(&self->set);
    emlio__energy_nvml_close(&self->nvml);
    self->running = false;
    return 0;
}

int
emlio_energy_read(emlio_energy_t *self, emlio_energy_report_t *out)
{
    assert(self && out);
    if (!self->running)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "cannot read: the meter is not running");
    pthread_mutex_lock(&self->lock);
    s_sample_locked(self);
    s_report(self, out, false);
    pthread_mutex_unlock(&self->lock);
    return 0;
}

bool
emlio_energy_running(const emlio_energy_t *self)
{
    assert(self);
    return self->running;
}

uint64_t
emlio_energy_samples(const emlio_energy_t *self)
{
    assert(self);
    return atomic_load(&((emlio_energy_t *)self)->samples);
}

const char *
emlio_energy_notes(const emlio_energy_t *self)
{
    assert(self);
    return self->notes;
}

const char *
emlio_energy_errmsg(const emlio_energy_t *self)
{
    assert(self);
    return self->err;
}
