/* shardset.c - discovering, mapping and indexing the shards of a directory.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "shardset.h"
#include "tfrecord.h"

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
       s_names_t *tars, char *errbuf)
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
                rc = s_walk(root, sub, depth + 1, out, tars, errbuf);
        } else if ((S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) &&
                   s_has_suffix(e->d_name, ".tfrecord")) {
            rc = s_names_push(out, child);
        } else if ((S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) &&
                   s_has_suffix(e->d_name, ".tar")) {
            rc = s_names_push(tars, child);
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

/* Opens the shard that the mapping will come from and takes a read lease on
 * it. A lease break is signalled to the holder; SIGURG is asked for because
 * its default action is to ignore it, so neither the daemon nor a program
 * embedding the library is killed by it (the watcher polls F_GETLEASE
 * instead of handling signals). Without a lease, the shard is read by
 * copying (see emlio__shard_read_copy). */
static int
s_lease_shard(emlio_shard_t *shard, const char *path, char *errbuf)
{
    int fd;
    do
        fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return emlio__seterr(errbuf, -errno, "cannot open '%s': %s", path,
                             strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = -errno;
        close(fd);
        return emlio__seterr(errbuf, rc, "cannot stat '%s': %s", path,
                             strerror(-rc));
    }
    shard->fd = fd;
    shard->dev = st.st_dev;
    shard->ino = st.st_ino;
    shard->size = (uint64_t)st.st_size;
    shard->leased = S_ISREG(st.st_mode) && fcntl(fd, F_SETSIG, SIGURG) == 0 &&
                    fcntl(fd, F_SETLEASE, F_RDLCK) == 0;
    atomic_init(&shard->users, 0);
    atomic_init(&shard->changed, false);
    atomic_init(&shard->logged, false);
    return 0;
}

bool
emlio__shard_acquire(emlio_shard_t *shard)
{
    /* Sequentially consistent on both sides: either the watcher sees this
     * user, or this reader sees the change. */
    atomic_fetch_add(&shard->users, 1);
    if (!atomic_load(&shard->changed))
        return true;
    atomic_fetch_sub(&shard->users, 1);
    return false;
}

void
emlio__shard_hold(emlio_shard_t *shard)
{
    atomic_fetch_add(&shard->users, 1);
}

void
emlio__shard_release(emlio_shard_t *shard)
{
    atomic_fetch_sub(&shard->users, 1);
}

void
emlio__shard_mark_changed(emlio_shard_t *shard, const char *why,
                          emlio_shardset_log_fn *log, void *userdata)
{
    atomic_store(&shard->changed, true);
    if (atomic_exchange(&shard->logged, true) || !log)
        return;
    char msg[PATH_MAX + 256];
    snprintf(msg, sizeof(msg),
             "shard '%s' changed on disk (%s): its samples are refused from "
             "now on; restart emliod to serve the new contents",
             shard->name, why);
    log(userdata, msg);
}

/* Reads bytes [offset, offset + want) of shard's file into a fresh buffer.
 * A short read means the file shrank under us: the shard is marked changed
 * and the answer is -ESTALE. */
