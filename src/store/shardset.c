/* shardset.c - discovering, mapping and indexing the shards of a directory.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "iobuf.h"
#include "ioengine.h"
#include "shard_cache.h"
#include "shardset.h"
#include "sharecache.h"

/* Formats the registry may hold (format.c); a walk keeps one list each. */
#define S_MAX_FORMATS 8

static bool
s_has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s);
    size_t m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* The file format whose suffix name has, as an index into emlio__formats,
 * or -1. */
static int
s_file_format(const char *name)
{
    for (int k = 0; emlio__formats[k]; k++)
        if (emlio__formats[k]->suffix &&
            s_has_suffix(name, emlio__formats[k]->suffix))
            return k;
    return -1;
}

/* What a walk left out, for one log line. */
typedef struct {
    size_t links;
    char link[PATH_MAX];
    size_t unreadable;
    char dir[PATH_MAX];
} s_skipped_t;

/* Collects shard paths relative to the root, one list per file format
 * (found[k] for emlio__formats[k]); rel is "" or "sub/dir/". Every
 * directory is opened beneath the root (beneath.h); symlinks are listed
 * only when the root follows them and they lead to a regular file inside
 * it, never to directories. Depth is bounded so a pathological tree cannot
 * exhaust the stack. */
static int
s_walk(const emlio__root_t *root, const char *dir, const char *rel, int depth,
       const emlio__shardset_opts_t *opts, emlio__names_t *found,
       s_skipped_t *skipped, char *errbuf)
{
    /* Asked at every directory: the walk of an ImageFolder tree of 20,000
     * classes took half a second under ASan, and a SIGTERM waited. */
    if (emlio__shardset_cancelled(opts))
        return emlio__seterr(errbuf, -ECANCELED, "loading '%s' was interrupted",
                             dir);
    if (depth > 32)
        return 0;
    struct stat st;
    int fd =
        emlio__open_beneath(root, rel[0] ? rel : ".", EMLIO__OPEN_DIR, &st);
    if (fd < 0 && depth > 0 && (fd == -EACCES || fd == -EPERM)) {
        /* lost+found under a non-root daemon: left out, with a warning. */
        if (skipped->unreadable++ == 0)
            snprintf(skipped->dir, sizeof(skipped->dir), "%s", rel);
        return 0;
    }
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int rc = fd >= 0 ? -errno : fd;
        if (fd >= 0)
            close(fd);
        return emlio__seterr(errbuf, rc, "cannot open directory '%s/%s': %s",
                             dir, rel, emlio__open_why(rc));
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        int k = s_file_format(e->d_name);
        /* Only directories and shard names matter: an ImageFolder tree's
         * million images are passed over by their entry's type, without a
         * stat each (the file system may not say: then stat). */
        if (k < 0 && e->d_type != DT_DIR && e->d_type != DT_UNKNOWN)
            continue;
        char child[PATH_MAX];
        if (snprintf(child, sizeof(child), "%s%s", rel, e->d_name) >=
                (int)sizeof(child) ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            char sub[PATH_MAX];
            if (snprintf(sub, sizeof(sub), "%s/", child) < (int)sizeof(sub))
                rc = s_walk(root, dir, sub, depth + 1, opts, found, skipped,
                            errbuf);
        } else if (S_ISLNK(st.st_mode) && k >= 0) {
            int lfd = root->follow ? emlio__open_beneath(root, child, 0, &st)
                                   : -ELOOP;
            if (lfd >= 0) {
                close(lfd);
                rc = emlio__names_push(&found[k], child);
            } else if (skipped->links++ == 0) {
                snprintf(skipped->link, sizeof(skipped->link), "%s", child);
            }
        } else if (S_ISREG(st.st_mode) && k >= 0) {
            rc = emlio__names_push(&found[k], child);
        }
    }
    closedir(d);
    return rc;
}

