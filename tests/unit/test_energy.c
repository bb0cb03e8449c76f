/* test_energy.c - unit tests of the energy meter: parsers, wrap arithmetic,
 * the model, synthetic powercap and perf trees, and a fake NVML.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <dlfcn.h>
#include <math.h>
#include <sys/wait.h>
#include <time.h>

#include "emlio/energy.h"
#include "energy.h"

/* --- Helpers. --- */

/* Writes text to dir/rel atomically (write then rename), as sysfs readers
 * must never see a half-written counter. */
static void
s_put(const char *dir, const char *rel, const char *text)
{
    char path[PATH_MAX];
    char tmp[PATH_MAX + 8];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    test_write_file(tmp, text, strlen(text));
    assert_int_equal(rename(tmp, path), 0);
}

static void
s_mkdir(const char *dir, const char *rel)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    assert_int_equal(mkdir(path, 0755), 0);
}

/* Sets a zone's counter to uj. */
static void
s_set_uj(const char *root, const char *zone, uint64_t uj)
{
    char rel[128];
    char text[32];
    snprintf(rel, sizeof(rel), "%s/energy_uj", zone);
    snprintf(text, sizeof(text), "%" PRIu64 "\n", uj);
    s_put(root, rel, text);
}

/* Makes a zone directory with name, range and counter. */
static void
s_zone(const char *root, const char *zone, const char *name, uint64_t max,
       uint64_t uj)
{
    char rel[128];
    char text[64];
    s_mkdir(root, zone);
    snprintf(rel, sizeof(rel), "%s/name", zone);
    snprintf(text, sizeof(text), "%s\n", name);
    s_put(root, rel, text);
    snprintf(rel, sizeof(rel), "%s/max_energy_range_uj", zone);
    snprintf(text, sizeof(text), "%" PRIu64 "\n", max);
    s_put(root, rel, text);
    s_set_uj(root, zone, uj);
}

/* The usual synthetic machine: one package with dram and core subzones, as
 * /sys/class/powercap lists them (flat). */
#define S_MAX 10000000u /* 10 J range, so wraps are easy to provoke */

static void
s_tree(const char *root)
{
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, 1000000);
    s_zone(root, "intel-rapl:0:0", "dram", S_MAX, 2000000);
    s_zone(root, "intel-rapl:0:1", "core", S_MAX, 3000000);
    /* Noise that must be ignored. */
    s_mkdir(root, "intel-rapl");
    s_mkdir(root, "intel-rapl-mmio:0");
}

/* A meter that sees only what the test gives it: no host PMU, no NVML. */
static emlio_energy_t *
s_meter(const char *powercap_root, int backend)
{
    emlio_energy_t *m = emlio_energy_new();
    assert_non_null(m);
    assert_int_equal(emlio_energy_set_powercap_root(m, powercap_root), 0);
    assert_int_equal(emlio_energy_set_perf_root(m, "/nonexistent/power"), 0);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_OFF), 0);
    assert_int_equal(emlio_energy_set_interval_ms(m, 0), 0);
    assert_int_equal(emlio_energy_set_backend(m, backend), 0);
    return m;
}

static const emlio_energy_domain_t *
s_domain(const emlio_energy_report_t *r, const char *name)
{
    for (size_t i = 0; i < r->n_domains; i++)
        if (!strcmp(r->domains[i].name, name))
            return &r->domains[i];
    fail_msg("no domain '%s' in the report", name);
    return NULL;
}

static void
s_burn_cpu(double seconds)
{
    double t0 = emlio__now_s();
    volatile uint64_t x = 1;
    while (emlio__now_s() - t0 < seconds)
        for (int i = 0; i < 100000; i++)
            x = x * 6364136223846793005u + 1;
}

/* Burns `seconds` of this process's CPU time, however long that takes on
 * a loaded machine (a wall-clock burn may get little CPU there). */
static void
s_burn_cpu_time(double seconds)
{
    struct timespec ts;
    volatile uint64_t x = 1;
    do {
        for (int i = 0; i < 100000; i++)
            x = x * 6364136223846793005u + 1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    } while ((double)ts.tv_sec + (double)ts.tv_nsec / 1e9 < seconds);
}

