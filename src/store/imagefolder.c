/* imagefolder.c - class directories of image files served as shards: the
 * walk, the packed listing, checked reads, and the format's table (the
 * tree's load is in imagefolder_tree.c, the file-list cache in
 * imagefolder_cache.c).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "beneath.h"
#include "format.h"
#include "imagefolder.h"
#include "imagefolder_list.h"
#include "iobuf.h"
#include "ioengine.h"

/* A file or directory found by a walk, before packing. */
typedef struct {
    char *rel;
    uint64_t size; /* files */
    uint64_t dev;  /* directories */
    uint64_t ino;
    int64_t mtime_ns;
} s_found_t;

typedef struct {
    s_found_t *v;
    size_t n;
    size_t cap;
} s_founds_t;

/* What one walk of a class directory found. */
typedef struct {
    s_founds_t files;
    s_founds_t dirs;
} s_walk_t;

bool
emlio__folder_is_image(const char *name)
{
    /* torchvision's IMG_EXTENSIONS. */
    static const char *const exts[] = { ".jpg", ".jpeg", ".png",
                                        ".ppm", ".bmp",  ".pgm",
                                        ".tif", ".tiff", ".webp" };
    size_t n = strlen(name);
    if (name[0] == '.')
        return false;
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(exts); i++) {
        size_t m = strlen(exts[i]);
        if (n > m && strncasecmp(name + n - m, exts[i], m) == 0)
            return true;
    }
    return false;
}

int64_t
emlio__folder_ns(struct timespec ts)
{
    /* Wrapping arithmetic: the same on both sides of every comparison. */
    return (int64_t)((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}

emlio__folder_blob_t *
emlio__folder_blob_new(void *mem)
{
    emlio__folder_blob_t *blob = emlio_calloc(1, sizeof(*blob));
    if (!blob)
        return NULL;
    atomic_init(&blob->refs, 1);
    blob->mem = mem;
    return blob;
}

void
emlio__folder_blob_drop(emlio__folder_blob_t **blob_p)
{
    emlio__folder_blob_t *blob = *blob_p;
    *blob_p = NULL;
    if (blob && atomic_fetch_sub(&blob->refs, 1) == 1) {
        emlio_free(blob->mem);
        emlio_free(blob);
    }
}

emlio__folder_t *
emlio__folder_new(const char *root, const char *cls, int64_t label,
                  const emlio__root_t *base)
{
    emlio__folder_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->root = emlio_strdup(root);
    self->cls = emlio_strdup(cls);
    self->label = label;
    self->base = *base;
    if (!self->root || !self->cls)
        emlio__folder_destroy(&self);
    return self;
}

void
emlio__folder_forget(emlio__folder_t *self)
{
    emlio__folder_blob_drop(&self->blob);
    self->files = NULL;
    self->dirs = NULL;
    self->names = NULL;
    self->n = self->n_dirs = 0;
    self->bytes = 0;
    self->cached = self->listed = false;
    self->flags = 0;
}

void
emlio__folder_destroy(emlio__folder_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__folder_t *self = *self_p;
    emlio__folder_forget(self);
    emlio_free(self->root);
    emlio_free(self->cls);
    emlio_free(self);
    *self_p = NULL;
}

static void
s_founds_release(s_founds_t *f)
{
    for (size_t i = 0; i < f->n; i++)
        emlio_free(f->v[i].rel);
    emlio_free(f->v);
    *f = (s_founds_t){ 0 };
}

static int
s_founds_push(s_founds_t *f, const char *rel, const struct stat *st)
{
    if (emlio__grow(&f->v, &f->cap, f->n, sizeof(*f->v), 64) < 0)
        return EMLIO_ENOMEM;
    char *copy = emlio_strdup(rel);
    if (!copy)
        return EMLIO_ENOMEM;
    f->v[f->n++] = (s_found_t){
        .rel = copy,
        .size = (uint64_t)st->st_size,
        .dev = (uint64_t)st->st_dev,
        .ino = (uint64_t)st->st_ino,
        .mtime_ns = emlio__folder_ns(st->st_mtim),
    };
    return 0;
}

/* Opens CLASS/rel beneath the data root (rel "" is the class directory). */
int
emlio__folder_open(const emlio__folder_t *self, const char *rel, unsigned flags,
                   struct stat *st)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", self->cls, rel) >=
        (int)sizeof(path))
        return -ENAMETOOLONG;
    return emlio__open_beneath(&self->base, path, flags, st);
}

