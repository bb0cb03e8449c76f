/* main.c - emliod, the EMLIO storage-node daemon: argv -> emlio_server_*.
 * Signals are handled here and only here (the library installs none).
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "emlio.h"
#include "metrics.h"
#include "opts.h"
#include "sd_notify.h"
#include "tool_util.h"

static const char *const s_levels[] = { "error", "warn", "info", "debug" };

static void
s_log(void *userdata, int level, const char *module, const char *msg)
{
    (void)userdata;
    struct timespec ts;
    struct tm tm;
    char when[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ld %-5s %s: %s\n", when, ts.tv_nsec / 1000000,
            s_levels[level], module, msg);
}

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(out, "usage: emliod --data DIR --bind ENDPOINT [options]\n"
                 "       emliod --config FILE [options]\n"
                 "\n"
                 "Serves the dataset under DIR (*.tfrecord files, WebDataset\n"
                 "*.tar shards or an ImageFolder tree) to emlio clients.\n"
                 "\n");
    opt_usage(out, tables);
    fprintf(out, "\nA config file holds one option a line, without the "
                 "dashes (\"bind tcp://*:5555\");\noptions on the command "
                 "line override it.\n");
}

/* Sets up the metrics endpoint and the InfluxDB pusher (docs/energy.md,
 * "Exports"). Returns 0 or < 0 after printing why. */
static int
s_start_metrics(emlio_ctx_t *ctx, emlio_server_t *srv, const char *addr,
                const char *influx, double interval_s, tool_metrics_t **out)
{
    tool_metrics_t *m = tool_metrics_new(ctx, srv);
    int rc = m ? 0 : EMLIO_ENOMEM;
    if (rc == 0)
        rc = tool_metrics_set_powercap_root(m, getenv("EMLIO_POWERCAP_ROOT"));
    if (rc == 0 && addr)
        rc = tool_metrics_listen(m, addr);
    if (rc == 0 && influx)
        rc = tool_metrics_set_influx(m, influx, interval_s);
    if (rc == 0)
        rc = tool_metrics_start(m);
    if (rc < 0)
        fprintf(stderr, "emliod: %s\n",
                m && *tool_metrics_errmsg(m) ? tool_metrics_errmsg(m)
                                             : emlio_strerror(rc));
    *out = m;
    return rc;
}

/* The daemon's options: the server's configuration and what main itself
 * sets up (metrics, log level, keys). */
typedef struct s_opts {
    emlio_server_config_t cfg;
    const char *bind;
    const char *config;
    const char *curve_secret_path;
    int log_level;
    const char *metrics_addr;
    const char *influx_url;
    double influx_interval;
    uint32_t idle_timeout_s;
    bool have_idle_timeout;
    const char *sndbuf;
    double core_w; /* --core-watts; 0 = the energy model's */
    bool version;
    char *config_text;
} s_opts_t;

static const opt_choice_t s_corrupt_modes[] = {
    { "fail", EMLIO_ON_CORRUPT_FAIL },
    { "skip", EMLIO_ON_CORRUPT_SKIP },
    { NULL, 0 },
};

static const opt_choice_t s_coalesce_modes[] = {
    { "auto", EMLIO_COALESCE_AUTO },
    { "always", EMLIO_COALESCE_ALWAYS },
    { "never", EMLIO_COALESCE_NEVER },
    { NULL, 0 },
};

static const opt_choice_t s_schedules[] = {
    { "fair", EMLIO_SCHEDULE_FAIR },
    { "fifo", EMLIO_SCHEDULE_FIFO },
    { NULL, 0 },
};

static const opt_choice_t s_pack_modes[] = {
    { "auto", EMLIO_PACK_AUTO },
    { "large", EMLIO_PACK_LARGE },
    { "small", EMLIO_PACK_SMALL },
    { NULL, 0 },
};

static const opt_choice_t s_level_names[] = {
    { "error", EMLIO_LOG_ERROR },
    { "warn", EMLIO_LOG_WARN },
    { "info", EMLIO_LOG_INFO },
    { "debug", EMLIO_LOG_DEBUG },
    { NULL, 0 },
};