/* Waits until the sampler has taken n more samples than before. */
static void
s_wait_samples(emlio_energy_t *m, uint64_t before, uint64_t n)
{
    uint64_t deadline = emlio__now_ns() + 5000000000u;
    while (emlio_energy_samples(m) < before + n) {
        assert_true(emlio__now_ns() < deadline);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

/* --- Pure helpers. --- */

static void
test_energy_parse_u64(void **state)
{
    (void)state;
    uint64_t v = 0;
    assert_int_equal(emlio__energy_parse_u64("123\n", 4, &v), 0);
    assert_true(v == 123);
    assert_int_equal(emlio__energy_parse_u64("0", 1, &v), 0);
    assert_true(v == 0);
    /* len bounds the read; a NUL ends the string. */
    assert_int_equal(emlio__energy_parse_u64("42999", 2, &v), 0);
    assert_true(v == 42);
    assert_int_equal(emlio__energy_parse_u64("7\0junk", 6, &v), 0);
    assert_true(v == 7);
    assert_int_equal(emlio__energy_parse_u64("18446744073709551615", 20, &v),
                     0);
    assert_true(v == UINT64_MAX);
    static const char *const bad[] = {
        "",      "\n",   "-1",
        "+1",    "12a",  "1 2",
        "abc\n", "0x10", "18446744073709551616"
    };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(bad); i++)
        assert_int_equal(emlio__energy_parse_u64(bad[i], strlen(bad[i]), &v),
                         EMLIO_EFORMAT);
}

static void
test_energy_parse_others(void **state)
{
    (void)state;
    double d = 0;
    const char *scale = "2.3283064365386962890625e-10\n";
    assert_int_equal(emlio__energy_parse_double(scale, strlen(scale), &d), 0);
    assert_true(fabs(d - ldexp(1.0, -32)) < 1e-20);
    assert_int_equal(emlio__energy_parse_double("0", 1, &d), EMLIO_EFORMAT);
    assert_int_equal(emlio__energy_parse_double("nan", 3, &d), EMLIO_EFORMAT);
    assert_int_equal(emlio__energy_parse_double("1x", 2, &d), EMLIO_EFORMAT);
    assert_int_equal(emlio__energy_parse_double("", 0, &d), EMLIO_EFORMAT);

    char name[EMLIO_ENERGY_NAME_LEN];
    assert_int_equal(emlio__energy_parse_name("dram\n", 5, name, sizeof(name)),
                     0);
    assert_string_equal(name, "dram");
    assert_int_equal(emlio__energy_parse_name("\n", 1, name, sizeof(name)),
                     EMLIO_EFORMAT);
    assert_int_equal(emlio__energy_parse_name("a b\n", 4, name, sizeof(name)),
                     EMLIO_EFORMAT);
    assert_int_equal(emlio__energy_parse_name("package-0", 9, name, 4),
                     EMLIO_EFORMAT);

    uint64_t config = 0;
    const char *ev = "event=0x02\n";
    assert_int_equal(emlio__energy_parse_perf_event(ev, strlen(ev), &config),
                     0);
    assert_true(config == 2);
    ev = "umask=0x1,event=0x1F";
    assert_int_equal(emlio__energy_parse_perf_event(ev, strlen(ev), &config),
                     0);
    assert_true(config == 0x1f);
    ev = "event=2";
    assert_int_equal(emlio__energy_parse_perf_event(ev, strlen(ev), &config),
                     EMLIO_EFORMAT);
    ev = "umask=0x1";
    assert_int_equal(emlio__energy_parse_perf_event(ev, strlen(ev), &config),
                     EMLIO_EFORMAT);
    ev = "event=0xzz";
    assert_int_equal(emlio__energy_parse_perf_event(ev, strlen(ev), &config),
                     EMLIO_EFORMAT);
}

static void
test_energy_wrap_delta(void **state)
{
    (void)state;
    bool wrapped = true;
    assert_true(emlio__energy_wrap_delta(100, 250, 1000, &wrapped) == 150);
    assert_false(wrapped);
    assert_true(emlio__energy_wrap_delta(7, 7, 1000, &wrapped) == 0);
    assert_false(wrapped);
    /* 900 -> 1000 is 100, then 1000 -> 0 is one more count, then 0 -> 50. */
    assert_true(emlio__energy_wrap_delta(900, 50, 1000, &wrapped) == 151);
    assert_true(wrapped);
    /* A real RAPL range (about 262 kJ) and a wrap near the top. */
    uint64_t max = 262143328850u;
    assert_true(emlio__energy_wrap_delta(max - 10, 5, max, &wrapped) == 16);
    /* Without a range, a smaller value is a reset. */
    assert_true(emlio__energy_wrap_delta(5000, 300, 0, &wrapped) == 300);
    assert_true(wrapped);
    /* A previous value above the range is clamped, never underflows. */
    assert_true(emlio__energy_wrap_delta(2000, 10, 1000, &wrapped) == 11);
}

static void
test_energy_rapl_in_total(void **state)
{
    (void)state;
    assert_true(emlio__energy_rapl_in_total("package-0", 0, true));
    assert_true(emlio__energy_rapl_in_total("dram", 1, true));
    assert_false(emlio__energy_rapl_in_total("core", 1, true));
    assert_false(emlio__energy_rapl_in_total("uncore", 1, true));
    assert_false(emlio__energy_rapl_in_total("psys", 0, true));
    assert_true(emlio__energy_rapl_in_total("psys", 0, false));
}

static void
test_energy_model_formula(void **state)
{
    (void)state;
    /* 10 W x 2 s + 5 W x 3 CPU-s + 1 nJ/B x 1 GB = 20 + 15 + 1 J. */
    double j = emlio_energy_model_j(10, 5, 1e-9, 2, 3, 1000000000u);
    assert_true(fabs(j - 36.0) < 1e-9);
    assert_true(emlio_energy_model_j(0, 0, 0, 5, 5, 5) == 0);
    /* The defaults of a 2-vCPU VM: 1 s fully busy on both costs
     * 1.3 + 2 x 3.2 = 7.7 J. */
    j = emlio_energy_model_j(EMLIO_ENERGY_DEFAULT_IDLE_W,
                             EMLIO_ENERGY_DEFAULT_CORE_W, 0, 1, 2, 0);
    assert_true(fabs(j - 7.7) < 1e-9);
}

/* --- The meter object. --- */

static void
test_energy_lifecycle(void **state)
{
    (void)state;
    emlio_energy_destroy(NULL);
    emlio_energy_t *m = NULL;
    emlio_energy_destroy(&m);

    m = emlio_energy_new();
    assert_non_null(m);
    assert_false(emlio_energy_running(m));
    assert_string_equal(emlio_energy_errmsg(m), "");
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), EMLIO_ESTATE);
    assert_non_null(strstr(emlio_energy_errmsg(m), "not running"));
    assert_int_equal(emlio_energy_sample(m), EMLIO_ESTATE);
    assert_int_equal(emlio_energy_set_backend(m, 99), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_gpu(m, -1), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_cpu_scope(m, 3), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_interval_ms(m, 3600001), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_model(m, -1, 1, 0), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_model(m, 1, NAN, 0), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_model(m, 1, 1, INFINITY), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_set_powercap_root(m, NULL), 0);
    assert_int_equal(emlio_energy_set_nvml_path(m, ""), 0);

    assert_int_equal(emlio_energy_set_backend(m, EMLIO_ENERGY_MODEL), 0);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_OFF), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    assert_true(emlio_energy_running(m));
    assert_int_equal(emlio_energy_start(m), EMLIO_ESTATE);
    assert_int_equal(emlio_energy_set_interval_ms(m, 5), EMLIO_ESTATE);
    assert_int_equal(emlio_energy_set_powercap_root(m, "/x"), EMLIO_ESTATE);
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_false(emlio_energy_running(m));
    /* A meter can measure again. */
    assert_int_equal(emlio_energy_start(m), 0);
    emlio_energy_destroy(&m); /* while running: stops and frees */
    assert_null(m);
    emlio_energy_destroy(&m);
}

