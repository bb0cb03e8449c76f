/* smallfiles.c - how to read many small files (ImageFolder records):
 * per-sample openat + pread + close into a fresh buffer, openat + mmap +
 * munmap, or pread on a table of descriptors kept open. Reads every file
 * of DIR (flat) ROUNDS times, warm page cache, and prints us per file.
 *   cc -O2 -o smallfiles bench/smallfiles.c && ./smallfiles DIR [ROUNDS]
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_clock.h"

int
main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int dfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    DIR *d = fdopendir(dup(dfd));
    if (dfd < 0 || !d)
        return 1;
    char **names = NULL;
    size_t *sizes = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dfd, e->d_name, &st, 0) ||
            !S_ISREG(st.st_mode))
            continue;
        names = realloc(names, (n + 1) * sizeof(*names));
        sizes = realloc(sizes, (n + 1) * sizeof(*sizes));
        names[n] = strdup(e->d_name);
        sizes[n++] = (size_t)st.st_size;
    }
    closedir(d);
    uint64_t sum = 0;
    double t;
    /* 1: openat + pread + close, fresh malloc each (freed at once, as a
     * sent batch frees it). */
    for (int r = 0; r <= rounds; r++) {
        if (r == 1)
            t = bench_seconds(CLOCK_MONOTONIC);
        for (size_t i = 0; i < n; i++) {
            int fd = openat(dfd, names[i], O_RDONLY | O_NOATIME);
            uint8_t *buf = malloc(sizes[i] + 1);
            ssize_t got = pread(fd, buf, sizes[i] + 1, 0);
            sum += buf[got / 2];
            free(buf);
            close(fd);
        }
    }
    printf("openat+pread+close  %.1f us/file\n",
           (bench_seconds(CLOCK_MONOTONIC) - t) / (rounds * (double)n) * 1e6);
    /* 2: openat + mmap + touch every page + munmap. */
    long page = sysconf(_SC_PAGESIZE);
    for (int r = 0; r <= rounds; r++) {
        if (r == 1)
            t = bench_seconds(CLOCK_MONOTONIC);
        for (size_t i = 0; i < n; i++) {
            int fd = openat(dfd, names[i], O_RDONLY | O_NOATIME);
            uint8_t *p = mmap(NULL, sizes[i], PROT_READ, MAP_PRIVATE, fd, 0);
            close(fd);
            for (size_t k = 0; k < sizes[i]; k += (size_t)page)
                sum += p[k];
            munmap(p, sizes[i]);
        }
    }
    printf("openat+mmap+munmap  %.1f us/file\n",
           (bench_seconds(CLOCK_MONOTONIC) - t) / (rounds * (double)n) * 1e6);
    /* 3: descriptors opened once, pread per sample. */
    int *fds = malloc(n * sizeof(*fds));
    for (size_t i = 0; i < n; i++)
        fds[i] = openat(dfd, names[i], O_RDONLY | O_NOATIME);
    for (int r = 0; r <= rounds; r++) {
        if (r == 1)
            t = bench_seconds(CLOCK_MONOTONIC);
        for (size_t i = 0; i < n; i++) {
            uint8_t *buf = malloc(sizes[i] + 1);
            ssize_t got = pread(fds[i], buf, sizes[i] + 1, 0);
            sum += buf[got / 2];
            free(buf);
        }
    }
    printf("cached fd + pread   %.1f us/file\n",
           (bench_seconds(CLOCK_MONOTONIC) - t) / (rounds * (double)n) * 1e6);
    /* 4: the copy alone (memcpy of the same sizes from a warm buffer). */
    size_t max = 0;
    for (size_t i = 0; i < n; i++)
        max = sizes[i] > max ? sizes[i] : max;
    uint8_t *src = malloc(max);
    memset(src, 1, max);
    for (int r = 0; r <= rounds; r++) {
        if (r == 1)
            t = bench_seconds(CLOCK_MONOTONIC);
        for (size_t i = 0; i < n; i++) {
            uint8_t *buf = malloc(sizes[i] + 1);
            memcpy(buf, src, sizes[i]);
            sum += buf[sizes[i] / 2];
            free(buf);
        }
    }
    printf("malloc+memcpy only  %.1f us/file  (%zu files, checksum %llu)\n",
           (bench_seconds(CLOCK_MONOTONIC) - t) / (rounds * (double)n) * 1e6, n,
           (unsigned long long)sum);
    return 0;
}