/* --sndbuf: "auto" (0), "kernel" (-1) or a byte count. Returns -1 to go
 * on, or 2 after saying what is wrong. */
static int
s_parse_sndbuf(const char *arg, emlio_server_config_t *cfg)
{
    if (!arg || !strcmp(arg, "auto")) {
        cfg->sndbuf = 0;
        return -1;
    }
    if (!strcmp(arg, "kernel")) {
        cfg->sndbuf = -1;
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v == 0 ||
        v > (1u << 30)) {
        fprintf(stderr,
                "emliod: invalid value '%s' for --sndbuf: auto, kernel or "
                "1..1073741824 bytes\n",
                arg);
        return 2;
    }
    cfg->sndbuf = (int64_t)v;
    return -1;
}

/* What the parsed options imply: --version printed, units converted.
 * Returns -1 to go on, else the exit status. */
static int
s_finish_args(s_opts_t *o)
{
    if (o->version) {
        printf("emliod %s (libemlio %s)\n", EMLIO_VERSION_STRING,
               emlio_version_string());
        return 0;
    }
    if (o->have_idle_timeout)
        o->cfg.idle_timeout_ms = o->idle_timeout_s * 1000;
    o->cfg.core_mw = (uint32_t)(o->core_w * 1000 + 0.5);
    return s_parse_sndbuf(o->sndbuf, &o->cfg);
}

/* Parses the config file (when --config names one) and then argv, so
 * the command line wins. Returns -1 to go on, else the exit status. */