static void
test_energy_rapl_counts_domains(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_tree(root);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_AUTO);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 1000000 + 5000000);   /* +5 J */
    s_set_uj(root, "intel-rapl:0:0", 2000000 + 1500000); /* +1.5 J */
    s_set_uj(root, "intel-rapl:0:1", 3000000 + 4000000); /* +4 J, in pkg */
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);

    assert_string_equal(r.source, "rapl");
    assert_false(r.modelled);
    assert_int_equal(r.n_domains, 3);
    /* package + dram; the core subzone is part of the package. */
    assert_true(fabs(r.energy_j - 6.5) < 1e-9);
    const emlio_energy_domain_t *d = s_domain(&r, "package-0");
    assert_string_equal(d->source, "rapl");
    assert_true(d->in_total);
    assert_true(fabs(d->joules - 5.0) < 1e-9);
    d = s_domain(&r, "dram-0");
    assert_true(d->in_total);
    assert_true(fabs(d->joules - 1.5) < 1e-9);
    d = s_domain(&r, "core-0");
    assert_false(d->in_total);
    assert_true(fabs(d->joules - 4.0) < 1e-9);
    assert_true(r.wall_s >= 0);
    assert_true(r.samples >= 2);
    assert_string_equal(emlio_energy_notes(m), "");

    emlio_energy_destroy(&m);
    test_rmtree(root);
}

