/* emlio/energy.h - the energy meter: wall time, CPU time and energy of a
 * run, from RAPL, the perf power PMU, NVML or, where no counter exists, a
 * labelled model. SPDX-License-Identifier: MIT
 *
 * A meter measures one interval at a time:
 *
 * Example:
 *   emlio_energy_t *m = emlio_energy_new();
 *   emlio_energy_set_powercap_root(m, getenv("EMLIO_POWERCAP_ROOT"));
 *   if (emlio_energy_start(m) < 0)
 *       die(emlio_energy_errmsg(m));
 *   do_the_work();
 *   emlio_energy_report_t r;
 *   emlio_energy_stop(m, &r);
 *   printf("%.3f J (%s)\n", r.energy_j, r.source);
 *   emlio_energy_destroy(&m);
 *
 * Backends. The CPU side uses one of:
 *   - "rapl":  the powercap sysfs tree (/sys/class/powercap/intel-rapl:N and
 *              intel-rapl:N:M; files name, energy_uj, max_energy_range_uj).
 *              The counters wrap at max_energy_range_uj; the meter samples
 *              them every interval_ms on a thread of its own so that a wrap
 *              between two reads is never missed.
 *   - "perf":  the perf "power" PMU (events energy-pkg, energy-ram, ...),
 *              opened with perf_event_open, when the sysfs tree is absent.
 *   - "model": E = idle_w * wall_s + core_w * cpu_s + j_per_byte * bytes,
 *              an estimate for machines without counters. Its figures are
 *              always labelled "model", never presented as measured.
 * With EMLIO_ENERGY_AUTO the first that works is used, in that order. The GPU
 * side, "nvml", is added on top when libnvidia-ml can be loaded (dlopen at
 * run time; no build dependency) and reports at least one device.
 *
 * Totals. energy_j sums the domains whose in_total is true: RAPL/perf
 * package and dram domains (core, uncore and gpu-integrated domains are
 * parts of the package and are reported but not added; psys is added only
 * where there is no package domain), every NVML GPU, and the model terms.
 *
 * The library reads no environment variable: callers that honour
 * EMLIO_POWERCAP_ROOT (as `emlio energy` does) pass it to the setter.
 *
 * Thread rules: a meter is used by one thread at a time. Between start and
 * stop it runs a sampler thread of its own, which touches only the meter's
 * counters under the meter's lock; different meters share nothing.
 */
#ifndef EMLIO_ENERGY_H
#define EMLIO_ENERGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which CPU-side backend to use (emlio_energy_set_backend). */
enum emlio_energy_backend {
    EMLIO_ENERGY_AUTO = 0,  /* rapl, else perf, else model */
    EMLIO_ENERGY_RAPL = 1,  /* powercap sysfs only; start fails without it */
    EMLIO_ENERGY_PERF = 2,  /* perf power PMU only; start fails without it */
    EMLIO_ENERGY_MODEL = 3, /* the model, even where counters exist */
    EMLIO_ENERGY_NONE = 4   /* no CPU energy (GPU only, or time only) */
};

/* Whether to add NVML GPU energy (emlio_energy_set_gpu). */
enum emlio_energy_gpu {
    EMLIO_ENERGY_GPU_AUTO = 0,   /* when the library loads and has a GPU */
    EMLIO_ENERGY_GPU_OFF = 1,    /* never */
    EMLIO_ENERGY_GPU_REQUIRE = 2 /* start fails without a GPU counter */
};

/* Whose CPU time cpu_s counts (emlio_energy_set_cpu_scope). */
enum emlio_energy_cpu_scope {
    EMLIO_ENERGY_CPU_SELF = 0,     /* this process (getrusage RUSAGE_SELF) */
    EMLIO_ENERGY_CPU_CHILDREN = 1, /* children waited for (RUSAGE_CHILDREN) */
    EMLIO_ENERGY_CPU_BOTH = 2      /* the sum of the two */
};

/* Model defaults; docs/energy.md gives their sources. They are assumptions
 * about a typical cloud server, not measurements of this machine. */
#define EMLIO_ENERGY_DEFAULT_INTERVAL_MS     1000
#define EMLIO_ENERGY_DEFAULT_IDLE_W          1.3 /* 2 vCPU x 0.64 W idle */
#define EMLIO_ENERGY_DEFAULT_CORE_W          3.2 /* per busy vCPU, above idle */
#define EMLIO_ENERGY_DEFAULT_J_PER_BYTE      0.0 /* I/O energy not modelled */
/* Reading a datacentre NVMe SSD: about 5 W above its idle at about 2 GB/s
 * (docs/energy.md, "The disk term"). */
