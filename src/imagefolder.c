/* imagefolder.c - class directories of image files served as shards.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "imagefolder.h"

typedef struct {
    char *rel;
    uint64_t size;
} s_file_t;

struct emlio__folder {
    char *root;
    char *cls;
    int64_t label;
    int dirfd;
    s_file_t *files;
    size_t n;
    size_t cap;
    uint64_t bytes;
    char err[EMLIO_ERRMSG_LEN];
};

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

emlio__folder_t *
emlio__folder_new(const char *root, const char *cls, int64_t label)
{
    emlio__folder_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->root = emlio_strdup(root);
    self->cls = emlio_strdup(cls);
    self->label = label;
    self->dirfd = -1;
    if (!self->root || !self->cls)
        emlio__folder_destroy(&self);
    return self;
}

void
emlio__folder_destroy(emlio__folder_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__folder_t *self = *self_p;
    for (size_t i = 0; i < self->n; i++)
        emlio_free(self->files[i].rel);
    emlio_free(self->files);
    if (self->dirfd >= 0)
        close(self->dirfd);
    emlio_free(self->root);
    emlio_free(self->cls);
    emlio_free(self);
    *self_p = NULL;
}

static int
s_push(emlio__folder_t *self, const char *rel, uint64_t size)
{
    if (self->n == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 64;
        s_file_t *files = emlio_reallocarray(self->files, cap, sizeof(*files));
        if (!files)
            return EMLIO_ENOMEM;
        self->files = files;
        self->cap = cap;
    }
    char *copy = emlio_strdup(rel);
    if (!copy)
        return EMLIO_ENOMEM;
    self->files[self->n++] = (s_file_t){ copy, size };
    self->bytes += size;
    return 0;
}

/* Walks dirfd/rel ("" or "sub/"), following no symlinked directories. */
static int
s_walk(emlio__folder_t *self, const char *rel, int depth)
{
    if (depth > 32)
        return 0;
    int fd = rel[0] ? openat(self->dirfd, rel,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                    : dup(self->dirfd);
    if (fd < 0)
        return emlio__seterr(self->err, -errno,
                             "cannot open directory '%s/%s/%s': %s", self->root,
                             self->cls, rel, strerror(errno));
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    rewinddir(dir);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char child[PATH_MAX];
        if (snprintf(child, sizeof(child), "%s%s", rel, e->d_name) >=
            (int)sizeof(child))
            continue;
        struct stat st;
        if (fstatat(self->dirfd, child, &st, 0) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            struct stat lst;
            if (fstatat(self->dirfd, child, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISDIR(lst.st_mode)) {
                char sub[PATH_MAX];
                if (snprintf(sub, sizeof(sub), "%s/", child) < (int)sizeof(sub))
                    rc = s_walk(self, sub, depth + 1);
            }
        } else if (S_ISREG(st.st_mode) && emlio__folder_is_image(e->d_name)) {
            rc = s_push(self, child, (uint64_t)st.st_size);
        }
    }
    closedir(dir);
    return rc;
}

static int
s_cmp_files(const void *a, const void *b)
{
    return strcmp(((const s_file_t *)a)->rel, ((const s_file_t *)b)->rel);
}

int
emlio__folder_scan(emlio__folder_t *self)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", self->root, self->cls) >=
        (int)sizeof(path))
        return emlio__seterr(self->err, -ENAMETOOLONG, "path too long: '%s'",
                             self->cls);
    if (self->dirfd < 0) {
        self->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (self->dirfd < 0)
            return emlio__seterr(self->err, -errno,
                                 "cannot open directory '%s': %s", path,
                                 strerror(errno));
    }
    int rc = s_walk(self, "", 0);
    if (rc < 0)
        return rc;
    qsort(self->files, self->n, sizeof(*self->files), s_cmp_files);
    return self->n > INT_MAX ? EMLIO_EFORMAT : (int)self->n;
}

size_t
emlio__folder_count(const emlio__folder_t *self)
{
    return self->n;
}

uint64_t
emlio__folder_size(const emlio__folder_t *self)
{
    return self->bytes;
}

int64_t
emlio__folder_label(const emlio__folder_t *self)
{
    return self->label;
}

const char *
emlio__folder_file(const emlio__folder_t *self, size_t i)
{
    return i < self->n ? self->files[i].rel : "";
}

const char *
emlio__folder_errmsg(const emlio__folder_t *self)
{
    return self->err;
}

int
emlio__folder_read(const emlio__folder_t *self, size_t i, uint8_t **data,
                   size_t *len)
{
    *data = NULL;
    *len = 0;
    if (i >= self->n)
        return EMLIO_ENOTFOUND;
    const s_file_t *f = &self->files[i];
    int fd;
    do
        fd = openat(self->dirfd, f->rel, O_RDONLY | O_CLOEXEC | O_NOATIME);
    while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno == EPERM) /* O_NOATIME on a file we do not own */
        fd = openat(self->dirfd, f->rel, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* One byte more than listed: a grown file reads long, a shrunk one
     * short; either is a changed file. */
    size_t want = (size_t)f->size;
    uint8_t *buf = emlio_malloc(want + 1);
    if (!buf) {
        close(fd);
        return EMLIO_ENOMEM;
    }
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
    close(fd);
    if (rc == 0 && got != want)
        rc = EMLIO_EFORMAT;
    if (rc < 0) {
        emlio_free(buf);
        return rc;
    }
    *data = buf;
    *len = want;
    return 0;
}