static void
test_energy_rapl_wraparound(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, S_MAX - 500000);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 250000); /* wrapped */
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "rapl");
    /* 0.5 J to the top, one count to 0, 0.25 J after. */
    assert_true(fabs(r.energy_j - 0.750001) < 1e-9);
    assert_int_equal(s_domain(&r, "package-0")->wraps, 1);

    emlio_energy_destroy(&m);
    test_rmtree(root);
}

/* 9 -> 1 (wrap) -> 9.5 -> 0.5 (wrap) MJ-of-uJ: 2.000001 + 8.5 + 1.000001 J. */
static const double s_two_wraps_j = 11.500002;

static void
test_energy_rapl_multiple_wraps_sampled(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, 9000000);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 1000000);
    assert_int_equal(emlio_energy_sample(m), 0);
    s_set_uj(root, "intel-rapl:0", 9500000);
    assert_int_equal(emlio_energy_sample(m), 0);
    s_set_uj(root, "intel-rapl:0", 500000);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_true(fabs(r.energy_j - s_two_wraps_j) < 1e-9);
    assert_int_equal(s_domain(&r, "package-0")->wraps, 2);
    assert_int_equal(r.samples, 4);

    /* The same counter values without the middle samples lose a range:
     * that is why the meter samples on a thread. */
    s_set_uj(root, "intel-rapl:0", 9000000);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 500000);
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_true(fabs(r.energy_j - 1.500001) < 1e-9);

    emlio_energy_destroy(&m);
    test_rmtree(root);
}

static void
test_energy_rapl_sampler_thread_sees_wraps(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, 9000000);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_set_interval_ms(m, 2), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    /* After each write, wait for two samples: the second surely began
     * after the write. */
    static const uint64_t steps[] = { 1000000, 9500000, 500000 };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(steps); i++) {
        s_set_uj(root, "intel-rapl:0", steps[i]);
        s_wait_samples(m, emlio_energy_samples(m), 2);
    }
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_true(fabs(r.energy_j - s_two_wraps_j) < 1e-9);
    assert_int_equal(s_domain(&r, "package-0")->wraps, 2);
    assert_true(r.samples >= 7);

    emlio_energy_destroy(&m);
    test_rmtree(root);
}

static void
test_energy_rapl_bad_trees(void **state)
{
    (void)state;
    char root[64];
    char path[PATH_MAX];
    emlio_energy_report_t r;
    test_mkdtemp(root, sizeof(root));

    /* No tree at all. */
    snprintf(path, sizeof(path), "%s/absent", root);
    emlio_energy_t *m = s_meter(path, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "no powercap tree"));
    assert_false(emlio_energy_running(m));
    emlio_energy_destroy(&m);

    /* A tree without zones. */
    m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "no intel-rapl zones"));
    emlio_energy_destroy(&m);

    /* A garbled counter. */
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, 1);
    s_put(root, "intel-rapl:0/energy_uj", "12ab\n");
    m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "intel-rapl:0/energy_uj"));
    emlio_energy_destroy(&m);

    /* A counter above its range. */
    s_set_uj(root, "intel-rapl:0", S_MAX + 1u);
    m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "above"));
    emlio_energy_destroy(&m);

    /* A missing range: wraps could not be handled, so no figure. */
    s_set_uj(root, "intel-rapl:0", 5);
    snprintf(path, sizeof(path), "%s/intel-rapl:0/max_energy_range_uj", root);
    assert_int_equal(unlink(path), 0);
    m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), -ENOENT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "max_energy_range_uj"));
    emlio_energy_destroy(&m);

    /* With AUTO the same tree falls back to the model, says why, and never
     * labels the figure rapl. */
    m = s_meter(root, EMLIO_ENERGY_AUTO);
    assert_int_equal(emlio_energy_start(m), 0);
    assert_non_null(strstr(emlio_energy_notes(m), "rapl: cannot read"));
    assert_non_null(strstr(emlio_energy_notes(m), "perf: no perf power PMU"));
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "model");
    assert_true(r.modelled);
    for (size_t i = 0; i < r.n_domains; i++)
        assert_string_equal(r.domains[i].source, "model");
    emlio_energy_destroy(&m);

    /* A bad core subzone beside a good package: the package is measured
     * and the skipped zone is noted (core is part of the package anyway). */
    s_put(root, "intel-rapl:0/max_energy_range_uj", "10000000\n");
    s_zone(root, "intel-rapl:0:1", "core", S_MAX, 1);
    s_put(root, "intel-rapl:0:1/energy_uj", "x\n");
    m = s_meter(root, EMLIO_ENERGY_AUTO);
    assert_int_equal(emlio_energy_start(m), 0);
    assert_non_null(strstr(emlio_energy_notes(m), "intel-rapl:0:1/energy_uj"));
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "rapl");
    assert_int_equal(r.n_domains, 1);

    /* A bad dram or unnamed subzone would shrink the total: the backend
     * is refused instead. */
    s_zone(root, "intel-rapl:0:0", "dram", S_MAX, 1);
    s_put(root, "intel-rapl:0:0/energy_uj", "-3\n");
    assert_int_equal(emlio_energy_set_backend(m, EMLIO_ENERGY_RAPL), 0);
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "intel-rapl:0:0/energy_uj"));
    s_put(root, "intel-rapl:0:0/energy_uj", "1\n");
    s_put(root, "intel-rapl:0:0/name", "\n");
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "intel-rapl:0:0/name"));
    emlio_energy_destroy(&m);

    test_rmtree(root);
}

