/* cmd_fetch.c - `emlio fetch`: runs whole epochs against emliod daemons and
 * reports throughput; optionally proves exactly-once delivery.
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "cli.h"
#include "commands.h"
#include "dataset_util.h"
#include "emlio.h"
#include "fetch_path.h"
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

static void
s_usage(FILE *out)
{
    fprintf(
        out,
        "usage: emlio fetch --connect EP[,EP...] --batch B [options]\n"
        "\n"
        "  --connect EPS        daemon endpoints, comma-separated\n"
        "  --batch B            samples per batch\n"
        "  --epochs E           epochs to run (default 1)\n"
        "  --seed S             shuffle seed shared by all ranks (0)\n"
        "  --shuffle MODE       window (default) or none\n"
        "  --window-shards N    shards per shuffle window (4)\n"
        "  --drop-last          drop the remainder instead of padding\n"
        "  --rank R --world W   this rank and the job size (else RANK/\n"
        "                       WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, 0/1)\n"
        "  --streams N          TCP streams per daemon (default: tuned, 2-64)\n"
        "  --inflight K         batches in flight (default: auto, BDP)\n"
        "  --in-order           deliver in plan order\n"
        "  --no-crc             skip the per-sample CRC-32C check\n"
        "  --verify             exit non-zero unless every planned sample\n"
        "                       arrived exactly once, intact\n"
        "  --ids FILE           write 'EPOCH SHARD RECORD' per sample\n"
        "                       (padding lines end in ' pad')\n"
        "  --state FILE         resume from / save progress to FILE\n"
        "  --timeout-ms MS      fail when no reply comes for MS (60000)\n"
        "  --connect-timeout-ms MS  give up connecting after MS (10000)\n"
        "  --quiet              no progress line\n"
        "  --influx URL         push an emlio_epoch point per epoch, e.g.\n"
        "                       http://127.0.0.1:8086/write?db=emlio\n"
        "\n"
        "The last line of stdout is a JSON object with the figures.\n");
}

/* Rank and world: flags, else torchrun's, else SLURM's, else 0 of 1. */
static int
s_rank_from_env(bool have_rank, bool have_world, uint64_t *rank,
                uint64_t *world)
{
    static const char *const pairs[][2] = {
        { "RANK", "WORLD_SIZE" }, { "SLURM_PROCID", "SLURM_NTASKS" }
    };
    for (size_t i = 0; i < 2 && !(have_rank && have_world); i++) {
        const char *r = getenv(pairs[i][0]);
        const char *w = getenv(pairs[i][1]);
        if (!r || !w)
            continue;
        if ((!have_rank && cli_parse_u64("fetch", pairs[i][0], r, rank) < 0) ||
            (!have_world && cli_parse_u64("fetch", pairs[i][1], w, world) < 0))
            return -1;
        have_rank = have_world = true;
    }
    if (*world == 0 || *rank >= *world) {
        fprintf(stderr,
                "emlio fetch: rank %" PRIu64 " is not below world "
                "%" PRIu64 "\n",
                *rank, *world);
        return -1;
    }
    return 0;
}

/* The state file: "EMFS", the length of the --ids file that matches the
 * state (little-endian u64), then the library's resume blob. It is written
 * after every batch, after that batch's ids are flushed, and replaced
 * atomically; a run killed at any point resumes from the last batch whose
 * ids and state were both written, and cuts the ids file back to match, so
 * every sample appears exactly once even after kill -9. */
#define S_STATE_HEAD 12

