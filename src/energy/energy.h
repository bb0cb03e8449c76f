/* energy.h - internals of the energy meter shared by src/energy*.c and its
 * unit test: the counter table, the backend probes and the pure helpers.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_ENERGY_PRIV_H
#define EMLIO_ENERGY_PRIV_H

#include "emlio/energy.h"

enum emlio__energy_kind {
    EMLIO__ENERGY_RAPL = 1, /* a powercap energy_uj file */
    EMLIO__ENERGY_PERF = 2, /* a perf_event fd */
    EMLIO__ENERGY_NVML = 3  /* an NVML device handle */
};

/* One hardware counter. raw values are in counter units; unit_j converts. */
typedef struct emlio__energy_counter {
    char name[EMLIO_ENERGY_NAME_LEN];
    const char *source; /* static: "rapl", "perf", "nvml" */
    int kind;
    bool in_total;
    char *path;     /* rapl: the energy_uj file (owned) */
    int fd;         /* perf: the event fd, or -1 */
    void *device;   /* nvml: the device handle */
    double unit_j;  /* joules per raw unit */
    uint64_t max;   /* wrap range (rapl), 0 when the counter never wraps */
    uint64_t prev;  /* last raw value read */
    uint64_t total; /* raw units accumulated since start */
    uint32_t wraps;
    uint32_t read_errors;
} emlio__energy_counter_t;

/* A growable list of counters found by the probes. */
typedef struct emlio__energy_set {
    emlio__energy_counter_t *v;
    size_t n;
    size_t cap;
} emlio__energy_set_t;

/* Appends a zeroed counter (fd -1) and returns it, or NULL when out of
 * memory. */
emlio__energy_counter_t *emlio__energy_set_add(emlio__energy_set_t *set);
/* Closes fds, frees paths and the array; the set is empty afterwards. */
void emlio__energy_set_release(emlio__energy_set_t *set);

/* The NVML library, loaded with dlopen (opaque here). */
typedef struct emlio__nvml emlio__nvml_t;

/* Probes. Each appends the counters it finds to set and returns how many it
 * added (>= 0), or < 0 with a message in err (EMLIO_ERRMSG_LEN bytes):
 * EMLIO_ENOTFOUND when the backend is absent, EMLIO_EFORMAT when its files
 * are garbled, -errno when they cannot be read, EMLIO_ENOMEM. On failure set
 * is left as it was. */
int emlio__energy_rapl_probe(const char *root, emlio__energy_set_t *set,
                             char *err);
int emlio__energy_perf_probe(const char *root, emlio__energy_set_t *set,
                             char *err);
int emlio__energy_nvml_probe(const char *path, emlio__nvml_t **nvml_p,
                             emlio__energy_set_t *set, char *err);
/* Reads one GPU's counter (millijoules). 0 or EMLIO_EPROTO. */
int emlio__energy_nvml_read(emlio__nvml_t *nvml, void *device, uint64_t *raw);
/* nvmlShutdown and dlclose. Accepts NULL; sets *nvml_p to NULL. */
void emlio__energy_nvml_close(emlio__nvml_t **nvml_p);

/* Reads the raw value of one counter. 0, or < 0 (-errno, EMLIO_EFORMAT or
 * EMLIO_EPROTO for an NVML failure). */
int emlio__energy_read(emlio__nvml_t *nvml, const emlio__energy_counter_t *c,
                       uint64_t *raw);

/* Folds a new raw reading into c: adds the delta from c->prev, counting a
 * wrap when the value went down. */
void emlio__energy_fold(emlio__energy_counter_t *c, uint64_t raw);

/* --- Pure helpers (no I/O), unit-tested directly. --- */

/* Parses a sysfs decimal counter: digits, then optional whitespace, nothing
 * else. Returns 0, EMLIO_EFORMAT (empty, sign, junk, overflow). Reads at most
 * len bytes; buf need not be NUL-terminated. */
int emlio__energy_parse_u64(const char *buf, size_t len, uint64_t *out);

/* Parses a finite positive floating-point value such as a perf .scale
 * file. 0 or EMLIO_EFORMAT. */
int emlio__energy_parse_double(const char *buf, size_t len, double *out);

/* Copies a sysfs name file into out (cap bytes): strips the trailing
 * newline, refuses empty, over-long or non-printable names. 0 or
 * EMLIO_EFORMAT. */
int emlio__energy_parse_name(const char *buf, size_t len, char *out,
                             size_t cap);

/* Parses a perf event description such as "event=0x02" or
 * "event=0x02,umask=0x0" (only event= is used): 0 or EMLIO_EFORMAT. */
int emlio__energy_parse_perf_event(const char *buf, size_t len,
                                   uint64_t *config);

/* The energy between two readings of a counter that counts from 0 to max
 * and then starts again at 0 (modulo max + 1). When cur < prev the counter
 * wrapped once: the delta is (max - prev) + cur + 1 and *wrapped is set.
 * With max == 0 (a counter without a known range) a smaller value is a
 * reset: the delta is cur. A prev above max is clamped to max. */
uint64_t emlio__energy_wrap_delta(uint64_t prev, uint64_t cur, uint64_t max,
                                  bool *wrapped);

/* Whether a RAPL domain of the given sysfs name (package-0, dram, core,
 * uncore, psys) at depth 0 (intel-rapl:N) or 1 (intel-rapl:N:M) counts into
 * the total; has_package says whether any package domain exists. */
bool emlio__energy_rapl_in_total(const char *name, int depth, bool has_package);

/* Reads a small file whole into buf (cap bytes, NUL-terminated). Returns the
 * length, or -errno. */
int emlio__energy_read_small(const char *path, char *buf, size_t cap);

#endif /* EMLIO_ENERGY_PRIV_H */
