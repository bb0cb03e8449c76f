/* mapfile.c - map a whole file read-only (see mapfile.h).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mapfile.h"

int
emlio__map_file(const char *path, const uint8_t **base, size_t *size,
                struct stat *st, char *errbuf)
{
    *base = NULL;
    *size = 0;
    int fd;
    do
        fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int rc = -errno;
        return emlio__seterr(errbuf, rc, "cannot open '%s': %s", path,
                             emlio_strerror(rc));
    }
    int rc = 0;
    if (fstat(fd, st) < 0) {
        rc = -errno;
        emlio__seterr(errbuf, rc, "cannot stat '%s': %s", path,
                      emlio_strerror(rc));
    } else if (S_ISDIR(st->st_mode)) {
        rc = emlio__seterr(errbuf, -EISDIR, "cannot map '%s': %s", path,
                           emlio_strerror(-EISDIR));
    } else if (!S_ISREG(st->st_mode)) {
        rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                           "cannot map '%s': not a regular file", path);
    } else if ((uint64_t)st->st_size > SIZE_MAX) {
        rc = emlio__seterr(errbuf, -EFBIG, "cannot map '%s': %s", path,
                           emlio_strerror(-EFBIG));
    } else if (st->st_size > 0) {
        void *map =
            mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = -errno;
            emlio__seterr(errbuf, rc, "cannot map '%s': %s", path,
                          emlio_strerror(rc));
        } else {
            *base = map;
            *size = (size_t)st->st_size;
        }
    }
    close(fd);
    return rc;
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
