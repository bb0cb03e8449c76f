/* cmd_pack.c - `emlio pack`: packs an ImageFolder tree of JPEGs into
 * TFRecord shards of tf.train.Example records, with DALI index files.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "dataset_util.h"
#include "emlio/buf.h"
#include "emlio/example.h"
#include "emlio/tfrecord.h"
#include "formats.h"

#define CMD "pack"

#define PACK_DEFAULT_SHARD_BYTES (64ull << 20)
/* Bytes of Example encoding around the image bytes, used only to plan the
 * shard boundaries before writing (keys, tags, lengths, the label). */
#define PACK_EXAMPLE_SLACK       64
/* Records are written in batches of about this many bytes. */
#define PACK_WRITE_CHUNK         (4u << 20)

typedef struct pack_item {
    char *path;     /* SRC/class/.../name (owned), for messages */
    size_t shard;   /* the class in the dataset */
    size_t record;  /* the file in the class */
    uint32_t label; /* class index */
    uint64_t size;  /* st_size when listed */
} pack_item_t;

typedef struct pack {
    const char *src;
    const char *dst;
    const char *prefix;
    const char *bytes_key;
    const char *label_key;
    uint64_t shard_bytes;
    uint64_t seed;
    bool no_shuffle; /* --no-shuffle: class order, as emliod lists SRC */
    bool quiet;
    bool force;  /* replace the <prefix>-* shards of an earlier run */
    bool follow; /* follow symlinks inside SRC (never out of it) */

    emlio_dataset_t *ds; /* SRC, as emliod would serve it */
    dataset_strv_t classes;
    pack_item_t *items;
    size_t n_items;
    size_t cap_items;
    size_t skipped; /* images that are not .jpg/.jpeg */
} pack_t;

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(
        out,
        "usage: emlio pack SRC DST [options]\n"
        "\n"
        "Packs the ImageFolder tree SRC/<class>/**/<image>.jpg into TFRecord\n"
        "shards DST/<prefix>-NNNNN-of-NNNNN.tfrecord of tf.train.Example\n"
        "records holding the JPEG bytes and the class index. SRC is read\n"
        "as emliod serves it: classes are the subdirectories of SRC in\n"
        "sorted (byte) order, as torchvision's ImageFolder numbers them;\n"
        "DST/classes.txt lists them, line i for label i. Images not named\n"
        ".jpg/.jpeg are skipped; a .jpg/.jpeg file that is not a JPEG\n"
        "image is an error.\n"
        "\n"
        "Record order: shuffled (Fisher-Yates with --seed, 0 by default,\n"
        "so the same seed gives the same shards), which mixes the classes\n"
        "in every shard; --no-shuffle keeps the order emliod lists SRC in\n"
        "(by class, then by path). DST/pack.txt records which.\n"
        "Each shard is written under a temporary name, re-read and\n"
        "checked, renamed into place, and given a DALI index <shard>.idx.\n"
        "\n"
        "options:\n");
    opt_usage(out, tables);
}

