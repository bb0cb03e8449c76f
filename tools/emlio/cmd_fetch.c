/* cmd_fetch.c - `emlio fetch`: runs whole epochs against emliod daemons and
 * reports throughput; optionally proves exactly-once delivery.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "sha256.h"

#include "cli.h"
#include "commands.h"
#include "dataset_util.h"
#include "emlio.h"
#include "emlio/buf.h"
#include "fetch_metrics.h"
#include "fetch_path.h"
#include "fetch_sources.h"
#include "fetch_state.h"
#include "influx.h"

/* Set by SIGINT/SIGTERM; checked between batches. */
static volatile sig_atomic_t s_interrupted;

static void
s_on_signal(int sig)
{
    (void)sig;
    s_interrupted = 1;
}

static double
s_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* The state file (fetch_state.h) is written after every batch, after that
 * batch's ids are flushed, and replaced atomically; a run killed at any
 * point resumes from the last batch whose ids and state were both written,
 * and cuts the ids file back to match, so every sample appears exactly once
 * even after kill -9. */
static int
s_save_state(emlio_client_t *client, const char *path, FILE *ids,
             const char *ids_path)
{
    return fetch_state_save(client, path, ids, ids_path);
}

/* Exactly-once bookkeeping for one epoch: one bit per (shard, record) of
 * the rank's plan, set when the sample arrives. A blend of sources may
 * plan a sample several times (a source asked for more than it has):
 * then a count per sample instead, each arrival checked against it. */
typedef struct s_verifier {
    uint64_t *first; /* first global record number of each shard */
    uint8_t *planned;
    uint8_t *seen;
    uint16_t *planned_n; /* with sources: times planned, saturating */
    uint16_t *seen_n;
    uint64_t total;
    uint64_t expected;
    uint64_t received;
    uint64_t duplicates;
    uint64_t unplanned;
} s_verifier_t;

static int
s_verifier_begin(s_verifier_t *v, emlio_client_t *client)
{
    size_t shards = emlio_client_shard_count(client);
    if (!v->first) {
        v->first = calloc(shards + 1, sizeof(uint64_t));
        if (!v->first)
            return -1;
        for (size_t i = 0; i < shards; i++)
            v->first[i + 1] =
                v->first[i] + emlio_client_shard_records(client, i);
        v->total = v->first[shards];
        v->planned = calloc(v->total / 8 + 1, 1);
        v->seen = calloc(v->total / 8 + 1, 1);
        if (!v->planned || !v->seen)
            return -1;
        if (emlio_client_source_count(client)) {
            v->planned_n = calloc(v->total + 1, sizeof(uint16_t));
            v->seen_n = calloc(v->total + 1, sizeof(uint16_t));
            if (!v->planned_n || !v->seen_n)
                return -1;
        }
    }
    memset(v->planned, 0, v->total / 8 + 1);
    memset(v->seen, 0, v->total / 8 + 1);
    if (v->planned_n) {
        memset(v->planned_n, 0, (v->total + 1) * sizeof(uint16_t));
        memset(v->seen_n, 0, (v->total + 1) * sizeof(uint16_t));
    }
    v->expected = v->received = v->duplicates = v->unplanned = 0;
    const emlio_plan_t *plan = emlio_client_plan(client);
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t n;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
        for (size_t i = 0; i < n; i++) {
            if (s[i].pad)
                continue;
            uint64_t g = v->first[s[i].shard] + s[i].record;
            v->planned[g / 8] |= (uint8_t)(1u << (g % 8));
            if (v->planned_n && v->planned_n[g] < UINT16_MAX)
                v->planned_n[g]++;
            v->expected++;
        }
    }
    return 0;
}

static void
s_verifier_add(s_verifier_t *v, const emlio_sample_t *s)
{
    if (s->pad)
        return;
    uint64_t g = v->first[s->shard] + s->record;
    uint8_t bit = (uint8_t)(1u << (g % 8));
    if (v->planned_n && (v->planned[g / 8] & bit)) {
        if (v->seen_n[g] < v->planned_n[g] || v->planned_n[g] == UINT16_MAX)
            v->received++;
        else
            v->duplicates++;
        v->seen_n[g] += v->seen_n[g] < UINT16_MAX;
        return;
    }
    if (!(v->planned[g / 8] & bit))
        v->unplanned++;
    else if (v->seen[g / 8] & bit)
        v->duplicates++;
    else
        v->received++;
    v->seen[g / 8] |= bit;
}

static void
s_verifier_release(s_verifier_t *v)
{
    free(v->first);
    free(v->planned);
    free(v->seen);
    free(v->planned_n);
    free(v->seen_n);
}

/* One JSON line per epoch on stdout: T, wait, volume, CPU and energy, with
 * every energy figure labelled with its source. */