static void
s_log_skipped(const s_skipped_t *skipped, const char *dir,
              emlio__shardset_log_fn *log, void *userdata)
{
    char msg[3 * PATH_MAX];
    if (skipped->links && log) {
        snprintf(msg, sizeof(msg),
                 "left out %zu symbolic link%s under '%s' (e.g. '%s'): links "
                 "are followed only with --follow-symlinks, and only to "
                 "regular files inside the data root",
                 skipped->links, skipped->links == 1 ? "" : "s", dir,
                 skipped->link);
        log(userdata, msg);
    }
    if (skipped->unreadable && log) {
        snprintf(msg, sizeof(msg),
                 "left out %zu unreadable director%s under '%s' (e.g. '%s')",
                 skipped->unreadable, skipped->unreadable == 1 ? "y" : "ies",
                 dir, skipped->dir);
        log(userdata, msg);
    }
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

int
emlio__shard_acquire(emlio__shard_t *shard)
{
    /* Sequentially consistent on both sides: either the watcher sees this
     * user, or this reader sees the change; either the cache's close sees
     * this user, or this reader sees the shard closed (shard_cache.c). */
    atomic_fetch_add(&shard->users, 1);
    bool changed = atomic_load(&shard->changed);
    if (!changed && (!shard->cache || atomic_load(&shard->is_open))) {
        if (shard->cache && !atomic_load(&shard->ref))
            atomic_store(&shard->ref, true);
        return 0;
    }
    atomic_fetch_sub(&shard->users, 1);
    if (changed)
        return -ESTALE;
    return emlio__shard_cache_acquire(shard->cache, shard);
}

bool
emlio__shard_zero_copy(const emlio__shard_t *shard)
{
    if (!shard->ops->mapped)
        return false;
    if (!shard->cache || atomic_load(&shard->is_open))
        return emlio__shard_maps(shard);
    return emlio__shard_cache_leases_work(shard->cache);
}

bool
emlio__shard_try_use(emlio__shard_t *shard)
{
    atomic_fetch_add(&shard->users, 1);
    if (!atomic_load(&shard->changed) &&
        (!shard->cache || atomic_load(&shard->is_open)))
        return true;
    atomic_fetch_sub(&shard->users, 1);
    return false;
}

void
emlio__shard_hold(emlio__shard_t *shard)
{
    atomic_fetch_add(&shard->users, 1);
}

void
emlio__shard_release(emlio__shard_t *shard)
{
    atomic_fetch_sub(&shard->users, 1);
}

void
emlio__shard_mark_changed(emlio__shard_t *shard, const char *why,
                          emlio__shardset_log_fn *log, void *userdata)
{
    atomic_store(&shard->changed, true);
    if (shard->cache)
        emlio__shard_cache_poke(shard->cache);
    if (atomic_exchange(&shard->logged, true) || !log)
        return;
    char msg[PATH_MAX + 256];
    snprintf(msg, sizeof(msg),
             "shard '%s' changed on disk (%s): its samples are refused from "
             "now on; restart emliod to serve the new contents",
             shard->name, why);
    log(userdata, msg);
}

/* A read's result as the shard's callers see it: a file that ended early
 * changed under us (marked, -ESTALE); any other failure is -EIO. */
static int
s_read_verdict(emlio__shard_t *shard, int rc, emlio__shardset_log_fn *log,
               void *userdata)
{
    if (rc == -ESTALE)
        emlio__shard_mark_changed(shard, "it became shorter", log, userdata);
    return rc == -ESTALE ? rc : -EIO;
}

unsigned
emlio__shard_io_align(emlio__shard_t *shard)
{
    int fd = shard->fd;
    if (fd < 0)
        return 0;
    if (atomic_load(&shard->io_fd) == fd)
        return atomic_load(&shard->io_align);
    if (!emlio__shard_reads_io(shard))
        return 0;
    /* Once per descriptor (two readers may both do it: it is the same
     * answer): readahead off, so a random record pulls in nothing around
     * it, and past the page cache where the file system allows. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    unsigned align = emlio__io_direct(fd);
    atomic_store(&shard->io_align, align);
    atomic_store(&shard->io_fd, fd);
    return align;
}

unsigned
emlio__shard_io_align_file(emlio__shard_t *shard, int fd)
{
    unsigned align;
    if (atomic_load(&shard->io_fd) == 0) { /* the shard's files probed */
        align = atomic_load(&shard->io_align);
        int fl = fcntl(fd, F_GETFL);
        if (align && (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) < 0))
            align = 0;
    } else {
        align = emlio__io_direct(fd);
        atomic_store(&shard->io_align, align);
        atomic_store(&shard->io_fd, 0);
    }
    if (!align)
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    return align;
}

