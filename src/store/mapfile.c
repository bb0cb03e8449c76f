/* mapfile.c - map a whole file read-only (see mapfile.h).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mapfile.h"

int
emlio__map_file(const emlio__root_t *root, const char *rel, const char *path,
                const uint8_t **base, size_t *size, struct stat *st,
                char *errbuf)
{
    *base = NULL;
    *size = 0;
    int fd = emlio__open_beneath(root, rel, 0, st);
    if (fd < 0)
        return emlio__seterr(errbuf, fd, "cannot open '%s': %s", path,
                             emlio__open_why(fd));
    int rc = emlio__map_fd(fd, st, path, base, size, errbuf);
    close(fd);
    return rc;
}

int
emlio__map_fd(int fd, const struct stat *st, const char *path,
              const uint8_t **base, size_t *size, char *errbuf)
{
    *base = NULL;
    *size = 0;
    if ((uint64_t)st->st_size > SIZE_MAX)
        return emlio__seterr(errbuf, -EFBIG, "cannot map '%s': %s", path,
                             emlio_strerror(-EFBIG));
    if (st->st_size == 0)
        return 0;
    void *map = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        int rc = -errno;
        return emlio__seterr(errbuf, rc, "cannot map '%s': %s", path,
                             emlio_strerror(rc));
    }
    *base = map;
    *size = (size_t)st->st_size;
    return 0;
}

void
emlio__map_drop(const uint8_t *base, size_t size)
{
    if (base)
        munmap((void *)base, size);
}

int
emlio__map_blank(const uint8_t *base, size_t size)
{
    if (!base)
        return 0;
    void *map = mmap((void *)base, size, PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return map == MAP_FAILED ? -errno : 0;
}