#define EMLIO_ENERGY_DEFAULT_DISK_J_PER_BYTE 2.5e-9

#define EMLIO_ENERGY_MAX_DOMAINS 32
#define EMLIO_ENERGY_NAME_LEN    32

/* One energy domain of a report. */
typedef struct emlio_energy_domain {
    char name[EMLIO_ENERGY_NAME_LEN]; /* "package-0", "dram-0", "gpu-0",
                                         "model-idle", "model-cpu", ... */
    char source[8];                   /* "rapl", "perf", "nvml", "model" */
    double joules;                    /* energy over the interval */
    bool in_total;                    /* added into energy_j */
    uint32_t wraps;       /* counter wraps seen (rapl) or resets (nvml) */
    uint32_t read_errors; /* samples that could not be read */
} emlio_energy_domain_t;

/* What emlio_energy_stop reports. */
typedef struct emlio_energy_report {
    double wall_s;    /* monotonic time from start to stop */
    double cpu_s;     /* user_s + sys_s */
    double user_s;    /* CPU time in user mode, of the configured scope */
    double sys_s;     /* CPU time in the kernel, of the configured scope */
    double energy_j;  /* sum of the domains with in_total */
    bool modelled;    /* energy_j contains model terms (an estimate) */
    char source[24];  /* "rapl", "perf", "model", "rapl+nvml", "model+nvml",
                         "nvml", or "none" */
    uint64_t samples; /* counter samples taken, start and stop included */
    size_t n_domains;
    emlio_energy_domain_t domains[EMLIO_ENERGY_MAX_DOMAINS];
} emlio_energy_report_t;

typedef struct emlio_energy emlio_energy_t;

/** Allocates a meter with the defaults: backend AUTO, GPU AUTO, CPU scope
 * SELF, interval EMLIO_ENERGY_DEFAULT_INTERVAL_MS, powercap root
 * "/sys/class/powercap", perf root "/sys/bus/event_source/devices/power",
 * NVML library "libnvidia-ml.so.1", the model defaults above. Touches no
 * file. Returns NULL only when out of memory. */
EMLIO_EXPORT emlio_energy_t *emlio_energy_new(void);

/** Stops a running meter (discarding its figures) and frees it. Accepts NULL
 * and *self_p == NULL; sets *self_p to NULL. */
EMLIO_EXPORT void emlio_energy_destroy(emlio_energy_t **self_p);

/* Setters. Each copies its argument, takes effect at the next
 * emlio_energy_start, and returns 0, EMLIO_EINVAL for a value out of range
 * or EMLIO_ENOMEM. Calling one while the meter runs is EMLIO_ESTATE. */

/** CPU-side backend, an enum emlio_energy_backend. */
EMLIO_EXPORT int emlio_energy_set_backend(emlio_energy_t *self, int backend);

/** GPU policy, an enum emlio_energy_gpu. */
EMLIO_EXPORT int emlio_energy_set_gpu(emlio_energy_t *self, int gpu);

/** Whose CPU time is counted, an enum emlio_energy_cpu_scope. */
EMLIO_EXPORT int emlio_energy_set_cpu_scope(emlio_energy_t *self, int scope);

/** Sampling period of the sampler thread in milliseconds, 0 to 3600000.
 * 0 runs no thread: counters are read at start, stop and
 * emlio_energy_sample only (a RAPL counter that wraps twice in between is
 * then undercounted by one range). */
EMLIO_EXPORT int emlio_energy_set_interval_ms(emlio_energy_t *self,
                                              uint32_t interval_ms);

/** Directory holding the intel-rapl:N[:M] zones. NULL or "" restores the
 * default "/sys/class/powercap". */
EMLIO_EXPORT int emlio_energy_set_powercap_root(emlio_energy_t *self,
                                                const char *root);

/** Directory of the perf power PMU (files type, cpumask, events/). NULL or
 * "" restores the default "/sys/bus/event_source/devices/power". */
EMLIO_EXPORT int emlio_energy_set_perf_root(emlio_energy_t *self,
                                            const char *root);

/** File name or path given to dlopen for NVML. NULL or "" restores
 * "libnvidia-ml.so.1". */