static void
s_print_epoch(uint64_t epoch, const emlio_client_stats_t *st, uint64_t samples,
              uint64_t bytes, const emlio_energy_report_t *rep, bool partial,
              const emlio_client_t *client, const uint64_t *source_samples)
{
    printf("{\"epoch\": %" PRIu64 ", \"partial\": %s, \"seconds\": %.6f"
           ", \"wait_s\": %.6f, \"first_batch_s\": %.6f, \"samples\": %" PRIu64
           ", \"bytes\": %" PRIu64 ", \"cpu_s\": %.4f, \"energy_j\": %.6f"
           ", \"energy_source\": \"%s\", \"modelled\": %s"
           ", \"j_per_sample\": %.9f, \"j_per_gb\": %.4f, \"domains\": {",
           epoch, partial ? "true" : "false", rep->wall_s, st->wait_s,
           st->first_batch_s, samples, bytes, rep->cpu_s, rep->energy_j,
           rep->source, rep->modelled ? "true" : "false",
           samples ? rep->energy_j / (double)samples : 0,
           bytes ? rep->energy_j / ((double)bytes / 1e9) : 0);
    for (size_t i = 0; i < rep->n_domains; i++)
        printf("%s\"%s\": {\"joules\": %.6f, \"source\": \"%s\"}",
               i ? ", " : "", rep->domains[i].name, rep->domains[i].joules,
               rep->domains[i].source);
    printf("}");
    /* Sources: what this rank got of each, and each one's quota over all
     * ranks. Names are checked printable; quotes and backslashes escaped. */
    size_t n_src = emlio_client_source_count(client);
    if (n_src)
        printf(", \"sources\": {");
    for (size_t i = 0; i < n_src; i++) {
        printf("%s\"", i ? ", " : "");
        for (const char *c = emlio_client_source_name(client, i); *c; c++)
            printf(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        printf("\": {\"samples\": %" PRIu64 ", \"quota\": %" PRIu64 "}",
               source_samples[i], emlio_client_source_quota(client, i));
    }
    if (n_src)
        printf("}");
    fetch_path_json(stdout, client, NULL);
    fetch_path_xf_json(stdout, client);
    printf("}\n");
}

/* Pushes the epoch's figures (those of s_print_epoch) to InfluxDB as one
 * emlio_epoch point. A failure is a warning: the data path goes on. */
static void
s_push_epoch(const tool_influx_url_t *url, uint64_t epoch, uint32_t rank,
             uint32_t world, const emlio_client_stats_t *st, uint64_t samples,
             uint64_t bytes, const emlio_energy_report_t *rep)
{
    char host[256] = "unknown";
    char r[16];
    char w[16];
    gethostname(host, sizeof(host) - 1);
    snprintf(r, sizeof(r), "%u", rank);
    snprintf(w, sizeof(w), "%u", world);
    emlio_buf_t body = EMLIO_BUF_INIT;
    tool_influx_point_t p;
    tool_influx_begin(&p, &body, "emlio_epoch");
    tool_influx_tag(&p, "host", host);
    tool_influx_tag(&p, "rank", r);
    tool_influx_tag(&p, "world", w);
    tool_influx_int(&p, "epoch", (int64_t)epoch);
    tool_influx_float(&p, "seconds", rep->wall_s);
    tool_influx_float(&p, "wait_s", st->wait_s);
    tool_influx_float(&p, "first_batch_s", st->first_batch_s);
    tool_influx_int(&p, "samples", (int64_t)samples);
    tool_influx_int(&p, "bytes", (int64_t)bytes);
    tool_influx_float(&p, "cpu_s", rep->cpu_s);
    tool_influx_float(&p, "energy_j", rep->energy_j);
    tool_influx_float(&p, "j_per_sample",
                      samples ? rep->energy_j / (double)samples : 0);
    tool_influx_str(&p, "energy_source", rep->source);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char err[512] = "out of memory";
    int rc = tool_influx_end(&p, (int64_t)now.tv_sec * 1000000000 +
                                     (int64_t)now.tv_nsec);
    if (rc == 0)
        rc = tool_influx_post(url, body.data, body.len, 2000, err);
    if (rc < 0)
        fprintf(stderr,
                "emlio fetch: warning: cannot push epoch %" PRIu64
                " to influx: %s\n",
                epoch, err);
    emlio_buf_release(&body);
}

/* Everything one `emlio fetch` run needs: its options, the open files and
 * the running totals. */
static const opt_choice_t s_corrupt_modes[] = {
    { "fail", EMLIO_ON_CORRUPT_FAIL },
    { "skip", EMLIO_ON_CORRUPT_SKIP },
    { NULL, 0 },
};

typedef struct s_fetch {
    cli_plan_opts_t plan;
    emlio_client_config_t cfg;
    uint64_t epochs;
    bool verify;
    bool quiet;
    bool digests;           /* --ids lines carry each sample's SHA-256 */
    bool labels;            /* --ids lines carry each sample's label */
    const char *decode_at;  /* --decode-at */
    int on_corrupt;         /* --on-corrupt: enum emlio_on_corrupt */
    const char *share_join; /* --share-join */
    double progress_s;      /* --progress: a plain line every S s (0: off) */
    const char *ids_path;
    const char *state_path;
    const char *resume_from; /* --resume-from: every rank's states */
    double resume_s;         /* reading and merging them */
    const char *server_key_path;
    const char *client_key_path;
    const char *influx_arg;
    tool_influx_url_t influx;
    const char *metrics_arg;
    fetch_metrics_t *metrics;
    double last_metrics;
    char server_key[EMLIO_CURVE_KEY_LEN];
    char client_pub[EMLIO_CURVE_KEY_LEN];
    char client_sec[EMLIO_CURVE_KEY_LEN];
    /* The run. */
    emlio_ctx_t *ctx;
    emlio_client_t *client;
    emlio_energy_t *meter;
    FILE *ids;
    int ids_errno; /* the first failed write of an ids line */
    s_verifier_t ver;
    bool resumed;
    bool tty;
    bool failed_verify;
    uint64_t ids_offset;
    uint64_t epoch;
    uint64_t epochs_done;
    uint64_t skipped;
    uint64_t samples;
    uint64_t bytes;
    uint64_t batches;
    uint64_t pads;
    uint32_t inflight;
    double t0;
    double cpu0;
    double first_batch_s;
    fetch_ramp_t ramp; /* bytes handed over in time since t0 */
    double wait_s;
    double compute_s; /* --compute-s: each batch held this long */
    double computed;  /* seconds spent holding batches so far */
    double energy_j;
    /* The daemons' device reads and shared-cache bytes of every epoch so
     * far: the client's figures are the current epoch's. */
    uint64_t disk_read_bytes, shared_bytes;
    char energy_source[24];
    double last_progress;
    bool progress_drawn;    /* a redrawn line is on the terminal */
    uint64_t epoch0;        /* the first epoch this run fetches */
    opt_list_t source_opts; /* --source NAME=EP[,EP...][@WEIGHT] */
    emlio_source_t sources[OPT_LIST_MAX];
    uint64_t source_samples[OPT_LIST_MAX]; /* this epoch's, padding aside */
    char *source_text;        /* the --source values split in place */
    const char *sources_path; /* --sources FILE */
    char *sources_file_text;  /* its text, the sources pointing into it */
} s_fetch_t;

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(out, "usage: emlio fetch --connect EP[,EP...] --batch B "
                 "[options]\n\n");
    opt_usage(out, tables);
    fprintf(out, "\nThe last line of stdout is a JSON object with the "
                 "figures.\n");
}