/* Remembers a symlink the walk left out (not following links, or one that
 * leads out of the root or to something that is not a regular file). */
static void
s_skip_link(emlio__folder_t *self, const char *child)
{
    if (self->links++ == 0)
        (void)!snprintf(self->link, sizeof(self->link), "%.120s/%.120s",
                        self->cls, child);
}

static int s_walk(emlio__folder_t *self, s_walk_t *w, const char *rel,
                  int depth);

/* One directory entry of CLASS/rel: a subdirectory walked, an image
 * listed with its size and mtime (one stat: only a first start, or a
 * class whose directory changed, pays it). */
static int
s_entry(emlio__folder_t *self, s_walk_t *w, int dfd, const char *rel,
        const struct dirent *e, int depth)
{
    char child[PATH_MAX];
    if (snprintf(child, sizeof(child), "%s%s", rel, e->d_name) >=
        (int)sizeof(child))
        return 0;
    struct stat st = { 0 };
    unsigned char type = e->d_type;
    if (type != DT_DIR) {
        if (type != DT_UNKNOWN && !emlio__folder_is_image(e->d_name))
            return 0;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            return 0;
        type = S_ISDIR(st.st_mode)   ? DT_DIR
               : S_ISREG(st.st_mode) ? DT_REG
               : S_ISLNK(st.st_mode) ? DT_LNK
                                     : DT_UNKNOWN;
    }
    if (type == DT_DIR) {
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof(sub), "%s/", child) >= (int)sizeof(sub))
            return 0;
        return s_walk(self, w, sub, depth + 1);
    }
    if (!emlio__folder_is_image(e->d_name))
        return 0;
    if (type == DT_LNK) {
        /* Followed only when asked, and only to a regular file inside the
         * root: the file served is the one opened. */
        int lfd = self->base.follow ? emlio__folder_open(self, child, 0, &st)
                                    : -ELOOP;
        if (lfd < 0) {
            s_skip_link(self, child);
            return 0;
        }
        close(lfd);
        type = DT_REG;
    }
    if (type == DT_REG && st.st_size == 0) {
        if (self->empty++ == 0)
            (void)!snprintf(self->empty_ex, sizeof(self->empty_ex),
                            "%.120s/%.120s", self->cls, child);
        return 0;
    }
    return type == DT_REG ? s_founds_push(&w->files, child, &st) : 0;
}

/* Walks CLASS/rel ("" or "sub/"), following no symlinked directories. */
static int
s_walk(emlio__folder_t *self, s_walk_t *w, const char *rel, int depth)
{
    if (depth > 32)
        return 0;
    struct stat dst;
    int fd = emlio__folder_open(self, rel, EMLIO__OPEN_DIR, &dst);
    if (fd < 0 && depth > 0 && (fd == -EACCES || fd == -EPERM)) {
        /* An unreadable subdirectory (lost+found under a non-root
         * daemon) is left out, as find(1) goes on; the class directory
         * itself must be readable. */
        if (self->unreadable++ == 0)
            (void)!snprintf(self->unread, sizeof(self->unread), "%.120s/%.120s",
                            self->cls, rel);
        return 0;
    }
    if (fd < 0)
        return emlio__seterr(self->err, fd,
                             "cannot open directory '%s/%s/%s': %s", self->root,
                             self->cls, rel, emlio__open_why(fd));
    int rc = s_founds_push(&w->dirs, rel, &dst);
    DIR *dir = rc == 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        close(fd);
        return rc < 0 ? rc : -errno;
    }
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL)
        if (e->d_name[0] != '.')
            rc = s_entry(self, w, dirfd(dir), rel, e, depth);
    closedir(dir);
    return rc;
}

static int
s_cmp_found(const void *a, const void *b)
{
    return strcmp(((const s_found_t *)a)->rel, ((const s_found_t *)b)->rel);
}

/* Packs what a walk found, sorted, into one block the listing points at:
 * the same entries the cache stores, so a cached class and a walked one
 * are served by the same code. */
