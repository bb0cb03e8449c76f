/* netpath.c - host TCP limits, buffer sizing and TCP_INFO samples.
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include "netpath.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h> /* glibc's struct tcp_info lacks min_rtt, bytes_* */
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The last number on the first line of a /proc/sys file (tcp_wmem holds
 * "min default max"); 0 when unreadable. */
static uint64_t
s_read_last(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[128];
    uint64_t v = 0;
    if (fgets(line, sizeof(line), f)) {
        const char *p = line;
        unsigned long long x;
        int n;
        while (sscanf(p, "%llu%n", &x, &n) == 1) {
            v = x;
            p += n;
        }
    }
    fclose(f);
    return v;
}

/* Whether SO_SNDBUFFORCE works here: tried on a throwaway socket, which is
 * what the kernel checks (CAP_NET_ADMIN in the socket's namespace). */
static bool
s_can_force(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int v = 1 << 20;
    bool ok = setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) == 0;
    close(fd);
    return ok;
}

void
emlio__netpath_limits(emlio__netpath_limits_t *out)
{
    out->tcp_wmem_max = s_read_last("/proc/sys/net/ipv4/tcp_wmem");
    out->tcp_rmem_max = s_read_last("/proc/sys/net/ipv4/tcp_rmem");
    out->wmem_max = s_read_last("/proc/sys/net/core/wmem_max");
    out->rmem_max = s_read_last("/proc/sys/net/core/rmem_max");
    out->net_admin = s_can_force();
}

void
emlio__netpath_plan(const emlio__netpath_limits_t *limits, bool send,
                    int64_t want, emlio__netpath_bufplan_t *out)
{
    uint64_t autotuned = send ? limits->tcp_wmem_max : limits->tcp_rmem_max;
    uint64_t cap = send ? limits->wmem_max : limits->rmem_max;
    *out = (emlio__netpath_bufplan_t){ -1, 0, autotuned, "autotuned" };
    if (want < 0)
        return;
    uint64_t ask = want > 0 ? (uint64_t)want : EMLIO_NETPATH_AUTO_FORCE;
    if (ask > (1u << 30))
        ask = 1u << 30;
    /* The kernel doubles what it is given (bookkeeping overhead), so the
     * buffer an explicit value buys is twice that value. */
    if (limits->net_admin && (want > 0 || 2 * ask > autotuned)) {
        out->force_value = (int)ask;
        out->effective = 2 * ask;
        out->how = "forced";
        return;
    }
    uint64_t explicit_max = cap < ask ? cap : ask;
    if (want > 0 || 2 * explicit_max > autotuned) {
        out->zmq_value = (int)explicit_max;
        out->effective = 2 * explicit_max;
        out->how = "explicit";
    }
}

void
emlio__netpath_plan_recv(const emlio__netpath_limits_t *limits, uint32_t rtt_us,
                         emlio__netpath_bufplan_t *out)
{
    emlio__netpath_plan(limits, false, 0, out);
    if (rtt_us < EMLIO_NETPATH_LONG_RTT_US)
        return;
    uint64_t explicit_max =
        limits->rmem_max < (1u << 30) ? limits->rmem_max : (1u << 30);
    /* Explicit first, even where forcing is allowed: set before the SYN,
     * it opens the first windows at once (first batch 0.43 s after
     * connect at 100 ms, against 0.54 s forced once connected), and the
     * tuner starts more streams for the smaller window, whose slow starts
     * run side by side: 528-654 MB/s against 492-600 forced, 3 of 3 runs
     * (docs/performance.md). Forcing later would not widen it: the buffer
     * at the SYN fixes the window clamp (seen: 8 MiB windows on 32 MiB
     * forced buffers). */
    if (explicit_max && 4 * 2 * explicit_max >= limits->tcp_rmem_max) {
        *out = (emlio__netpath_bufplan_t){ (int)explicit_max, 0,
                                           2 * explicit_max, "explicit" };
        return;
    }
    if (limits->net_admin)
        *out = (emlio__netpath_bufplan_t){ -1, EMLIO_NETPATH_AUTO_FORCE,
                                           2 * EMLIO_NETPATH_AUTO_FORCE,
                                           "forced" };
}

int
emlio__netpath_apply_recv(int fd, const emlio__netpath_bufplan_t *plan)
{
    if (plan->force_value)
        return emlio__netpath_force(fd, false, plan->force_value);
    if (plan->zmq_value >= 0 &&
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &plan->zmq_value,
                   sizeof(plan->zmq_value)) != 0)
        return -errno;
    return 0;
}

