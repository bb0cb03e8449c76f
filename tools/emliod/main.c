/* main.c - emliod, the EMLIO storage-node daemon: argv -> emlio_server_*.
 * Signals are handled here and only here (the library installs none).
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emlio.h"
#include "metrics.h"

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
s_usage(FILE *out)
{
    fprintf(out,
            "usage: emliod --data DIR --bind ENDPOINT [options]\n"
            "\n"
            "Serves every *.tfrecord under DIR to emlio clients.\n"
            "\n"
            "  --data DIR          dataset directory (searched recursively)\n"
            "  --bind ENDPOINT     e.g. tcp://0.0.0.0:5555; tcp://127.0.0.1:*\n"
            "                      picks a free port (printed when ready)\n"
            "  --readers N         reader threads: find and verify (2)\n"
            "                      (--workers is an alias)\n"
            "  --serializers N     serializer threads: frames (1)\n"
            "  --queue-depth N     jobs between the stages (64)\n"
            "  --no-readahead      no madvise WILLNEED as requests arrive\n"
            "  --drop-behind       madvise DONTNEED pages once sent\n"
            "  --max-batch N       samples per request (default 4096)\n"
            "  --max-credit N      outstanding requests per stream (256)\n"
            "  --bytes-key KEY     Example feature to send (image/encoded)\n"
            "  --label-key KEY     int64 label feature (image/class/label)\n"
            "  --raw               send whole records, do not parse Examples\n"
            "  --no-verify         do not check record CRCs when reading\n"
            "  --no-write-index    do not write missing .idx files\n"
            "  --on-corrupt MODE   fail (default) or skip corrupt records\n"
            "  --log-level LEVEL   error, warn, info (default), debug\n"
            "  --curve-secret FILE encrypt with CURVE using this secret key\n"
            "                      (from `emlio keygen`)\n"
            "  --authorized-keys DIR  admit only clients whose public key\n"
            "                      file is in DIR (needs --curve-secret)\n"
            "  --max-clients N     client connections at once (1024)\n"
            "  --idle-timeout S    forget silent connections after S (300)\n"
            "  --sndbuf auto|kernel|BYTES  send buffer per connection: auto\n"
            "                      = as large as the host allows (default)\n"
            "  --metrics HOST:PORT serve Prometheus metrics at\n"
            "                      http://HOST:PORT/metrics (port 0: any)\n"
            "  --influx URL        push to InfluxDB, e.g.\n"
            "                      http://127.0.0.1:8086/write?db=emlio\n"
            "  --influx-interval S seconds between pushes (default 10)\n");
}

/* Sets up the metrics endpoint and the InfluxDB pusher (docs/energy.md,
 * "Exports"). Returns 0 or < 0 after printing why. */
static int
s_start_metrics(emlio_ctx_t *ctx, emlio_server_t *srv, const char *addr,
                const char *influx, double interval_s, emlio_metrics_t **out)
{
    emlio_metrics_t *m = emlio__metrics_new(ctx, srv);
    int rc = m ? 0 : EMLIO_ENOMEM;
    if (rc == 0)
        rc = emlio__metrics_set_powercap_root(m, getenv("EMLIO_POWERCAP_ROOT"));
    if (rc == 0 && addr)
        rc = emlio__metrics_listen(m, addr);
    if (rc == 0 && influx)
        rc = emlio__metrics_set_influx(m, influx, interval_s);
    if (rc == 0)
        rc = emlio__metrics_start(m);
    if (rc < 0)
        fprintf(stderr, "emliod: %s\n",
                m && *emlio__metrics_errmsg(m) ? emlio__metrics_errmsg(m)
                                               : emlio_strerror(rc));
    *out = m;
    return rc;
}