static int
s_pack(emlio__folder_t *self, s_walk_t *w)
{
    if (w->files.n > 1) /* qsort(NULL, 0) is undefined */
        qsort(w->files.v, w->files.n, sizeof(*w->files.v), s_cmp_found);
    if (w->dirs.n > 1)
        qsort(w->dirs.v, w->dirs.n, sizeof(*w->dirs.v), s_cmp_found);
    size_t names = 0;
    for (size_t i = 0; i < w->files.n; i++)
        names += strlen(w->files.v[i].rel) + 1;
    for (size_t i = 0; i < w->dirs.n; i++)
        names += strlen(w->dirs.v[i].rel) + 1;
    size_t head = w->dirs.n * sizeof(emlio__folder_dir_t) +
                  w->files.n * sizeof(emlio__folder_file_t);
    if (names > UINT32_MAX || w->files.n > INT_MAX)
        return EMLIO_EFORMAT;
    uint8_t *mem = emlio_malloc(head + names + 1);
    emlio__folder_blob_t *blob = mem ? emlio__folder_blob_new(mem) : NULL;
    if (!blob) {
        emlio_free(mem);
        return EMLIO_ENOMEM;
    }
    emlio__folder_dir_t *dirs = (emlio__folder_dir_t *)mem;
    emlio__folder_file_t *files = (emlio__folder_file_t *)(dirs + w->dirs.n);
    char *text = (char *)mem + head;
    uint32_t at = 0;
    for (size_t i = 0; i < w->dirs.n; i++) {
        const s_found_t *d = &w->dirs.v[i];
        size_t len = strlen(d->rel);
        dirs[i] = (emlio__folder_dir_t){ d->dev, d->ino, d->mtime_ns, at,
                                         (uint32_t)len };
        memcpy(text + at, d->rel, len + 1);
        at += (uint32_t)len + 1;
    }
    self->bytes = 0;
    for (size_t i = 0; i < w->files.n; i++) {
        const s_found_t *f = &w->files.v[i];
        size_t len = strlen(f->rel);
        files[i] =
            (emlio__folder_file_t){ f->size, f->mtime_ns, at, (uint32_t)len };
        memcpy(text + at, f->rel, len + 1);
        at += (uint32_t)len + 1;
        self->bytes += f->size;
    }
    self->blob = blob;
    self->dirs = dirs;
    self->n_dirs = w->dirs.n;
    self->files = files;
    self->n = w->files.n;
    self->names = text;
    self->names_len = at;
    return 0;
}

int
emlio__folder_scan(emlio__folder_t *self)
{
    emlio__folder_forget(self);
    self->links = self->unreadable = self->empty = 0;
    /* Taken before the first readdir: a directory whose mtime is this
     * close to it may change again within its clock tick unseen, so the
     * cache lists it again next time (imagefolder_cache.c). */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    self->listed_ns = emlio__folder_ns(now);
    s_walk_t w = { 0 };
    int rc = s_walk(self, &w, "", 0);
    if (rc == 0)
        rc = s_pack(self, &w);
    s_founds_release(&w.files);
    s_founds_release(&w.dirs);
    if (rc < 0)
        return rc;
    self->listed = true;
    /* Left-out links and unreadable subdirectories can change without
     * their directory's mtime changing: such a class is listed again at
     * every start, which also logs them again. */
    self->flags = self->links || self->unreadable || self->empty
                      ? EMLIO__FOLDER_RELIST
                      : 0;
    return (int)self->n;
}

bool
emlio__folder_listed(const emlio__folder_t *self)
{
    return self->listed;
}

bool
emlio__folder_cached(const emlio__folder_t *self)
{
    return self->cached;
}

size_t
emlio__folder_links(const emlio__folder_t *self, const char **example)
{
    *example = self->link;
    return self->links;
}

size_t
emlio__folder_empty(const emlio__folder_t *self, const char **example)
{
    *example = self->empty_ex;
    return self->empty;
}

size_t
emlio__folder_unreadable(const emlio__folder_t *self, const char **example)
{
    *example = self->unread;
    return self->unreadable;
}

size_t
emlio__folder_count(const emlio__folder_t *self)
{
    return self->n;
}

/* ---- the format's table (format.h): a class is a shard ---- */

/* The format's size: the sum of the listed files' sizes. */
static uint64_t
s_size(const void *impl)
{
    const emlio__folder_t *self = impl;
    return self->bytes;
}

/* The format's shard_label: the class's index among the sorted classes. */
static int64_t
s_shard_label(const void *impl)
{
    const emlio__folder_t *self = impl;
    return self->label;
}

/* The format's member_name: record i's path relative to the class
 * directory (borrowed). */