EMLIO_EXPORT int emlio_energy_set_nvml_path(emlio_energy_t *self,
                                            const char *path);

/** Model parameters: idle_w (watts charged for the whole wall time),
 * core_w (watts per busy CPU, charged per CPU-second) and j_per_byte
 * (joules per byte passed to emlio_energy_add_bytes). Each must be finite
 * and >= 0. */
EMLIO_EXPORT int emlio_energy_set_model(emlio_energy_t *self, double idle_w,
                                        double core_w, double j_per_byte);

/** Starts measuring: discovers the backends, reads every counter once,
 * records the wall clock and CPU times, and starts the sampler thread.
 * With AUTO a backend that is absent or unreadable is skipped and the
 * reason kept in emlio_energy_notes. Returns 0; EMLIO_ESTATE when already
 * running; EMLIO_ENOTFOUND, EMLIO_EFORMAT or -errno when a backend that was
 * asked for explicitly (RAPL, PERF, GPU_REQUIRE) cannot be used; EMLIO_ENOMEM;
 * or -errno from pthread_create. Blocks for at most about 20 ms (the liveness
 * probe of the perf PMU). */
EMLIO_EXPORT int emlio_energy_start(emlio_energy_t *self);

/** Reads every counter now and folds the deltas in (wraps included). Useful
 * with interval 0, or to bracket a phase. Returns 0, or EMLIO_ESTATE when
 * not running. A counter that cannot be read counts a read error and keeps
 * its previous value. */
EMLIO_EXPORT int emlio_energy_sample(emlio_energy_t *self);

/** Adds n bytes to the model's I/O term (ignored by measured backends but
 * kept, so the caller can report J per byte). */
EMLIO_EXPORT void emlio_energy_add_bytes(emlio_energy_t *self, uint64_t n);

/** Adds n bytes read from a storage device to the disk term: a domain
 * "model-disk" (source "model") of disk_j_per_byte * bytes. No counter a
 * CPU or GPU backend reads sees a disk, so the term is an estimate
 * wherever it appears: added into energy_j when the model is the CPU's
 * source (the whole figure is an estimate), reported beside a measured
 * total but never added to it. */
EMLIO_EXPORT void emlio_energy_add_disk_bytes(emlio_energy_t *self, uint64_t n);
/** The disk term's joules per byte (finite, >= 0; 0 turns it off);
 * default EMLIO_ENERGY_DEFAULT_DISK_J_PER_BYTE. */
EMLIO_EXPORT int emlio_energy_set_disk_model(emlio_energy_t *self,
                                             double j_per_byte);

/** Stops the sampler, takes a last sample and fills *out. Returns 0 or
 * EMLIO_ESTATE when not running. For the CHILDREN scope, call it after
 * waiting for the children. Joins the sampler thread (at most one read of
 * every counter). */
EMLIO_EXPORT int emlio_energy_stop(emlio_energy_t *self,
                                   emlio_energy_report_t *out);

/** Reads every counter now and fills *out with the figures from start until
 * now, as emlio_energy_stop would, but keeps the meter running: a long-lived
 * process (emliod's metrics) reads running totals this way. The sampler
 * thread may run meanwhile (the read takes the meter's lock). Returns 0, or
 * EMLIO_ESTATE when not running. */
EMLIO_EXPORT int emlio_energy_read(emlio_energy_t *self,
                                   emlio_energy_report_t *out);

/** Whether the meter runs. */
EMLIO_EXPORT bool emlio_energy_running(const emlio_energy_t *self);

/** Samples taken since start (start included); safe to call from the thread
 * that owns the meter while it runs. */
EMLIO_EXPORT uint64_t emlio_energy_samples(const emlio_energy_t *self);

/** Why backends were skipped at the last start, "; "-separated, or "".
 * Borrowed; valid until the next start or destroy. */
EMLIO_EXPORT const char *emlio_energy_notes(const emlio_energy_t *self);

/** The text of the last failure, or "". Borrowed; valid until the next call
 * on the meter. */
EMLIO_EXPORT const char *emlio_energy_errmsg(const emlio_energy_t *self);

/** The model's estimate in joules: idle_w * wall_s + core_w * cpu_s +
 * j_per_byte * bytes. Pure; thread-safe. */
EMLIO_EXPORT double emlio_energy_model_j(double idle_w, double core_w,
                                         double j_per_byte, double wall_s,
                                         double cpu_s, uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_ENERGY_H */