/* --source NAME=EP[,EP...][@WEIGHT]: the values split in one copy. The
 * weight is what follows the last '@' when it reads as a number (an ipc
 * path may hold an '@' of its own); 1 when none is given. */
static int
s_parse_sources(s_fetch_t *self)
{
    size_t len = 0;
    for (size_t i = 0; i < self->source_opts.n; i++)
        len += strlen(self->source_opts.v[i]) + 1;
    char *p = self->source_text = malloc(len ? len : 1);
    if (!p) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        return -1;
    }
    for (size_t i = 0; i < self->source_opts.n; i++) {
        const char *arg = self->source_opts.v[i];
        char *text = strcpy(p, arg);
        p += strlen(arg) + 1;
        char *eq = strchr(text, '=');
        if (!eq || eq == text || !eq[1]) {
            fprintf(stderr,
                    "emlio fetch: --source '%s': expected "
                    "NAME=EP[,EP...][@WEIGHT]\n",
                    arg);
            return -1;
        }
        *eq = '\0';
        double weight = 1;
        char *at = strrchr(eq + 1, '@');
        if (at) {
            char *end;
            errno = 0;
            double w = strtod(at + 1, &end);
            if (end != at + 1 && !*end) {
                if (errno || !isfinite(w) || w <= 0) {
                    fprintf(stderr,
                            "emlio fetch: --source '%s': the weight must be "
                            "a positive, finite number\n",
                            arg);
                    return -1;
                }
                weight = w;
                *at = '\0';
            }
        }
        self->sources[i] = (emlio_source_t){ text, eq + 1, weight, 0 };
    }
    self->cfg.sources = self->sources;
    self->cfg.n_sources = (uint32_t)self->source_opts.n;
    return 0;
}