static bool
s_is_jpeg_name(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static int
s_push_item(pack_t *self, const pack_item_t *item)
{
    if (self->n_items == self->cap_items) {
        size_t cap = self->cap_items ? self->cap_items * 2 : 1024;
        pack_item_t *items = reallocarray(self->items, cap, sizeof(*items));
        if (!items)
            return EMLIO_ENOMEM;
        self->items = items;
        self->cap_items = cap;
    }
    self->items[self->n_items++] = *item;
    return 0;
}

/* Lists the .jpg/.jpeg files of class c (dataset order: torchvision's)
 * with their sizes. Returns 0, or 1 after printing an error. */
static int
s_list_class(pack_t *self, size_t c)
{
    char ebuf[128];
    const char *cls = emlio_dataset_shard_name(self->ds, c);
    size_t before = self->n_items;
    if (dataset_strv_push(&self->classes, cls) < 0) {
        dataset_error(CMD, "out of memory");
        return 1;
    }
    for (size_t r = 0; r < emlio_dataset_shard_records(self->ds, c); r++) {
        const char *name = emlio_dataset_record_name(self->ds, c, r);
        if (!s_is_jpeg_name(name)) {
            self->skipped++;
            continue;
        }
        pack_item_t item = { dataset_path_join(self->src, name), c, r,
                             (uint32_t)c, 0 };
        struct stat st;
        if (!item.path || s_push_item(self, &item) < 0) {
            free(item.path);
            dataset_error(CMD, "out of memory");
            return 1;
        }
        if (stat(item.path, &st) < 0) {
            dataset_error(CMD, "cannot read '%s': %s", item.path,
                          dataset_strerror(-errno, ebuf, sizeof(ebuf)));
            return 1;
        }
        self->items[self->n_items - 1].size = (uint64_t)st.st_size;
    }
    if (self->n_items == before) {
        dataset_error(CMD,
                      "cannot pack class '%s': no .jpg/.jpeg files in '%s/%s'",
                      cls, self->src, cls);
        return 1;
    }
    return 0;
}

/* Opens SRC through emlio/dataset.h, the reader emliod serves it with, so
 * the classes, labels and files are the ones clients see; keeps the JPEGs
 * and shuffles them when asked. Returns 0, or 1 after printing an error. */
static int
s_scan_tree(pack_t *self)
{
    char ebuf[128];
    struct stat st;
    if (stat(self->src, &st) < 0) {
        dataset_error(CMD, "cannot read '%s': %s", self->src,
                      dataset_strerror(-errno, ebuf, sizeof(ebuf)));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        dataset_error(CMD, "cannot read '%s': not a directory", self->src);
        return 1;
    }
    self->ds = emlio_dataset_new();
    if (!self->ds) {
        dataset_error(CMD, "out of memory");
        return 1;
    }
    emlio_dataset_set_log(self->ds, dataset_warn, (void *)CMD);
    if (emlio_dataset_open(self->ds, self->src, "imagefolder",
                           self->follow ? EMLIO_DATASET_FOLLOW_SYMLINKS : 0) <
        0) {
        dataset_error(CMD,
                      "cannot pack '%s': %s (expected "
                      "SRC/<class>/<image>.jpg)",
                      self->src, emlio_dataset_errmsg(self->ds));
        return 1;
    }
    size_t n_classes = emlio_dataset_shard_count(self->ds);
    if (n_classes > INT32_MAX) {
        dataset_error(CMD, "cannot pack '%s': too many classes", self->src);
        return 1;
    }
    for (size_t c = 0; c < n_classes; c++)
        if (s_list_class(self, c))
            return 1;
    if (!self->no_shuffle) {
        uint64_t st_rng = self->seed;
        for (size_t i = self->n_items; i > 1; i--) {
            size_t j = (size_t)dataset_rand_below(&st_rng, i);
            pack_item_t t = self->items[i - 1];
            self->items[i - 1] = self->items[j];
            self->items[j] = t;
        }
    }
    return 0;
}

/* Whether name is a file an earlier pack with this prefix wrote: a shard,
 * its index, or the class list. */
static bool
s_replaced(const char *name, const char *prefix)
{
    static const char *const ends[] = { ".tfrecord", ".tfrecord.idx", ".tar",
                                        ".tar.idx" };
    size_t plen = strlen(prefix);
    size_t len = strlen(name);
    if (!strcmp(name, "classes.txt") || !strcmp(name, "pack.txt"))
        return true;
    if (strncmp(name, prefix, plen) || name[plen] != '-')
        return false;
    for (size_t i = 0; i < TOOL_ARRAY_SIZE(ends); i++) {
        size_t n = strlen(ends[i]);
        if (len > plen + n && !strcmp(name + len - n, ends[i]))
            return true;
    }
    return false;
}

/* Refuses a DST that is not empty: shards of an earlier run would mix with
 * the new ones (a different count leaves stale shards that readers pick
 * up, and --verify cannot tell). With --force, first removes the files it
 * replaces (<prefix>-* shards and indexes, classes.txt). Returns 0, or 1
 * after printing an error. */
static int
s_check_dst(const char *dst, const char *prefix, bool force)
{
    char ebuf[128];
    dataset_strv_t names = DATASET_STRV_INIT;
    int rc = dataset_list_dir(dst, 0, &names);
    if (rc == -ENOENT)
        return 0; /* created once SRC has been read */
    if (rc < 0) {
        dataset_error(CMD, "cannot read '%s': %s", dst,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        dataset_strv_release(&names);
        return 1;
    }
    int status = 0;
    for (size_t i = 0; i < names.n && status == 0; i++) {
        const char *name = names.items[i];
        if (!force || !s_replaced(name, prefix)) {
            if (!force)
                dataset_error(CMD,
                              "cannot write to '%s': it already holds "
                              "shards or other files ('%s'); pack into a new "
                              "directory, or --force to replace its "
                              "'%s-*' shards",
                              dst, name, prefix);
            status = !force;
            continue;
        }
        char *path = dataset_path_join(dst, name);
        if (!path || unlink(path) < 0) {
            dataset_error(CMD, "cannot remove '%s/%s': %s", dst, name,
                          path ? dataset_strerror(-errno, ebuf, sizeof(ebuf))
                               : "out of memory");
            status = 1;
        }
        free(path);
    }
    dataset_strv_release(&names);
    return status;
}

/* Returns the number of shards and, in first[s], the index of the first
 * item of shard s (first[n_shards] = n_items). A shard is closed before the
 * record that would take it past shard_bytes, but never left empty. */
static size_t
s_plan(const pack_t *self, size_t *first)
{
    size_t n_shards = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < self->n_items; i++) {
        uint64_t rec =
            self->items[i].size + PACK_EXAMPLE_SLACK + EMLIO_TFRECORD_OVERHEAD;
        if (i == 0 || (cur > 0 && cur + rec > self->shard_bytes)) {
            first[n_shards++] = i;
            cur = 0;
        }
        cur += rec;
    }
    first[n_shards] = self->n_items;
    return n_shards;
}

typedef struct pack_stats {
    uint64_t records;
    uint64_t image_bytes;
    uint64_t shard_bytes;
} pack_stats_t;

/* Copies an ImageFolder file's bytes (its one field) into the buffer. */
static int
s_copy_field(void *userdata, const char *field, const uint8_t *data, size_t len)
{
    (void)field;
    return emlio_buf_add(userdata, data, len) < 0 ? EMLIO_ENOMEM : 0;
}

/* Reads, checks and frames the records of one shard into a temporary file,
 * re-reads it with a full CRC scan, renames it into place and writes its
 * index. Returns 0, or 1 after printing an error. */
static int
s_write_shard(pack_t *self, tjhandle tj, const char *final_path, size_t begin,
              size_t end, pack_stats_t *stats)
{
    char ebuf[128];
    int status = 1;
    int fd = -1;
    emlio_tfrecord_t *tf = NULL;
    emlio_buf_t img = EMLIO_BUF_INIT;
    emlio_buf_t ex = EMLIO_BUF_INIT;
    emlio_buf_t out = EMLIO_BUF_INIT;
    emlio_buf_t tmp = EMLIO_BUF_INIT;
    emlio_buf_t idx = EMLIO_BUF_INIT;
    if (emlio_buf_addf(&tmp, "%s.tmp.%ld", final_path, (long)getpid()) < 0 ||
        emlio_buf_addf(&idx, "%s.idx", final_path) < 0)
        goto oom;
    const char *tmp_path = (const char *)tmp.data;
    fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        dataset_error(CMD, "cannot create '%s': %s", tmp_path,
                      dataset_strerror(-errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    int rc;
    uint64_t written = 0;
    for (size_t i = begin; i < end; i++) {
        const pack_item_t *it = &self->items[i];
        emlio_buf_clear(&img);
        rc = emlio_dataset_record(self->ds, it->shard, it->record, s_copy_field,
                                  &img, NULL);
        if (rc < 0) {
            dataset_error(CMD, "cannot read '%s': %s", it->path,
                          dataset_strerror(rc, ebuf, sizeof(ebuf)));
            goto out;
        }
        int w;
        int h;
        int sub;
        int cs;
        if (img.len < 3 || img.data[0] != 0xff || img.data[1] != 0xd8 ||
            tjDecompressHeader3(tj, img.data, img.len, &w, &h, &sub, &cs) < 0) {
            dataset_error(
                CMD, "cannot pack '%s': not a JPEG image (%s)", it->path,
                img.len < 3 || img.data[0] != 0xff || img.data[1] != 0xd8
                    ? "no start-of-image marker"
                    : tjGetErrorStr2(tj));
            goto out;
        }
        emlio_buf_clear(&ex);
        if (emlio_example_build(&ex, self->bytes_key, img.data, img.len,
                                self->label_key, (int64_t)it->label) < 0 ||
            emlio_tfrecord_append(&out, ex.data, ex.len) < 0)
            goto oom;
        stats->image_bytes += img.len;
        if (out.len >= PACK_WRITE_CHUNK || i + 1 == end) {
            rc = dataset_write_all(fd, out.data, out.len);
            if (rc < 0) {
                dataset_error(CMD, "cannot write '%s': %s", tmp_path,
                              dataset_strerror(rc, ebuf, sizeof(ebuf)));
                goto out;
            }
            written += out.len;
            emlio_buf_clear(&out);
        }
    }
    if (fsync(fd) < 0 || close(fd) < 0) {
        fd = -1;
        dataset_error(CMD, "cannot write '%s': %s", tmp_path,
                      dataset_strerror(-errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    fd = -1;

    /* Re-read what landed on disk, every data CRC included, before the
     * shard gets its final name. */
    tf = emlio_tfrecord_new(tmp_path);
    if (!tf)
        goto oom;
    rc = emlio_tfrecord_open(tf);
    if (rc == 0)
        rc = emlio_tfrecord_scan(tf, true);
    if (rc < 0) {
        dataset_error(CMD, "cannot verify '%s': %s", tmp_path,
                      emlio_tfrecord_errmsg(tf));
        goto out;
    }
    if ((size_t)rc != end - begin) {
        dataset_error(CMD, "cannot verify '%s': %d records, expected %zu",
                      tmp_path, rc, end - begin);
        goto out;
    }
    if (rename(tmp_path, final_path) < 0) {
        dataset_error(CMD, "cannot rename '%s' to '%s': %s", tmp_path,
                      final_path, dataset_strerror(-errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    rc = emlio_tfrecord_write_index(tf, (const char *)idx.data);
    if (rc < 0) {
        dataset_error(CMD, "cannot write '%s': %s", (const char *)idx.data,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        goto out;
    }
    stats->records += end - begin;
    stats->shard_bytes += written;
    status = 0;
    goto out;
oom:
    dataset_error(CMD, "out of memory");
out:
    if (fd >= 0)
        close(fd);
    if (status != 0 && tmp.data)
        unlink((const char *)tmp.data);
    emlio_tfrecord_destroy(&tf);
    emlio_buf_release(&img);
    emlio_buf_release(&ex);
    emlio_buf_release(&out);
    emlio_buf_release(&tmp);
    emlio_buf_release(&idx);
    return status;
}

/* DST/pack.txt: how the records were ordered, so a dataset says whether
 * (and with which seed) it was shuffled. */
static int
s_write_order(const pack_t *self)
{
    char ebuf[128];
    char text[128];
    int n = self->no_shuffle
                ? snprintf(text, sizeof(text), "order class\n")
                : snprintf(text, sizeof(text),
                           "order shuffled\nseed %" PRIu64 "\n", self->seed);
    char *path = dataset_path_join(self->dst, "pack.txt");
    int rc =
        path ? dataset_write_file_atomic(path, text, (size_t)n) : EMLIO_ENOMEM;
    if (rc < 0)
        dataset_error(CMD, "cannot write '%s': %s", path ? path : "pack.txt",
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
    free(path);
    return rc < 0 ? 1 : 0;
}

static int
s_write_classes(const pack_t *self)
{
    char ebuf[128];
    emlio_buf_t text = EMLIO_BUF_INIT;
    char *path = dataset_path_join(self->dst, "classes.txt");
    int rc = path ? 0 : EMLIO_ENOMEM;
    for (size_t c = 0; c < self->classes.n && rc == 0; c++)
        rc = emlio_buf_addf(&text, "%s\n", self->classes.items[c]);
    if (rc == 0)
        rc = dataset_write_file_atomic(path, text.data, text.len);
    if (rc < 0)
        dataset_error(CMD, "cannot write '%s': %s", path ? path : "classes.txt",
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
    free(path);
    emlio_buf_release(&text);
    return rc < 0 ? 1 : 0;
}

static int
s_run(pack_t *self)
{
    double t0 = dataset_now();
    int status = s_scan_tree(self);
    if (status)
        return status;
    char ebuf[128];
    int rc = dataset_mkdir_p(self->dst);
    if (rc < 0) {
        dataset_error(CMD, "cannot create '%s': %s", self->dst,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        return 1;
    }
    size_t *first = reallocarray(NULL, self->n_items + 1, sizeof(*first));
    tjhandle tj = tjInitDecompress();
    emlio_buf_t path = EMLIO_BUF_INIT;
    if (!first || !tj) {
        dataset_error(CMD, "%s",
                      tj ? "out of memory" : "cannot start the JPEG decoder");
        status = 1;
        goto out;
    }
    size_t n_shards = s_plan(self, first);
    /* Five digits like TensorFlow's names; more only when needed. */
    int width = 5;
    for (size_t n = n_shards; n >= 100000; n /= 10)
        width++;
    pack_stats_t stats = { 0 };
    for (size_t s = 0; s < n_shards && status == 0; s++) {
        emlio_buf_clear(&path);
        if (emlio_buf_addf(&path, "%s/%s-%0*zu-of-%0*zu.tfrecord", self->dst,
                           self->prefix, width, s, width, n_shards) < 0) {
            dataset_error(CMD, "out of memory");
            status = 1;
            break;
        }
        status = s_write_shard(self, tj, (const char *)path.data, first[s],
                               first[s + 1], &stats);
    }
    if (status == 0)
        status = s_write_classes(self);
    if (status == 0)
        status = s_write_order(self);
    double dt = dataset_now() - t0;
    if (status == 0 && !self->quiet) {
        printf("packed %" PRIu64 " records from %zu classes in '%s' into %zu "
               "shards in '%s'\n",
               stats.records, self->classes.n, self->src, n_shards, self->dst);
        printf("bytes: %" PRIu64 " of images, %" PRIu64 " of shards; "
               "%zu files skipped (images not .jpg/.jpeg)\n",
               stats.image_bytes, stats.shard_bytes, self->skipped);
        printf("time: %.2f s, %.1f MB/s, %.0f records/s\n", dt,
               dt > 0 ? (double)stats.shard_bytes / dt / 1e6 : 0.0,
               dt > 0 ? (double)stats.records / dt : 0.0);
    }
out:
    if (tj)
        tjDestroy(tj);
    free(first);
    emlio_buf_release(&path);
    return status;
}

static bool
s_valid_key(const char *key)
{
    return key[0] != '\0' && strlen(key) < 1024;
}

enum { PACK_TO_TFRECORD, PACK_TO_TAR };

int
cmd_pack(int argc, char **argv)
{
    static const opt_choice_t formats[] = {
        { "tfrecord", PACK_TO_TFRECORD },
        { "tar", PACK_TO_TAR },
        { NULL, 0 },
    };
    pack_t self = { 0 };
    int to = PACK_TO_TFRECORD;
    self.prefix = "train";
    self.bytes_key = "image/encoded";
    self.label_key = "image/class/label";
    self.shard_bytes = PACK_DEFAULT_SHARD_BYTES;
    const opt_t table[] = {
        OPT("shard-bytes", 's', OPT_SIZE, &self.shard_bytes, "N",
            "target shard size, K/M/G suffixes allowed\n(default 64M)",
            .min = 1),
        OPT("bytes-key", 0, OPT_STR, &self.bytes_key, "K",
            "feature key of the image bytes\n(default image/encoded)"),
        OPT("label-key", 0, OPT_STR, &self.label_key, "K",
            "feature key of the label\n(default image/class/label)"),
        OPT("seed", 0, OPT_U64, &self.seed, "S",
            "shuffle the records with seed S (default 0)"),
        OPT("no-shuffle", 0, OPT_FLAG, &self.no_shuffle, NULL,
            "keep the records in class order"),
        OPT("prefix", 0, OPT_STR, &self.prefix, "P",
            "shard file name prefix (default train)"),
        OPT("quiet", 0, OPT_FLAG, &self.quiet, NULL, "print no summary"),
        OPT("force", 0, OPT_FLAG, &self.force, NULL,
            "write into a DST that is not empty, first\nremoving the "
            "<prefix>-* shards, their\nindexes and classes.txt it replaces"),
        OPT("follow-symlinks", 0, OPT_FLAG, &self.follow, NULL,
            "follow symlinks that stay inside SRC\n(default: leave them "
            "out)"),
        OPT("to", 0, OPT_CHOICE, &to, "FORMAT",
            "tfrecord (default) or tar: WebDataset\nshards "
            "DST/<prefix>-NNNNN.tar from SRC in\nany format emliod serves "
            "(ImageFolder,\nTFRecord, tar), samples keyed by position,\nthe "
            "label as <key>.cls, wds2idx indexes",
            .choices = formats),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "show this help"),
        OPT_END,
    };
    const opt_t *tables[] = { table, NULL };
    int npos = 0;
    int parsed = cli_parse_args(CMD, tables, argc, argv, 0, &npos, s_usage);
    if (parsed >= 0)
        return parsed;
    if (npos != 2) {
        dataset_error(CMD, "expected SRC and DST, got %d arguments", npos);
        s_usage(stderr, tables);
        return 2;
    }
    self.src = argv[1];
    self.dst = argv[2];
    if (!s_valid_key(self.bytes_key) || !s_valid_key(self.label_key) ||
        !strcmp(self.bytes_key, self.label_key)) {
        dataset_error(CMD,
                      "bad feature keys '%s' and '%s': they must be "
                      "non-empty and different",
                      self.bytes_key, self.label_key);
        return 2;
    }
    if (!self.prefix[0] || strchr(self.prefix, '/')) {
        dataset_error(CMD, "bad value '%s' for --prefix: expected a file name",
                      self.prefix);
        return 2;
    }
    /* Checked before SRC is read: a refusal costs nothing. */
    if (s_check_dst(self.dst, self.prefix, self.force))
        return 1;
    if (to == PACK_TO_TAR)
        return formats_pack_tar(CMD, self.src, self.dst, self.prefix,
                                self.shard_bytes, self.quiet, self.follow);
    int status = s_run(&self);
    for (size_t i = 0; i < self.n_items; i++)
        free(self.items[i].path);
    free(self.items);
    dataset_strv_release(&self.classes);
    emlio_dataset_destroy(&self.ds);
    return status;
}