int
emlio__shard_pread(emlio__shard_t *shard, uint64_t offset, size_t want,
                   uint8_t **buf_out, const uint8_t **data,
                   emlio__shardset_log_fn *log, void *userdata)
{
    int fd = shard->fd;
    unsigned align = emlio__shard_io_align(shard);
    int rc = 0;
    uint64_t reader;
    emlio__share_tally_t *tally;
    emlio__share_cache_t *share = emlio__share_scope(&reader, &tally);
    if (share && emlio__shard_reads_io(shard) && fd >= 0)
        rc = emlio__share_cache_read(
            share, shard, shard->mtime_ns ^ (shard->size << 20), fd, align,
            shard->size, offset, want, reader, buf_out, data, tally);
    else if (emlio__shard_reads_io(shard))
        rc = emlio__ioengine_take(emlio__ioengine_thread(0), shard, fd, offset,
                                  want, buf_out, data);
    if (rc == 0)
        rc = emlio__io_read(fd, offset, want, align, buf_out, data);
    /* Another reader made the descriptor direct between our look and our
     * read (--io auto turned read_io on): read again at its alignment. */
    if (rc == -EINVAL && !align && atomic_load(&shard->io_fd) == fd &&
        (align = atomic_load(&shard->io_align)) != 0)
        rc = emlio__io_read(fd, offset, want, align, buf_out, data);
    if (rc == EMLIO_ENOMEM)
        return rc;
    return rc < 0 ? s_read_verdict(shard, rc, log, userdata) : 0;
}

/* One read of a shard as its format sees it: the context (format.h) and
 * what binding it to the shard needs. */
typedef struct {
    emlio__read_ctx_t ctx;
    emlio__shard_t *shard;
    emlio__shardset_log_fn *log;
    void *userdata;
} s_reader_t;

/* The context's pread: the shard's descriptor, or EMLIO_EFORMAT when it
 * has none (tree formats' reads are copies already; tools map without
 * one). */
static int
s_reader_pread(emlio__read_ctx_t *ctx, uint64_t offset, size_t want,
               uint8_t **buf_out, const uint8_t **data)
{
    s_reader_t *r = ctx->arg;
    *buf_out = NULL;
    if (r->shard->fd < 0)
        return EMLIO_EFORMAT;
    return emlio__shard_pread(r->shard, offset, want, buf_out, data, r->log,
                              r->userdata);
}

/* Binds r to shard for one read: whether it is read from the mapping
 * now, and its pread. */
static void
s_reader_init(s_reader_t *r, emlio__shard_t *shard, emlio__shardset_log_fn *log,
              void *userdata)
{
    memset(r, 0, sizeof(*r));
    r->shard = shard;
    r->log = log;
    r->userdata = userdata;
    r->ctx.maps = emlio__shard_maps(shard);
    r->ctx.read_io = emlio__shard_reads_io(shard);
    r->ctx.pread = s_reader_pread;
    r->ctx.arg = r;
}

/* What the format found while reading: a file that no longer says what
 * its index does is marked changed here, on the shard the format never
 * saw. */
static void
s_reader_done(s_reader_t *r)
{
    if (r->ctx.changed)
        emlio__shard_mark_changed(r->shard, r->ctx.changed, r->log,
                                  r->userdata);
}

int
emlio__shard_read_copy(emlio__shard_t *shard, size_t i, uint8_t **buf_out,
                       const uint8_t **data, size_t *len, uint32_t *stored,
                       emlio__shardset_log_fn *log, void *userdata)
{
    *buf_out = NULL;
    *stored = 0;
    if (shard->fd < 0 || !shard->ops->read_copy)
        return EMLIO_EFORMAT; /* tree formats' reads are copies already */
    s_reader_t r;
    s_reader_init(&r, shard, log, userdata);
    int rc = shard->ops->read_copy(shard->impl, &r.ctx, i, buf_out, data, len,
                                   stored);
    s_reader_done(&r);
    return rc;
}