static void
test_energy_rapl_read_error_during_run(void **state)
{
    (void)state;
    char root[64];
    char path[PATH_MAX];
    test_mkdtemp(root, sizeof(root));
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, 100);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 2000100);
    assert_int_equal(emlio_energy_sample(m), 0);
    snprintf(path, sizeof(path), "%s/intel-rapl:0/energy_uj", root);
    assert_int_equal(unlink(path), 0);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    /* The last good reading stands; the failure is counted. */
    assert_true(fabs(r.energy_j - 2.0) < 1e-9);
    assert_int_equal(s_domain(&r, "package-0")->read_errors, 1);
    emlio_energy_destroy(&m);
    test_rmtree(root);
}

/* The disk term: a labelled estimate, added into a modelled total and
 * reported beside a measured one without touching it. */
static void
test_energy_disk_term_is_labelled(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_zone(root, "intel-rapl:0", "package-0", S_MAX, 1000000);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_MODEL);
    assert_int_equal(emlio_energy_set_disk_model(m, -1.0), EMLIO_EINVAL);
    assert_int_equal(emlio_energy_start(m), 0);
    emlio_energy_add_disk_bytes(m, 2000000000u); /* 2 GB */
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    const emlio_energy_domain_t *d = s_domain(&r, "model-disk");
    assert_non_null(d);
    assert_string_equal(d->source, "model");
    assert_true(d->in_total);
    assert_true(fabs(d->joules - 2e9 * EMLIO_ENERGY_DEFAULT_DISK_J_PER_BYTE) <
                1e-9);
    double cpu =
        s_domain(&r, "model-idle")->joules + s_domain(&r, "model-cpu")->joules;
    assert_true(fabs(r.energy_j - cpu - d->joules) < 1e-9);
    emlio_energy_destroy(&m);

    /* Measured (RAPL): reported, not added. */
    m = s_meter(root, EMLIO_ENERGY_RAPL);
    assert_int_equal(emlio_energy_set_disk_model(m, 1e-9), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 1500000); /* 0.5 J */
    emlio_energy_add_disk_bytes(m, 1000000000u);
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "rapl");
    d = s_domain(&r, "model-disk");
    assert_non_null(d);
    assert_false(d->in_total);
    assert_true(fabs(d->joules - 1.0) < 1e-9);
    assert_true(fabs(r.energy_j - 0.5) < 1e-9);
    emlio_energy_destroy(&m);

    /* Off: no domain. */
    m = s_meter(root, EMLIO_ENERGY_MODEL);
    assert_int_equal(emlio_energy_set_disk_model(m, 0), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    emlio_energy_add_disk_bytes(m, 1000);
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    for (size_t i = 0; i < r.n_domains; i++)
        assert_string_not_equal(r.domains[i].name, "model-disk");
    emlio_energy_destroy(&m);
    test_rmtree(root);
}

