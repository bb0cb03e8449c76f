/* fileio.c - small file helpers shared by the shard backends.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

const char *
emlio__write_advice(int rc, const char *if_denied, const char *if_full)
{
    switch (-rc) {
    case EROFS:
    case EACCES:
    case EPERM:
    case ENOENT: /* the directory is gone (an --index-dir not made) */
    case ENOTDIR:
        return if_denied;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return if_full;
    default:
        return "";
    }
}

static int
s_write_all(int fd, const uint8_t *p, size_t len)
{
    while (len) {
        ssize_t put = write(fd, p, len);
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0)
            return -errno;
        p += put;
        len -= (size_t)put;
    }
    return 0;
}

int
emlio__write_file_atomic(const char *path, const void *data, size_t len)
{
    emlio_buf_t tmp = EMLIO_BUF_INIT;
    if (emlio_buf_addf(&tmp, "%s.tmpXXXXXX", path) < 0)
        return -ENOMEM;
    char *tmp_path = (char *)tmp.data;
    int rc = 0;
    int fd = mkostemp(tmp_path, O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
    } else {
        /* mkstemp creates 0600; an index is as public as its shard. */
        if (fchmod(fd, 0644) < 0)
            rc = -errno;
        if (rc == 0)
            rc = s_write_all(fd, data, len);
        /* fsync before rename so a crash leaves the old file or the whole
         * new one, never an empty file under the final name. */
        if (rc == 0 && fsync(fd) < 0)
            rc = -errno;
        if (close(fd) < 0 && rc == 0)
            rc = -errno;
        if (rc == 0 && rename(tmp_path, path) < 0)
            rc = -errno;
        if (rc < 0)
            unlink(tmp_path);
    }
    emlio_buf_release(&tmp);
    return rc;
}