static int
s_pread_copy(emlio_shard_t *shard, uint64_t offset, size_t want,
             uint8_t **buf_out, emlio_shardset_log_fn *log, void *userdata)
{
    uint8_t *buf = emlio_malloc(want ? want : 1);
    if (!buf)
        return EMLIO_ENOMEM;
    size_t got = 0;
    while (got < want) {
        ssize_t n =
            pread(shard->fd, buf + got, want - got, (off_t)(offset + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            emlio_free(buf);
            return -EIO;
        }
        if (n == 0) {
            emlio_free(buf);
            emlio__shard_mark_changed(shard, "it became shorter", log,
                                      userdata);
            return -ESTALE;
        }
        got += (size_t)n;
    }
    *buf_out = buf;
    return 0;
}

static int
s_read_copy_tfrecord(emlio_shard_t *shard, size_t i, uint8_t **buf_out,
                     const uint8_t **data, size_t *len, uint32_t *stored,
                     emlio_shardset_log_fn *log, void *userdata)
{
    if (i >= emlio_tfrecord_count(shard->file))
        return EMLIO_ENOTFOUND;
    const emlio_tfrecord_loc_t *loc = emlio_tfrecord_loc(shard->file, i);
    if (loc->len > EMLIO_TFRECORD_MAX_RECORD)
        return EMLIO_EFORMAT;
    uint8_t *buf;
    int rc = s_pread_copy(shard, loc->offset,
                          (size_t)loc->len + EMLIO_TFRECORD_OVERHEAD, &buf, log,
                          userdata);
    if (rc < 0)
        return rc;
    uint32_t masked =
        (uint32_t)buf[12 + loc->len] | (uint32_t)buf[13 + loc->len] << 8 |
        (uint32_t)buf[14 + loc->len] << 16 | (uint32_t)buf[15 + loc->len] << 24;
    *buf_out = buf;
    *data = buf + 12;
    *len = (size_t)loc->len;
    *stored = emlio_crc32c_unmask(masked);
    return 0;
}

/* A tar member with the header block before it, which must still describe
 * it: a rewritten archive whose members moved is refused, not served. */
static int
s_read_copy_tar(emlio_shard_t *shard, size_t i, uint8_t **buf_out,
                const uint8_t **data, size_t *len, emlio_shardset_log_fn *log,
                void *userdata)
{
    const emlio__tar_index_t *idx = emlio__tar_index(shard->tar);
    if (i >= idx->n_members)
        return EMLIO_ENOTFOUND;
    const emlio__tar_member_t *m = &idx->members[i];
    if (m->offset < 512 || m->len > SIZE_MAX - 512)
        return EMLIO_EFORMAT;
    uint8_t *buf;
    int rc = s_pread_copy(shard, m->offset - 512, (size_t)m->len + 512, &buf,
                          log, userdata);
    if (rc < 0)
        return rc;
    if (!emlio__tar_header_ok(buf, m->len)) {
        emlio_free(buf);
        emlio__shard_mark_changed(shard, "a member's header no longer matches",
                                  log, userdata);
        return -ESTALE;
    }
    *buf_out = buf;
    *data = buf + 512;
    *len = (size_t)m->len;
    return 0;
}

int
emlio__shard_read_copy(emlio_shard_t *shard, size_t i, uint8_t **buf_out,
                       const uint8_t **data, size_t *len, uint32_t *stored,
                       emlio_shardset_log_fn *log, void *userdata)
{
    *buf_out = NULL;
    *stored = 0;
    if (shard->fd < 0)
        return EMLIO_EFORMAT;
    switch (shard->kind) {
    case EMLIO_SHARD_TFRECORD:
        return s_read_copy_tfrecord(shard, i, buf_out, data, len, stored, log,
                                    userdata);
    case EMLIO_SHARD_TAR:
        return s_read_copy_tar(shard, i, buf_out, data, len, log, userdata);
    default:
        return EMLIO_EFORMAT; /* ImageFolder reads are copies already */
    }
}

/* The file a mapped shard was opened from. */
static const char *
s_mapped_path(const emlio_shard_t *shard)
{
    return shard->kind == EMLIO_SHARD_TAR ? emlio__tar_path(shard->tar)
                                          : emlio_tfrecord_path(shard->file);
}

/* Gives back the lease of a changed shard once nothing reads its mapping;
 * after grace_ms, users that still hold frames get zero pages instead of
 * the file (their clients reject them by CRC) rather than a SIGBUS. */
static void
s_release_changed(emlio_shard_t *shard, uint64_t now, uint32_t grace_ms,
                  emlio_shardset_log_fn *log, void *userdata)
{
    if (!shard->changed_ns)
        shard->changed_ns = now;
    if (atomic_load(&shard->users) != 0) {
        if (now - shard->changed_ns < (uint64_t)grace_ms * 1000000ull)
            return;
        if (shard->kind == EMLIO_SHARD_TAR)
            emlio__tar_blank(shard->tar);
        else
            emlio__tfrecord_blank(shard->file);
        if (log) {
            char msg[PATH_MAX + 128];
            snprintf(msg, sizeof(msg),
                     "shard '%s': %u frames still in flight after %u ms; "
                     "their bytes were replaced by zeros",
                     shard->name, atomic_load(&shard->users), grace_ms);
            log(userdata, msg);
        }
    }
    fcntl(shard->fd, F_SETLEASE, F_UNLCK);
    close(shard->fd);
    shard->fd = -1;
    shard->released = true;
}

void
emlio__shardset_watch(emlio_shardset_t *self, bool check_paths,
                      uint32_t grace_ms, emlio_shardset_log_fn *log,
                      void *userdata)
{
    uint64_t now = emlio__now_ns();
    for (size_t i = 0; i < self->n; i++) {
        emlio_shard_t *shard = &self->shards[i];
        if (shard->released || shard->fd < 0)
            continue;
        bool changed = atomic_load(&shard->changed);
        struct stat st;
        if (!changed && shard->leased) {
            if (fcntl(shard->fd, F_GETLEASE) != F_RDLCK)
                emlio__shard_mark_changed(
                    shard, "a writer opened it; lease given back", log,
                    userdata);
        } else if (!changed && fstat(shard->fd, &st) == 0 &&
                   (uint64_t)st.st_size != shard->size) {
            char why[96];
            snprintf(why, sizeof(why),
                     "its size went from %" PRIu64 " to %lld bytes",
                     shard->size, (long long)st.st_size);
            emlio__shard_mark_changed(shard, why, log, userdata);
        }
        if (shard->leased && atomic_load(&shard->changed)) {
            s_release_changed(shard, now, grace_ms, log, userdata);
            continue;
        }
        if (!check_paths || shard->replaced || atomic_load(&shard->changed))
            continue;
        const char *path = s_mapped_path(shard);
        bool gone = stat(path, &st) != 0;
        if (gone || st.st_dev != shard->dev || st.st_ino != shard->ino) {
            shard->replaced = true;
            if (log) {
                char msg[PATH_MAX + 200];
                snprintf(msg, sizeof(msg),
                         "shard '%s' was %s on disk; still serving the file "
                         "opened at load (restart emliod to serve the new "
                         "one)",
                         shard->name, gone ? "removed" : "replaced");
                log(userdata, msg);
            }
        }
    }
}

/* Loads the DALI index cached beside a mapped shard (TFRecord .idx or tar
 * wds2idx), or scans the shard and caches a new one (an empty tar gets
 * none). A stale or broken index is logged and rebuilt; a failed write is
 * only logged. Returns the record count or < 0 with errbuf set. */
static int
s_index_mapped(emlio_shard_t *shard, const emlio_shardset_opts_t *opts,
               emlio_shardset_log_fn *log, void *userdata, char *errbuf)
{
    bool tar = shard->kind == EMLIO_SHARD_TAR;
    const char *path =
        tar ? emlio__tar_path(shard->tar) : emlio_tfrecord_path(shard->file);
    char idx[PATH_MAX];
    if (snprintf(idx, sizeof(idx), "%s.idx", path) >= (int)sizeof(idx))
        return emlio__seterr(errbuf, -ENAMETOOLONG, "path too long: '%s'",
                             path);
    int rc = opts->rescan ? -ENOENT
             : tar        ? emlio__tar_load_index(shard->tar, idx)
                          : emlio_tfrecord_load_index(shard->file, idx);
    if (rc >= 0)
        return rc;
    const char *why = tar ? emlio__tar_errmsg(shard->tar)
                          : emlio_tfrecord_errmsg(shard->file);
    if (rc != -ENOENT && log) {
        char msg[PATH_MAX + EMLIO_ERRMSG_LEN + 64];
        snprintf(msg, sizeof(msg), "ignoring index '%s': %s; rescanning", idx,
                 why);
        log(userdata, msg);
    }
    rc = tar ? emlio__tar_scan(shard->tar)
             : emlio_tfrecord_scan(shard->file, opts->verify_data);
    if (rc < 0)
        return emlio__seterr(errbuf, rc, "%s",
                             tar ? emlio__tar_errmsg(shard->tar)
                                 : emlio_tfrecord_errmsg(shard->file));
    if (opts->write_index && (!tar || rc > 0)) {
        int wrc = tar ? emlio__tar_write_index(shard->tar, idx)
                      : emlio_tfrecord_write_index(shard->file, idx);
        if (wrc < 0 && log) {
            char msg[PATH_MAX + 128];
            snprintf(msg, sizeof(msg), "cannot write index '%s': %s", idx,
                     emlio_strerror(wrc));
            log(userdata, msg);
        }
    }
    return rc;
}

/* The class directories of an ImageFolder root: its non-hidden
 * subdirectories (symlinks to directories included, as torchvision's
 * os.scandir(...).is_dir() does), sorted. */
static int
s_classes(const char *root, s_names_t *out, char *errbuf)
{
    DIR *dir = opendir(root);
    if (!dir)
        return emlio__seterr(errbuf, -errno, "cannot open directory '%s': %s",
                             root, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char full[PATH_MAX];
        struct stat st;
        if (snprintf(full, sizeof(full), "%s/%s", root, e->d_name) >=
                (int)sizeof(full) ||
            stat(full, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        rc = s_names_push(out, e->d_name);
    }
    closedir(dir);
    if (rc == 0 && out->n > 1) /* qsort(NULL, 0) is undefined */
        qsort(out->v, out->n, sizeof(*out->v), s_cmp_names);
    return rc;
}

/* Reads the whole small file at path into a fresh buffer. */
static int
s_slurp(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rbe");
    if (!f)
        return -errno;
    emlio_buf_t buf = EMLIO_BUF_INIT;
    char chunk[65536];
    size_t got;
    int rc = 0;
    while (rc == 0 && (got = fread(chunk, 1, sizeof(chunk), f)) > 0)
        rc = emlio_buf_add(&buf, chunk, got);
    fclose(f);
    if (rc < 0) {
        emlio_buf_release(&buf);
        return rc;
    }
    *out = (char *)emlio_buf_detach(&buf, len);
    return 0;
}

/* The class directories as shards: their listing from ROOT/.emlio-files
 * when it still describes the tree, else from a walk (then cached). The
 * classes' names move into the shards. */
static int
s_load_folders(emlio_shardset_t *self, const char *dir, s_names_t *classes,
               const struct stat *root, const emlio_shardset_opts_t *opts,
               emlio_shardset_log_fn *log, void *userdata, char *errbuf)
{
    size_t first = self->n;
    emlio__folder_t **folders = emlio_calloc(classes->n, sizeof(*folders));
    if (!folders)
        return EMLIO_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < classes->n && rc == 0; i++) {
        emlio_shard_t *shard = &self->shards[self->n];
        shard->name = classes->v[i];
        shard->kind = EMLIO_SHARD_IMAGEFOLDER;
        shard->fd = -1; /* read by copies: no lease */
        classes->v[i] = NULL;
        self->n++;
        shard->folder = emlio__folder_new(dir, shard->name, (int64_t)i);
        folders[i] = shard->folder;
        if (!shard->folder)
            rc = EMLIO_ENOMEM;
    }
    char cache[PATH_MAX];
    snprintf(cache, sizeof(cache), "%s/.emlio-files", dir);
    char *text = NULL;
    size_t len = 0;
    bool cached = false;
    if (rc == 0 && !opts->rescan && s_slurp(cache, &text, &len) == 0) {
        cached = emlio__folder_cache_load(text, len, root->st_mtim, folders,
                                          classes->n) == 0;
        if (!cached && log) {
            char msg[PATH_MAX + 64];
            snprintf(msg, sizeof(msg),
                     "file list '%s' is stale; listing the tree", cache);
            log(userdata, msg);
        }
    }
    emlio_free(text);
    for (size_t i = 0; i < classes->n && rc >= 0 && !cached; i++) {
        emlio_shard_t *shard = &self->shards[first + i];
        rc = emlio__folder_scan(shard->folder);
        if (rc < 0)
            emlio__seterr(errbuf, rc, "%s",
                          emlio__folder_errmsg(shard->folder));
    }
    for (size_t i = 0; i < classes->n && rc >= 0; i++)
        if (emlio__folder_count(folders[i]) == 0) /* as torchvision */
            rc = emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                               "class directory '%s/%s' has no images", dir,
                               self->shards[first + i].name);
    if (rc >= 0 && !cached && opts->write_index) {
        int wrc = emlio__folder_cache_write(cache, root->st_mtim, folders,
                                            classes->n);
        if (wrc < 0 && log) {
            char msg[PATH_MAX + 128];
            snprintf(msg, sizeof(msg), "cannot write file list '%s': %s", cache,
                     emlio_strerror(wrc));
            log(userdata, msg);
        }
    }
    emlio_free(folders);
    return rc < 0 ? rc : 0;
}

static int
s_grow(emlio_shardset_t *self, size_t more)
{
    emlio_shard_t *shards =
        emlio_reallocarray(self->shards, self->n + more, sizeof(*shards));
    if (!shards)
        return EMLIO_ENOMEM;
    self->shards = shards;
    memset(shards + self->n, 0, more * sizeof(*shards));
    return 0;
}

static int
s_cmp_shards(const void *a, const void *b)
{
    return strcmp(((const emlio_shard_t *)a)->name,
                  ((const emlio_shard_t *)b)->name);
}

/* Adds the mapped shard *name (a TFRecord or tar file under dir; the name
 * is taken over and *name set NULL): leases it when asked (before the
 * mapping, so no writer can shrink it under us unseen), maps it and reads
 * or builds its index. Returns 0 or < 0 with errbuf set; a shard that
 * failed is counted in self->n, so release frees it. */
static int
s_load_mapped(emlio_shardset_t *self, const char *dir, char **name,
              emlio_shard_kind_t kind, const emlio_shardset_opts_t *opts,
              emlio_shardset_log_fn *log, void *userdata, char *errbuf)
{
    char path[PATH_MAX];
    emlio_shard_t *shard = &self->shards[self->n];
    snprintf(path, sizeof(path), "%s/%s", dir, *name);
    shard->name = *name;
    shard->kind = kind;
    *name = NULL;
    self->n++;
    shard->fd = -1;
    bool tar = kind == EMLIO_SHARD_TAR;
    if (tar)
        shard->tar = emlio__tar_new(path);
    else
        shard->file = emlio_tfrecord_new(path);
    if (tar ? !shard->tar : !shard->file)
        return EMLIO_ENOMEM;
    int rc = opts->lease ? s_lease_shard(shard, path, errbuf) : 0;
    if (rc < 0)
        return rc;
    self->mapped++;
    self->leased += shard->leased;
    rc = tar ? emlio__tar_open(shard->tar) : emlio_tfrecord_open(shard->file);
    if (rc < 0)
        return emlio__seterr(errbuf, rc, "%s",
                             tar ? emlio__tar_errmsg(shard->tar)
                                 : emlio_tfrecord_errmsg(shard->file));
    return s_index_mapped(shard, opts, log, userdata, errbuf);
}

int
emlio__shardset_load(emlio_shardset_t *self, const char *dir,
                     const emlio_shardset_opts_t *opts,
                     emlio_shardset_log_fn *log, void *userdata, char *errbuf)
{
    struct stat st;
    memset(self, 0, sizeof(*self));
    const char *format = opts->format ? opts->format : "auto";
    bool want_tf = true, want_tar = true, want_folder = true;
    if (strcmp(format, "tfrecord") == 0)
        want_tar = want_folder = false;
    else if (strcmp(format, "tar") == 0)
        want_tf = want_folder = false;
    else if (strcmp(format, "imagefolder") == 0)
        want_tf = want_tar = false;
    else if (strcmp(format, "auto") != 0)
        return emlio__seterr(errbuf, EMLIO_EINVAL,
                             "unknown format '%s' (auto, tfrecord, tar or "
                             "imagefolder)",
                             format);
    if (stat(dir, &st) != 0)
        return emlio__seterr(errbuf, -errno,
                             "cannot open data directory '%s': %s", dir,
                             strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return emlio__seterr(errbuf, -ENOTDIR,
                             "data directory '%s' is not a directory", dir);
    s_names_t names = { 0 };
    s_names_t tars = { 0 };
    s_names_t classes = { 0 };
    int rc = s_walk(dir, "", 0, &names, &tars, errbuf);
    if (rc < 0)
        goto out;
    if (!want_tf)
        s_names_release(&names);
    if (!want_tar)
        s_names_release(&tars);
    /* An ImageFolder is what is left when no shard files are found (or
     * what was asked for); files of other formats inside class
     * directories are not images and are ignored then. */
    bool folder =
        want_folder && (!want_tf || names.n == 0) && (!want_tar || tars.n == 0);
    if (folder) {
        rc = s_classes(dir, &classes, errbuf);
        if (rc < 0)
            goto out;
    }
    if (names.n && tars.n && !opts->mixed_formats) {
        rc = emlio__seterr(errbuf, EMLIO_EINVAL,
                           "several formats under '%s': %zu *.tfrecord and "
                           "%zu *.tar shards (choose one with --format, or "
                           "serve both with --mixed-formats)",
                           dir, names.n, tars.n);
        goto out;
    }
    if (names.n == 0 && tars.n == 0 && classes.n == 0) {
        rc = emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                           "no *.tfrecord shards, *.tar shards or class "
                           "directories under '%s'",
                           dir);
        goto out;
    }
    rc = s_grow(self, names.n + tars.n + classes.n);
    if (rc < 0)
        goto out;
    for (size_t i = 0; i < names.n && rc >= 0; i++)
        rc = s_load_mapped(self, dir, &names.v[i], EMLIO_SHARD_TFRECORD, opts,
                           log, userdata, errbuf);
    for (size_t i = 0; i < tars.n && rc >= 0; i++)
        rc = s_load_mapped(self, dir, &tars.v[i], EMLIO_SHARD_TAR, opts, log,
                           userdata, errbuf);
    if (rc < 0)
        goto out;
    if (classes.n) {
        rc = s_load_folders(self, dir, &classes, &st, opts, log, userdata,
                            errbuf);
        if (rc < 0)
            goto out;
    }
    /* One order whatever the backends: by name, as the planner expects. */
    qsort(self->shards, self->n, sizeof(*self->shards), s_cmp_shards);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < self->n; i++) {
        const emlio_shard_t *shard = &self->shards[i];
        uint64_t records = emlio__shard_count(shard);
        uint64_t bytes = emlio__shard_size(shard);
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
    if (self->records == 0) {
        rc = emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                           "the dataset under '%s' is empty: %zu shard%s, "
                           "no records",
                           dir, self->n, self->n == 1 ? "" : "s");
        goto out;
    }
    snprintf(self->fingerprint, sizeof(self->fingerprint), "%016" PRIx64, h);
    rc = (int)self->n;
out:
    s_names_release(&names);
    s_names_release(&tars);
    s_names_release(&classes);
    if (rc < 0)
        emlio__shardset_release(self);
    return rc;
}