static void
test_energy_model_never_claims_rapl(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_tree(root); /* counters exist, but the model is asked for */

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_MODEL);
    assert_int_equal(emlio_energy_set_model(m, 10.0, 20.0, 1e-6), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    s_burn_cpu(0.05);
    emlio_energy_add_bytes(m, 1000000);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);

    assert_string_equal(r.source, "model");
    assert_true(r.modelled);
    assert_true(r.cpu_s > 0);
    assert_int_equal(r.n_domains, 3);
    for (size_t i = 0; i < r.n_domains; i++) {
        assert_string_equal(r.domains[i].source, "model");
        assert_null(strstr(r.domains[i].name, "package"));
    }
    assert_true(fabs(s_domain(&r, "model-idle")->joules - 10.0 * r.wall_s) <
                1e-9);
    assert_true(fabs(s_domain(&r, "model-cpu")->joules - 20.0 * r.cpu_s) <
                1e-9);
    assert_true(fabs(s_domain(&r, "model-io")->joules - 1.0) < 1e-9);
    double want =
        emlio_energy_model_j(10.0, 20.0, 1e-6, r.wall_s, r.cpu_s, 1000000);
    assert_true(fabs(r.energy_j - want) < 1e-9);

    emlio_energy_destroy(&m);
    test_rmtree(root);
}

static void
test_energy_cpu_scope_children(void **state)
{
    (void)state;
    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_MODEL);
    assert_int_equal(emlio_energy_set_cpu_scope(m, EMLIO_ENERGY_CPU_CHILDREN),
                     0);
    assert_int_equal(emlio_energy_start(m), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        s_burn_cpu_time(0.1);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_true(r.cpu_s > 0.03);
    assert_true(r.cpu_s <= r.wall_s + 0.05);
    emlio_energy_destroy(&m);
}

static void
test_energy_backend_none(void **state)
{
    (void)state;
    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_NONE);
    assert_int_equal(emlio_energy_start(m), 0);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "none");
    assert_int_equal(r.n_domains, 0);
    assert_true(r.energy_j == 0);
    emlio_energy_destroy(&m);
}

/* --- The perf power PMU, through synthetic PMU directories. --- */

static void
test_energy_perf_bad_trees(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_PERF);

    assert_int_equal(emlio_energy_set_perf_root(m, root), 0);
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "no perf power PMU"));

    s_put(root, "type", "power\n");
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "/type"));

    s_put(root, "type", "4294967295\n");
    s_mkdir(root, "events");
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "no energy events"));

    s_put(root, "events/energy-pkg", "event=0x02\n");
    s_put(root, "events/energy-pkg.scale", "garbage\n");
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "energy-pkg.scale"));

    /* A well-formed description of a PMU the kernel does not have. */
    s_put(root, "events/energy-pkg.scale", "2.3283064365386962890625e-10\n");
    assert_true(emlio_energy_start(m) < 0);
    assert_non_null(strstr(emlio_energy_errmsg(m), "power/energy-pkg/"));
    assert_false(emlio_energy_running(m));

    emlio_energy_destroy(&m);
    test_rmtree(root);
}

/* The software cpu-clock event (type 1, config 0) dressed up as a power
 * PMU drives the whole perf path: open, liveness, read, scale. */
static void
test_energy_perf_reads_counters(void **state)
{
    (void)state;
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_put(root, "type", "1\n");
    s_put(root, "cpumask", "0\n");
    s_mkdir(root, "events");
    s_put(root, "events/energy-pkg", "event=0x00\n");
    s_put(root, "events/energy-pkg.scale", "1e-9\n"); /* ns -> "J" */

    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_PERF);
    assert_int_equal(emlio_energy_set_perf_root(m, root), 0);
    int rc = emlio_energy_start(m);
    if (rc < 0) {
        /* CPU-wide events need root or perf_event_paranoid <= 0. */
        print_message("# skip: %s\n", emlio_energy_errmsg(m));
        emlio_energy_destroy(&m);
        test_rmtree(root);
        skip();
    }
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "perf");
    assert_false(r.modelled);
    const emlio_energy_domain_t *d = s_domain(&r, "package-0");
    assert_string_equal(d->source, "perf");
    assert_true(d->in_total);
    /* cpu-clock counts nanoseconds of CPU 0's time: about the wall time. */
    assert_true(r.energy_j > 0.5 * r.wall_s);
    assert_true(r.energy_j < 1.5 * r.wall_s + 0.01);
    emlio_energy_destroy(&m);
    test_rmtree(root);
}

/* --- NVML, through tests/fake_nvml.c. --- */

typedef struct s_fake {
    char dir[64];
    char path[PATH_MAX];
    void *dl;
    void (*reset)(int init_rc, unsigned devices);
    void (*set_energy)(unsigned dev, unsigned long long mj);
    void (*set_supported)(unsigned dev, int supported);
    int (*live)(void);
} s_fake_t;