/* Parses argv into self. Returns -1 to go on, else the exit status. */
static int
s_parse_args(s_fetch_t *self, int argc, char **argv)
{
    emlio_client_config_t *cfg = &self->cfg;
    opt_t shared[CLI_PLAN_NOPTS + 1];
    cli_plan_opts_init(&self->plan);
    cli_plan_opts_table(&self->plan, shared);
    const opt_t own[] = {
        OPT("epochs", 0, OPT_U64, &self->epochs, "E",
            "epochs to run (default 1)"),
        OPT("streams", 0, OPT_U32, &cfg->streams, "N",
            "TCP streams per daemon (default: tuned, 2 to 64)", .min = 1,
            .max = 64),
        OPT("inflight", 0, OPT_U32, &cfg->inflight, "K",
            "batches in flight (default: auto, BDP)"),
        OPT("request-bytes", 0, OPT_SIZE, &cfg->request_bytes, "N",
            "ask for a batch in GETs of about N bytes\n"
            "each (default 2M; 1T: one per daemon)"),
        OPT("io-threads", 0, OPT_U32, &cfg->io_threads, "N",
            "ZeroMQ I/O threads the streams use (default:\n"
            "one, two when it runs full; all on loopback)",
            .min = 1, .max = 2),
        OPT("in-order", 0, OPT_FLAG, &cfg->in_order, NULL,
            "deliver in plan order"),
        OPT("no-crc", 0, OPT_UNSET, &cfg->verify, NULL,
            "skip the per-sample CRC-32C check"),
        OPT("verify", 0, OPT_FLAG, &self->verify, NULL,
            "exit non-zero unless every planned sample\n"
            "arrived exactly once, intact"),
        OPT("ids", 0, OPT_STR, &self->ids_path, "FILE",
            "write 'EPOCH SHARD RECORD' per sample\n"
            "(padding lines end in ' pad')"),
        OPT("labels", 0, OPT_FLAG, &self->labels, NULL,
            "add each sample's label to its --ids line\n"
            "(after the record)"),
        OPT("digests", 0, OPT_FLAG, &self->digests, NULL,
            "add each sample's SHA-256 to its --ids line\n"
            "(after the record and label)"),
        OPT("job", 0, OPT_STR, &cfg->job, "NAME",
            "the training job this run belongs to: the\n"
            "daemons share their readers among jobs by\n"
            "weight (default: $EMLIO_JOB, $TORCHELASTIC_RUN_ID,\n"
            "$SLURM_JOB_ID, or a job of its own)"),
        OPT("job-weight", 0, OPT_U32, &cfg->job_weight, "W",
            "the weight the job asks for (1..1000; capped\n"
            "by the daemon's --job-weight)",
            .min = 1, .max = 1000),
        OPT("share", 0, OPT_FLAG, &cfg->share, NULL,
            "share reads with the other jobs over this\n"
            "dataset: plan from its shared schedule and be\n"
            "served from the chunks the daemons read once\n"
            "for all (docs/fairness.md)"),
        OPT("share-join", 0, OPT_STR, &self->share_join, "auto|C",
            "with --share: where epoch 0 begins in the\n"
            "shared schedule: auto (default) where the\n"
            "daemons' sharing jobs are now, or cursor C\n"
            "(0: the start; the share_join a run reported)"),
        OPT("disjoint-shards", 0, OPT_FLAG, &cfg->disjoint_shards, NULL,
            "shards of one name with different content on\n"
            "different daemons are distinct shards (an\n"
            "ImageFolder split over nodes by files);\n"
            "default: refused"),
        OPT("state", 0, OPT_STR, &self->state_path, "FILE",
            "resume from / save progress to FILE"),
        OPT("resume-from", 0, OPT_STR, &self->resume_from, "GLOB|DIR",
            "resume the job from every rank's --state of\n"
            "its last run, on this run's world size (same\n"
            "global batch); --state then only saves"),
        OPT("fields", 0, OPT_STR, &cfg->fields, "LIST",
            "ask for these fields of every sample, in this\n"
            "order (e.g. jpg,cls); default: the daemon's"),
        OPT("transform", 0, OPT_STR, &cfg->transform, "SPEC",
            "deliver uint8 tensors: decode and augment,\n"
            "e.g. random_resized_crop(224),horizontal_flip"),
        OPT("decode-at", 0, OPT_STR, &self->decode_at, "WHERE",
            "auto (default: by time and energy), client\n"
            "or server"),
        OPT("on-corrupt", 0, OPT_CHOICE, &self->on_corrupt, "MODE",
            "an image that does not decode here: fail\n"
            "(default) or skip it (as emliod --on-corrupt)",
            .choices = s_corrupt_modes),
        OPT("transform-threads", 0, OPT_U32, &cfg->transform_threads, "N",
            "decode threads here (default: one per CPU)", .max = 1024),
        OPT("max-pixels", 0, OPT_SIZE, &cfg->max_pixels, "N",
            "refuse images above N pixels (100M)"),
        OPT("timeout-ms", 0, OPT_INT, &cfg->timeout_ms, "MS",
            "fail when no reply comes for MS (60000)"),
        OPT("connect-timeout-ms", 0, OPT_INT, &cfg->connect_timeout_ms, "MS",
            "give up connecting after MS (10000)"),
        OPT("compute-s", 0, OPT_DOUBLE, &self->compute_s, "S",
            "hold each batch S seconds, as an accelerator\n"
            "computing on it would, and report accelerator\n"
            "utilisation (compute / wall time, as MLPerf\n"
            "Storage counts it)",
            .dmin = 0, .dmax = 3600),
        OPT("quiet", 0, OPT_FLAG, &self->quiet, NULL, "no progress line"),
        OPT("progress", 0, OPT_DOUBLE, &self->progress_s, "S",
            "a plain progress line on stderr every S s (0.2\n"
            "and up) and at each epoch's end, terminal or\n"
            "not (Slurm, nohup); default: a redrawn line on\n"
            "a terminal",
            .dmin = 0.2, .dmax = 86400),
        OPT("influx", 0, OPT_STR, &self->influx_arg, "URL",
            "push an emlio_epoch point per epoch, e.g.\n"
            "http://127.0.0.1:8086/write?db=emlio"),
        OPT("metrics", 0, OPT_STR, &self->metrics_arg, "HOST:PORT",
            "serve Prometheus metrics (RTT, streams, rate\n"
            "per stream, what limits) at\n"
            "http://HOST:PORT/metrics (port 0: any)"),
        OPT("server-key", 0, OPT_STR, &self->server_key_path, "FILE",
            "the daemon's CURVE public key"),
        OPT("client-key", 0, OPT_STR, &self->client_key_path, "FILE",
            "this client's CURVE secret key"),
        OPT("source", 0, OPT_LIST, &self->source_opts,
            "NAME=EP[,EP...][@WEIGHT]",
            "a source of a blended job: its daemons and weight (1);\n"
            "repeat for each source, instead of --connect\n"
            "(docs/planner.md, \"Sources\")"),
        OPT("sources", 0, OPT_STR, &self->sources_path, "FILE",
            "the sources as a JSON list of {name, endpoints, weight\n"
            "or samples} (instead of --source)"),
        OPT("epoch-samples", 0, OPT_U64, &cfg->epoch_samples, "N",
            "samples per epoch over all ranks with --source\n"
            "(default: the sum of the sources' sizes)"),
        OPT("stratify", 0, OPT_FLAG, &cfg->stratify, NULL,
            "with --source: every global batch holds each source's\n"
            "share within one sample"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "this text"),
        OPT_END,
    };
    const opt_t *const tables[] = { shared, own, NULL };
    self->epochs = 1;
    int status = cli_parse("fetch", tables, argc, argv, s_usage);
    if (status >= 0)
        return status;
    if (self->sources_path && self->source_opts.n) {
        fprintf(stderr, "emlio fetch: give the sources by --source or in "
                        "--sources FILE, not both\n");
        return 2;
    }
    if (self->sources_path) {
        char err[512];
        size_t n;
        if (fetch_sources_load(self->sources_path, self->sources, OPT_LIST_MAX,
                               &n, &self->sources_file_text, err,
                               sizeof(err)) < 0) {
            fprintf(stderr, "emlio fetch: --sources %s\n", err);
            return 2;
        }
        self->cfg.sources = self->sources;
        self->cfg.n_sources = (uint32_t)n;
    }
    if (self->source_opts.n && s_parse_sources(self) < 0)
        return 2;
    if (self->cfg.n_sources && self->plan.connect) {
        fprintf(stderr, "emlio fetch: the sources name the daemons: give "
                        "them or --connect, not both\n");
        return 2;
    }
    if ((!self->plan.connect && !self->cfg.n_sources) ||
        self->plan.batch == 0) {
        fprintf(stderr, "emlio fetch: --connect (or --source) and a positive "
                        "--batch are required\n");
        return 2;
    }
    if (self->decode_at) {
        int where = emlio_decode_at_parse(self->decode_at);
        if (where < 0) {
            fprintf(stderr,
                    "emlio fetch: invalid value '%s' for --decode-at "
                    "(auto, client or server)\n",
                    self->decode_at);
            return 2;
        }
        self->cfg.decode_at = where;
    }
    self->cfg.on_corrupt = (uint8_t)self->on_corrupt;
    if (self->share_join && strcmp(self->share_join, "auto") != 0) {
        char *end;
        errno = 0;
        unsigned long long c = strtoull(self->share_join, &end, 10);
        if (errno || end == self->share_join || *end ||
            self->share_join[0] == '-') {
            fprintf(stderr,
                    "emlio fetch: invalid value '%s' for --share-join "
                    "(auto, or a cursor 0..2^64-1)\n",
                    self->share_join);
            return 2;
        }
        self->cfg.share_join_mode = EMLIO_SHARE_JOIN_AT;
        self->cfg.share_join = c;
    }
    if ((self->digests || self->labels) && !self->ids_path) {
        fprintf(stderr, "emlio fetch: --%s goes with --ids FILE\n",
                self->digests ? "digests" : "labels");
        return 2;
    }
    for (size_t i = 0; i < self->cfg.n_sources; i++)
        if (cli_check_connect("fetch", self->sources[i].endpoints) < 0)
            return 2;
    if (self->plan.connect &&
        cli_check_connect("fetch", self->plan.connect) < 0)
        return 2;
    return -1;
}