static int
s_parse_args(s_opts_t *o, int argc, char **argv)
{
    emlio_server_config_t *cfg = &o->cfg;
    const opt_t table[] = {
        OPT("data", 'd', OPT_STR, &cfg->data_dir, "DIR",
            "dataset directory (searched recursively)"),
        OPT("bind", 'b', OPT_STR, &o->bind, "ENDPOINT",
            "e.g. tcp://0.0.0.0:5555; tcp://127.0.0.1:*\n"
            "picks a free port (printed when ready)"),
        OPT("config", 0, OPT_STR, &o->config, "FILE",
            "read options from FILE (one a line)"),
        OPT("readers", 0, OPT_U32, &cfg->workers, "N",
            "reader threads: find and verify (2)", .min = 1),
        OPT("workers", 0, OPT_U32, &cfg->workers, "N", "same as --readers",
            .min = 1),
        OPT("serializers", 0, OPT_U32, &cfg->serializers, "N",
            "serializer threads: frames (1)", .min = 1),
        OPT("queue-depth", 0, OPT_U32, &cfg->queue_depth, "N",
            "jobs between the stages (64)", .min = 1),
        OPT("no-readahead", 0, OPT_UNSET, &cfg->readahead, NULL,
            "no madvise WILLNEED as requests arrive"),
        OPT("drop-behind", 0, OPT_FLAG, &cfg->drop_behind, NULL,
            "madvise DONTNEED pages once sent"),
        OPT("io", 0, OPT_STR, &cfg->io, "MODE",
            "auto (default), map (zero-copy from the\n"
            "page cache) or read (exact reads, io_uring;\n"
            "auto: when the data exceeds 3/4 of memory)"),
        OPT("io-depth", 0, OPT_U32, &cfg->io_depth, "N",
            "reads in flight per reader with --io read\n"
            "(default: the device's nr_requests, <= 128)",
            .min = 1),
        OPT("read-ahead-bytes", 0, OPT_SIZE, &cfg->read_ahead_bytes, "BYTES",
            "with --io read: bytes read ahead for the\n"
            "requests queued behind the ones served (64M)",
            .min = 1),
        OPT("max-batch", 0, OPT_U32, &cfg->max_batch, "N",
            "samples per request (default 4096)", .min = 1),
        OPT("max-credit", 0, OPT_U32, &cfg->max_credit, "N",
            "outstanding requests per stream (256)", .min = 1),
        OPT("max-copy-bytes", 0, OPT_SIZE, &cfg->max_copy_bytes, "BYTES",
            "copied reply bytes one connection may hold\n"
            "(256M); bigger requests are refused",
            .min = 1),
        OPT("max-copy-bytes-total", 0, OPT_SIZE, &cfg->max_copy_bytes_total,
            "BYTES", "copied reply bytes of all connections (1G)", .min = 1),
        OPT("bytes-key", 0, OPT_STR, &cfg->bytes_key, "KEY",
            "Example feature to send (image/encoded)"),
        OPT("label-key", 0, OPT_STR, &cfg->label_key, "KEY",
            "int64 label feature (image/class/label)"),
        OPT("format", 0, OPT_STR, &cfg->format, "FMT",
            "auto (default), tfrecord, tar (WebDataset)\nor imagefolder"),
        OPT("mixed-formats", 0, OPT_FLAG, &cfg->mixed_formats, NULL,
            "serve *.tfrecord and *.tar together"),
        OPT("follow-symlinks", 0, OPT_FLAG, &cfg->follow_symlinks, NULL,
            "follow symlinks that stay inside the data\n"
            "directory (default: leave them out)"),
        OPT("fields", 0, OPT_STR, &cfg->fields, "A,B,..",
            "send these fields, one frame each per\nsample (docs/formats.md)"),
        OPT("field", 0, OPT_STR, &cfg->field, "EXT",
            "tar member to send (first image member)"),
        OPT("label-field", 0, OPT_STR, &cfg->label_field, "EXT",
            "tar member holding the label (cls)"),
        OPT("raw", 0, OPT_FLAG, &cfg->raw, NULL,
            "send whole records, do not parse Examples"),
        OPT("no-verify", 0, OPT_UNSET, &cfg->verify, NULL,
            "do not check record CRCs when reading"),
        OPT("no-write-index", 0, OPT_UNSET, &cfg->write_index, NULL,
            "do not write missing .idx files or the\ndataset index"),
        OPT("index-dir", 0, OPT_STR, &cfg->index_dir, "DIR",
            "dataset index here (DATA/.emlio-index)"),
        OPT("on-corrupt", 0, OPT_CHOICE, &cfg->on_corrupt, "MODE",
            "fail (default) or skip corrupt records",
            .choices = s_corrupt_modes),
        OPT("log-level", 0, OPT_CHOICE, &o->log_level, "LEVEL",
            "error, warn, info (default), debug", .choices = s_level_names),
        OPT("curve-secret", 0, OPT_STR, &o->curve_secret_path, "FILE",
            "encrypt with CURVE using this secret key\n(from `emlio keygen`)"),
        OPT("authorized-keys", 0, OPT_STR, &cfg->authorized_keys, "DIR",
            "admit only clients whose public key\n"
            "file is in DIR (needs --curve-secret)"),
        OPT("transform-threads", 0, OPT_U32, &cfg->transform_threads, "N",
            "threads that decode and augment for clients\n"
            "that ask for tensors (one per CPU; 0: none)",
            .max = EMLIO_SERVER_MAX_TRANSFORM_THREADS),
        OPT("max-pixels", 0, OPT_SIZE, &cfg->max_pixels, "N",
            "refuse images above N pixels (100M)"),
        OPT("core-watts", 0, OPT_DOUBLE, &o->core_w, "W",
            "power of one busy core, told to clients\n"
            "for placement by energy (model: 3.2)",
            .dmin = 0, .dmax = 1000),
        OPT("max-open-shards", 0, OPT_U32, &cfg->max_open_shards, "N",
            "shards open at once (default: from ulimit -n)", .min = 1),
        OPT("max-clients", 0, OPT_U32, &cfg->max_clients, "N",
            "clients at once; a client's streams count once\n(1024)", .min = 1),
        OPT("job-weight", 0, OPT_STR, &cfg->job_weights, "NAME=W,..",
            "the weight of each named job (1..1000; *=W\n"
            "for all others; default 1): a job may ask\n"
            "for less, never more (docs/fairness.md)"),
        OPT("schedule", 0, OPT_CHOICE, &cfg->schedule, "HOW",
            "fair (default): share the readers among jobs\n"
            "by weight; fifo: in arrival order",
            .choices = s_schedules),
        OPT("max-jobs", 0, OPT_U32, &cfg->max_jobs, "N",
            "jobs known at once (4096)", .min = 1),
        OPT("share-bytes", 0, OPT_SIZE, &cfg->share_bytes, "BYTES",
            "chunks kept for jobs that share reads (512M,\n"
            "or a quarter of the memory when less)"),
        OPT("share-all", 0, OPT_FLAG, &cfg->share_all, NULL,
            "serve every job from the shared chunks, not\n"
            "only those that ask (fetch --share)"),
        OPT("idle-timeout", 0, OPT_U32, &o->idle_timeout_s, "S",
            "forget silent connections after S (300)", .min = 1,
            .max = UINT32_MAX / 1000, .seen = &o->have_idle_timeout),
        OPT("sndbuf", 0, OPT_STR, &o->sndbuf, "auto|kernel|BYTES",
            "send buffer of each connection; auto (default):\n"
            "as large as the host allows (docs/tuning.md)"),
        OPT("coalesce", 0, OPT_CHOICE, &cfg->coalesce, "WHEN",
            "full TCP segments while a client keeps\n"
            "requests in flight: auto (default: paths\n"
            "of 1 ms RTT or more), always or never",
            .choices = s_coalesce_modes),
        OPT("pack", 0, OPT_CHOICE, &cfg->pack, "WHICH",
            "frames packed: auto (default), large, small",
            .choices = s_pack_modes),
        OPT("metrics", 0, OPT_STR, &o->metrics_addr, "HOST:PORT",
            "serve Prometheus metrics at\n"
            "http://HOST:PORT/metrics (port 0: any)"),
        OPT("influx", 0, OPT_STR, &o->influx_url, "URL",
            "push to InfluxDB, e.g.\nhttp://127.0.0.1:8086/write?db=emlio"),
        OPT("influx-interval", 0, OPT_DOUBLE, &o->influx_interval, "S",
            "seconds between pushes (default 10)", .dmin = 0.05, .dmax = 86400),
        OPT("version", 0, OPT_FLAG, &o->version, NULL, "print the version"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "this text"),
        OPT_END,
    };
    const opt_t *const tables[] = { table, NULL };
    int rc = opt_parse("emliod", tables, argc, argv);
    if (rc == 0 && o->config) {
        /* The file first, then argv again so the command line wins. */
        rc = opt_load_config("emliod", tables, o->config, &o->config_text);
        if (rc == 0)
            rc = opt_parse("emliod", tables, argc, argv);
    }
    if (rc == OPT_HELP_SHOWN) {
        s_usage(stdout, tables);
        return 0;
    }
    return rc < 0 ? 2 : s_finish_args(o);
}