static int
s_save_state(emlio_client_t *client, const char *path, FILE *ids)
{
    uint8_t *blob;
    size_t len;
    uint8_t head[S_STATE_HEAD] = { 'E', 'M', 'F', 'S' };
    if (ids) {
        if (fflush(ids) != 0)
            return -1;
        uint64_t off = (uint64_t)ftello(ids);
        for (int i = 0; i < 8; i++)
            head[4 + i] = (uint8_t)(off >> (8 * i));
    }
    if (emlio_client_save_state(client, &blob, &len) < 0)
        return -1;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(head, 1, sizeof(head), f) == sizeof(head) &&
             fwrite(blob, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = 0;
    emlio_client_free_blob(blob);
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "emlio fetch: cannot write state '%s': %s\n", path,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* Exactly-once bookkeeping for one epoch: one bit per (shard, record) of
 * the rank's plan, set when the sample arrives. */
typedef struct s_verifier {
    uint64_t *first; /* first global record number of each shard */
    uint8_t *planned;
    uint8_t *seen;
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
    }
    memset(v->planned, 0, v->total / 8 + 1);
    memset(v->seen, 0, v->total / 8 + 1);
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
}

/* One JSON line per epoch on stdout: T, wait, volume, CPU and energy, with
 * every energy figure labelled with its source. */
static void
s_print_epoch(uint64_t epoch, const emlio_client_stats_t *st, uint64_t samples,
              uint64_t bytes, const emlio_energy_report_t *rep, bool partial,
              const emlio_client_t *client)
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
    fetch_path_json(stdout, client);
    printf("}\n");
}

/* Pushes the epoch's figures (those of s_print_epoch) to InfluxDB as one
 * emlio_epoch point. A failure is a warning: the data path goes on. */
static void
s_push_epoch(const emlio_influx_url_t *url, uint64_t epoch, uint32_t rank,
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
    emlio_influx_point_t p;
    emlio__influx_begin(&p, &body, "emlio_epoch");
    emlio__influx_tag(&p, "host", host);
    emlio__influx_tag(&p, "rank", r);
    emlio__influx_tag(&p, "world", w);
    emlio__influx_int(&p, "epoch", (int64_t)epoch);
    emlio__influx_float(&p, "seconds", rep->wall_s);
    emlio__influx_float(&p, "wait_s", st->wait_s);
    emlio__influx_float(&p, "first_batch_s", st->first_batch_s);
    emlio__influx_int(&p, "samples", (int64_t)samples);
    emlio__influx_int(&p, "bytes", (int64_t)bytes);
    emlio__influx_float(&p, "cpu_s", rep->cpu_s);
    emlio__influx_float(&p, "energy_j", rep->energy_j);
    emlio__influx_float(&p, "j_per_sample",
                        samples ? rep->energy_j / (double)samples : 0);
    emlio__influx_str(&p, "energy_source", rep->source);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char err[512] = "out of memory";
    int rc = emlio__influx_end(&p, (int64_t)now.tv_sec * 1000000000 +
                                       (int64_t)now.tv_nsec);
    if (rc == 0)
        rc = emlio__influx_post(url, body.data, body.len, 2000, err);
    if (rc < 0)
        fprintf(stderr,
                "emlio fetch: warning: cannot push epoch %" PRIu64
                " to influx: %s\n",
                epoch, err);
    emlio_buf_release(&body);
}

