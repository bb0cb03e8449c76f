/* relay.h - a TCP relay that holds every byte for a fixed one-way delay and
 * can cap each direction's rate: RTT emulation where the kernel has no netem.
 * SPDX-License-Identifier: MIT
 */
#ifndef RELAY_H
#define RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

/* How bytes are held while they wait out the delay. */
enum {
    RELAY_COPY = 0,   /* read() into pooled, pre-touched 256 KiB blocks */
    RELAY_SPLICE = 1, /* splice() into a pool of kernel pipes: no copy */
};

typedef struct {
    const char *listen;      /* "HOST:PORT"; port 0 picks a free one */
    const char *connect;     /* "HOST:PORT" of the upstream server */
    double delay_ms;         /* one-way delay, each direction */
    double rate_mbit;        /* per-direction cap in Mbit/s; 0 = none */
    int max_conns;           /* concurrent client connections */
    double stats_interval_s; /* 0 = only at exit */
    size_t max_buffer;       /* bytes held per direction before backpressure */
    int spin_us;             /* busy-poll this long before each release */
    int mode;                /* RELAY_COPY or RELAY_SPLICE */
    FILE *log;               /* stats lines go here; NULL = silent */
} relay_opts_t;

/* Fills opts with the defaults: 1024 connections, 64 MiB per direction,
 * 150 us busy-poll, copy mode, log to stderr. */
void relay_opts_init(relay_opts_t *opts);

typedef struct relay relay_t;

/* Parses "HOST:PORT" or "[V6]:PORT" and resolves HOST (numeric or a name).
 * Fills *addr and *addr_len. Returns 0, or -1 with a reason (such as
 * "invalid port") written to err. Blocks on DNS for names. */
int relay_parse_addr(const char *text, struct sockaddr_storage *addr,
                     unsigned *addr_len, char *err, size_t err_len);

/* Allocates a relay with a copy of opts (the strings are borrowed and must
 * outlive it). Returns NULL only when out of memory. */
relay_t *relay_new(const relay_opts_t *opts);

/* Resolves both addresses and listens. Returns 0, or -1 with the reason in
 * relay_errmsg(). */
int relay_bind(relay_t *self);

/* "HOST:PORT" actually listened on (the real port when 0 was asked for).
 * Borrowed; valid until destroy. */
const char *relay_endpoint(const relay_t *self);

/* Runs the event loop in the calling thread until stop_fd (a signalfd or
 * eventfd, or -1 for none) becomes readable. Returns 0 on a requested stop,
 * -1 on a fatal error (see relay_errmsg()). Per-connection failures
 * only close that connection. */
int relay_run(relay_t *self, int stop_fd);

/* Writes one summary line (bytes, chunks, lateness max/p99, CPU) to out. */
void relay_print_stats(relay_t *self, FILE *out);

/* The reason for the last failure. Borrowed; valid until the next call. */
const char *relay_errmsg(const relay_t *self);

/* Closes every socket and frees the relay; NULL-safe; sets *self_p = NULL. */
void relay_destroy(relay_t **self_p);

#endif /* RELAY_H */
