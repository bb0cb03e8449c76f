/* delayline.c - an end-to-end RTT emulator for kernels without netem.
 * SPDX-License-Identifier: MIT
 *
 * Two TUN devices, one in the current network namespace ("near") and one in
 * another ("far", given by name as `ip netns` knows it). Every IP packet the
 * kernel routes into one device is read here, held for the one-way delay,
 * and written into the other device, where the kernel receives it as if it
 * had come off a wire. Unlike a relay that accepts the TCP connection and
 * opens its own, nothing here terminates TCP: the sender's window, socket
 * buffers, slow start and congestion control all act across the emulated
 * path, as they do on a real long network.
 *
 *   delayline --netns NS --delay-ms 15 [--rate-mbit R] [--loss P]
 *             [--near-addr 10.77.0.1] [--far-addr 10.77.0.2] [--mtu 65000]
 *
 * prints "delayline: ready NEAR_ADDR FAR_ADDR" once both devices are up and
 * addressed, then runs until SIGINT/SIGTERM and prints one stats line per
 * direction on stderr. Processes in NS reach this namespace at NEAR_ADDR;
 * this namespace reaches them at FAR_ADDR.
 *
 * Each direction is one thread with a ring of pre-touched memory (fresh
 * pages are expensive on our VMs): it waits in ppoll() until a packet
 * arrives or the oldest one is due (timer slack 1 ns), so the delay is
 * exact to the scheduler's wake-up latency; lateness percentiles are
 * reported. A full ring drops the packet,
 * as a router's tail-drop queue would; the ring is sized far above the
 * bandwidth-delay product of any path this machine can carry.
 *
 * By default both devices carry a virtio-net header and take checksum and
 * TSO offload (--no-offload turns it off): the sending kernel then hands
 * over 64 KB TCP packets unsegmented and unchecksummed, and the receiving
 * kernel trusts them, which saves one pass over every byte (+5-10% for one
 * iperf3 stream here). --spin-us US busy-waits instead of sleeping when
 * the next packet is due within US microseconds: lower lateness at
 * sub-millisecond delays, at the cost of CPU. Each byte is still copied
 * four times (sender, TUN read, TUN write, receiver); on this 2-core VM
 * iperf3 + delay line reach ~1.2-1.4 GB/s for one stream at 0.05 ms RTT
 * when other work shares the cores.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLOT_HDR 16u            /* len (4) + pad (4) + due time (8) */
#define MAX_PKT  (65536u + 64u) /* a GSO packet and its virtio-net header */

typedef struct {
    const char *name; /* "near->far" or "far->near" */
    int in_fd, out_fd;
    uint8_t *ring;
    uint64_t ring_bytes;
    uint64_t head;    /* bytes produced */
    uint64_t tail;    /* bytes consumed */
    uint64_t free_at; /* rate cap: when the link is free again */
    uint64_t delay_ns;
    double rate_bytes_per_ns; /* 0 = no cap */
    double loss;              /* probability of dropping a packet */
    uint64_t spin_ns; /* busy-wait instead of sleeping for waits this short */
    uint64_t rng;
    /* Figures, written by one thread each, read at exit. */
    uint64_t packets, bytes, dropped_full, dropped_loss, write_errors;
    uint64_t late_hist[32]; /* lateness, log2 microsecond buckets */
} direction_t;

static volatile sig_atomic_t g_stop;

static void
on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Prints "delayline: WHAT ARG: strerror(errno)" and exits 1. */
static void
die(const char *what, const char *arg)
{
    fprintf(stderr, "delayline: %s %s: %s\n", what, arg, strerror(errno));
    exit(1);
}

/* Opens a TUN device named `name` in the calling thread's namespace. */
static int
tun_open(const char *name, bool offload)
{
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        die("cannot open /dev/net/tun for", name);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (offload ? IFF_VNET_HDR : 0);
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0)
        die("cannot create TUN device", name);
    /* Offload: every packet carries a virtio-net header, and the device
     * takes unchecksummed TSO packets. The sender's kernel then neither
     * segments nor checksums what it hands us, and the header, passed on
     * unchanged, tells the receiving kernel the checksum needs no check. */
    if (offload &&
        ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) < 0)
        die("cannot set offloads on TUN device", name);
    return fd;
}