/* Reads the CURVE secret key when one is configured. Returns 0, or the
 * exit status after printing why. */
static int
s_load_keys(s_opts_t *o, char curve_secret[EMLIO_CURVE_KEY_LEN])
{
    if (!o->curve_secret_path) {
        if (o->cfg.authorized_keys) {
            fprintf(stderr, "emliod: --authorized-keys needs --curve-secret\n");
            return 2;
        }
        return 0;
    }
    int krc = emlio_curve_read_key(o->curve_secret_path, curve_secret);
    if (krc < 0) {
        fprintf(stderr, "emliod: cannot read curve secret '%s': %s\n",
                o->curve_secret_path,
                krc == EMLIO_EFORMAT ? "not a Z85 key" : emlio_strerror(krc));
        return 2;
    }
    o->cfg.curve_secret_key = curve_secret;
    return 0;
}

/* The signal thread: every other thread blocks SIGINT, SIGTERM and
 * SIGHUP, and this one takes them with sigwait, so a stop signal is seen
 * at once, even while the dataset loads (the load is told to stop between
 * shards: emlio_server_interrupt), and SIGHUP is logged, not fatal. */
typedef struct s_signals {
    sigset_t set;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    emlio_server_t *srv; /* interrupted on a stop signal; under lock */
    int sig;             /* the stop signal, 0 until one came */
} s_signals_t;

