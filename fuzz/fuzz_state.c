/* fuzz_state.c - libFuzzer harness for the resume state a job reads back
 * from disk or from another rank (emlio_client_load_state and
 * emlio_client_load_states; docs/protocol.md 17a): framing, sizes, the
 * consumed spans, the blend section with its earlier blends and the
 * sources' fingerprints, and what the planner makes of them.
 * SPDX-License-Identifier: MIT
 *
 * Once per process it writes two small TFRecord datasets, serves each from
 * an emliod in this process, and connects two clients: one to the first
 * daemon alone, one blending both as sources "a" and "b". Every input is
 * tried twice: as it is, and "fixed" (the job's own parameters, seed to
 * dataset fingerprint, from a state the client saved, and the CRC set
 * right), since a state of another job or with a bad CRC is refused
 * before its spans and blends reach the planner. Each is loaded alone
 * into both clients, and split in two (at the length its first byte says)
 * as the states of two ranks.
 */
#include "emlio_internal.h"

#include <ftw.h>
#include <unistd.h>

#include "crc32c.h"
#include "emlio/client.h"
#include "emlio/example.h"
#include "emlio/server.h"
#include "emlio/tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Two daemons and the two clients, set up at the first input. */
static struct {
    bool ready;
    char dirs[2][64]; /* their datasets, removed at exit */
    emlio_ctx_t *ctx;
    emlio_server_t *srv[2];
    emlio_client_t *plain, *blend;
    uint8_t job[2][48]; /* bytes 8..56 of a state each client saved */
} s_env;

/* Writes SHARDS x records small Examples under dir. Returns 0 or -1. */
static int
s_write_dataset(const char *dir, int records)
{
    int rc = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        emlio_buf_t file = EMLIO_BUF_INIT, ex = EMLIO_BUF_INIT;
        for (int r = 0; r < records && rc == 0; r++) {
            char payload[32];
            int n = snprintf(payload, sizeof(payload), "%d:%d", s, r);
            emlio_buf_clear(&ex);
            rc = emlio_example_build(&ex, "image/encoded",
                                     (const uint8_t *)payload, (size_t)n,
                                     "image/class/label", s) < 0 ||
                         emlio_tfrecord_append(&file, ex.data, ex.len) < 0
                     ? -1
                     : 0;
        }
        char path[512];
        snprintf(path, sizeof(path), "%s/part-%d.tfrecord", dir, s);
        FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
        if (!f || fwrite(file.data, 1, file.len, f) != file.len)
            rc = -1;
        if (f && fclose(f) != 0)
            rc = -1;
        emlio_buf_release(&file);
        emlio_buf_release(&ex);
    }
    return rc;
}

/* A client of batch 4 on endpoint (or, with sources, on both daemons),
 * connected, with one batch of epoch 0 taken and its state's job bytes
 * kept in job. NULL on failure. */
static emlio_client_t *
s_client(const char *endpoint, const emlio_source_t *sources, uint32_t n,
         uint8_t job[48])
{
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.batch_size = 4;
    cfg.seed = 7;
    cfg.sources = sources;
    cfg.n_sources = n;
    emlio_client_t *c = emlio_client_new(s_env.ctx, &cfg);
    emlio_batch_t *b = NULL;
    uint8_t *blob = NULL;
    size_t len = 0;
    if (!c || emlio_client_connect(c, sources ? NULL : endpoint) < 0 ||
        emlio_client_begin_epoch(c, 0) < 0 || emlio_client_next(c, &b) <= 0 ||
        emlio_client_save_state(c, &blob, &len) < 0 || len < 56) {
        fprintf(stderr, "fuzz_state: set-up failed: %s\n",
                c ? emlio_client_errmsg(c) : "no client");
        abort();
    }
    emlio_batch_release(&b);
    memcpy(job, blob + 8, 48);
    /* EMLIO_FUZZ_SEEDS=DIR: the saved states as seeds for the corpus. */
    const char *seeds = getenv("EMLIO_FUZZ_SEEDS");
    if (seeds) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", seeds,
                 sources ? "blend-epoch0" : "plain-epoch0");
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(blob, 1, len, f);
            fclose(f);
        }
    }
    emlio_client_free_blob(blob);
    return c;
}