int
emlio__shard_read(emlio__shard_t *shard, uint64_t record,
                  const emlio__read_opts_t *o, emlio__view_t *views,
                  const char **missing)
{
    /* A mapped shard that changed on disk is never touched again, since its
     * mapping may now lie past the end of the file; while it is read, this
     * read is one of its users. */
    bool mapped = shard->ops->mapped;
    int rc = mapped ? emlio__shard_acquire(shard) : 0;
    if (rc < 0)
        return rc;
    s_reader_t r;
    s_reader_init(&r, shard, o->log, o->userdata);
    rc = shard->ops->read(shard->impl, &r.ctx, record, o, views, missing);
    /* Each view into the mapping keeps the shard in use until it is
     * released, however the read ended (the caller releases them all). */
    size_t per = o->n_fields ? o->n_fields : 1;
    for (size_t f = 0; f < per; f++)
        if (views[f].held)
            emlio__shard_hold(shard);
    s_reader_done(&r);
    if (mapped)
        emlio__shard_release(shard);
    if (rc < 0 || !o->n_fields)
        return rc;
    /* Multi-field samples: one CRC over the frames in field order. */
    uint32_t crc = 0;
    for (size_t f = 0; f < o->n_fields; f++)
        crc = emlio_crc32c(crc, views[f].data, views[f].len);
    views[0].crc = crc;
    return 0;
}

void
emlio__view_release(emlio__view_t *view, emlio__shard_t *shard)
{
    if (view->held)
        emlio__shard_release(shard);
    emlio__iobuf_free(view->owned);
    view->held = false;
    view->owned = NULL;
}

void
emlio__shard_describe(const emlio__shard_t *shard, uint64_t record, char *buf,
                      size_t len)
{
    const char *member =
        shard->ops->member_name && record < SIZE_MAX
            ? shard->ops->member_name(shard->impl, (size_t)record)
            : NULL;
    if (member)
        snprintf(buf, len, "file '%s/%s' (record %" PRIu64 ")", shard->name,
                 member, record);
    else
        snprintf(buf, len,
                 "record %" PRIu64 " in shard '%s' at offset %" PRIu64, record,
                 shard->name, emlio__shard_offset(shard, (size_t)record));
}

int
emlio__shardset_grow(emlio__shardset_t *self, size_t more)
{
    /* One element past the last new one: emlio__grow makes room for
     * index n, so ask for index n + more - 1 (more >= 1). A 20,000-class
     * tree added one shard at a time reallocated 20,000 times (all of
     * them copies under ASan: a second per SIGTERM check). */
    if (more == 0)
        return 0;
    if (more > SIZE_MAX - self->n ||
        emlio__grow(&self->shards, &self->cap, self->n + more - 1,
                    sizeof(*self->shards), 16) < 0)
        return EMLIO_ENOMEM;
    memset(self->shards + self->n, 0, more * sizeof(*self->shards));
    return 0;
}

static int
s_cmp_shards(const void *a, const void *b)
{
    return strcmp(((const emlio__shard_t *)a)->name,
                  ((const emlio__shard_t *)b)->name);
}

/* Which formats --format asks for: want[k] for emlio__formats[k]. */
static int
s_wanted(const char *format, bool *want, char *errbuf)
{
    bool any = strcmp(format, "auto") == 0;
    bool found = any;
    for (size_t k = 0; emlio__formats[k]; k++) {
        want[k] = any || strcmp(format, emlio__formats[k]->name) == 0;
        found |= want[k];
    }
    if (found)
        return 0;
    char list[256] = "auto";
    for (size_t k = 0; emlio__formats[k]; k++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%s",
                 emlio__formats[k + 1] ? ", " : " or ",
                 emlio__formats[k]->name);
    }
    return emlio__seterr(errbuf, EMLIO_EINVAL, "unknown format '%s' (%s)",
                         format, list);
}