static void *
s_signal_main(void *arg)
{
    s_signals_t *sigs = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&sigs->set, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            /* Nothing to reopen: emliod logs to stderr, which systemd or
             * the shell owns. Said once per signal so it is not a
             * mystery. */
            s_log(NULL, EMLIO_LOG_INFO, "emliod",
                  "SIGHUP ignored (logs go to stderr; nothing to reopen; "
                  "stop with SIGTERM)");
            continue;
        }
        pthread_mutex_lock(&sigs->lock);
        sigs->sig = sig;
        if (sigs->srv)
            emlio_server_interrupt(sigs->srv);
        pthread_cond_broadcast(&sigs->cond);
        pthread_mutex_unlock(&sigs->lock);
        return NULL;
    }
}

/* The stop signal that came, 0 if none yet; srv (when not NULL) is
 * interrupted by one from now on. */
static int
s_signal_arm(s_signals_t *sigs, emlio_server_t *srv)
{
    pthread_mutex_lock(&sigs->lock);
    sigs->srv = srv;
    int sig = sigs->sig;
    pthread_mutex_unlock(&sigs->lock);
    return sig;
}

/* Loads the dataset unless a stop signal came first or comes meanwhile.
 * Returns 0, or < 0 after printing why (-ECANCELED: stopped by a signal,
 * which is not a failure). */
static int
s_load(emlio_server_t *srv, s_signals_t *sigs)
{
    int rc = s_signal_arm(sigs, srv) ? -ECANCELED : emlio_server_load(srv);
    int sig = s_signal_arm(sigs, NULL);
    if (sig) {
        fprintf(stderr, "emliod: %s while loading, stopping\n", strsignal(sig));
        return -ECANCELED;
    }
    if (rc < 0)
        fprintf(stderr, "emliod: cannot load dataset: %s\n",
                emlio_server_errmsg(srv));
    return rc;
}

/* Loads, binds and starts the server and the exporters, then waits for
 * SIGINT or SIGTERM. Returns 0 or < 0 after printing why. */
static int
s_serve(emlio_ctx_t *ctx, const s_opts_t *o, s_signals_t *sigs)
{
    emlio_server_t *srv = emlio_server_new(ctx, &o->cfg);
    int rc = srv ? 0 : EMLIO_ENOMEM;
    if (rc < 0)
        fprintf(stderr, "emliod: out of memory\n");
    else if ((rc = s_load(srv, sigs)) < 0)
        ;
    else if ((rc = emlio_server_bind(srv, o->bind)) < 0)
        fprintf(stderr, "emliod: %s\n", emlio_server_errmsg(srv));
    else if ((rc = emlio_server_start(srv)) < 0)
        fprintf(stderr, "emliod: cannot start: %s\n", emlio_server_errmsg(srv));
    tool_metrics_t *metrics = NULL;
    if (rc >= 0 && (o->metrics_addr || o->influx_url))
        rc = s_start_metrics(ctx, srv, o->metrics_addr, o->influx_url,
                             o->influx_interval, &metrics);
    if (rc >= 0) {
        printf("emliod: listening on %s\n", emlio_server_endpoint(srv));
        if (o->metrics_addr)
            printf("emliod: metrics on http://%s/metrics\n",
                   tool_metrics_address(metrics));
        fflush(stdout);
        sd_notify_ready(emlio_server_endpoint(srv));
        pthread_mutex_lock(&sigs->lock);
        while (!sigs->sig)
            pthread_cond_wait(&sigs->cond, &sigs->lock);
        int sig = sigs->sig;
        pthread_mutex_unlock(&sigs->lock);
        sd_notify_stopping();
        emlio_server_stats_t st;
        emlio_server_stats(srv, &st);
        fprintf(stderr,
                "emliod: %s, stopping: %" PRIu64 " requests, %" PRIu64
                " samples, %" PRIu64 " bytes (%" PRIu64 " packed), %" PRIu64
                " errors, %" PRIu64 " refused\n",
                strsignal(sig), st.requests, st.samples, st.bytes,
                st.packed_bytes, st.errors, st.auth_refused);
        if (st.io_reads)
            fprintf(stderr,
                    "emliod: io: %" PRIu64 " exact-size reads (%" PRIu64
                    " past the page cache, %" PRIu64
                    " into registered buffers), %" PRIu64 " MB\n",
                    st.io_reads, st.io_direct_reads, st.io_fixed_reads,
                    st.io_read_bytes / 1000000);
    }
    tool_metrics_destroy(&metrics); /* pushes a last point; reads srv */
    emlio_server_destroy(&srv);
    return rc == -ECANCELED ? 0 : rc;
}