/* Runs `ip ARGS...` (optionally inside namespace ns) and dies on failure. */
static void __attribute__((format(printf, 2, 3)))
ip_cmd(const char *ns, const char *fmt, ...)
{
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    char cmd[640];
    if (ns)
        snprintf(cmd, sizeof(cmd), "ip -n %s %s", ns, args);
    else
        snprintf(cmd, sizeof(cmd), "ip %s", args);
    int rc = system(cmd);
    if (rc != 0) {
        errno = EINVAL;
        die("command failed:", cmd);
    }
}

/* xorshift64*: enough randomness for loss, and reproducible per run. */
static double
rand01(direction_t *d)
{
    d->rng ^= d->rng >> 12;
    d->rng ^= d->rng << 25;
    d->rng ^= d->rng >> 27;
    return (double)((d->rng * 0x2545F4914F6CDD1Dull) >> 11) /
           9007199254740992.0;
}

/* Reads every packet waiting on the input device into the ring (the fd is
 * non-blocking). Returns when the device is empty or the ring is full. */
static void
take_packets(direction_t *d)
{
    for (int burst = 0; burst < 256; burst++) {
        /* Room for the largest packet, wrapping to the ring's start with a
         * marker when the end is too near. */
        uint64_t off = d->head % d->ring_bytes;
        if (d->ring_bytes - off < SLOT_HDR + MAX_PKT) {
            if (d->head + (d->ring_bytes - off) - d->tail > d->ring_bytes)
                return; /* full: leave packets queued in the device */
            *(uint64_t *)(d->ring + off + 8) = UINT64_MAX;
            d->head += d->ring_bytes - off;
            continue;
        }
        if (d->head + SLOT_HDR + MAX_PKT - d->tail > d->ring_bytes) {
            /* Full: drop what arrives, as a router's tail-drop queue. */
            uint8_t junk[MAX_PKT];
            if (read(d->in_fd, junk, sizeof(junk)) > 0)
                d->dropped_full++;
            return;
        }
        uint8_t *slot = d->ring + off;
        ssize_t n = read(d->in_fd, slot + SLOT_HDR, MAX_PKT);
        if (n <= 0)
            return; /* EAGAIN: the device is empty */
        if (d->loss > 0 && rand01(d) < d->loss) {
            d->dropped_loss++;
            continue;
        }
        uint32_t len = (uint32_t)n;
        uint64_t due = now_ns() + d->delay_ns;
        memcpy(slot, &len, 4);
        memcpy(slot + 8, &due, 8);
        d->head += (SLOT_HDR + (uint64_t)n + 15) & ~15ull;
    }
}

/* Writes every packet whose time has come to the output device. Returns
 * when the next packet is due (at *next_due), or 0 when the ring is empty. */
static uint64_t
give_packets(direction_t *d, uint64_t now)
{
    while (d->tail != d->head) {
        uint8_t *slot = d->ring + d->tail % d->ring_bytes;
        uint32_t len;
        uint64_t due;
        memcpy(&len, slot, 4);
        memcpy(&due, slot + 8, 8);
        if (due == UINT64_MAX) { /* wrap marker */
            d->tail += d->ring_bytes - d->tail % d->ring_bytes;
            continue;
        }
        if (d->rate_bytes_per_ns > 0 && d->free_at > due)
            due = d->free_at; /* the capped link is still busy */
        if (now < due)
            return due;
        uint64_t late_us = (now - due) / 1000;
        int bucket = 0;
        while (late_us && bucket < 31) {
            late_us >>= 1;
            bucket++;
        }
        d->late_hist[bucket]++;
        if (write(d->out_fd, slot + SLOT_HDR, len) < 0)
            d->write_errors++; /* e.g. the far device is down: drop */
        if (d->rate_bytes_per_ns > 0)
            d->free_at = due + (uint64_t)(len / d->rate_bytes_per_ns);
        d->packets++;
        d->bytes += len;
        d->tail += (SLOT_HDR + (uint64_t)len + 15) & ~15ull;
        now = now_ns();
    }
    return 0;
}

