/* cmd_inspect.c - `emlio inspect`: record counts, sizes and feature keys of
 * one TFRecord shard, or a summary of a data directory or tar shard (see
 * formats.c), as text or one JSON object, both through emlio/dataset.h; or
 * what a running daemon serves (tcp://HOST:PORT), as its WELCOME tells a
 * client.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <sys/stat.h>

#include "cli.h"
#include "commands.h"
#include "dataset_util.h"
#include "emlio/example.h"
#include "formats.h"

#define CMD "inspect"

#define INSPECT_DEFAULT_SAMPLE      100
#define INSPECT_DEFAULT_SAMPLE_TEXT "100"
/* Distinct (key, kind) pairs we track; a shard with more is unusual and
 * the rest are counted as "more". */
#define INSPECT_MAX_KEYS            256

typedef struct inspect_key {
    char *key; /* owned, NUL-terminated copy */
    size_t key_len;
    int kind;
    uint64_t records; /* sampled records holding it */
    size_t min_count;
    size_t max_count;
} inspect_key_t;

typedef struct inspect_keys {
    inspect_key_t *items;
    size_t n;
    size_t dropped; /* entries not tracked past INSPECT_MAX_KEYS */
    int rc;         /* EMLIO_ENOMEM when a copy failed */
} inspect_keys_t;

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(out,
            "usage: emlio inspect FILE|DIR|tcp://HOST:PORT[,...] [options]\n"
            "\n"
            "tcp://HOST:PORT: asks running daemons what they serve (as a\n"
            "client learns it when it connects): daemons, shards and their\n"
            "records, samples and fields.\n"
            "\n"
            "A DIR (TFRecord, WebDataset tar or ImageFolder, as emliod reads\n"
            "it) or a *.tar shard: prints the format, shards, records, bytes,\n"
            "the fields of the first --sample records of each shard and the\n"
            "label range.\n"
            "\n"
            "Prints the record count, the file size, the min/mean/max record\n"
            "size and the feature keys of a TFRecord shard. Keys (with their\n"
            "kind, the number of values per record and how many records hold\n"
            "them) are the union over the first --sample records; a record\n"
            "that does not parse as a tf.train.Example is counted as raw.\n"
            "\n"
            "options:\n");
    opt_usage(out, tables);
}

static const char *
s_kind_name(int kind)
{
    switch (kind) {
    case EMLIO_FEATURE_BYTES:
        return "bytes";
    case EMLIO_FEATURE_FLOAT:
        return "float";
    case EMLIO_FEATURE_INT64:
        return "int64";
    default:
        return "none";
    }
}

static int
s_on_key(void *userdata, const uint8_t *key, size_t key_len, int kind,
         size_t count)
{
    inspect_keys_t *keys = userdata;
    for (size_t i = 0; i < keys->n; i++) {
        inspect_key_t *k = &keys->items[i];
        if (k->kind == kind && k->key_len == key_len &&
            !memcmp(k->key, key, key_len)) {
            k->records++;
            k->min_count = TOOL_MIN(k->min_count, count);
            k->max_count = TOOL_MAX(k->max_count, count);
            return 0;
        }
    }
    if (keys->n == INSPECT_MAX_KEYS) {
        keys->dropped++;
        return 0;
    }
    char *copy = malloc(key_len + 1);
    if (!copy) {
        keys->rc = EMLIO_ENOMEM;
        return 1;
    }
    memcpy(copy, key, key_len);
    copy[key_len] = '\0';
    keys->items[keys->n++] =
        (inspect_key_t){ copy, key_len, kind, 1, count, count };
    return 0;
}

static int
s_key_cmp(const void *pa, const void *pb)
{
    const inspect_key_t *a = pa;
    const inspect_key_t *b = pb;
    size_t n = TOOL_MIN(a->key_len, b->key_len);
    int c = memcmp(a->key, b->key, n);
    if (c == 0 && a->key_len != b->key_len)
        c = a->key_len < b->key_len ? -1 : 1;
    return c ? c : a->kind - b->kind;
}

/* Writes s (len bytes, maybe not UTF-8) as a JSON string. Bytes >= 0x80
 * pass through; control characters are escaped. */
