/* iolanes.c - the client's I/O lanes: placing streams on ZeroMQ I/O
 * threads and measuring those threads (iolanes.h).
 * SPDX-License-Identifier: MIT
 */
#include "iolanes.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"

void
emlio__iolanes_init(emlio__iolanes_t *self, uint32_t threads, int prefix,
                    bool spread)
{
    memset(self, 0, sizeof(*self));
    if (threads < 1)
        threads = 1;
    if (threads > EMLIO_IOLANES_MAX)
        threads = EMLIO_IOLANES_MAX;
    self->threads = threads;
    self->used = spread || prefix <= 0 ? threads : 1;
    self->prefix = prefix;
}

uint32_t
emlio__iolanes_place(emlio__iolanes_t *self, uint64_t *mask)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < self->used; i++)
        if (self->streams[i] < self->streams[best])
            best = i;
    self->streams[best]++;
    *mask = (uint64_t)1 << best;
    return best;
}

void
emlio__iolanes_remove(emlio__iolanes_t *self, uint32_t lane)
{
    if (lane < EMLIO_IOLANES_MAX && self->streams[lane])
        self->streams[lane]--;
}

uint32_t
emlio__iolanes_carrying(const emlio__iolanes_t *self)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < self->threads; i++)
        n += self->streams[i] != 0;
    return n;
}

bool
emlio__iolanes_step(emlio__iolanes_t *self, uint64_t now_ns,
                    const uint64_t *run_ns)
{
    bool first = self->tick_ns == 0;
    uint64_t dt = now_ns - self->tick_ns;
    double busiest = 0;
    for (uint32_t i = 0; i < self->used; i++) {
        /* A lane not measured now or then (its thread not found, a read
         * that failed) says nothing; a clock that went back neither. */
        if (!first && dt && run_ns[i] && self->run_ns[i] &&
            run_ns[i] >= self->run_ns[i]) {
            double share = (double)(run_ns[i] - self->run_ns[i]) / (double)dt;
            if (share > busiest)
                busiest = share;
        }
    }
    memcpy(self->run_ns, run_ns, sizeof(self->run_ns));
    self->tick_ns = now_ns;
    if (first)
        return false;
    self->busiest = busiest;
    self->full_ticks = busiest >= EMLIO_IOLANE_FULL ? self->full_ticks + 1 : 0;
    if (self->full_ticks < EMLIO_IOLANE_FULL_TICKS ||
        self->used >= self->threads)
        return false;
    self->used++;
    self->full_ticks = 0;
    return true;
}

/* ---- reading /proc ------------------------------------------------------ */

/* Finds the context's I/O threads among this process's tasks by name:
 * "<prefix>/ZMQbg/IO/<n>"; those not found keep tid 0. */
static void
s_find_threads(emlio__iolanes_t *self)
{
    DIR *dir = opendir("/proc/self/task");
    if (!dir)
        return;
    char want[32];
    int want_len = snprintf(want, sizeof(want), "%d/ZMQbg/IO/", self->prefix);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int tid = atoi(e->d_name);
        if (tid <= 0)
            continue;
        char path[64], name[32] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%d/comm", tid);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        if (!fgets(name, sizeof(name), f))
            name[0] = '\0';
        fclose(f);
        if (strncmp(name, want, (size_t)want_len) != 0)
            continue;
        char *end;
        long lane = strtol(name + want_len, &end, 10);
        if (end == name + want_len || lane < 0 || lane >= (long)self->threads ||
            self->tid[lane])
            continue;
        self->tid[lane] = tid;
    }
    closedir(dir);
}

/* A thread's run time in nanoseconds; 0 when it cannot be read (gone). */
static uint64_t
s_run_ns(int tid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", tid);
    FILE *f = fopen(path, "re");
    if (f) {
        unsigned long long run = 0;
        int n = fscanf(f, "%llu", &run);
        fclose(f);
        if (n == 1 && run)
            return run;
    }
    /* Without schedstats: utime + stime, the 14th and 15th fields, after
     * the parenthesised name (which may hold spaces). */
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
    f = fopen(path, "re");
    if (!f)
        return 0;
    char line[512];
    char *ok = fgets(line, sizeof(line), f);
    fclose(f);
    char *p = ok ? strrchr(line, ')') : NULL;
    unsigned long long utime = 0, stime = 0;
    if (!p ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
               &utime, &stime) != 2)
        return 0;
    long hz = sysconf(_SC_CLK_TCK);
    return (utime + stime) * (uint64_t)(1000000000 / (hz > 0 ? hz : 100));
}

bool
emlio__iolanes_sample(emlio__iolanes_t *self, uint64_t now_ns)
{
    bool missing = false;
    for (uint32_t i = 0; i < self->used; i++)
        missing |= self->tid[i] == 0;
    if (missing)
        s_find_threads(self);
    uint64_t run[EMLIO_IOLANES_MAX] = { 0 };
    bool any = false;
    for (uint32_t i = 0; i < self->threads; i++) {
        if (self->tid[i] && (run[i] = s_run_ns(self->tid[i])) == 0)
            self->tid[i] = 0; /* gone: look again next time */
        any |= run[i] != 0;
    }
    if (!any) {
        if (++self->unmeasured < EMLIO_IOLANES_GIVE_UP ||
            self->used >= self->threads)
            return false;
        self->used = self->threads;
        self->busiest = -1;
        return true;
    }
    self->unmeasured = 0;
    return emlio__iolanes_step(self, now_ns, run);
}