/* One descriptor per leased shard (1,282 for ImageNet's WebDataset
 * layout) plus the connections: the soft limit is raised to the hard one
 * (a fresh shell's 1,024 is too few), capped where a huge table would
 * only cost memory. */
static void
s_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20)
                      ? (rlim_t)(1u << 20)
                      : rl.rlim_max;
    if (rl.rlim_cur >= want)
        return;
    rl.rlim_cur = want;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
}

int
main(int argc, char **argv)
{
    s_opts_t o = { .log_level = EMLIO_LOG_INFO, .influx_interval = 10 };
    emlio_server_config_init(&o.cfg);
    char curve_secret[EMLIO_CURVE_KEY_LEN];
    int status = s_parse_args(&o, argc, argv);
    if (status < 0)
        status = s_load_keys(&o, curve_secret);
    else if (status == 0)
        status = -1; /* --help or --version: done */
    if (status == 0 && (!o.cfg.data_dir || !o.bind)) {
        fprintf(stderr, "emliod: --data and --bind are required\n");
        status = 2;
    }
    /* Before anything is loaded or any warning printed: a malformed
     * --bind is the mistake to report. */
    char err[TOOL_ERRMSG_LEN];
    if (status == 0 && tool_check_endpoints(o.bind, true, err) < 0) {
        fprintf(stderr, "emliod: --bind: %s\n", err);
        status = 2;
    }
    if (status != 0) {
        free(o.config_text);
        return status < 0 ? 0 : status;
    }

    /* ZeroMQ allocates a buffer per received message; keep freed memory in
     * the heap instead of returning it to the kernel each time, since
     * faulting fresh pages in is expensive (~16 us a page on our VMs). */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);

    s_raise_nofile();
    /* Block the signals before any thread exists, so every library thread
     * inherits the mask and only the signal thread receives them. */
    s_signals_t sigs = { .lock = PTHREAD_MUTEX_INITIALIZER,
                         .cond = PTHREAD_COND_INITIALIZER };
    sigemptyset(&sigs.set);
    sigaddset(&sigs.set, SIGINT);
    sigaddset(&sigs.set, SIGTERM);
    sigaddset(&sigs.set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs.set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t signal_thread;
    if (pthread_create(&signal_thread, NULL, s_signal_main, &sigs) != 0) {
        fprintf(stderr, "emliod: cannot start the signal thread\n");
        free(o.config_text);
        return 1;
    }
    pthread_detach(signal_thread); /* it ends with the process */

    emlio_ctx_t *ctx = emlio_ctx_new();
    int rc = ctx ? 0 : EMLIO_ENOMEM;
    if (ctx) {
        emlio_ctx_set_log(ctx, s_log, NULL, o.log_level);
        rc = s_serve(ctx, &o, &sigs);
    } else {
        fprintf(stderr, "emliod: out of memory\n");
    }
    emlio_ctx_destroy(&ctx);
    memset(curve_secret, 0, sizeof(curve_secret));
    free(o.config_text);
    return rc < 0 ? 1 : 0;
}