static void
s_json_string(const char *s, size_t len)
{
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* Prints printable bytes as they are and others as \xNN, for the text
 * output of keys that are not clean text. */
static void
s_text_key(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

/* One TFRecord record as emlio_dataset_record hands it over: its length,
 * and its keys when it is among the sampled ones (keys not NULL). */
typedef struct inspect_record {
    inspect_keys_t *keys;
    size_t len;
    bool raw; /* not a tf.train.Example */
} inspect_record_t;

static int
s_on_record(void *userdata, const char *field, const uint8_t *data, size_t len)
{
    (void)field;
    inspect_record_t *rec = userdata;
    rec->len = len;
    if (rec->keys)
        rec->raw = emlio_example_foreach(data, len, s_on_key, rec->keys) < 0;
    return rec->keys && rec->keys->rc < 0 ? rec->keys->rc : 0;
}

/* What cmd_inspect found, for the two output formats. */
typedef struct inspect_summary {
    const char *path;
    size_t n;       /* records */
    uint64_t size;  /* file bytes */
    uint64_t total; /* record data bytes */
    uint64_t min_len;
    uint64_t max_len;
    double mean;
    size_t sampled; /* records whose keys were read */
    size_t raw;     /* of those, not tf.train.Example */
    bool verify;
} inspect_summary_t;

static void
s_print_json(const inspect_summary_t *sm, const inspect_keys_t *keys)
{
    printf("{\"file\": ");
    s_json_string(sm->path, strlen(sm->path));
    printf(", \"records\": %zu, \"bytes\": %" PRIu64
           ", \"data_bytes\": %" PRIu64 ", \"record_bytes\": {\"min\": "
           "%" PRIu64 ", \"mean\": %.1f, \"max\": %" PRIu64 "}",
           sm->n, sm->size, sm->total, sm->min_len, sm->mean, sm->max_len);
    printf(", \"sampled\": %zu, \"raw\": %zu, \"verified\": %s, "
           "\"features\": [",
           sm->sampled, sm->raw, sm->verify ? "true" : "false");
    for (size_t i = 0; i < keys->n; i++) {
        const inspect_key_t *k = &keys->items[i];
        printf("%s{\"key\": ", i ? ", " : "");
        s_json_string(k->key, k->key_len);
        printf(", \"kind\": \"%s\", \"records\": %" PRIu64
               ", \"min_values\": %zu, \"max_values\": %zu}",
               s_kind_name(k->kind), k->records, k->min_count, k->max_count);
    }
    printf("], \"untracked_keys\": %zu}\n", keys->dropped);
}

static void
s_print_text(const inspect_summary_t *sm, const inspect_keys_t *keys)
{
    printf("file:     %s\n", sm->path);
    printf("records:  %zu\n", sm->n);
    printf("bytes:    %" PRIu64 " (record data %" PRIu64 ")\n", sm->size,
           sm->total);
    printf("record:   min %" PRIu64 ", mean %.1f, max %" PRIu64 " bytes\n",
           sm->min_len, sm->mean, sm->max_len);
    printf("crc:      %s\n", sm->verify ? "every data crc checked"
                                        : "length crcs checked (--verify "
                                          "checks data)");
    printf("features (first %zu records, %zu raw):\n", sm->sampled, sm->raw);
    size_t key_width = 0;
    for (size_t i = 0; i < keys->n; i++)
        key_width = TOOL_MAX(key_width, keys->items[i].key_len);
    for (size_t i = 0; i < keys->n; i++) {
        const inspect_key_t *k = &keys->items[i];
        printf("  ");
        s_text_key(k->key, k->key_len);
        printf("%*s  %-5s  ", (int)(key_width - k->key_len), "",
               s_kind_name(k->kind));
        if (k->min_count == k->max_count)
            printf("%zu value%s", k->min_count, k->min_count == 1 ? "" : "s");
        else
            printf("%zu..%zu values", k->min_count, k->max_count);
        printf("  in %" PRIu64 " records\n", k->records);
    }
    if (keys->dropped)
        printf("  (%zu more key entries not tracked)\n", keys->dropped);
}

/* Parses argv: the options and the one FILE. Returns -1 to go on, else
 * the exit status (after printing usage or what is wrong). */
static int
s_parse_args(int argc, char **argv, bool *json, bool *verify, bool *disjoint,
             uint64_t *sample, const char **path)
{
    const opt_t table[] = {
        OPT("json", 0, OPT_FLAG, json, NULL, "print one JSON object"),
        OPT("sample", 'n', OPT_U64, sample, "N",
            "records to read keys from (default " INSPECT_DEFAULT_SAMPLE_TEXT
            ";\n0 means all)"),
        OPT("verify", 0, OPT_FLAG, verify, NULL,
            "also check every record's data CRC"),
        OPT("disjoint-shards", 0, OPT_FLAG, disjoint, NULL,
            "tcp://: count shards of one name with different\n"
            "content on different daemons as distinct shards\n"
            "(as emlio fetch --disjoint-shards)"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "show this help"),
        OPT_END,
    };
    const opt_t *tables[] = { table, NULL };
    int npos = 0;
    int status = cli_parse_args(CMD, tables, argc, argv, 0, &npos, s_usage);
    if (status >= 0)
        return status;
    if (npos != 1) {
        dataset_error(CMD, "expected one FILE, got %d", npos);
        s_usage(stderr, tables);
        return 2;
    }
    *path = argv[1];
    return -1;
}

/* What running daemons serve: the inventory a client receives in WELCOME,
 * through the public client API. Returns the exit status. */
/* Ends the fields line and prints the class names the daemons sent (in
 * label order), or that they sent none. */
static void
s_print_classes(const emlio_client_t *c, bool json)
{
    size_t nc = emlio_client_class_count(c);
    fputs(json ? "], \"classes\": [" : "\nclasses: ", stdout);
    if (!nc && !json)
        fputs("(not known to the daemons)", stdout);
    for (size_t i = 0; i < nc; i++) {
        const char *name = emlio_client_class_name(c, i);
        if (json)
            s_json_string(name, strlen(name));
        else
            printf("%zu=%s", i, name);
        if (i + 1 < nc)
            fputs(json ? ", " : " ", stdout);
    }
    fputs(json ? "]" : "\n", stdout);
}

static int
s_inspect_daemons(const char *endpoints, bool json, bool disjoint)
{
    char err[TOOL_ERRMSG_LEN];
    if (tool_check_endpoints(endpoints, false, err) < 0) {
        dataset_error(CMD, "%s", err);
        return 2;
    }
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.name = "emlio-inspect";
    cfg.connect_timeout_ms = 5000;
    cfg.disjoint_shards = disjoint;
    emlio_client_t *c = cli_client_connect(CMD, ctx, &cfg, endpoints);
    int status = 1;
    if (!c)
        goto out;
    size_t n = emlio_client_shard_count(c);
    uint64_t samples = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        samples += emlio_client_shard_records(c, i);
        bytes += emlio_client_shard_bytes(c, i);
    }
    const char *format = emlio_client_format(c);
    size_t nd = emlio_client_daemon_count(c);
    size_t nf = emlio_client_field_count(c);
    fputs(json ? "{\"daemons\": [" : "daemons: ", stdout);
    for (size_t d = 0; d < nd; d++) {
        const char *ep = emlio_client_daemon_endpoint(c, d);
        if (json)
            s_json_string(ep, strlen(ep));
        else
            printf("%s", ep);
        if (d + 1 < nd)
            fputs(", ", stdout);
    }
    if (json) {
        fputs("], \"format\": ", stdout);
        s_json_string(format, strlen(format));
    } else {
        printf("\nformat: %s", *format ? format : "(not said)");
    }
    printf(json ? ", \"shards\": %zu, \"samples\": %" PRIu64
                  ", \"bytes\": %" PRIu64 ", \"fields\": ["
                : "\nshards: %zu\nsamples: %" PRIu64 "\nbytes: %" PRIu64
                  "\nfields: ",
           n, samples, bytes);
    for (size_t f = 0; f < nf; f++) {
        const char *name = emlio_client_field_name(c, f);
        if (json)
            s_json_string(name, strlen(name));
        else
            printf("%s", *name ? name : "(one unnamed field)");
        if (f + 1 < nf)
            fputs(", ", stdout);
    }
    s_print_classes(c, json);
    fputs(json ? ", \"shard_list\": [" : "", stdout);
    for (size_t i = 0; i < n; i++) {
        const char *name = emlio_client_shard_name(c, i);
        size_t nh;
        emlio_client_shard_holders(c, i, &nh);
        if (json) {
            printf("%s{\"name\": ", i ? ", " : "");
            s_json_string(name, strlen(name));
            printf(", \"records\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"holders\": %zu}",
                   emlio_client_shard_records(c, i),
                   emlio_client_shard_bytes(c, i), nh);
        } else {
            printf("  %s  %" PRIu64 " records  %" PRIu64 " bytes%s\n", name,
                   emlio_client_shard_records(c, i),
                   emlio_client_shard_bytes(c, i),
                   nh > 1 ? "  (replicated)" : "");
        }
    }
    if (json)
        fputs("]}\n", stdout);
    status = 0;
out:
    emlio_client_destroy(&c);
    emlio_ctx_destroy(&ctx);
    return status;
}

int
cmd_inspect(int argc, char **argv)
{
    bool json = false;
    bool verify = false;
    bool disjoint = false;
    uint64_t sample = INSPECT_DEFAULT_SAMPLE;
    const char *path = NULL;
    int parsed =
        s_parse_args(argc, argv, &json, &verify, &disjoint, &sample, &path);
    if (parsed >= 0)
        return parsed;
    if (strstr(path, "://"))
        return s_inspect_daemons(path, json, disjoint);
    /* A data directory (any format) or a WebDataset tar shard. */
    struct stat st;
    if (formats_is_tar(path) || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
        return formats_inspect(CMD, path, json, sample);

    char ebuf[128];
    int status = 1;
    inspect_keys_t keys = { 0 };
    emlio_dataset_t *ds = emlio_dataset_new();
    keys.items = calloc(INSPECT_MAX_KEYS, sizeof(*keys.items));
    if (!ds || !keys.items) {
        dataset_error(CMD, "out of memory");
        goto out;
    }
    /* Always a scan, as an index says nothing of the framing CRCs. */
    int rc = emlio_dataset_open_file(
        ds, path, EMLIO_DATASET_REINDEX | (verify ? EMLIO_DATASET_VERIFY : 0));
    if (rc < 0) {
        dataset_error(CMD, "cannot %s '%s': %s",
                      rc > -1000 && rc != -EIO ? "open" : "read", path,
                      emlio_dataset_errmsg(ds));
        goto out;
    }
    size_t n = emlio_dataset_shard_records(ds, 0);
    uint64_t total = 0;
    uint64_t min_len = 0;
    uint64_t max_len = 0;
    size_t sampled = sample == 0 || sample > n ? n : (size_t)sample;
    size_t raw = 0;
    for (size_t i = 0; i < n; i++) {
        inspect_record_t rec = { i < sampled ? &keys : NULL, 0, false };
        rc = emlio_dataset_record(ds, 0, i, s_on_record, &rec, NULL);
        if (keys.rc < 0) {
            dataset_error(CMD, "out of memory");
            goto out;
        }
        if (rc < 0) {
            dataset_error(CMD, "cannot read record %zu of '%s': %s", i, path,
                          dataset_strerror(rc, ebuf, sizeof(ebuf)));
            goto out;
        }
        total += rec.len;
        min_len = i == 0 ? rec.len : TOOL_MIN(min_len, rec.len);
        max_len = TOOL_MAX(max_len, rec.len);
        raw += rec.raw;
    }
    qsort(keys.items, keys.n, sizeof(*keys.items), s_key_cmp);
    double mean = n ? (double)total / (double)n : 0.0;

    inspect_summary_t sm = { .path = path,
                             .n = n,
                             .size = emlio_dataset_shard_bytes(ds, 0),
                             .total = total,
                             .min_len = min_len,
                             .max_len = max_len,
                             .mean = mean,
                             .sampled = sampled,
                             .raw = raw,
                             .verify = verify };
    if (json)
        s_print_json(&sm, &keys);
    else
        s_print_text(&sm, &keys);
    status = 0;
out:
    if (keys.items) {
        for (size_t i = 0; i < keys.n; i++)
            free(keys.items[i].key);
        free(keys.items);
    }
    emlio_dataset_destroy(&ds);
    return status;
}