void
emlio__shardset_release(emlio_shardset_t *self)
{
    for (size_t i = 0; i < self->n; i++) {
        emlio_shard_t *shard = &self->shards[i];
        emlio_free(shard->name);
        emlio_tfrecord_destroy(&shard->file);
        emlio__tar_destroy(&shard->tar);
        emlio__folder_destroy(&shard->folder);
        if (shard->fd >= 0) /* closing it gives the lease back */
            close(shard->fd);
    }
    emlio_free(self->shards);
    memset(self, 0, sizeof(*self));
}

size_t
emlio__shard_count(const emlio_shard_t *shard)
{
    switch (shard->kind) {
    case EMLIO_SHARD_TAR:
        return emlio__tar_count(shard->tar);
    case EMLIO_SHARD_IMAGEFOLDER:
        return emlio__folder_count(shard->folder);
    default:
        return emlio_tfrecord_count(shard->file);
    }
}

uint64_t
emlio__shard_size(const emlio_shard_t *shard)
{
    switch (shard->kind) {
    case EMLIO_SHARD_TAR:
        return emlio__tar_size(shard->tar);
    case EMLIO_SHARD_IMAGEFOLDER:
        return emlio__folder_size(shard->folder);
    default:
        return emlio_tfrecord_size(shard->file);
    }
}

uint64_t
emlio__shard_offset(const emlio_shard_t *shard, size_t i)
{
    switch (shard->kind) {
    case EMLIO_SHARD_TAR:
        return emlio__tar_offset(shard->tar, i);
    case EMLIO_SHARD_IMAGEFOLDER:
        return 0;
    default:
        return i < emlio_tfrecord_count(shard->file)
                   ? emlio_tfrecord_loc(shard->file, i)->offset
                   : 0;
    }
}

void
emlio__shard_advise(const emlio_shard_t *shard, size_t first, size_t n,
                    int advice)
{
    switch (shard->kind) {
    case EMLIO_SHARD_TAR:
        emlio__tar_advise(shard->tar, first, n, advice);
        break;
    case EMLIO_SHARD_IMAGEFOLDER:
        break; /* files are read whole, once */
    default:
        emlio_tfrecord_advise(shard->file, first, n, advice);
        break;
    }
}

const char *
emlio__shard_kind_name(emlio_shard_kind_t kind)
{
    switch (kind) {
    case EMLIO_SHARD_TAR:
        return "tar";
    case EMLIO_SHARD_IMAGEFOLDER:
        return "imagefolder";
    default:
        return "tfrecord";
    }
}