static int
s_remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    (void)remove(path); /* best effort */
    return 0;
}

/* The datasets go at exit; the daemons and clients with the process. */
static void
s_cleanup(void)
{
    for (int i = 0; i < 2; i++)
        if (s_env.dirs[i][0])
            nftw(s_env.dirs[i], s_remove, 8, FTW_DEPTH | FTW_PHYS);
}

static void
s_setup(void)
{
    char(*dirs)[64] = s_env.dirs;
    s_env.ctx = emlio_ctx_new();
    atexit(s_cleanup);
    for (int i = 0; i < 2; i++) {
        snprintf(dirs[i], sizeof(dirs[i]), "/tmp/emlio-fuzz-state.XXXXXX");
        if (!mkdtemp(dirs[i]) || s_write_dataset(dirs[i], 10 + 5 * i) < 0)
            abort();
        emlio_server_config_t cfg;
        emlio_server_config_init(&cfg);
        cfg.data_dir = dirs[i];
        s_env.srv[i] = emlio_server_new(s_env.ctx, &cfg);
        if (!s_env.srv[i] || emlio_server_load(s_env.srv[i]) != 2 ||
            emlio_server_bind(s_env.srv[i], "tcp://127.0.0.1:*") < 0 ||
            emlio_server_start(s_env.srv[i]) < 0)
            abort();
    }
    emlio_source_t src[2] = {
        { "a", emlio_server_endpoint(s_env.srv[0]), 1.0, 0 },
        { "b", emlio_server_endpoint(s_env.srv[1]), 3.0, 0 },
    };
    s_env.plain = s_client(src[0].endpoints, NULL, 0, s_env.job[0]);
    s_env.blend = s_client(NULL, src, 2, s_env.job[1]);
    s_env.ready = true;
}

/* A private copy of an input (reads past its end are caught), fixed as
 * client k's (its job bytes and a right CRC) when fix is set. */
static uint8_t *
s_as_state(const uint8_t *data, size_t size, int k, bool fix)
{
    uint8_t *copy = emlio_malloc(size ? size : 1);
    if (!copy)
        return NULL;
    if (size)
        memcpy(copy, data, size);
    if (fix && size >= 60) {
        /* Seed, then shuffle to the fingerprint; world, rank and batch
         * size (16..28) stay the input's. */
        memcpy(copy + 8, s_env.job[k], 8);
        memcpy(copy + 28, s_env.job[k] + 20, 28);
        uint32_t crc = emlio_crc32c(0, copy, size - 4);
        for (int i = 0; i < 4; i++)
            copy[size - 4 + i] = (uint8_t)(crc >> (8 * i));
    }
    return copy;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!s_env.ready)
        s_setup();
    emlio_client_t *clients[2] = { s_env.plain, s_env.blend };
    for (int t = 0; t < 4; t++) {
        int k = t & 1;
        bool fix = t >= 2;
        uint8_t *one = s_as_state(data, size, k, fix);
        if (!one)
            return 0;
        (void)emlio_client_load_state(clients[k], one, size);
        /* Two ranks' states: the first byte says where the first ends. */
        size_t cut = size ? (size_t)data[0] * size / 256 : 0;
        uint8_t *a = s_as_state(data, cut, k, fix);
        uint8_t *b = s_as_state(data + cut, size - cut, k, fix);
        if (a && b) {
            const uint8_t *blobs[2] = { a, b };
            size_t lens[2] = { cut, size - cut };
            (void)emlio_client_load_states(clients[k], blobs, lens, 2);
        }
        emlio_free(a);
        emlio_free(b);
        emlio_free(one);
    }
    return 0;
}