/* Applies the parsed options to cfg: the plan, rank, keys, the InfluxDB
 * URL. Returns 0 or -1 after printing why. */
static int
s_configure(s_fetch_t *self)
{
    emlio_client_config_t *cfg = &self->cfg;
    if (cli_rank_from_env("fetch", &self->plan) < 0)
        return -1;
    cfg->batch_size = (uint32_t)self->plan.batch;
    cfg->seed = self->plan.seed;
    cfg->shuffle = self->plan.shuffle;
    cfg->window_shards = self->plan.window_shards;
    cfg->drop_last = self->plan.drop_last;
    cfg->rank = (uint32_t)self->plan.rank;
    cfg->world = (uint32_t)self->plan.world;
    if (self->verify)
        cfg->verify = true; /* --verify proves intact bytes: CRCs stay on */
    if (self->influx_arg) {
        char err[512];
        if (tool_influx_url_parse(&self->influx, self->influx_arg, err) < 0) {
            fprintf(stderr, "emlio fetch: --influx: %s\n", err);
            return -1;
        }
    }
    if (!self->server_key_path != !self->client_key_path) {
        fprintf(stderr, "emlio fetch: --server-key and --client-key go "
                        "together\n");
        return -1;
    }
    if (!self->server_key_path)
        return 0;
    const char *bad = self->server_key_path;
    int krc = emlio_curve_read_key(self->server_key_path, self->server_key);
    if (krc == 0) {
        bad = self->client_key_path;
        krc = emlio_curve_read_key(self->client_key_path, self->client_sec);
    }
    if (krc == 0 && emlio_curve_public(self->client_pub, self->client_sec) < 0)
        krc = EMLIO_EFORMAT;
    if (krc < 0) {
        fprintf(stderr, "emlio fetch: cannot read key '%s': %s\n", bad,
                krc == EMLIO_EFORMAT ? "not a Z85 key" : emlio_strerror(krc));
        return -1;
    }
    cfg->curve_server_key = self->server_key;
    cfg->curve_public_key = self->client_pub;
    cfg->curve_secret_key = self->client_sec;
    return 0;
}

/* Loads the --state file when there is one: the client resumes the saved
 * epoch, and ids_offset is where the matching --ids file ends. */
static int
s_load_state(s_fetch_t *self)
{
    fetch_state_t st;
    int rc = fetch_state_load(self->state_path, &st);
    if (rc > 0 && self->ids_path &&
        fetch_state_check_ids(&st, self->state_path, self->ids_path) < 0)
        rc = -1;
    if (rc > 0 &&
        emlio_client_load_state(self->client, st.blob, st.blob_len) < 0) {
        fprintf(stderr, "emlio fetch: cannot resume from '%s': %s\n",
                self->state_path, emlio_client_errmsg(self->client));
        rc = -1;
    }
    self->ids_offset = st.ids_len;
    fetch_state_release(&st);
    if (rc <= 0)
        return rc;
    self->resumed = true;
    emlio_client_stats_t cst;
    emlio_client_stats(self->client, &cst);
    self->epoch = cst.epoch;
    return 0;
}

/* Connects, resumes from --state, opens --ids and the energy meter. */
static int
s_open(s_fetch_t *self)
{
    /* The epochs to run are known: the next one's batches are requested
     * while the current one's last arrive, and none past the last. */
    self->cfg.end_epoch = self->epochs;
    self->ctx = emlio_ctx_new();
    if (self->ctx)
        cli_install_log(self->ctx);
    self->client = self->ctx ? emlio_client_new(self->ctx, &self->cfg) : NULL;
    self->meter = emlio_energy_new();
    if (!self->client || !self->meter) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        return -1;
    }
    if (emlio_client_connect(self->client, self->plan.connect) < 0) {
        fprintf(stderr, "emlio fetch: %s\n", emlio_client_errmsg(self->client));
        return -1;
    }
    if (self->resume_from) {
        /* --ids starts afresh: the earlier runs' ids are in their files. */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (fetch_state_resume_from(self->client, self->resume_from,
                                    self->state_path) < 0)
            return -1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        self->resume_s = (double)(t1.tv_sec - t0.tv_sec) +
                         (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        emlio_client_stats_t cst;
        emlio_client_stats(self->client, &cst);
        self->epoch = cst.epoch;
        self->resumed = true;
        self->ids_offset = 0;
    } else if (self->state_path && s_load_state(self) < 0) {
        return -1;
    }
    const char *ids_path = self->ids_path;
    bool append = self->resumed && !self->resume_from;
    if (ids_path && !(self->ids = fopen(ids_path, append ? "a" : "w"))) {
        fprintf(stderr, "emlio fetch: cannot open '%s': %s\n", ids_path,
                strerror(errno));
        return -1;
    }
    /* Lines written after the last saved state belong to batches that will
     * be delivered again: cut them. */
    if (self->ids && append &&
        (ftruncate(fileno(self->ids), (off_t)self->ids_offset) != 0 ||
         fseeko(self->ids, (off_t)self->ids_offset, SEEK_SET) != 0)) {
        fprintf(stderr, "emlio fetch: cannot trim '%s': %s\n", ids_path,
                strerror(errno));
        return -1;
    }
    /* Energy is measured per epoch (RAPL/NVML where present, else the
     * labelled model); the figures of the epochs add up to the totals. */
    if (emlio_energy_set_powercap_root(self->meter,
                                       getenv("EMLIO_POWERCAP_ROOT")) < 0) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        return -1;
    }
    return 0;
}