/* One thread per direction: wait in ppoll() for a packet or for the next
 * departure (timer slack 1 ns, so the wake-up is as exact as the
 * scheduler allows), take what arrived, send what is due. */
static void *
direction_main(void *arg)
{
    direction_t *d = arg;
    struct pollfd pfd = { d->in_fd, POLLIN, 0 };
    uint64_t next_due = 0;
    while (!g_stop) {
        struct timespec ts = { 0, 100000000 }, *tmo = &ts;
        if (next_due) {
            uint64_t now = now_ns();
            uint64_t left = next_due > now ? next_due - now : 0;
            ts.tv_sec = (time_t)(left / 1000000000ull);
            ts.tv_nsec = (long)(left % 1000000000ull);
        }
        if (next_due && d->spin_ns && tmo->tv_sec == 0 &&
            (uint64_t)tmo->tv_nsec <= d->spin_ns) {
            /* A short wait: spin (still taking arrivals) rather than pay a
             * timer wake-up, which is late by tens of microseconds here. */
            uint64_t now;
            while ((now = now_ns()) < next_due && !g_stop)
                take_packets(d);
            next_due = give_packets(d, now);
            continue;
        }
        int rc = ppoll(&pfd, 1, tmo, NULL);
        if (rc > 0)
            take_packets(d);
        next_due = give_packets(d, now_ns());
    }
    return NULL;
}

/* Upper bound of the bucket holding the p-quantile of lateness, in us. */
static uint64_t
late_quantile(const direction_t *d, double p)
{
    uint64_t total = 0;
    for (int i = 0; i < 32; i++)
        total += d->late_hist[i];
    uint64_t want = (uint64_t)(p * (double)total), seen = 0;
    for (int i = 0; i < 32; i++) {
        seen += d->late_hist[i];
        if (total && seen >= want)
            return i ? (1ull << i) : 0;
    }
    return 0;
}

static void
usage(void)
{
    fprintf(stderr,
            "usage: delayline --netns NS --delay-ms MS [--rate-mbit R] "
            "[--loss P]\n"
            "                 [--near-addr A] [--far-addr B] [--mtu N] "
            "[--near-dev D] [--far-dev D]\n"
            "                 [--no-offload] [--spin-us US]\n"
            "  MS is the one-way delay (RTT/2) applied in each direction.\n");
    exit(2);
}

/* Sets up one direction: a ring holding one delay's worth of a 2.5 GB/s
 * link (more than this machine carries), at least 32 MiB, pre-touched. */