static const char *
s_member_name(const void *impl, size_t i)
{
    const emlio__folder_t *self = impl;
    return i < self->n ? self->names + self->files[i].name : "";
}

/* The format's record_bytes: record i's size as listed (0 for none). */
static uint64_t
s_record_bytes(const void *impl, size_t i)
{
    const emlio__folder_t *self = impl;
    return i < self->n ? self->files[i].size : 0;
}

/* The format's identity: a CRC-32C over the listing, each file's path
 * relative to the class, a NUL and its size as 8 bytes little-endian, in
 * listing order. Two nodes holding the same files of a class agree; a
 * class split between them by files does not (mtimes, which copies do not
 * keep, are left out). */
static uint32_t
s_identity(const void *impl)
{
    const emlio__folder_t *self = impl;
    uint32_t crc = 0;
    for (size_t i = 0; i < self->n; i++) {
        const emlio__folder_file_t *f = &self->files[i];
        uint8_t size[8];
        for (int b = 0; b < 8; b++)
            size[b] = (uint8_t)(f->size >> (8 * b));
        crc = emlio_crc32c(crc, self->names + f->name, (size_t)f->len + 1);
        crc = emlio_crc32c(crc, size, sizeof(size));
    }
    return crc;
}

const char *
emlio__folder_errmsg(const emlio__folder_t *self)
{
    return self->err;
}

/* Reads the whole open file fd of want bytes into a fresh buffer; one
 * byte more is asked for: a grown file reads long, a shrunk one short,
 * and either is a changed file. */
