/* shardset.c - discovering, mapping and indexing the shards of a directory.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <dirent.h>
#include <sys/stat.h>

#include "shardset.h"

typedef struct s_names {
    char **v;
    size_t n;
    size_t cap;
} s_names_t;

static int
s_names_push(s_names_t *names, const char *name)
{
    if (names->n == names->cap) {
        size_t cap = names->cap ? names->cap * 2 : 64;
        char **v = emlio_reallocarray(names->v, cap, sizeof(*v));
        if (!v)
            return EMLIO_ENOMEM;
        names->v = v;
        names->cap = cap;
    }
    names->v[names->n] = emlio_strdup(name);
    if (!names->v[names->n])
        return EMLIO_ENOMEM;
    names->n++;
    return 0;
}

static void
s_names_release(s_names_t *names)
{
    for (size_t i = 0; i < names->n; i++)
        emlio_free(names->v[i]);
    emlio_free(names->v);
    memset(names, 0, sizeof(*names));
}

static bool
s_has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s);
    size_t m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* Collects shard paths relative to root; rel is "" or "sub/dir/". Depth is
 * bounded so a pathological tree cannot exhaust the stack. */
static int
s_walk(const char *root, const char *rel, int depth, s_names_t *out,
       char *errbuf)
{
    char path[PATH_MAX];
    if (depth > 32)
        return 0;
    if (snprintf(path, sizeof(path), "%s/%s", root, rel) >= (int)sizeof(path))
        return emlio__seterr(errbuf, -ENAMETOOLONG, "path too long under '%s'",
                             root);
    DIR *dir = opendir(path);
    if (!dir)
        return emlio__seterr(errbuf, -errno, "cannot open directory '%s': %s",
                             path, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char child[PATH_MAX];
        if (snprintf(child, sizeof(child), "%s%s", rel, e->d_name) >=
            (int)sizeof(child))
            continue;
        char full[PATH_MAX];
        if (snprintf(full, sizeof(full), "%s/%s", root, child) >=
            (int)sizeof(full))
            continue;
        struct stat st;
        if (lstat(full, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            char sub[PATH_MAX];
            if (snprintf(sub, sizeof(sub), "%s/", child) < (int)sizeof(sub))
                rc = s_walk(root, sub, depth + 1, out, errbuf);
        } else if ((S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) &&
                   s_has_suffix(e->d_name, ".tfrecord")) {
            rc = s_names_push(out, child);
        }
    }
    closedir(dir);
    return rc;
}

static int
s_cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* FNV-1a over the inventory; not cryptographic, only a change detector. */
static uint64_t
s_fnv(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int
s_index_shard(emlio_tfrecord_t *file, bool verify_data, bool write_index,
              emlio_shardset_log_fn *log, void *userdata, char *errbuf)
{
    char idx[PATH_MAX];
    const char *path = emlio_tfrecord_path(file);
    if (snprintf(idx, sizeof(idx), "%s.idx", path) >= (int)sizeof(idx))
        return emlio__seterr(errbuf, -ENAMETOOLONG, "path too long: '%s'",
                             path);
    int rc = emlio_tfrecord_load_index(file, idx);
    if (rc >= 0)
        return rc;
    if (rc != -ENOENT && log) {
        char msg[PATH_MAX + EMLIO_ERRMSG_LEN + 64];
        snprintf(msg, sizeof(msg), "ignoring index '%s': %s; rescanning", idx,
                 emlio_tfrecord_errmsg(file));
        log(userdata, msg);
    }
    rc = emlio_tfrecord_scan(file, verify_data);
    if (rc < 0)
        return emlio__seterr(errbuf, rc, "%s", emlio_tfrecord_errmsg(file));
    if (write_index) {
        int wrc = emlio_tfrecord_write_index(file, idx);
        if (wrc < 0 && log) {
            char msg[PATH_MAX + 128];
            snprintf(msg, sizeof(msg), "cannot write index '%s': %s", idx,
                     emlio_strerror(wrc));
            log(userdata, msg);
        }
    }
    return rc;
}

int
emlio__shardset_load(emlio_shardset_t *self, const char *dir, bool verify_data,
                     bool write_index, emlio_shardset_log_fn *log,
                     void *userdata, char *errbuf)
{
    struct stat st;
    memset(self, 0, sizeof(*self));
    if (stat(dir, &st) != 0)
        return emlio__seterr(errbuf, -errno,
                             "cannot open data directory '%s': %s", dir,
                             strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return emlio__seterr(errbuf, -ENOTDIR,
                             "data directory '%s' is not a directory", dir);
    s_names_t names = { 0 };
    int rc = s_walk(dir, "", 0, &names, errbuf);
    if (rc < 0)
        goto out;
    if (names.n == 0) {
        rc = emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                           "no *.tfrecord shards under '%s'", dir);
        goto out;
    }
    qsort(names.v, names.n, sizeof(*names.v), s_cmp_names);
    self->shards = emlio_calloc(names.n, sizeof(*self->shards));
    if (!self->shards) {
        rc = EMLIO_ENOMEM;
        goto out;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < names.n; i++) {
        char path[PATH_MAX];
        emlio_shard_t *shard = &self->shards[i];
        snprintf(path, sizeof(path), "%s/%s", dir, names.v[i]);
        shard->name = names.v[i];
        names.v[i] = NULL;
        self->n++;
        shard->file = emlio_tfrecord_new(path);
        if (!shard->file) {
            rc = EMLIO_ENOMEM;
            goto out;
        }
        rc = emlio_tfrecord_open(shard->file);
        if (rc < 0) {
            emlio__seterr(errbuf, rc, "%s", emlio_tfrecord_errmsg(shard->file));
            goto out;
        }
        rc = s_index_shard(shard->file, verify_data, write_index, log, userdata,
                           errbuf);
        if (rc < 0)
            goto out;
        uint64_t records = emlio_tfrecord_count(shard->file);
        uint64_t bytes = emlio_tfrecord_size(shard->file);
        self->records += records;
        self->bytes += bytes;
        h = s_fnv(h, shard->name, strlen(shard->name) + 1);
        /* Little-endian bytes, so every machine computes the same value. */
        uint8_t le[16];
        for (int k = 0; k < 8; k++) {
            le[k] = (uint8_t)(records >> (8 * k));
            le[8 + k] = (uint8_t)(bytes >> (8 * k));
        }
        h = s_fnv(h, le, sizeof(le));
    }
    snprintf(self->fingerprint, sizeof(self->fingerprint), "%016" PRIx64, h);
    rc = (int)self->n;
out:
    s_names_release(&names);
    if (rc < 0)
        emlio__shardset_release(self);
    return rc;
}

void
emlio__shardset_release(emlio_shardset_t *self)
{
    for (size_t i = 0; i < self->n; i++) {
        emlio_free(self->shards[i].name);
        emlio_tfrecord_destroy(&self->shards[i].file);
    }
    emlio_free(self->shards);
    memset(self, 0, sizeof(*self));
}