/* Finds libfake_nvml.so beside the test binary (the Makefile rule puts it
 * there), else builds it with cc into a temporary directory. */
static int
s_fake_setup(void **state)
{
    s_fake_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    char exe[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(f->path, sizeof(f->path), "%s/libfake_nvml.so", exe);
    }
    if (access(f->path, R_OK) != 0) {
        test_mkdtemp(f->dir, sizeof(f->dir));
        snprintf(f->path, sizeof(f->path), "%s/libfake_nvml.so", f->dir);
        char cmd[PATH_MAX + 128];
        snprintf(cmd, sizeof(cmd),
                 "cc -shared -fPIC -o '%s' tests/fake_nvml.c 2>&1", f->path);
        if (system(cmd) != 0)
            f->path[0] = '\0';
    }
    if (f->path[0])
        f->dl = dlopen(f->path, RTLD_NOW | RTLD_LOCAL);
    if (f->dl) {
        void *syms[4] = { dlsym(f->dl, "fake_nvml_reset"),
                          dlsym(f->dl, "fake_nvml_set_energy"),
                          dlsym(f->dl, "fake_nvml_set_supported"),
                          dlsym(f->dl, "fake_nvml_live") };
        for (int i = 0; i < 4; i++)
            assert_non_null(syms[i]);
        memcpy(&f->reset, &syms[0], sizeof(void *));
        memcpy(&f->set_energy, &syms[1], sizeof(void *));
        memcpy(&f->set_supported, &syms[2], sizeof(void *));
        memcpy(&f->live, &syms[3], sizeof(void *));
    }
    *state = f;
    return 0;
}

static int
s_fake_teardown(void **state)
{
    s_fake_t *f = *state;
    if (f->dl)
        dlclose(f->dl);
    if (f->dir[0])
        test_rmtree(f->dir);
    free(f);
    return 0;
}

static s_fake_t *
s_fake(void **state)
{
    s_fake_t *f = *state;
    if (!f->dl) {
        print_message("# skip: no libfake_nvml.so and no cc to build "
                      "tests/fake_nvml.c\n");
        skip();
    }
    return f;
}

static void
test_energy_nvml_gpu_energy(void **state)
{
    s_fake_t *f = s_fake(state);
    f->reset(0, 2);
    f->set_supported(1, 0); /* like a pre-Volta GPU */
    f->set_energy(0, 1000);

    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_NONE);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_REQUIRE), 0);
    assert_int_equal(emlio_energy_set_nvml_path(m, f->path), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    assert_int_equal(f->live(), 1);
    assert_non_null(strstr(emlio_energy_notes(m), "gpu-1"));
    f->set_energy(0, 4500);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_int_equal(f->live(), 0); /* nvmlShutdown was called */

    assert_string_equal(r.source, "nvml");
    assert_false(r.modelled);
    assert_int_equal(r.n_domains, 1);
    const emlio_energy_domain_t *d = s_domain(&r, "gpu-0");
    assert_string_equal(d->source, "nvml");
    assert_true(fabs(d->joules - 3.5) < 1e-9);
    assert_true(fabs(r.energy_j - 3.5) < 1e-9);
    emlio_energy_destroy(&m);
}

static void
test_energy_nvml_on_top_of_rapl(void **state)
{
    s_fake_t *f = s_fake(state);
    char root[64];
    test_mkdtemp(root, sizeof(root));
    s_tree(root);
    f->reset(0, 1);
    f->set_energy(0, 50000);

    emlio_energy_t *m = s_meter(root, EMLIO_ENERGY_AUTO);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_AUTO), 0);
    assert_int_equal(emlio_energy_set_nvml_path(m, f->path), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    s_set_uj(root, "intel-rapl:0", 1000000 + 2000000);
    f->set_energy(0, 50000 + 7250);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "rapl+nvml");
    assert_true(fabs(s_domain(&r, "gpu-0")->joules - 7.25) < 1e-9);
    assert_true(fabs(s_domain(&r, "package-0")->joules - 2.0) < 1e-9);
    assert_true(fabs(r.energy_j - 9.25) < 1e-9);
    emlio_energy_destroy(&m);
    test_rmtree(root);
}

static void
test_energy_nvml_model_mix_is_labelled(void **state)
{
    s_fake_t *f = s_fake(state);
    f->reset(0, 1);
    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_AUTO);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_AUTO), 0);
    assert_int_equal(emlio_energy_set_nvml_path(m, f->path), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    f->set_energy(0, 2000);
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "model+nvml");
    assert_true(r.modelled);
    assert_string_equal(s_domain(&r, "gpu-0")->source, "nvml");
    assert_string_equal(s_domain(&r, "model-cpu")->source, "model");
    emlio_energy_destroy(&m);
}