/* Appends item to list (a, b and c), as the k-th of n. */
static void
s_list_add(char *list, size_t size, size_t k, size_t n, const char *item)
{
    size_t used = strlen(list);
    snprintf(list + used, size - used, "%s%s",
             k == 0 ? "" : (k + 1 == n ? " or " : ", "), item);
}

/* Shard files of several formats without mixed_formats is an error; so
 * is finding nothing at all. */
static int
s_check_found(const char *dir, const emlio__names_t *found, size_t tree,
              const emlio__shardset_opts_t *opts, char *errbuf)
{
    size_t kinds = 0, total = tree;
    for (size_t k = 0; emlio__formats[k]; k++) {
        kinds += found[k].n > 0;
        total += found[k].n;
    }
    if (kinds > 1 && !opts->mixed_formats) {
        char list[256] = "";
        for (size_t k = 0, i = 0; emlio__formats[k]; k++) {
            if (!found[k].n)
                continue;
            char item[64];
            snprintf(item, sizeof(item), "%zu *%s", found[k].n,
                     emlio__formats[k]->suffix);
            size_t used = strlen(list);
            snprintf(list + used, sizeof(list) - used, "%s%s",
                     i == 0 ? "" : (i + 1 == kinds ? " and " : ", "), item);
            i++;
        }
        return emlio__seterr(errbuf, EMLIO_EINVAL,
                             "several formats under '%s': %s shards (choose "
                             "one with --format, or serve %s with "
                             "--mixed-formats)",
                             dir, list, kinds == 2 ? "both" : "all");
    }
    if (total)
        return 0;
    char what[256] = "";
    size_t n = 0;
    while (emlio__formats[n])
        n++;
    for (size_t k = 0; k < n; k++)
        s_list_add(what, sizeof(what), k, n, emlio__formats[k]->what);
    return emlio__seterr(errbuf, EMLIO_ENOTFOUND, "no %s under '%s'", what,
                         dir);
}

/* The first field of the list "jpg,cls" that no shard of self has at all
 * (a pointer into list), or NULL. */
static const char *
s_field_nowhere(const emlio__shardset_t *self, const char *list)
{
    char one[256];
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        bool somewhere = n >= sizeof(one);
        if (!somewhere) {
            memcpy(one, p, n);
            one[n] = '\0';
        }
        for (size_t i = 0; i < self->n && !somewhere; i++) {
            const emlio__shard_t *shard = &self->shards[i];
            somewhere = !shard->ops->has_field ||
                        shard->ops->has_field(shard->impl, one) != 0;
        }
        if (!somewhere)
            return p;
        p += n + (p[n] == ',');
    }
    return NULL;
}

/* Leaves out the samples the daemon cannot serve (a tar sample with no
 * image member, or without one of --fields: a stray README.txt, a sample
 * of only .cls), with one log line; none left at all is an error naming
 * the field. */
static int
s_prune(emlio__shardset_t *self, const char *dir,
        const emlio__shardset_opts_t *opts, emlio__shardset_log_fn *log,
        void *userdata, char *errbuf)
{
    size_t dropped = 0, before = 0, after = 0;
    char example[PATH_MAX + 64] = "";
    /* A load may have pruned already (shardset_load.c: in parallel, and
     * remembered); the format then answers with what it left out. */
    for (size_t i = 0; i < self->n; i++) {
        emlio__shard_t *shard = &self->shards[i];
        if (shard->ops->prune)
            dropped +=
                shard->ops->prune(shard->impl, opts->prune_field,
                                  dropped ? NULL : example, sizeof(example));
        after += emlio__shard_count(shard);
    }
    before = after + dropped;
    if (!dropped)
        return 0;
    char what[128];
    if (opts->prune_field && strchr(opts->prune_field, ','))
        snprintf(what, sizeof(what), "every member of '%.100s'",
                 opts->prune_field);
    else if (opts->prune_field)
        snprintf(what, sizeof(what), "a '%.100s' member", opts->prune_field);
    else
        snprintf(what, sizeof(what), "an image member");
    if (after == 0 && opts->prune_field && strchr(opts->prune_field, ',')) {
        const char *absent = s_field_nowhere(self, opts->prune_field);
        if (absent)
            return emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                                 "no shard under '%s' has field '%.*s'", dir,
                                 (int)strcspn(absent, ","), absent);
    }
    if (after == 0)
        return emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                             "no sample under '%s' has %s (e.g. %s)", dir, what,
                             example);
    if (log) {
        char msg[PATH_MAX + 512];
        snprintf(msg, sizeof(msg),
                 "left out %zu of %zu samples without %s (e.g. %s)", dropped,
                 before, what, example);
        log(userdata, msg);
    }
    return 0;
}