int
emlio__netpath_force(int fd, bool send, int bytes)
{
    if (setsockopt(fd, SOL_SOCKET, send ? SO_SNDBUFFORCE : SO_RCVBUFFORCE,
                   &bytes, sizeof(bytes)) != 0)
        return -errno;
    return 0;
}

int
emlio__netpath_cpu_times(uint64_t *idle, uint64_t *total)
{
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return -1;
    unsigned long long v[8] = { 0 };
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 5)
        return -1;
    *idle = v[3] + v[4];
    *total = 0;
    for (int i = 0; i < 8; i++)
        *total += v[i];
    return 0;
}

int
emlio__netpath_info(int fd, emlio__netpath_info_t *out)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return -errno;
    memset(out, 0, sizeof(*out));
    out->rtt_us = ti.tcpi_rtt;
    out->rcv_rtt_us = ti.tcpi_rcv_rtt;
    out->snd_cwnd = ti.tcpi_snd_cwnd;
    out->snd_mss = ti.tcpi_snd_mss;
    out->rcv_space = ti.tcpi_rcv_space;
    /* Fields newer than the oldest kernels we run on: present only when
     * the kernel filled that far. */
    if (len >= offsetof(struct tcp_info, tcpi_bytes_received) +
                   sizeof(ti.tcpi_bytes_received)) {
        out->bytes_acked = ti.tcpi_bytes_acked;
        out->bytes_received = ti.tcpi_bytes_received;
    }
    if (len >=
        offsetof(struct tcp_info, tcpi_min_rtt) + sizeof(ti.tcpi_min_rtt))
        out->min_rtt_us = ti.tcpi_min_rtt;
    socklen_t il = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &out->sndbuf, &il);
    il = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &out->rcvbuf, &il);
    return 0;
}

/* Splits tcp://HOST:PORT (HOST may be [v6]) into host and port. */
static bool
s_split_tcp(const char *endpoint, char *host, size_t hlen, char *port,
            size_t plen)
{
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return false;
    const char *h = endpoint + 6;
    const char *colon = strrchr(h, ':');
    if (!colon || colon == h || strlen(colon + 1) == 0 ||
        strlen(colon + 1) >= plen)
        return false;
    size_t n = (size_t)(colon - h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    if (n == 0 || n >= hlen || (n == 1 && h[0] == '*'))
        return false;
    memcpy(host, h, n);
    host[n] = '\0';
    strcpy(port, colon + 1);
    return true;
}

bool
emlio__netpath_ipv6_endpoint(const char *endpoint)
{
    return !strncmp(endpoint, "tcp://[", 7);
}

bool
emlio__netpath_loopback(int family, const void *addr)
{
    if (family == AF_INET)
        return (ntohl(((const struct in_addr *)addr)->s_addr) >> 24) == 127;
    if (family != AF_INET6)
        return false;
    const struct in6_addr *a = addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool
emlio__netpath_local_endpoint(const char *endpoint)
{
    if (!strncmp(endpoint, "ipc://", 6) || !strncmp(endpoint, "inproc://", 9))
        return true;
    char host[256], port[16];
    if (!s_split_tcp(endpoint, host, sizeof(host), port, sizeof(port)))
        return false;
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return emlio__netpath_loopback(AF_INET, &v4);
    if (inet_pton(AF_INET6, host, &v6) == 1)
        return emlio__netpath_loopback(AF_INET6, &v6);
    return !strcmp(host, "localhost");
}

int
emlio__netpath_resolve(const char *endpoint, char *why, size_t len)
{
    char host[256], port[16];
    if (!s_split_tcp(endpoint, host, sizeof(host), port, sizeof(port)))
        return 0; /* not TCP, or ZeroMQ's to say what is wrong with it */
    /* The host alone: a bad port is ZeroMQ's to name. */
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (res)
        freeaddrinfo(res);
    if (rc == 0)
        return 0;
    snprintf(why, len, "cannot resolve host '%s' of endpoint '%s': %s", host,
             endpoint, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    return -1;
}

int
emlio__netpath_probe(const char *endpoint, int timeout_ms)
{
    char host[256], port[16];
    if (!s_split_tcp(endpoint, host, sizeof(host), port, sizeof(port)))
        return 0;
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0 || !res)
        return 0;
    int refused = 0;
    int fd =
        socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = { fd, POLLOUT, 0 };
            int err = 0;
            socklen_t len = sizeof(err);
            if (poll(&p, 1, timeout_ms) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0)
                refused = err == ECONNREFUSED;
        } else if (rc < 0) {
            refused = errno == ECONNREFUSED;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return refused ? -ECONNREFUSED : 0;
}
