/* start_scale.c - what emliod's start costs at 10^7-10^8 samples: one
 * 20,000-record shard of 128-byte payloads, hard-linked LINKS times
 * (5,000 links = 100M samples), served by a real emliod:
 *   first   no index: every shard scanned, .idx files and the dataset
 *           index written;
 *   cached  the dataset index is current, page cache warm;
 *   cold    the same after `echo 3 > /proc/sys/vm/drop_caches` (root).
 * Each start is timed from exec to emliod's "listening on" line; then
 * /proc/PID/io read_bytes, VmRSS and RssAnon (heap and other private
 * memory) are read, and the daemon is stopped. Hard links share their
 * pages: read_bytes from a cold cache counts each distinct page once, so
 * a start that touches any record of every shard shows one shard's worth
 * at most; the unit test test_dsindex checks 200 distinct files instead.
 *
 *   make build/bench/start_scale
 *   build/bench/start_scale DIR LINKS [first|cached|cold]...
 * e.g. build/bench/start_scale /tmp/scale 5000 first cached cold
 * DIR is created (or reused when it holds LINKS links already).
 *
 * Figures (this 2-core VM, shared; 2026-12-01, branch idx):
 *   100M samples, 5,000 shards: first start 7.3-25.6 s (11.9 M samples/s
 *   after a sync; 3.9 with a previous run's 3 GB still being written
 *   back), cached 0.39-0.62 s, cold cache 0.46-1.10 s reading 18-19 MB
 *   (libraries, the index's header and entries with readahead, one
 *   sample); daemon anon memory 5.7 MB (0.057 B/sample) cached, 46 MB
 *   after a first start. 10M samples against main 9b97707, same run:
 *   first 0.99-1.00 s vs 1.96-2.36 s, cached 0.03-0.04 s vs 0.40-0.48 s,
 *   cold read 18 MB vs 126-128 MB, anon 1.4 MB vs 160 MB.
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emlio.h"

#include "bench_clock.h"

#define RECORDS 20000
#define PAYLOAD 128

static void
s_die(const char *what)
{
    fprintf(stderr, "start_scale: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* DIR/shard-00000.tfrecord and links up to shard-(links-1), aged an hour
 * so the index trusts their mtime. */
static void
s_make(const char *dir, long links)
{
    char first[4096], path[4096];
    mkdir(dir, 0755);
    snprintf(first, sizeof(first), "%s/shard-00000.tfrecord", dir);
    if (access(first, F_OK) != 0) {
        emlio_buf_t file = EMLIO_BUF_INIT;
        unsigned char payload[PAYLOAD];
        for (int r = 0; r < RECORDS; r++) {
            memset(payload, 'a' + r % 26, sizeof(payload));
            if (emlio_tfrecord_append(&file, payload, sizeof(payload)) < 0)
                s_die("append");
        }
        FILE *f = fopen(first, "wb");
        if (!f || fwrite(file.data, 1, file.len, f) != file.len || fclose(f))
            s_die(first);
        emlio_buf_release(&file);
        struct timespec t[2];
        clock_gettime(CLOCK_REALTIME, &t[0]);
        t[0].tv_sec -= 3600;
        t[1] = t[0];
        utimensat(AT_FDCWD, first, t, 0);
    }
    for (long i = 1; i < links; i++) {
        snprintf(path, sizeof(path), "%s/shard-%05ld.tfrecord", dir, i);
        if (link(first, path) != 0 && errno != EEXIST)
            s_die(path);
    }
}

/* A number from a "Key: value" line of /proc/PID/<file>. */
static long long
s_proc(pid_t pid, const char *file, const char *key)
{
    char path[64], line[256];
    long long v = -1;
    size_t n = strlen(key);
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, n) == 0 && line[n] == ':')
            v = strtoll(line + n + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

/* MB of file dir/name in the page cache (mincore). */
static double
s_cached_mb(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    size_t pages = ((size_t)st.st_size + 4095) / 4096, n = 0;
    unsigned char *vec = malloc(pages);
    if (map != MAP_FAILED && vec && mincore(map, (size_t)st.st_size, vec) == 0)
        for (size_t i = 0; i < pages; i++)
            n += vec[i] & 1;
    free(vec);
    if (map != MAP_FAILED)
        munmap(map, (size_t)st.st_size);
    return (double)n * 4096 / 1e6;
}

/* Starts emliod on dir, waits for "listening on", prints one row. */
static void
s_start(const char *emliod, const char *dir, const char *mode, long links)
{
    int out[2];
    if (pipe(out) != 0)
        s_die("pipe");
    double t0 = bench_seconds(CLOCK_MONOTONIC);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        execl(emliod, emliod, "--data", dir, "--bind", "tcp://127.0.0.1:*",
              "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char line[512];
    bool up = false;
    while (!up && f && fgets(line, sizeof(line), f))
        up = strstr(line, "listening on") != NULL;
    double secs = bench_seconds(CLOCK_MONOTONIC) - t0;
    long long rb = s_proc(pid, "io", "read_bytes");
    long long rss = s_proc(pid, "status", "VmRSS");
    long long anon = s_proc(pid, "status", "RssAnon");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    if (f)
        fclose(f);
    double samples = (double)links * RECORDS;
    printf("%-7s %6ld shards %11.0f samples  %7.2f s  %6.2f M samples/s  "
           "read %7.1f MB (cached: data %.2f MB, index %.1f MB)  rss %7.1f MB"
           "  anon %7.1f MB (%.3f B/sample)%s\n",
           mode, links, samples, secs, samples / secs / 1e6, rb / 1e6,
           s_cached_mb(dir, "shard-00000.tfrecord"),
           s_cached_mb(dir, ".emlio-index"), rss / 1e3, anon / 1e3,
           anon * 1e3 / samples, up ? "" : "  [emliod did not start]");
    fflush(stdout);
}

static void
s_forget(const char *dir)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "rm -f '%s'/.emlio-index '%s'/*.idx", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "start_scale: could not remove the indexes\n");
}

int
main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR LINKS first|cached|cold...\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long links = strtol(argv[2], NULL, 10);
    char emliod[4096];
    snprintf(emliod, sizeof(emliod), "%s", argv[0]);
    char *slash = strrchr(emliod, '/');
    snprintf(slash ? slash + 1 : emliod,
             sizeof(emliod) - (size_t)(slash ? slash + 1 - emliod : 0),
             "../bin/emliod");
    s_make(dir, links);
    for (int a = 3; a < argc; a++) {
        if (strcmp(argv[a], "first") == 0) {
            s_forget(dir);
        } else if (strcmp(argv[a], "cold") == 0) {
            sync();
            FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
            if (!f || fputs("3\n", f) < 0 || fclose(f) != 0)
                fprintf(stderr, "start_scale: cannot drop caches (root?)\n");
        }
        s_start(emliod, dir, argv[a], links);
    }
    return 0;
}
