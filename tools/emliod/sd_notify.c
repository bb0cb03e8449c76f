/* sd_notify.c - the sd_notify(3) datagram protocol without libsystemd: one
 * datagram of "KEY=VALUE" lines to the unix socket named by $NOTIFY_SOCKET
 * (a path, or an abstract name when it starts with '@').
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sd_notify.h"

static int
s_send(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
        return -EINVAL;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    ssize_t n = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL,
                       (const struct sockaddr *)&sa, salen);
    int rc = n < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int
sd_notify_ready(const char *endpoint)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=listening on %s\nMAINPID=%ld",
             endpoint, (long)getpid());
    return s_send(msg);
}

int
sd_notify_stopping(void)
{
    return s_send("STOPPING=1");
}