/* Accounts for one delivered batch: totals, --ids lines, the verifier. */
static void
s_take_batch(s_fetch_t *self, emlio_batch_t *b)
{
    size_t n;
    const emlio_sample_t *s = emlio_batch_samples(b, &n);
    uint64_t bytes0 = self->bytes;
    for (size_t i = 0; i < n; i++) {
        self->bytes += s[i].len;
        self->pads += s[i].pad;
        if (!s[i].pad && s[i].source < OPT_LIST_MAX)
            self->source_samples[s[i].source]++;
        char label[24] = "";
        if (self->labels)
            snprintf(label, sizeof(label), " %" PRId64, s[i].label);
        char digest[66] = "";
        if (self->digests) {
            digest[0] = ' ';
            tool_sha256_hex(s[i].data, s[i].len, digest + 1);
        }
        /* With sources: EPOCH SOURCE SHARD RECORD. */
        const char *src = emlio_client_source_name(self->client, s[i].source);
        if (self->ids &&
            fprintf(self->ids, "%" PRIu64 " %s%s%s %" PRIu64 "%s%s%s\n",
                    self->epoch, src ? src : "", src ? " " : "",
                    emlio_client_shard_name(self->client, s[i].shard),
                    s[i].record, label, digest, s[i].pad ? " pad" : "") < 0 &&
            !self->ids_errno)
            self->ids_errno = errno; /* a full disk, say: reported below */
        if (self->verify)
            s_verifier_add(&self->ver, &s[i]);
    }
    self->samples += n;
    self->batches++;
    double t = dataset_now() - self->t0;
    if (self->first_batch_s < 0)
        self->first_batch_s = t;
    /* Out of memory only makes ramp_s read short: not worth failing for. */
    (void)fetch_ramp_add(&self->ramp, t, self->bytes - bytes0);
}

/* Erases a redrawn progress line, so that what comes next (an epoch's JSON
 * line on the same terminal, an error) starts on a clean line. */
static void
s_progress_clear(s_fetch_t *self)
{
    if (!self->progress_drawn)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    self->progress_drawn = false;
}

/* Shows progress: on a terminal a line redrawn at most four times a
 * second; with --progress N a plain line every N seconds (and at the end
 * of each epoch: final), for logs. Both say the epoch, the batch, the
 * share of the run done, the rate and the time left. */
static void
s_progress(s_fetch_t *self, size_t planned, bool final)
{
    double now = dataset_now();
    bool lines = self->progress_s > 0;
    if (!lines && !self->tty)
        return;
    double every = lines ? self->progress_s : 0.25;
    if (final ? !lines : now - self->last_progress <= every)
        return;
    double dt = now - self->t0;
    emlio_client_stats_t st;
    emlio_client_stats(self->client, &st);
    /* The run's share done: finished epochs plus this one's fraction. */
    uint64_t run_epochs = self->epochs - self->epoch0;
    double in_epoch = planned ? (double)st.batches / (double)planned : 1.0;
    double done = run_epochs ? ((double)(self->epoch - self->epoch0) +
                                (in_epoch < 1.0 ? in_epoch : 1.0)) /
                                   (double)run_epochs
                             : 1.0;
    char eta[32] = "?";
    if (done > 0 && dt > 0.5) {
        double left = dt * (1.0 - done) / done;
        snprintf(eta, sizeof(eta), "%dm%02ds", (int)(left / 60),
                 (int)left % 60);
    }
    char path[96];
    fetch_path_brief(path, sizeof(path), self->client);
    fprintf(stderr,
            "%sepoch %" PRIu64 "/%" PRIu64 "  batch %" PRIu64
            "/%zu  %.1f%%  %.0f samples/s  %.1f MB/s  ETA %s  window %u  "
            "%s%s",
            lines ? "emlio fetch: " : "\r", self->epoch + 1, self->epochs,
            st.batches, planned, 100.0 * done,
            dt > 0 ? (double)self->samples / dt : 0,
            dt > 0 ? (double)self->bytes / dt / 1e6 : 0, eta, st.inflight, path,
            lines ? "\n" : "\033[K");
    fflush(stderr);
    self->progress_drawn = !lines;
    self->last_progress = now;
}

/* Receives the batches of the current epoch until its end or a signal.
 * Returns 0, or -1 after printing why (the state is saved first). */
/* Sleeps s seconds (to the end, through signals unless interrupted) and
 * returns the time it took. */
static double
s_hold(double s)
{
    double t0 = dataset_now(), left = s;
    while (left > 0 && !s_interrupted) {
        struct timespec ts = { (time_t)left,
                               (long)((left - (double)(time_t)left) * 1e9) };
        nanosleep(&ts, NULL);
        left = s - (dataset_now() - t0);
    }
    return dataset_now() - t0;
}