static void
ring_setup(direction_t *d, int k, double delay_ms, double rate_mbit,
           double loss, double spin_us)
{
    uint64_t want = (uint64_t)(delay_ms * 1e-3 * 2.5e9);
    uint64_t bytes = (want < (32ull << 20) ? (32ull << 20) : want);
    d->ring_bytes = (bytes + (2ull << 20) - 1) & ~((2ull << 20) - 1);
    d->ring = mmap(NULL, d->ring_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (d->ring == MAP_FAILED)
        die("cannot map the ring of", d->name);
    /* Huge pages where the kernel has them: touching 256 MiB in 4 KiB
     * faults takes seconds here. */
    madvise(d->ring, d->ring_bytes, MADV_HUGEPAGE);
    memset(d->ring, 0, d->ring_bytes);
    d->delay_ns = (uint64_t)(delay_ms * 1e6);
    d->rate_bytes_per_ns = rate_mbit * 1e6 / 8 / 1e9;
    d->loss = loss;
    d->spin_ns = (uint64_t)(spin_us * 1e3);
    d->rng = 0x9E3779B97F4A7C15ull + (uint64_t)k;
}

/* One direction's counters, on stderr, at exit. */
static void
report(const direction_t *d)
{
    fprintf(stderr,
            "delayline: %s packets %" PRIu64 " bytes %" PRIu64
            " dropped_full %" PRIu64 " dropped_loss %" PRIu64
            " write_errors %" PRIu64 " late_p50_us %" PRIu64
            " late_p99_us %" PRIu64 "\n",
            d->name, d->packets, d->bytes, d->dropped_full, d->dropped_loss,
            d->write_errors, late_quantile(d, 0.50), late_quantile(d, 0.99));
}

int
main(int argc, char **argv)
{
    const char *netns = NULL, *near_addr = "10.77.0.1", *far_addr = "10.77.0.2",
               *near_dev = "dlnear0", *far_dev = "dlfar0";
    double delay_ms = -1, rate_mbit = 0, loss = 0;
    int mtu = 65000;
    bool offload = true;
    double spin_us = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-offload")) {
            offload = false;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (!strcmp(a, "--netns"))
            netns = v;
        else if (!strcmp(a, "--delay-ms"))
            delay_ms = atof(v);
        else if (!strcmp(a, "--rate-mbit"))
            rate_mbit = atof(v);
        else if (!strcmp(a, "--loss"))
            loss = atof(v);
        else if (!strcmp(a, "--near-addr"))
            near_addr = v;
        else if (!strcmp(a, "--far-addr"))
            far_addr = v;
        else if (!strcmp(a, "--near-dev"))
            near_dev = v;
        else if (!strcmp(a, "--far-dev"))
            far_dev = v;
        else if (!strcmp(a, "--spin-us"))
            spin_us = atof(v);
        else if (!strcmp(a, "--mtu"))
            mtu = atoi(v);
        else
            usage();
        i++;
    }
    if (!netns || delay_ms < 0 || loss < 0 || loss >= 1 || mtu < 576 ||
        mtu > 65000)
        usage();
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

    /* The far device is created from inside the far namespace (a TUN
     * device belongs to the namespace of the process that creates it),
     * then this thread returns home. */
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", netns);
    int far_ns = open(path, O_RDONLY | O_CLOEXEC);
    if (home < 0 || far_ns < 0)
        die("cannot open network namespace", netns);
    int near_fd = tun_open(near_dev, offload);
    if (setns(far_ns, CLONE_NEWNET) < 0)
        die("cannot enter network namespace", netns);
    int far_fd = tun_open(far_dev, offload);
    if (setns(home, CLONE_NEWNET) < 0)
        die("cannot return to the home namespace", "");
    close(far_ns);
    close(home);

    char mtus[16];
    snprintf(mtus, sizeof(mtus), "%d", mtu);
    ip_cmd(NULL, "addr add %s peer %s dev %s", near_addr, far_addr, near_dev);
    ip_cmd(NULL, "link set %s mtu %s up", near_dev, mtus);
    ip_cmd(netns, "addr add %s peer %s dev %s", far_addr, near_addr, far_dev);
    ip_cmd(netns, "link set %s mtu %s up", far_dev, mtus);
    ip_cmd(netns, "link set lo up");
    /* Longer device queues: a burst of a whole window must not be dropped
     * by the device before the delay line has read it. */
    ip_cmd(NULL, "link set %s txqueuelen %s", near_dev, "10000");
    ip_cmd(netns, "link set %s txqueuelen %s", far_dev, "10000");

    direction_t dir[2] = {
        { .name = "near->far", .in_fd = near_fd, .out_fd = far_fd },
        { .name = "far->near", .in_fd = far_fd, .out_fd = near_fd },
    };
    for (int k = 0; k < 2; k++)
        ring_setup(&dir[k], k, delay_ms, rate_mbit, loss, spin_us);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        fcntl(dir[k].in_fd, F_SETFL, O_NONBLOCK);
        pthread_create(&th[k], NULL, direction_main, &dir[k]);
    }
    printf("delayline: ready %s %s\n", near_addr, far_addr);
    fflush(stdout);
    while (!g_stop)
        pause();
    /* Readers block in read(): closing the devices would race them, so
     * report and leave; the devices vanish with the process. */
    for (int k = 0; k < 2; k++)
        report(&dir[k]);
    fflush(stderr);
    _exit(0);
}