static int
s_read_whole(int fd, size_t want, uint8_t **data)
{
    uint8_t *buf = emlio__iobuf_alloc(want + 1);
    if (!buf)
        return EMLIO_ENOMEM;
    size_t got = 0;
    int rc = 0;
    while (got < want + 1) {
        ssize_t r = pread(fd, buf + got, want + 1 - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            break;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (rc == 0 && got != want)
        rc = EMLIO_EFORMAT;
    if (rc < 0) {
        emlio__iobuf_free(buf);
        return rc;
    }
    *data = buf;
    return 0;
}

/* Opens file i for a read, checked against the listing: returns the
 * descriptor (the caller's to close), EMLIO_ENOTFOUND, EMLIO_EFORMAT
 * (changed since the listing) or -errno; *key (if asked) names the file
 * for as long as self lives. Thread-safe. */
static int
s_open_file(const emlio__folder_t *self, size_t i, const void **key)
{
    if (i >= self->n)
        return EMLIO_ENOTFOUND;
    const emlio__folder_file_t *f = &self->files[i];
    if (key)
        *key = f;
    /* Beneath the root, regular, never blocking: a file replaced by a
     * symlink out of the root or by a FIFO since the listing is refused
     * as a changed file. */
    struct stat st;
    int fd = emlio__folder_open(self, self->names + f->name,
                                EMLIO__OPEN_NOATIME, &st);
    if (fd == EMLIO_EFORMAT || fd == -ELOOP || fd == -EXDEV || fd == -EISDIR)
        return EMLIO_EFORMAT;
    if (fd < 0)
        return fd;
    /* The listing may come from a cache that trusted the file's directory
     * without a stat of the file: a file rewritten since (size or mtime)
     * is reported, not served as something the list did not see. */
    if ((uint64_t)st.st_size != f->size ||
        emlio__folder_ns(st.st_mtim) != f->mtime_ns) {
        close(fd);
        return EMLIO_EFORMAT;
    }
    return fd;
}

/* Reads record i into a fresh buffer (*data, freed with
 * emlio__iobuf_free). Returns 0, EMLIO_ENOTFOUND (no record i),
 * EMLIO_EFORMAT (the file's size changed since the listing), -errno or
 * EMLIO_ENOMEM. Thread-safe. */
static int
s_read_file(const emlio__folder_t *self, size_t i, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd = s_open_file(self, i, NULL);
    if (fd < 0)
        return fd;
    size_t size = (size_t)self->files[i].size;
    int rc = s_read_whole(fd, size, data);
    close(fd);
    if (rc == 0)
        *len = size;
    return rc;
}

static void
s_destroy(void *impl)
{
    emlio__folder_t *folder = impl;
    emlio__folder_destroy(&folder);
}

static size_t
s_count(const void *impl)
{
    return emlio__folder_count(impl);
}

/* Records are files: no offset to name. */
static uint64_t
s_offset(const void *impl, size_t i)
{
    (void)impl;
    (void)i;
    return 0;
}

static int
s_has_field(const void *impl, const char *field)
{
    (void)impl;
    return !strcmp(field, "image") || !strcmp(field, "label");
}

/* A record's file, opened for a staged read (--io read). */
static int
s_open_record(const void *impl, size_t i, const void **key, size_t *len)
{
    int fd = s_open_file(impl, i, key);
    if (fd >= 0)
        *len = (size_t)s_record_bytes(impl, i);
    return fd;
}

/* The image file as a view of its own copy: the one a reader staged
 * (--io read, ioengine.h), else read now. A staged read that came short
 * is a file changed since the listing, as for a read now. */
static int
s_image_view(const void *impl, const emlio__read_ctx_t *ctx, uint64_t record,
             emlio__view_t *view)
{
    uint8_t *buf;
    const uint8_t *data;
    const emlio__folder_t *self = impl;
    size_t len = (size_t)s_record_bytes(impl, (size_t)record);
    int rc = 0;
    if (ctx->read_io && record < self->n) {
        const void *key = &self->files[record];
        rc = emlio__ioengine_take(emlio__ioengine_thread(0), key, -1, 0, len,
                                  &buf, &data);
        if (rc == -ESTALE)
            return EMLIO_EFORMAT;
        if (rc < 0)
            return -EIO;
    }
    if (rc == 0) {
        uint8_t *copy;
        rc = s_read_file(impl, (size_t)record, &copy, &len);
        if (rc < 0)
            return rc;
        buf = copy;
        data = copy;
    }
    view->owned = buf;
    view->data = data;
    view->len = len;
    return 0;
}

static int
s_read(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
       const emlio__read_opts_t *o, emlio__view_t *views, const char **missing)
{
    int64_t label = s_shard_label(impl);
    int rc = 0;
    views[0].label = label;
    if (!o->n_fields) {
        rc = s_image_view(impl, ctx, record, &views[0]);
        if (rc == 0)
            views[0].crc = emlio_crc32c(0, views[0].data, views[0].len);
        return rc;
    }
    for (size_t f = 0; f < o->n_fields && rc == 0; f++) {
        if (strcmp(o->fields[f], "image") == 0) {
            rc = s_image_view(impl, ctx, record, &views[f]);
        } else if (strcmp(o->fields[f], "label") == 0) {
            rc = emlio__view_int64(&views[f], label);
        } else {
            *missing = o->fields[f];
            rc = EMLIO__FORMAT_EMISSING;
        }
    }
    return rc;
}

/* The image, under its extension in lower case ("image" when it has
 * none, or a long one; .jpeg is "jpg": one field for one kind of file). */
static int
s_record(const void *impl, size_t r, emlio_dataset_field_fn *fn, void *userdata,
         int64_t *label)
{
    uint8_t *data;
    size_t len;
    *label = s_shard_label(impl);
    int rc = s_read_file(impl, r, &data, &len);
    if (rc < 0)
        return rc;
    const char *file = s_member_name(impl, r);
    const char *dot = strrchr(file, '.');
    char ext[16] = "image";
    if (dot && strlen(dot + 1) < sizeof(ext)) {
        for (size_t k = 0; dot[1 + k]; k++) {
            char c = dot[1 + k];
            ext[k] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
            ext[k + 1] = '\0';
        }
    }
    if (!strcmp(ext, "jpeg"))
        snprintf(ext, sizeof(ext), "jpg");
    rc = fn(userdata, ext, data, len);
    emlio__iobuf_free(data);
    return rc;
}

/* Listed in emlio__formats (format.c). */
const emlio__format_ops_t emlio__format_imagefolder = {
    .name = "imagefolder",
    .suffix = NULL,
    .what = "class directories",
    .mapped = false,
    .changed_code = EMLIO_EFORMAT,
    .load_tree = emlio__folder_load_tree,
    .destroy = s_destroy,
    .count = s_count,
    .size = s_size,
    .record_bytes = s_record_bytes,
    .offset = s_offset,
    .advise = NULL, /* files are read whole, once */
    .has_field = s_has_field,
    .read = s_read,
    .open_record = s_open_record,
    .member_name = s_member_name,
    .shard_label = s_shard_label,
    .record = s_record,
    .identity = s_identity,
};