static int
s_drain_epoch(s_fetch_t *self)
{
    size_t planned = emlio_plan_batch_count(emlio_client_plan(self->client));
    self->last_progress = 0;
    emlio_batch_t *b;
    int rc;
    while ((rc = emlio_client_next(self->client, &b)) != 0) {
        if (rc == -EINTR) {
            if (s_interrupted)
                break;
            continue;
        }
        if (rc < 0) {
            s_progress_clear(self);
            fprintf(stderr, "emlio fetch: epoch %" PRIu64 ": %s\n", self->epoch,
                    emlio_client_errmsg(self->client));
            if (self->state_path)
                s_save_state(self->client, self->state_path, self->ids,
                             self->ids_path);
            return -1;
        }
        s_take_batch(self, b);
        if (self->compute_s > 0) /* the accelerator works on it */
            self->computed += s_hold(self->compute_s);
        emlio_batch_release(&b);
        if (self->ids_errno) {
            fprintf(stderr, "emlio fetch: cannot write '%s': %s\n",
                    self->ids_path, strerror(self->ids_errno));
            return -1;
        }
        if (self->metrics && dataset_now() - self->last_metrics > 0.1) {
            fetch_metrics_update(self->metrics, self->client, self->samples,
                                 self->bytes);
            self->last_metrics = dataset_now();
        }
        if (self->state_path && s_save_state(self->client, self->state_path,
                                             self->ids, self->ids_path) < 0)
            return -1;
        s_progress(self, planned, false);
        if (s_interrupted)
            break;
    }
    s_progress(self, planned, true);
    s_progress_clear(self);
    return 0;
}

/* Reports the records left out as corrupt in this epoch, by the daemons or
 * by --on-corrupt skip here; they count as delivered for the verifier
 * (reported, not lost). */
static void
s_report_skipped(s_fetch_t *self)
{
    size_t n;
    const emlio_sample_t *skipped = emlio_client_skipped(self->client, &n);
    for (size_t i = 0; i < n; i++) {
        fprintf(stderr,
                "emlio fetch: epoch %" PRIu64 ": skipped corrupt record "
                "%" PRIu64 " of shard '%s' (left out; the log says why)\n",
                self->epoch, skipped[i].record,
                emlio_client_shard_name(self->client, skipped[i].shard));
        if (self->verify)
            s_verifier_add(&self->ver, &skipped[i]);
    }
    self->skipped += n;
}

/* Checks the epoch's exactly-once bookkeeping; sets failed_verify. */
static void
s_check_epoch(s_fetch_t *self)
{
    const s_verifier_t *v = &self->ver;
    uint64_t missing = 0;
    for (uint64_t g = 0; g < v->total; g++)
        if (v->planned_n)
            missing += v->planned_n[g] > v->seen_n[g]
                           ? (uint64_t)(v->planned_n[g] - v->seen_n[g])
                           : 0;
        else if ((v->planned[g / 8] & (1u << (g % 8))) &&
                 !(v->seen[g / 8] & (1u << (g % 8))))
            missing++;
    /* After a resume the earlier part was delivered by the run that saved
     * the state, so only duplicates and strays count here. */
    bool partial = v->received < v->expected && missing && self->state_path;
    if (v->duplicates || v->unplanned || (missing && !partial)) {
        fprintf(stderr,
                "emlio fetch: verify failed in epoch %" PRIu64 ": %" PRIu64
                " of %" PRIu64 " samples arrived, %" PRIu64 " missing, %" PRIu64
                " twice, %" PRIu64 " unplanned\n",
                self->epoch, v->received, v->expected, missing, v->duplicates,
                v->unplanned);
        self->failed_verify = true;
    }
}

/* Runs the current epoch: plan, receive, then print (and push) its line.
 * Returns 0 or -1 after printing why. */
static int
s_run_epoch(s_fetch_t *self)
{
    /* Started before the epoch so its probe (up to ~20 ms for a perf PMU)
     * is not counted as the epoch's time to first batch. */
    if (emlio_energy_start(self->meter) < 0) {
        fprintf(stderr, "emlio fetch: cannot measure energy: %s\n",
                emlio_energy_errmsg(self->meter));
        return -1;
    }
    if (!self->resumed &&
        emlio_client_begin_epoch(self->client, self->epoch) < 0) {
        fprintf(stderr, "emlio fetch: %s\n", emlio_client_errmsg(self->client));
        return -1;
    }
    uint64_t samples0 = self->samples;
    uint64_t bytes0 = self->bytes;
    memset(self->source_samples, 0, sizeof(self->source_samples));
    /* On a resumed epoch only the rest is checked: what came before was
     * checked (and its ids written) by the run that saved it. */
    if (self->verify && s_verifier_begin(&self->ver, self->client) < 0) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        return -1;
    }
    if (s_drain_epoch(self) < 0)
        return -1;
    emlio_client_stats_t st;
    emlio_client_stats(self->client, &st);
    self->wait_s += st.wait_s;
    self->disk_read_bytes += st.disk_read_bytes;
    self->shared_bytes += st.shared_bytes;
    self->inflight = st.inflight;
    self->resumed = false;
    uint64_t n = self->samples - samples0;
    uint64_t nb = self->bytes - bytes0;
    emlio_energy_report_t rep;
    emlio_energy_add_bytes(self->meter, nb);
    if (emlio_energy_stop(self->meter, &rep) == 0) {
        self->energy_j += rep.energy_j;
        snprintf(self->energy_source, sizeof(self->energy_source), "%s",
                 rep.source);
        s_print_epoch(self->epoch, &st, n, nb, &rep, s_interrupted,
                      self->client, self->source_samples);
        if (self->influx_arg)
            s_push_epoch(&self->influx, self->epoch, self->cfg.rank,
                         self->cfg.world, &st, n, nb, &rep);
    }
    s_report_skipped(self);
    if (s_interrupted)
        return 0;
    self->epochs_done++;
    if (self->verify)
        s_check_epoch(self);
    return 0;
}