static int
s_parse_uint(const char *opt, const char *arg, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || *end || end == arg || v == 0 || v > UINT32_MAX) {
        fprintf(stderr,
                "emliod: invalid value '%s' for %s: expected a "
                "positive integer\n",
                arg, opt);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int
main(int argc, char **argv)
{
    enum {
        O_WORKERS = 256,
        O_MAX_BATCH,
        O_MAX_CREDIT,
        O_BYTES_KEY,
        O_LABEL_KEY,
        O_RAW,
        O_NO_VERIFY,
        O_NO_WRITE_INDEX,
        O_ON_CORRUPT,
        O_LOG_LEVEL,
        O_CURVE_SECRET,
        O_AUTHORIZED_KEYS,
        O_MAX_CLIENTS,
        O_IDLE_TIMEOUT,
        O_SNDBUF,
        O_SERIALIZERS,
        O_QUEUE_DEPTH,
        O_NO_READAHEAD,
        O_DROP_BEHIND,
        O_METRICS,
        O_INFLUX,
        O_INFLUX_INTERVAL
    };
    static const struct option opts[] = {
        { "data", required_argument, NULL, 'd' },
        { "bind", required_argument, NULL, 'b' },
        { "workers", required_argument, NULL, O_WORKERS },
        { "readers", required_argument, NULL, O_WORKERS },
        { "serializers", required_argument, NULL, O_SERIALIZERS },
        { "queue-depth", required_argument, NULL, O_QUEUE_DEPTH },
        { "no-readahead", no_argument, NULL, O_NO_READAHEAD },
        { "drop-behind", no_argument, NULL, O_DROP_BEHIND },
        { "max-batch", required_argument, NULL, O_MAX_BATCH },
        { "max-credit", required_argument, NULL, O_MAX_CREDIT },
        { "bytes-key", required_argument, NULL, O_BYTES_KEY },
        { "label-key", required_argument, NULL, O_LABEL_KEY },
        { "raw", no_argument, NULL, O_RAW },
        { "no-verify", no_argument, NULL, O_NO_VERIFY },
        { "no-write-index", no_argument, NULL, O_NO_WRITE_INDEX },
        { "on-corrupt", required_argument, NULL, O_ON_CORRUPT },
        { "log-level", required_argument, NULL, O_LOG_LEVEL },
        { "curve-secret", required_argument, NULL, O_CURVE_SECRET },
        { "authorized-keys", required_argument, NULL, O_AUTHORIZED_KEYS },
        { "max-clients", required_argument, NULL, O_MAX_CLIENTS },
        { "idle-timeout", required_argument, NULL, O_IDLE_TIMEOUT },
        { "sndbuf", required_argument, NULL, O_SNDBUF },
        { "metrics", required_argument, NULL, O_METRICS },
        { "influx", required_argument, NULL, O_INFLUX },
        { "influx-interval", required_argument, NULL, O_INFLUX_INTERVAL },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    const char *bind = NULL;
    const char *curve_secret_path = NULL;
    int log_level = EMLIO_LOG_INFO;
    const char *metrics_addr = NULL;
    const char *influx_url = NULL;
    double influx_interval = 10;
    int c;
    while ((c = getopt_long(argc, argv, "d:b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            cfg.data_dir = optarg;
            break;
        case 'b':
            bind = optarg;
            break;
        case O_WORKERS:
            if (s_parse_uint("--workers", optarg, &cfg.workers) < 0)
                return 2;
            break;
        case O_MAX_BATCH:
            if (s_parse_uint("--max-batch", optarg, &cfg.max_batch) < 0)
                return 2;
            break;
        case O_MAX_CREDIT:
            if (s_parse_uint("--max-credit", optarg, &cfg.max_credit) < 0)
                return 2;
            break;
        case O_BYTES_KEY:
            cfg.bytes_key = optarg;
            break;
        case O_LABEL_KEY:
            cfg.label_key = optarg;
            break;
        case O_RAW:
            cfg.raw = true;
            break;
        case O_NO_VERIFY:
            cfg.verify = false;
            break;
        case O_NO_WRITE_INDEX:
            cfg.write_index = false;
            break;
        case O_ON_CORRUPT:
            if (!strcmp(optarg, "fail")) {
                cfg.on_corrupt = EMLIO_ON_CORRUPT_FAIL;
            } else if (!strcmp(optarg, "skip")) {
                cfg.on_corrupt = EMLIO_ON_CORRUPT_SKIP;
            } else {
                fprintf(stderr,
                        "emliod: invalid --on-corrupt '%s': expected "
                        "fail or skip\n",
                        optarg);
                return 2;
            }
            break;
        case O_LOG_LEVEL:
            log_level = -1;
            for (int i = 0; i < 4; i++)
                if (!strcmp(optarg, s_levels[i]))
                    log_level = i;
            if (log_level < 0) {
                fprintf(stderr, "emliod: invalid --log-level '%s'\n", optarg);
                return 2;
            }
            break;
        case O_CURVE_SECRET:
            curve_secret_path = optarg;
            break;
        case O_AUTHORIZED_KEYS:
            cfg.authorized_keys = optarg;
            break;
        case O_MAX_CLIENTS:
            if (s_parse_uint("--max-clients", optarg, &cfg.max_clients) < 0)
                return 2;
            break;
        case O_SERIALIZERS:
            if (s_parse_uint("--serializers", optarg, &cfg.serializers) < 0)
                return 2;
            break;
        case O_QUEUE_DEPTH:
            if (s_parse_uint("--queue-depth", optarg, &cfg.queue_depth) < 0)
                return 2;
            break;
        case O_NO_READAHEAD:
            cfg.readahead = false;
            break;
        case O_DROP_BEHIND:
            cfg.drop_behind = true;
            break;
        case O_SNDBUF: {
            uint32_t bytes = 0;
            if (!strcmp(optarg, "auto")) {
                cfg.sndbuf = 0;
            } else if (!strcmp(optarg, "kernel")) {
                cfg.sndbuf = -1;
            } else if (s_parse_uint("--sndbuf", optarg, &bytes) < 0) {
                return 2;
            } else if (bytes == 0 || bytes > (1u << 30)) {
                fprintf(stderr, "emliod: --sndbuf takes auto, kernel or "
                                "1..1073741824 bytes\n");
                return 2;
            } else {
                cfg.sndbuf = bytes;
            }
            break;
        }
        case O_IDLE_TIMEOUT: {
            uint32_t secs;
            if (s_parse_uint("--idle-timeout", optarg, &secs) < 0 ||
                secs > UINT32_MAX / 1000)
                return 2;
            cfg.idle_timeout_ms = secs * 1000;
            break;
        }
        case O_METRICS:
            metrics_addr = optarg;
            break;
        case O_INFLUX:
            influx_url = optarg;
            break;
        case O_INFLUX_INTERVAL: {
            char *end;
            influx_interval = strtod(optarg, &end);
            if (*end || end == optarg ||
                !(influx_interval >= 0.05 && influx_interval <= 86400)) {
                fprintf(stderr,
                        "emliod: invalid --influx-interval '%s': expected "
                        "0.05 to 86400 seconds\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'h':
            s_usage(stdout);
            return 0;
        default:
            s_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "emliod: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    char curve_secret[EMLIO_CURVE_KEY_LEN];
    if (curve_secret_path) {
        int krc = emlio_curve_read_key(curve_secret_path, curve_secret);
        if (krc < 0) {
            fprintf(stderr, "emliod: cannot read curve secret '%s': %s\n",
                    curve_secret_path,
                    krc == EMLIO_EFORMAT ? "not a Z85 key"
                                         : emlio_strerror(krc));
            return 2;
        }
        cfg.curve_secret_key = curve_secret;
    } else if (cfg.authorized_keys) {
        fprintf(stderr, "emliod: --authorized-keys needs --curve-secret\n");
        return 2;
    }
    if (!cfg.data_dir || !bind) {
        fprintf(stderr, "emliod: --data and --bind are required\n");
        s_usage(stderr);
        return 2;
    }

    /* ZeroMQ allocates a buffer per received message; keep freed memory in
     * the heap instead of returning it to the kernel each time, since
     * faulting fresh pages in is expensive (~16 us a page on our VMs). */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);

    /* Block the stop signals before any thread exists, so every library
     * thread inherits the mask and only sigwait below receives them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    emlio_ctx_t *ctx = emlio_ctx_new();
    if (!ctx) {
        fprintf(stderr, "emliod: out of memory\n");
        return 1;
    }
    emlio_ctx_set_log(ctx, s_log, NULL, log_level);
    emlio_server_t *srv = emlio_server_new(ctx, &cfg);
    int rc = srv ? 0 : EMLIO_ENOMEM;
    if (rc == 0 && (rc = emlio_server_load(srv)) < 0)
        fprintf(stderr, "emliod: cannot load dataset: %s\n",
                emlio_server_errmsg(srv));
    else if (rc >= 0 && (rc = emlio_server_bind(srv, bind)) < 0)
        fprintf(stderr, "emliod: %s\n", emlio_server_errmsg(srv));
    else if (rc >= 0 && (rc = emlio_server_start(srv)) < 0)
        fprintf(stderr, "emliod: cannot start: %s\n", emlio_server_errmsg(srv));
    emlio_metrics_t *metrics = NULL;
    if (rc >= 0 && (metrics_addr || influx_url))
        rc = s_start_metrics(ctx, srv, metrics_addr, influx_url,
                             influx_interval, &metrics);
    if (rc >= 0) {
        printf("emliod: listening on %s\n", emlio_server_endpoint(srv));
        if (metrics_addr)
            printf("emliod: metrics on http://%s/metrics\n",
                   emlio__metrics_address(metrics));
        fflush(stdout);
        int sig = 0;
        while (sigwait(&stop, &sig) != 0)
            ;
        emlio_server_stats_t st;
        emlio_server_stats(srv, &st);
        fprintf(stderr,
                "emliod: %s, stopping: %" PRIu64 " requests, %" PRIu64
                " samples, %" PRIu64 " bytes, %" PRIu64 " errors, %" PRIu64
                " refused\n",
                strsignal(sig), st.requests, st.samples, st.bytes, st.errors,
                st.auth_refused);
    }
    emlio__metrics_destroy(&metrics); /* pushes a last point; reads srv */
    emlio_server_destroy(&srv);
    emlio_ctx_destroy(&ctx);
    memset(curve_secret, 0, sizeof(curve_secret));
    return rc < 0 ? 1 : 0;
}