/* Totals and the fingerprint, over shards in their final order. */
static int
s_inventory(emlio__shardset_t *self, const char *dir, char *errbuf)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < self->n; i++) {
        const emlio__shard_t *shard = &self->shards[i];
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
    if (self->records == 0)
        return emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                             "the dataset under '%s' is empty: %zu shard%s, "
                             "no records",
                             dir, self->n, self->n == 1 ? "" : "s");
    snprintf(self->fingerprint, sizeof(self->fingerprint), "%016" PRIx64, h);
    return 0;
}

/* The daemon's shard cache, with its budget (see shard_cache.h). */
static int
s_cache_new(emlio__shardset_t *self, size_t shards,
            const emlio__shardset_opts_t *opts, emlio__shardset_log_fn *log,
            void *userdata, char *errbuf)
{
    size_t budget;
    int rc = emlio__shard_cache_budget(opts->max_open_shards, opts->lease,
                                       shards, &budget, errbuf);
    if (rc < 0)
        return rc;
    return emlio__shard_cache_new(&self->cache, self, budget, opts->lease,
                                  opts->grace_ms ? opts->grace_ms : 5000, log,
                                  userdata, errbuf);
}

/* A tree format's load adding to self (see emlio__tree_load_t). */
typedef struct {
    emlio__shardset_t *set;
    const emlio__format_ops_t *ops;
} s_tree_t;

/* Adds a shard of a tree format: read by copies (fd -1), so never leased,
 * never counting users. */
static int
s_tree_add(void *arg, const char *name, void *impl)
{
    s_tree_t *tree = arg;
    char *copy = emlio_strdup(name);
    if (!copy || emlio__shardset_grow(tree->set, 1) < 0) {
        emlio_free(copy);
        tree->ops->destroy(impl);
        return EMLIO_ENOMEM;
    }
    emlio__shard_t *shard = &tree->set->shards[tree->set->n++];
    shard->name = copy;
    shard->ops = tree->ops;
    shard->impl = impl;
    shard->fd = -1;
    return 0;
}

/* Loads the shard files found (one list per file format; see
 * emlio__shardset_load_files), or, when there are none, the first wanted
 * tree format. Returns the tree's shard count, 0 or < 0. */
static int
s_load_all(emlio__shardset_t *self, const char *dir, const struct stat *root,
           emlio__names_t *found, const bool *want,
           const emlio__shardset_opts_t *opts, emlio__shardset_log_fn *log,
           void *userdata, char *errbuf)
{
    size_t files = 0;
    for (size_t k = 0; emlio__formats[k]; k++)
        files += found[k].n;
    /* Only mapped shards need the cache (and its budget, and its thread):
     * an ImageFolder tree never opens it. */
    if (files) {
        int rc = s_cache_new(self, files, opts, log, userdata, errbuf);
        return rc < 0 ? rc
                      : emlio__shardset_load_files(self, dir, root, found, opts,
                                                   log, userdata, errbuf);
    }
    /* A tree is what is left when no shard files are found (or what was
     * asked for); files of other formats inside it are ignored then. */
    (void)root; /* a tree's mtime changes when its listing is cached */
    for (size_t k = 0; emlio__formats[k]; k++) {
        if (!want[k] || !emlio__formats[k]->load_tree)
            continue;
        s_tree_t tree = { .set = self, .ops = emlio__formats[k] };
        emlio__tree_load_t load = {
            .root = &self->root,
            .rescan = opts->rescan,
            .write_index = opts->write_index,
            .cancel = opts->cancel,
            .log = log,
            .userdata = userdata,
            .add = s_tree_add,
            .arg = &tree,
        };
        return emlio__formats[k]->load_tree(&load, dir, errbuf);
    }
    return 0;
}