/* The last line of stdout: the run's totals as one JSON object. */
static void
s_print_summary(const s_fetch_t *self, double seconds, double cpu_s)
{
    uint64_t samples = self->samples;
    uint64_t bytes = self->bytes;
    double energy_j = self->energy_j;
    printf("{\"samples\": %" PRIu64 ", \"bytes\": %" PRIu64
           ", \"batches\": %" PRIu64 ", \"epochs\": %" PRIu64
           ", \"seconds\": %.6f, \"samples_per_s\": %.1f, \"mb_per_s\": %.2f"
           ", \"first_batch_s\": %.6f, \"wait_s\": %.6f, \"cpu_s\": %.3f"
           ", \"pad_samples\": %" PRIu64 ", \"rank\": %u, \"world\": %u"
           ", \"inflight\": %u, \"interrupted\": %s"
           ", \"verified\": %s, \"energy_j\": %.6f, \"energy_source\": \"%s\""
           ", \"j_per_sample\": %.9f, \"j_per_gb\": %.4f"
           ", \"skipped\": %" PRIu64 ", \"ramp_s\": %.3f"
           ", \"compute_s\": %.6f, \"au\": %.4f, \"resume_s\": %.6f",
           samples, bytes, self->batches, self->epochs_done, seconds,
           seconds > 0 ? (double)samples / seconds : 0,
           seconds > 0 ? (double)bytes / seconds / 1e6 : 0,
           self->first_batch_s < 0 ? 0 : self->first_batch_s, self->wait_s,
           cpu_s, self->pads, self->cfg.rank, self->cfg.world, self->inflight,
           s_interrupted ? "true" : "false",
           self->verify && !self->failed_verify ? "true" : "false", energy_j,
           self->energy_source, samples ? energy_j / (double)samples : 0,
           bytes ? energy_j / ((double)bytes / 1e9) : 0, self->skipped,
           fetch_ramp_seconds(&self->ramp, seconds), self->computed,
           seconds > 0 ? self->computed / seconds : 0, self->resume_s);
    fetch_path_totals_t run = { .bytes = bytes,
                                .disk_read_bytes = self->disk_read_bytes,
                                .shared_bytes = self->shared_bytes };
    fetch_path_json(stdout, self->client, &run);
    printf("}\n");
    fflush(stdout);
}

/* Runs every epoch, then saves the state and prints the totals. Returns
 * the exit status. */
static int
s_run(s_fetch_t *self)
{
    self->tty = !self->quiet && isatty(STDERR_FILENO);
    if (self->quiet)
        self->progress_s = 0;
    self->epoch0 = self->epoch;
    bool resumed = self->resumed;
    self->t0 = dataset_now();
    self->cpu0 = s_cpu_seconds();
    self->first_batch_s = -1;
    snprintf(self->energy_source, sizeof(self->energy_source), "none");
    for (; self->epoch < self->epochs && !s_interrupted; self->epoch++) {
        if (s_run_epoch(self) < 0)
            return 1;
        if (s_interrupted)
            break;
    }
    s_progress_clear(self);
    if (resumed && self->samples == 0 && !s_interrupted)
        /* Re-running a finished job must not look like an empty epoch. */
        fprintf(stderr,
                "emlio fetch: nothing left to fetch: the resume state '%s' "
                "says every sample of the %" PRIu64 " epoch(s) asked for "
                "(--epochs) was delivered; delete it to start over, or pass "
                "a larger --epochs to go on\n",
                self->resume_from ? self->resume_from : self->state_path,
                self->epochs);
    double seconds = dataset_now() - self->t0;
    double cpu_s = s_cpu_seconds() - self->cpu0;
    emlio_energy_report_t last;
    if (emlio_energy_running(self->meter) &&
        emlio_energy_stop(self->meter, &last) == 0)
        self->energy_j += last.energy_j;
    if (self->state_path && s_save_state(self->client, self->state_path,
                                         self->ids, self->ids_path) < 0)
        return 1;
    if (self->ids && (fflush(self->ids) != 0 || ferror(self->ids))) {
        fprintf(stderr, "emlio fetch: cannot write '%s': %s\n", self->ids_path,
                strerror(self->ids_errno ? self->ids_errno : errno));
        return 1;
    }
    s_print_summary(self, seconds, cpu_s);
    return self->failed_verify ? 1 : s_interrupted ? 130 : 0;
}

/* --metrics: the endpoint starts once connected, and says where it is. */
static int
s_start_metrics(s_fetch_t *self)
{
    if (!self->metrics_arg)
        return 0;
    self->metrics = fetch_metrics_start(self->metrics_arg);
    if (!self->metrics)
        return -1;
    fetch_metrics_update(self->metrics, self->client, 0, 0);
    fprintf(stderr, "emlio fetch: metrics on http://%s/metrics\n",
            fetch_metrics_address(self->metrics));
    return 0;
}

int
cmd_fetch(int argc, char **argv)
{
    s_fetch_t self = { 0 };
    emlio_client_config_init(&self.cfg);
    int status = s_parse_args(&self, argc, argv);
    if (status >= 0)
        return status;
    if (s_configure(&self) < 0)
        return 2;

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = s_on_signal; /* no SA_RESTART: waits return EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    status = s_open(&self) < 0            ? 1
             : s_start_metrics(&self) < 0 ? 1
                                          : s_run(&self);
    if (self.metrics)
        fetch_metrics_update(self.metrics, self.client, self.samples,
                             self.bytes);
    fetch_metrics_stop(&self.metrics);
    if (self.ids)
        fclose(self.ids);
    free(self.source_text);
    free(self.sources_file_text);
    s_verifier_release(&self.ver);
    fetch_ramp_release(&self.ramp);
    emlio_energy_destroy(&self.meter);
    emlio_client_destroy(&self.client);
    emlio_ctx_destroy(&self.ctx);
    return status;
}