static void
test_energy_nvml_counter_reset(void **state)
{
    s_fake_t *f = s_fake(state);
    f->reset(0, 1);
    f->set_energy(0, 900000);
    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_NONE);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_REQUIRE), 0);
    assert_int_equal(emlio_energy_set_nvml_path(m, f->path), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    f->set_energy(0, 901000);
    assert_int_equal(emlio_energy_sample(m), 0);
    f->set_energy(0, 500); /* driver reloaded: counts from 0 again */
    emlio_energy_report_t r;
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_true(fabs(r.energy_j - 1.5) < 1e-9);
    assert_int_equal(s_domain(&r, "gpu-0")->wraps, 1);
    emlio_energy_destroy(&m);
}

static void
test_energy_nvml_unavailable(void **state)
{
    s_fake_t *f = s_fake(state);
    emlio_energy_report_t r;

    /* No library: absent, not an error, unless required. */
    emlio_energy_t *m = s_meter("/nonexistent", EMLIO_ENERGY_MODEL);
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_AUTO), 0);
    assert_int_equal(
        emlio_energy_set_nvml_path(m, "/nonexistent/libnvidia-ml.so.1"), 0);
    assert_int_equal(emlio_energy_start(m), 0);
    assert_non_null(strstr(emlio_energy_notes(m), "nvml: cannot load"));
    assert_int_equal(emlio_energy_stop(m, &r), 0);
    assert_string_equal(r.source, "model");
    assert_int_equal(emlio_energy_set_gpu(m, EMLIO_ENERGY_GPU_REQUIRE), 0);
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "nvml: cannot load"));

    /* A library without the NVML symbols. */
    assert_int_equal(emlio_energy_set_nvml_path(m, "libc.so.6"), 0);
    assert_int_equal(emlio_energy_start(m), EMLIO_EFORMAT);
    assert_non_null(strstr(emlio_energy_errmsg(m), "nvmlInit_v2"));

    /* nvmlInit_v2 fails (driver not loaded). */
    f->reset(9, 1);
    assert_int_equal(emlio_energy_set_nvml_path(m, f->path), 0);
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "Driver Not Loaded"));

    /* No GPU has a counter: nothing is left initialised. */
    f->reset(0, 1);
    f->set_supported(0, 0);
    assert_int_equal(emlio_energy_start(m), EMLIO_ENOTFOUND);
    assert_non_null(strstr(emlio_energy_errmsg(m), "no GPU"));
    assert_int_equal(f->live(), 0);
    emlio_energy_destroy(&m);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_energy_parse_u64),
        cmocka_unit_test(test_energy_parse_others),
        cmocka_unit_test(test_energy_wrap_delta),
        cmocka_unit_test(test_energy_rapl_in_total),
        cmocka_unit_test(test_energy_model_formula),
        cmocka_unit_test(test_energy_lifecycle),
        cmocka_unit_test(test_energy_rapl_counts_domains),
        cmocka_unit_test(test_energy_rapl_wraparound),
        cmocka_unit_test(test_energy_rapl_multiple_wraps_sampled),
        cmocka_unit_test(test_energy_rapl_sampler_thread_sees_wraps),
        cmocka_unit_test(test_energy_rapl_bad_trees),
        cmocka_unit_test(test_energy_rapl_read_error_during_run),
        cmocka_unit_test(test_energy_model_never_claims_rapl),
        cmocka_unit_test(test_energy_disk_term_is_labelled),
        cmocka_unit_test(test_energy_cpu_scope_children),
        cmocka_unit_test(test_energy_backend_none),
        cmocka_unit_test(test_energy_perf_bad_trees),
        cmocka_unit_test(test_energy_perf_reads_counters),
    };
    const struct CMUnitTest nvml_tests[] = {
        cmocka_unit_test(test_energy_nvml_gpu_energy),
        cmocka_unit_test(test_energy_nvml_on_top_of_rapl),
        cmocka_unit_test(test_energy_nvml_model_mix_is_labelled),
        cmocka_unit_test(test_energy_nvml_counter_reset),
        cmocka_unit_test(test_energy_nvml_unavailable),
    };
    int failed = cmocka_run_group_tests_name("energy", tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("energy_nvml", nvml_tests,
                                          s_fake_setup, s_fake_teardown);
    return failed ? 1 : 0;
}
