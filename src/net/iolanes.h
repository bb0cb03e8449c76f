/* iolanes.h - which of the context's ZeroMQ I/O threads ("lanes") carry a
 * client's streams, and when to spread them over one more.
 * SPDX-License-Identifier: MIT
 *
 * Every byte a client receives passes through a ZeroMQ I/O thread: it
 * reads the socket (the kernel's copy into user memory), decodes frames
 * and hands messages to the application thread. Spread over two threads,
 * each wakes for less data, reads less per call and so lets the kernel
 * ACK more often; on a 30 ms path this host spent ~0.07 CPU-s/GB more (the
 * client's wake-ups, and the ACKs the sender and the network carry) for
 * 1-7% less MB/s than with one (docs/performance.md, "I/O threads").
 * One thread runs out, though, where a path carries more than it can copy:
 * over loopback here one carried 2.1 GB/s against two threads' 2.4.
 *
 * So a client starts on one lane and measures it: when the thread of a
 * lane in use ran at least EMLIO_IOLANE_FULL of a CPU over
 * EMLIO_IOLANE_FULL_TICKS ticks in a row, the next lane is taken, and the
 * client opens as many streams again for it (the window sends each GET to the
 * stream with the fewest outstanding, so the new streams take their share at
 * once). Streams never move between lanes: ZeroMQ binds a connection to its I/O
 * thread when it is made (ZMQ_AFFINITY). Every lane is used from the start
 * where waiting to measure would only cost: streams the caller fixed (none
 * can be added later), daemons on this host (loopback, ipc: one thread ran
 * full there, and growing later cost 5-10% of loopback MB/s), and a caller
 * who fixed the threads (cfg.io_threads, at most that many).
 *
 * Measuring: ZeroMQ names its I/O threads "<prefix>/ZMQbg/IO/<n>"; the
 * library context sets a number of its own as the prefix
 * (emlio__ctx_io_prefix: no two live contexts share one), so that the
 * threads of other contexts in the process (another client's, pyzmq's)
 * are never counted. A thread's run
 * time comes from /proc/self/task/<tid>/schedstat (nanoseconds), or its
 * stat's utime + stime where schedstat is missing.
 */
#ifndef EMLIO_IOLANES_H
#define EMLIO_IOLANES_H

#include <stdbool.h>
#include <stdint.h>

/* Lanes a client can use; the share of a CPU a lane's thread must run in
 * a tick, and in how many ticks in a row, for the client to take one more.
 * Two ticks: a burst (one busy tick at 100 ms in a bench/run cell) once
 * took a second thread, doubling 32 streams to 64 for no more MB/s and
 * ~100 MiB more RSS; over loopback a thread runs full in every tick. */
#define EMLIO_IOLANES_MAX       8
#define EMLIO_IOLANE_FULL       0.75
#define EMLIO_IOLANE_FULL_TICKS 2

typedef struct emlio__iolanes {
    uint32_t threads; /* the context's I/O threads: lanes there are */
    uint32_t used;    /* lanes new streams go to, 1..threads */
    uint32_t streams[EMLIO_IOLANES_MAX]; /* streams placed on each lane */
    /* Measuring (emlio__iolanes_sample). */
    int prefix;                         /* the context's thread name prefix */
    int tid[EMLIO_IOLANES_MAX];         /* each lane's thread; 0 = not found */
    uint64_t run_ns[EMLIO_IOLANES_MAX]; /* its run time at the last tick */
    uint64_t tick_ns;                   /* when that was; 0 = never */
    double busiest;      /* the busiest used lane's share of a CPU last tick;
                            -1 when the lanes could not be measured */
    uint32_t unmeasured; /* samples in a row that found no thread */
    uint32_t full_ticks; /* ticks in a row a used lane ran full */
} emlio__iolanes_t;

/* Samples in a row that may find none of the context's I/O threads (no
 * /proc, a libzmq that does not name its threads) before the client stops
 * measuring and spreads over every lane, as it did before it measured:
 * a client that cannot see its threads must not stay on one for good. */
#define EMLIO_IOLANES_GIVE_UP 5

/* threads: the context's I/O threads (ZMQ_IO_THREADS); prefix: its
 * thread name prefix (0: none, the threads cannot be told apart, so every
 * lane is used from the start); spread: use every lane from the start
 * (the caller fixed the streams). */
void emlio__iolanes_init(emlio__iolanes_t *self, uint32_t threads, int prefix,
                         bool spread);

/* The lane for a new stream: the used lane with the fewest streams
 * (counted as placed), and its ZMQ_AFFINITY mask in *mask. */
uint32_t emlio__iolanes_place(emlio__iolanes_t *self, uint64_t *mask);

/* A stream on lane was closed. */
void emlio__iolanes_remove(emlio__iolanes_t *self, uint32_t lane);

/* Lanes that carry a stream now: what the client reports as its I/O
 * threads (fewer than `used` where there are fewer streams than lanes, or
 * a daemon took no more streams for a new lane). */
uint32_t emlio__iolanes_carrying(const emlio__iolanes_t *self);

/* Pure step: given each lane's thread run time now (run_ns[lane], 0 = not
 * known; EMLIO_IOLANES_MAX entries) at now_ns, measures the busiest used lane
 * and takes one more lane when it ran EMLIO_IOLANE_FULL of a CPU or more
 * in EMLIO_IOLANE_FULL_TICKS ticks in a row.
 * Returns true when it took one; the first call only records. */
bool emlio__iolanes_step(emlio__iolanes_t *self, uint64_t now_ns,
                         const uint64_t *run_ns);

/* Reads the lanes' thread run times (finding the threads the first time)
 * and steps: emlio__iolanes_step with what /proc says. Where no thread can
 * be found or read, takes no lane, until EMLIO_IOLANES_GIVE_UP samples in a
 * row found none: then takes every lane at once (busiest -1) and returns
 * true. */
bool emlio__iolanes_sample(emlio__iolanes_t *self, uint64_t now_ns);

#endif