int
cmd_fetch(int argc, char **argv)
{
    enum {
        O_EPOCHS = 256,
        O_SEED,
        O_SHUFFLE,
        O_WINDOW,
        O_DROP_LAST,
        O_RANK,
        O_WORLD,
        O_STREAMS,
        O_INFLIGHT,
        O_IN_ORDER,
        O_NO_CRC,
        O_VERIFY,
        O_IDS,
        O_STATE,
        O_TIMEOUT,
        O_CONNECT_TIMEOUT,
        O_QUIET,
        O_INFLUX,
        O_SERVER_KEY,
        O_CLIENT_KEY
    };
    static const struct option opts[] = {
        { "connect", required_argument, NULL, 'c' },
        { "batch", required_argument, NULL, 'b' },
        { "epochs", required_argument, NULL, O_EPOCHS },
        { "seed", required_argument, NULL, O_SEED },
        { "shuffle", required_argument, NULL, O_SHUFFLE },
        { "window-shards", required_argument, NULL, O_WINDOW },
        { "drop-last", no_argument, NULL, O_DROP_LAST },
        { "rank", required_argument, NULL, O_RANK },
        { "world", required_argument, NULL, O_WORLD },
        { "streams", required_argument, NULL, O_STREAMS },
        { "inflight", required_argument, NULL, O_INFLIGHT },
        { "in-order", no_argument, NULL, O_IN_ORDER },
        { "no-crc", no_argument, NULL, O_NO_CRC },
        { "verify", no_argument, NULL, O_VERIFY },
        { "ids", required_argument, NULL, O_IDS },
        { "state", required_argument, NULL, O_STATE },
        { "timeout-ms", required_argument, NULL, O_TIMEOUT },
        { "connect-timeout-ms", required_argument, NULL, O_CONNECT_TIMEOUT },
        { "quiet", no_argument, NULL, O_QUIET },
        { "influx", required_argument, NULL, O_INFLUX },
        { "server-key", required_argument, NULL, O_SERVER_KEY },
        { "client-key", required_argument, NULL, O_CLIENT_KEY },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    const char *connect = NULL;
    const char *ids_path = NULL;
    const char *state_path = NULL;
    const char *server_key_path = NULL;
    const char *client_key_path = NULL;
    uint64_t batch = 0, epochs = 1, rank = 0, world = 1, v;
    bool have_rank = false, have_world = false, verify = false, quiet = false;
    emlio_influx_url_t influx;
    bool have_influx = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            connect = optarg;
            break;
        case 'b':
            if (cli_parse_u64("fetch", "--batch", optarg, &batch) < 0)
                return 2;
            break;
        case O_EPOCHS:
            if (cli_parse_u64("fetch", "--epochs", optarg, &epochs) < 0)
                return 2;
            break;
        case O_SEED:
            if (cli_parse_u64("fetch", "--seed", optarg, &cfg.seed) < 0)
                return 2;
            break;
        case O_SHUFFLE:
            if (!strcmp(optarg, "none"))
                cfg.shuffle = EMLIO_SHUFFLE_NONE;
            else if (!strcmp(optarg, "window"))
                cfg.shuffle = EMLIO_SHUFFLE_WINDOW;
            else {
                fprintf(stderr,
                        "emlio fetch: invalid --shuffle '%s': "
                        "expected window or none\n",
                        optarg);
                return 2;
            }
            break;
        case O_WINDOW:
            if (cli_parse_u64("fetch", "--window-shards", optarg, &v) < 0)
                return 2;
            cfg.window_shards = (uint32_t)v;
            break;
        case O_DROP_LAST:
            cfg.drop_last = true;
            break;
        case O_RANK:
            if (cli_parse_u64("fetch", "--rank", optarg, &rank) < 0)
                return 2;
            have_rank = true;
            break;
        case O_WORLD:
            if (cli_parse_u64("fetch", "--world", optarg, &world) < 0)
                return 2;
            have_world = true;
            break;
        case O_STREAMS:
            if (cli_parse_u64("fetch", "--streams", optarg, &v) < 0)
                return 2;
            cfg.streams = (uint32_t)v;
            break;
        case O_INFLIGHT:
            if (cli_parse_u64("fetch", "--inflight", optarg, &v) < 0)
                return 2;
            cfg.inflight = (uint32_t)v;
            break;
        case O_IN_ORDER:
            cfg.in_order = true;
            break;
        case O_NO_CRC:
            cfg.verify = false;
            break;
        case O_VERIFY:
            verify = true;
            break;
        case O_IDS:
            ids_path = optarg;
            break;
        case O_STATE:
            state_path = optarg;
            break;
        case O_TIMEOUT:
            if (cli_parse_u64("fetch", "--timeout-ms", optarg, &v) < 0)
                return 2;
            cfg.timeout_ms = (int)v;
            break;
        case O_CONNECT_TIMEOUT:
            if (cli_parse_u64("fetch", "--connect-timeout-ms", optarg, &v) < 0)
                return 2;
            cfg.connect_timeout_ms = (int)v;
            break;
        case O_QUIET:
            quiet = true;
            break;
        case O_INFLUX: {
            char err[512];
            if (emlio__influx_url_parse(&influx, optarg, err) < 0) {
                fprintf(stderr, "emlio fetch: --influx: %s\n", err);
                return 2;
            }
            have_influx = true;
            break;
        }
        case O_SERVER_KEY:
            server_key_path = optarg;
            break;
        case O_CLIENT_KEY:
            client_key_path = optarg;
            break;
        case 'h':
            s_usage(stdout);
            return 0;
        default:
            s_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "emlio fetch: unexpected argument '%s'\n",
                argv[optind]);
        return 2;
    }
    if (!connect || batch == 0 || batch > UINT32_MAX) {
        fprintf(stderr, "emlio fetch: --connect and a positive --batch are "
                        "required\n");
        return 2;
    }
    if (s_rank_from_env(have_rank, have_world, &rank, &world) < 0)
        return 2;
    char server_key[EMLIO_CURVE_KEY_LEN], client_pub[EMLIO_CURVE_KEY_LEN],
        client_sec[EMLIO_CURVE_KEY_LEN];
    if (!server_key_path != !client_key_path) {
        fprintf(stderr, "emlio fetch: --server-key and --client-key go "
                        "together\n");
        return 2;
    }
    if (server_key_path) {
        const char *bad = server_key_path;
        int krc = emlio_curve_read_key(server_key_path, server_key);
        if (krc == 0) {
            bad = client_key_path;
            krc = emlio_curve_read_key(client_key_path, client_sec);
        }
        if (krc == 0 && emlio_curve_public(client_pub, client_sec) < 0)
            krc = EMLIO_EFORMAT;
        if (krc < 0) {
            fprintf(stderr, "emlio fetch: cannot read key '%s': %s\n", bad,
                    krc == EMLIO_EFORMAT ? "not a Z85 key"
                                         : emlio_strerror(krc));
            return 2;
        }
        cfg.curve_server_key = server_key;
        cfg.curve_public_key = client_pub;
        cfg.curve_secret_key = client_sec;
    }
    cfg.batch_size = (uint32_t)batch;
    if (verify)
        cfg.verify = true; /* --verify proves intact bytes: CRCs stay on */
    cfg.rank = (uint32_t)rank;
    cfg.world = (uint32_t)world;

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = s_on_signal; /* no SA_RESTART: waits return EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int status = 1;
    emlio_ctx_t *ctx = emlio_ctx_new();
    if (ctx)
        cli_install_log(ctx);
    emlio_client_t *client = ctx ? emlio_client_new(ctx, &cfg) : NULL;
    FILE *ids = NULL;
    s_verifier_t ver = { 0 };
    emlio_energy_t *meter = NULL;
    bool resumed = false;
    uint64_t ids_offset = 0;
    uint64_t skipped_total = 0;
    uint64_t epoch = 0;
    if (!client) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        goto out;
    }
    int rc = emlio_client_connect(client, connect);
    if (rc < 0) {
        fprintf(stderr, "emlio fetch: %s\n", emlio_client_errmsg(client));
        goto out;
    }
    if (state_path) {
        emlio_buf_t file = EMLIO_BUF_INIT;
        rc = dataset_read_file(state_path, &file);
        const uint8_t *blob = file.data;
        size_t len = file.len;
        if (rc == 0) {
            if (len < S_STATE_HEAD || memcmp(blob, "EMFS", 4)) {
                fprintf(stderr,
                        "emlio fetch: cannot resume from '%s': not a "
                        "state file\n",
                        state_path);
                emlio_buf_release(&file);
                goto out;
            }
            for (int i = 7; i >= 0; i--)
                ids_offset = (ids_offset << 8) | blob[4 + i];
            rc = emlio_client_load_state(client, blob + S_STATE_HEAD,
                                         len - S_STATE_HEAD);
            emlio_buf_release(&file);
            if (rc < 0) {
                fprintf(stderr, "emlio fetch: cannot resume from '%s': %s\n",
                        state_path, emlio_client_errmsg(client));
                goto out;
            }
            resumed = true;
            emlio_client_stats_t st;
            emlio_client_stats(client, &st);
            epoch = st.epoch;
        } else if (rc != -ENOENT) {
            fprintf(stderr, "emlio fetch: cannot read state '%s': %s\n",
                    state_path, emlio_strerror(rc));
            goto out;
        }
    }
    if (ids_path && !(ids = fopen(ids_path, resumed ? "a" : "w"))) {
        fprintf(stderr, "emlio fetch: cannot open '%s': %s\n", ids_path,
                strerror(errno));
        goto out;
    }
    /* Lines written after the last saved state belong to batches that will
     * be delivered again: cut them. */
    if (ids && resumed &&
        (ftruncate(fileno(ids), (off_t)ids_offset) != 0 ||
         fseeko(ids, (off_t)ids_offset, SEEK_SET) != 0)) {
        fprintf(stderr, "emlio fetch: cannot trim '%s': %s\n", ids_path,
                strerror(errno));
        goto out;
    }
    /* Energy is measured per epoch (RAPL/NVML where present, else the
     * labelled model); the figures of the epochs add up to the totals. */
    meter = emlio_energy_new();
    if (!meter || emlio_energy_set_powercap_root(
                      meter, getenv("EMLIO_POWERCAP_ROOT")) < 0) {
        fprintf(stderr, "emlio fetch: out of memory\n");
        goto out;
    }
    double energy_j = 0;
    char energy_source[24] = "none";
    bool tty = !quiet && isatty(STDERR_FILENO);
    double t0 = dataset_now();
    double cpu0 = s_cpu_seconds();
    double first_batch_s = -1, wait_s = 0;
    uint64_t samples = 0, bytes = 0, batches = 0, pads = 0, epochs_done = 0;
    bool failed_verify = false;
    uint32_t inflight = 0;
    for (; epoch < epochs && !s_interrupted; epoch++) {
        /* Started before the epoch so its probe (up to ~20 ms for a perf
         * PMU) is not counted as the epoch's time to first batch. */
        if (emlio_energy_start(meter) < 0) {
            fprintf(stderr, "emlio fetch: cannot measure energy: %s\n",
                    emlio_energy_errmsg(meter));
            goto out;
        }
        if (!resumed && (rc = emlio_client_begin_epoch(client, epoch)) < 0) {
            fprintf(stderr, "emlio fetch: %s\n", emlio_client_errmsg(client));
            goto out;
        }
        uint64_t epoch_samples0 = samples, epoch_bytes0 = bytes;
        /* On a resumed epoch only the rest is checked: what came before
         * was checked (and its ids written) by the run that saved it. */
        if (verify && s_verifier_begin(&ver, client) < 0) {
            fprintf(stderr, "emlio fetch: out of memory\n");
            goto out;
        }
        size_t planned = emlio_plan_batch_count(emlio_client_plan(client));
        double last_progress = 0;
        emlio_batch_t *b;
        while ((rc = emlio_client_next(client, &b)) != 0) {
            if (rc == -EINTR) {
                if (s_interrupted)
                    break;
                continue;
            }
            if (rc < 0) {
                fprintf(stderr, "emlio fetch: epoch %" PRIu64 ": %s\n", epoch,
                        emlio_client_errmsg(client));
                if (state_path)
                    s_save_state(client, state_path, ids);
                goto out;
            }
            size_t n;
            const emlio_sample_t *s = emlio_batch_samples(b, &n);
            for (size_t i = 0; i < n; i++) {
                bytes += s[i].len;
                pads += s[i].pad;
                if (ids)
                    fprintf(ids, "%" PRIu64 " %s %" PRIu64 "%s\n", epoch,
                            emlio_client_shard_name(client, s[i].shard),
                            s[i].record, s[i].pad ? " pad" : "");
                if (verify)
                    s_verifier_add(&ver, &s[i]);
            }
            samples += n;
            batches++;
            if (first_batch_s < 0)
                first_batch_s = dataset_now() - t0;
            emlio_batch_release(&b);
            if (state_path && s_save_state(client, state_path, ids) < 0)
                goto out;
            if (tty && dataset_now() - last_progress > 0.25) {
                double dt = dataset_now() - t0;
                emlio_client_stats_t st;
                emlio_client_stats(client, &st);
                char path[96];
                fetch_path_brief(path, sizeof(path), client);
                fprintf(stderr,
                        "\repoch %" PRIu64 "/%" PRIu64 "  batch %" PRIu64
                        "/%zu  %.0f samples/s  %.1f MB/s  window %u  %s   ",
                        epoch + 1, epochs, st.batches, planned,
                        (double)samples / dt, (double)bytes / dt / 1e6,
                        st.inflight, path);
                last_progress = dataset_now();
            }
            if (s_interrupted)
                break;
        }
        emlio_client_stats_t st;
        emlio_client_stats(client, &st);
        wait_s += st.wait_s;
        inflight = st.inflight;
        resumed = false;
        emlio_energy_report_t rep;
        emlio_energy_add_bytes(meter, bytes - epoch_bytes0);
        if (emlio_energy_stop(meter, &rep) == 0) {
            uint64_t n = samples - epoch_samples0;
            uint64_t nb = bytes - epoch_bytes0;
            energy_j += rep.energy_j;
            snprintf(energy_source, sizeof(energy_source), "%s", rep.source);
            s_print_epoch(epoch, &st, n, nb, &rep, s_interrupted, client);
            if (have_influx)
                s_push_epoch(&influx, epoch, cfg.rank, cfg.world, &st, n, nb,
                             &rep);
        }
        size_t n_skipped;
        const emlio_sample_t *skipped =
            emlio_client_skipped(client, &n_skipped);
        for (size_t i = 0; i < n_skipped; i++) {
            fprintf(stderr,
                    "emlio fetch: epoch %" PRIu64 ": skipped corrupt record "
                    "%" PRIu64 " of shard '%s' (left out by the daemon)\n",
                    epoch, skipped[i].record,
                    emlio_client_shard_name(client, skipped[i].shard));
            if (verify)
                s_verifier_add(&ver, &skipped[i]); /* reported, not lost */
        }
        skipped_total += n_skipped;
        if (s_interrupted)
            break;
        epochs_done++;
        if (verify) {
            uint64_t missing = 0;
            for (uint64_t g = 0; g < ver.total; g++)
                if ((ver.planned[g / 8] & (1u << (g % 8))) &&
                    !(ver.seen[g / 8] & (1u << (g % 8))))
                    missing++;
            /* After a resume the earlier part was delivered by the run that
             * saved the state, so only duplicates and strays count here. */
            bool partial = ver.received < ver.expected && missing && state_path;
            if (ver.duplicates || ver.unplanned || (missing && !partial)) {
                fprintf(stderr,
                        "emlio fetch: verify failed in epoch %" PRIu64
                        ": %" PRIu64 " of %" PRIu64 " samples arrived, %" PRIu64
                        " missing, %" PRIu64 " twice, %" PRIu64 " unplanned\n",
                        epoch, ver.received, ver.expected, missing,
                        ver.duplicates, ver.unplanned);
                failed_verify = true;
            }
        }
    }
    if (tty)
        fprintf(stderr, "\n");
    double seconds = dataset_now() - t0;
    double cpu_s = s_cpu_seconds() - cpu0;
    emlio_energy_report_t last;
    if (emlio_energy_running(meter) && emlio_energy_stop(meter, &last) == 0)
        energy_j += last.energy_j;
    if (state_path && s_save_state(client, state_path, ids) < 0)
        goto out;
    if (ids && fflush(ids) != 0) {
        fprintf(stderr, "emlio fetch: cannot write '%s': %s\n", ids_path,
                strerror(errno));
        goto out;
    }
    printf("{\"samples\": %" PRIu64 ", \"bytes\": %" PRIu64
           ", \"batches\": %" PRIu64 ", \"epochs\": %" PRIu64
           ", \"seconds\": %.6f, \"samples_per_s\": %.1f, \"mb_per_s\": %.2f"
           ", \"first_batch_s\": %.6f, \"wait_s\": %.6f, \"cpu_s\": %.3f"
           ", \"pad_samples\": %" PRIu64 ", \"rank\": %u, \"world\": %u"
           ", \"inflight\": %u, \"interrupted\": %s"
           ", \"verified\": %s, \"energy_j\": %.6f, \"energy_source\": \"%s\""
           ", \"j_per_sample\": %.9f, \"j_per_gb\": %.4f"
           ", \"skipped\": %" PRIu64,
           samples, bytes, batches, epochs_done, seconds,
           seconds > 0 ? (double)samples / seconds : 0,
           seconds > 0 ? (double)bytes / seconds / 1e6 : 0,
           first_batch_s < 0 ? 0 : first_batch_s, wait_s, cpu_s, pads, cfg.rank,
           cfg.world, inflight, s_interrupted ? "true" : "false",
           verify && !failed_verify ? "true" : "false", energy_j, energy_source,
           samples ? energy_j / (double)samples : 0,
           bytes ? energy_j / ((double)bytes / 1e9) : 0, skipped_total);
    fetch_path_json(stdout, client);
    printf("}\n");
    fflush(stdout);
    status = failed_verify ? 1 : s_interrupted ? 130 : 0;
out:
    if (ids)
        fclose(ids);
    s_verifier_release(&ver);
    emlio_energy_destroy(&meter);
    emlio_client_destroy(&client);
    emlio_ctx_destroy(&ctx);
    return status;
}
