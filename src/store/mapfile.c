/* mapfile.c - one file mapped whole, read-only (see mapfile.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emlio/tfrecord.h"
#include "mapfile.h"

int
emlio__mapfile_init(emlio__mapfile_t *self, const char *path)
{
    memset(self, 0, sizeof(*self));
    self->root = EMLIO__ROOT_NONE;
    self->path = emlio_strdup(path);
    return self->path ? 0 : EMLIO_ENOMEM;
}

void
emlio__mapfile_confine(emlio__mapfile_t *self, const emlio__root_t *root,
                       const char *rel)
{
    size_t n = strlen(self->path), m = strlen(rel);
    assert(m <= n && strcmp(self->path + n - m, rel) == 0);
    self->root = *root;
    self->skip = n - m;
}

int
emlio__mapfile_map_fd(emlio__mapfile_t *self, int fd, const struct stat *st)
{
    assert(self && !self->base);
    if ((uint64_t)st->st_size > SIZE_MAX)
        return emlio__seterr(self->err, -EFBIG, "cannot map '%s': %s",
                             self->path, emlio_strerror(-EFBIG));
    void *map = NULL;
    if (st->st_size > 0) {
        map = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int rc = -errno;
            return emlio__seterr(self->err, rc, "cannot map '%s': %s",
                                 self->path, emlio_strerror(rc));
        }
    }
    self->base = map;
    self->size = (size_t)st->st_size;
    self->mtime = st->st_mtim;
    self->open = true;
    return 0;
}

int
emlio__mapfile_open(emlio__mapfile_t *self)
{
    struct stat st;
    int fd = emlio__open_beneath(&self->root, self->path + self->skip, 0, &st);
    if (fd < 0)
        return emlio__seterr(self->err, fd, "cannot open '%s': %s", self->path,
                             emlio__open_why(fd));
    int rc = emlio__mapfile_map_fd(self, fd, &st);
    close(fd);
    return rc;
}

void
emlio__mapfile_unmap(emlio__mapfile_t *self)
{
    if (self->base)
        munmap((void *)(uintptr_t)self->base, self->size);
    self->base = NULL;
    self->open = false;
}

int
emlio__mapfile_blank(const emlio__mapfile_t *self)
{
    if (!self->base)
        return 0;
    void *map = mmap((void *)(uintptr_t)self->base, self->size, PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return map == MAP_FAILED ? -errno : 0;
}

int
emlio__mapfile_advise(const emlio__mapfile_t *self, uint64_t start,
                      uint64_t stop, int advice)
{
    if (!self->base)
        return 0;
    int how;
    switch (advice) {
    case EMLIO_ADVISE_WILLNEED:
        how = MADV_WILLNEED;
        break;
    case EMLIO_ADVISE_DONTNEED:
        how = MADV_DONTNEED;
        break;
    default:
        return -EINVAL;
    }
    if (stop > self->size || start >= stop)
        return -EINVAL;
    /* madvise wants a page-aligned start. */
    long page = sysconf(_SC_PAGESIZE);
    uint64_t mask = (uint64_t)(page > 0 ? page : 4096) - 1;
    uint64_t lo = start & ~mask;
    uint64_t hi = (stop + mask) & ~mask;
    if (madvise((void *)(uintptr_t)(self->base + lo), (size_t)(hi - lo), how) <
        0)
        return -errno;
    return 0;
}

/* Whether a is older than b. */
static bool
s_older(struct timespec a, struct timespec b)
{
    return a.tv_sec < b.tv_sec ||
           (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

int
emlio__mapfile_read_beside(emlio__mapfile_t *self, const char *idx_path,
                           bool fresh, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    bool beside =
        self->root.fd >= 0 && strncmp(idx_path, self->path, self->skip) == 0;
    emlio__root_t none = EMLIO__ROOT_NONE;
    struct stat st;
    int fd =
        emlio__open_beneath(beside ? &self->root : &none,
                            beside ? idx_path + self->skip : idx_path, 0, &st);
    if (fd < 0)
        return emlio__seterr(self->err, fd, "cannot open index '%s': %s",
                             idx_path, emlio__open_why(fd));
    int rc = 0;
    if ((uint64_t)st.st_size > EMLIO__MAPFILE_INDEX_MAX)
        rc = emlio__seterr(self->err, EMLIO_EFORMAT,
                           "index '%s' is not a regular file of at most %zu "
                           "bytes",
                           idx_path, EMLIO__MAPFILE_INDEX_MAX);
    else if (fresh && s_older(st.st_mtim, self->mtime))
        rc = emlio__seterr(self->err, -ESTALE, "index '%s' is older than '%s'",
                           idx_path, self->path);
    size_t cap = rc == 0 ? (size_t)st.st_size : 0;
    char *data = rc == 0 ? emlio_malloc(cap + 1) : NULL;
    if (rc == 0 && !data)
        rc = emlio__seterr(self->err, EMLIO_ENOMEM,
                           "out of memory reading index '%s'", idx_path);
    size_t got = 0;
    while (rc == 0 && got < cap) {
        ssize_t r = read(fd, data + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = -errno;
            rc = emlio__seterr(self->err, err, "cannot read index '%s': %s",
                               idx_path, emlio_strerror(err));
        }
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (rc < 0) {
        emlio_free(data);
        return rc;
    }
    *text = data;
    *len = got;
    return 0;
}

void
emlio__mapfile_release(emlio__mapfile_t *self)
{
    emlio__mapfile_unmap(self);
    emlio_free(self->path);
    memset(self, 0, sizeof(*self));
    self->root = EMLIO__ROOT_NONE;
}
