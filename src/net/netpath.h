/* netpath.h - what the host's TCP allows and measures: socket-buffer limits,
 * buffer sizing, and per-connection TCP_INFO samples.
 * SPDX-License-Identifier: MIT
 *
 * A TCP stream carries at most about (send buffer) / RTT, so on a long path
 * the buffers, not the link, set the rate. Linux gives a socket two ways to
 * get a big buffer: autotuning up to net.ipv4.tcp_wmem/tcp_rmem's maximum,
 * or an explicit SO_SNDBUF/SO_RCVBUF, which the kernel doubles and caps at
 * net.core.wmem_max/rmem_max (and which turns autotuning off). A process
 * with CAP_NET_ADMIN may pass the cap with SO_SNDBUFFORCE/SO_RCVBUFFORCE.
 * This module picks the largest of these the host allows, and reads the
 * kernel's own view of a connection (RTT, bytes, window) for the client's
 * stream tuner and for the "what limits the rate" report.
 */
#ifndef EMLIO_NETPATH_H
#define EMLIO_NETPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The host's limits, from /proc/sys (0 where unreadable). */
typedef struct emlio__netpath_limits {
    uint64_t tcp_wmem_max; /* autotuned send buffer ceiling */
    uint64_t tcp_rmem_max; /* autotuned receive buffer ceiling */
    uint64_t wmem_max;     /* explicit SO_SNDBUF ceiling (before doubling) */
    uint64_t rmem_max;     /* explicit SO_RCVBUF ceiling (before doubling) */
    bool net_admin;        /* SO_SNDBUFFORCE/SO_RCVBUFFORCE permitted */
} emlio__netpath_limits_t;

void emlio__netpath_limits(emlio__netpath_limits_t *out);

/* How to size one direction's buffer. `want` > 0: that many bytes;
 * 0: the largest the host allows (capped at EMLIO_NETPATH_AUTO_FORCE when
 * forcing); < 0: leave it to the kernel. */
typedef struct emlio__netpath_bufplan {
    int zmq_value;      /* for ZMQ_SNDBUF/ZMQ_RCVBUF; -1 = leave unset */
    int force_value;    /* for SO_*BUFFORCE on each connection; 0 = none */
    uint64_t effective; /* the buffer the kernel will allow, in bytes */
    const char *how;    /* "autotuned", "explicit" or "forced" */
} emlio__netpath_bufplan_t;

/* The forced buffer "auto" asks for: twice this in the kernel (32 MiB),
 * enough for ~1 GB/s per stream at 30 ms. */
#define EMLIO_NETPATH_AUTO_FORCE (16u << 20)

void emlio__netpath_plan(const emlio__netpath_limits_t *limits, bool send,
                         int64_t want, emlio__netpath_bufplan_t *out);

/* The RTT from which a path counts as long for the receive buffer. */
#define EMLIO_NETPATH_LONG_RTT_US 2000

/* The receive buffer for a path of RTT rtt_us (0: not known yet). On a
 * short path, the plan of want = 0 (autotuned where that is largest). On a
 * long one, a fixed buffer from the first byte: autotuning starts at
 * tcp_rmem's default (128 KiB) and grows with what the application read in
 * the last RTT, so at 100 ms a stream sat at a 64-88 KiB window for ~0.7 s
 * while the sender had 21 MB queued (bench/run, docs/performance.md).
 * That buffer is rmem_max, explicit (zmq_value: set before connecting,
 * and on stream 0, connected before the RTT was known, once connected),
 * unless it is below a quarter of what autotuning reaches (rmem_max is
 * 208 KiB on many hosts): then forced once connected (force_value) with
 * CAP_NET_ADMIN, else autotuned after all. */
void emlio__netpath_plan_recv(const emlio__netpath_limits_t *limits,
                              uint32_t rtt_us, emlio__netpath_bufplan_t *out);

/* Sizes a connected fd's receive buffer as plan says (SO_RCVBUFFORCE with
 * force_value, else SO_RCVBUF with an explicit zmq_value; nothing when
 * autotuned). Returns 0 or -errno. */
int emlio__netpath_apply_recv(int fd, const emlio__netpath_bufplan_t *plan);

/* Applies SO_SNDBUFFORCE (send) or SO_RCVBUFFORCE to a connected TCP fd.
 * Returns 0 or -errno. */
int emlio__netpath_force(int fd, bool send, int bytes);

/* One TCP_INFO sample of a connection. */
typedef struct emlio__netpath_info {
    uint32_t rtt_us;     /* smoothed RTT (from our sends' ACKs) */
    uint32_t min_rtt_us; /* lowest RTT seen; 0 where unknown */
    uint32_t rcv_rtt_us; /* receiver-side RTT estimate */
    uint64_t bytes_received;
    uint64_t bytes_acked;
    uint32_t snd_cwnd; /* segments */
    uint32_t snd_mss;
    uint32_t rcv_space; /* receive window the kernel aims for */
    int sndbuf;         /* SO_SNDBUF / SO_RCVBUF as the kernel keeps them */
    int rcvbuf;
} emlio__netpath_info_t;

/* This host's CPU time so far, from /proc/stat: idle (idle + iowait) and
 * total jiffies. Returns 0, or -1 where /proc/stat is unreadable. */
int emlio__netpath_cpu_times(uint64_t *idle, uint64_t *total);

/* Reads fd's TCP_INFO; 0, or -errno (the fd is gone or not TCP). */
int emlio__netpath_info(int fd, emlio__netpath_info_t *out);

/* Whether a tcp:// endpoint's host resolves (getaddrinfo, so a name the
 * resolver does not know fails at once rather than after the connect
 * timeout): 0, or -1 with why (len bytes) naming the host and the
 * resolver's reason. Other transports: 0. */
int emlio__netpath_resolve(const char *endpoint, char *why, size_t len);

/* Whether anything listens at a tcp://HOST:PORT endpoint: one plain TCP
 * connect, waited for at most timeout_ms, then closed. Returns
 * -ECONNREFUSED when the host answered that nothing listens there (the
 * case a ZeroMQ connect would retry silently until its timeout), else 0
 * (listening, unreachable for now, not a tcp:// endpoint, or unknown: the
 * caller's own connect decides). */
int emlio__netpath_probe(const char *endpoint, int timeout_ms);

/* Whether endpoint names an IPv6 address (tcp://[ADDR]:PORT): ZeroMQ then
 * needs ZMQ_IPV6 on the socket, or binding and connecting fail with "No
 * such device". Only for such literals: with ZMQ_IPV6 on, a host name
 * may resolve to an IPv6 address that nothing listens on (localhost to
 * ::1 while the daemon has 127.0.0.1), where ZeroMQ retries forever. */
bool emlio__netpath_ipv6_endpoint(const char *endpoint);

/* Whether addr (a struct in_addr for AF_INET, in6_addr for AF_INET6) is
 * a loopback address: 127.0.0.0/8, ::1, or ::ffff:127.x. */
bool emlio__netpath_loopback(int family, const void *addr);

/* Whether endpoint names this host by its loopback (emlio__netpath_loopback,
 * or localhost) or is ipc:// or inproc://. By name only: a daemon reached
 * at one of this host's other addresses counts as remote. */
bool emlio__netpath_local_endpoint(const char *endpoint);

#endif /* EMLIO_NETPATH_H */