/* Describes what the walk found that --format leaves out ("12 *.tar
 * shards", "4 subdirectories"), so that a wrong --format names what is
 * there; "" when nothing is left out. */
static void
s_left_out(const char *dir, const emlio__names_t *found, const bool *want,
           char *out, size_t len)
{
    for (size_t k = 0; emlio__formats[k]; k++) {
        if (want[k] || !found[k].n || !emlio__formats[k]->suffix)
            continue;
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s%zu *%s shards", used ? ", " : "",
                 found[k].n, emlio__formats[k]->suffix);
    }
    bool tree_wanted = false;
    for (size_t k = 0; emlio__formats[k]; k++)
        tree_wanted |= want[k] && !emlio__formats[k]->suffix;
    DIR *d = tree_wanted || out[0] ? NULL : opendir(dir);
    size_t subdirs = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        subdirs += e->d_type == DT_DIR && e->d_name[0] != '.';
    if (d)
        closedir(d);
    if (subdirs)
        snprintf(out, len, "%zu subdirectories (an ImageFolder tree?)",
                 subdirs);
}

int
emlio__shardset_load(emlio__shardset_t *self, const char *dir,
                     const emlio__shardset_opts_t *opts,
                     emlio__shardset_log_fn *log, void *userdata, char *errbuf)
{
    struct stat st;
    memset(self, 0, sizeof(*self));
    self->root = EMLIO__ROOT_NONE;
    bool want[S_MAX_FORMATS];
    int rc = s_wanted(opts->format ? opts->format : "auto", want, errbuf);
    if (rc < 0)
        return rc;
    if (stat(dir, &st) != 0)
        return emlio__seterr(errbuf, -errno,
                             "cannot open data directory '%s': %s", dir,
                             strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return emlio__seterr(errbuf, -ENOTDIR,
                             "data directory '%s' is not a directory", dir);
    /* Everything below is opened beneath this descriptor (beneath.h). */
    rc = emlio__root_open(&self->root, dir, opts->follow_symlinks);
    if (rc < 0)
        return emlio__seterr(errbuf, rc, "cannot open data directory '%s': %s",
                             dir, emlio_strerror(rc));
    emlio__names_t found[S_MAX_FORMATS];
    memset(found, 0, sizeof(found));
    s_skipped_t skipped = { 0 };
    rc = s_walk(&self->root, dir, "", 0, opts, found, &skipped, errbuf);
    if (rc >= 0)
        s_log_skipped(&skipped, dir, log, userdata);
    char there[256] = ""; /* what --format left out, for the error */
    s_left_out(dir, found, want, there, sizeof(there));
    for (size_t k = 0; emlio__formats[k]; k++)
        if (!want[k])
            emlio__names_release(&found[k]);
    if (rc >= 0)
        rc = s_check_found(dir, found, 1, opts, errbuf);
    if (rc >= 0)
        rc = s_load_all(self, dir, &st, found, want, opts, log, userdata,
                        errbuf);
    if (rc >= 0 && self->n == 0)
        rc = s_check_found(dir, found, 0, opts, errbuf);
    if (rc == EMLIO_ENOTFOUND && self->n == 0 && there[0]) {
        size_t used = strlen(errbuf);
        snprintf(errbuf + used, EMLIO_ERRMSG_LEN - used,
                 " with --format %s; it holds %s: choose that format, or "
                 "auto",
                 opts->format, there);
    }
    if (rc >= 0) {
        /* One order whatever the formats: by name, as the planner expects. */
        qsort(self->shards, self->n, sizeof(*self->shards), s_cmp_shards);
        if (self->cache)
            emlio__shard_cache_arm(self->cache);
        if (opts->prune)
            rc = s_prune(self, dir, opts, log, userdata, errbuf);
        if (rc >= 0)
            rc = s_inventory(self, dir, errbuf);
    }
    for (size_t k = 0; emlio__formats[k]; k++)
        emlio__names_release(&found[k]);
    if (rc < 0) {
        emlio__shardset_release(self);
        return rc;
    }
    return (int)self->n;
}

void
emlio__shardset_release(emlio__shardset_t *self)
{
    /* First: gives the leases back and stops the watcher. */
    emlio__shard_cache_destroy(&self->cache);
    for (size_t i = 0; i < self->n; i++) {
        emlio__shard_t *shard = &self->shards[i];
        emlio_free(shard->name);
        if (shard->impl)
            shard->ops->destroy(shard->impl);
        if (shard->fd >= 0) /* closing it gives the lease back */
            close(shard->fd);
    }
    emlio_free(self->shards);
    /* After the shards: TFRecord shards borrow their tables from it. */
    emlio__dsindex_close(&self->index);
    emlio__dsindex_close(&self->index_prev);
    /* After the shards: ImageFolder classes borrow the descriptor. */
    emlio__root_close(&self->root);
    memset(self, 0, sizeof(*self));
    self->root = EMLIO__ROOT_NONE;
}

size_t
emlio__shard_count(const emlio__shard_t *shard)
{
    return shard->ops->count(shard->impl);
}

uint64_t
emlio__shard_size(const emlio__shard_t *shard)
{
    return shard->ops->size(shard->impl);
}

uint64_t
emlio__shard_mean_record(const emlio__shard_t *shard)
{
    size_t count = emlio__shard_count(shard);
    return count ? emlio__shard_size(shard) / count : 0;
}

uint64_t
emlio__shard_offset(const emlio__shard_t *shard, size_t i)
{
    return shard->ops->offset(shard->impl, i);
}

void
emlio__shard_advise(const emlio__shard_t *shard, size_t first, size_t n,
                    int advice)
{
    if (!shard->ops->advise)
        return;
    /* Only a shard open now is advised (readahead never opens one), and
     * only while a use keeps the cache from unmapping it meanwhile: a
     * range unmapped and reused would get someone else's advice. */
    emlio__shard_t *use = (emlio__shard_t *)shard;
    if (!emlio__shard_try_use(use))
        return;
    shard->ops->advise(shard->impl, first, n, advice);
    emlio__shard_release(use);
}

/* Pages asked of mincore at a time: a 64 KiB vector covers 256 MiB. */
#define S_RESIDENT_PAGES 65536

bool
emlio__shard_resident(emlio__shard_t *shard, uint64_t *bytes)
{
    *bytes = 0;
    if (!shard->ops->mapped || shard->size == 0 || !emlio__shard_try_use(shard))
        return false;
    /* Held: the cache keeps the descriptor open until we let go. A
     * mapping of our own, never touched, so the answer is the page
     * cache's and not whatever the readers' mapping has faulted. */
    int fd = shard->fd;
    size_t size = (size_t)shard->size;
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *vec = emlio_malloc(S_RESIDENT_PAGES);
    void *map = fd < 0 || !vec ? MAP_FAILED
                               : mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    bool ok = map != MAP_FAILED && page > 0;
    size_t pages = ok ? (size + (size_t)page - 1) / (size_t)page : 0;
    uint64_t resident = 0;
    for (size_t first = 0; ok && first < pages; first += S_RESIDENT_PAGES) {
        size_t n = EMLIO_MIN((size_t)S_RESIDENT_PAGES, pages - first);
        size_t len = EMLIO_MIN(n * (size_t)page, size - first * (size_t)page);
        ok = mincore((uint8_t *)map + first * (size_t)page, len, vec) == 0;
        for (size_t i = 0; ok && i < n; i++)
            resident += vec[i] & 1;
    }
    if (map != MAP_FAILED)
        munmap(map, size);
    emlio_free(vec);
    emlio__shard_release(shard);
    *bytes = EMLIO_MIN(resident * (uint64_t)page, (uint64_t)size);
    return ok;
}
