/* energy_sysfs.c - the sysfs side of the energy meter: the powercap (RAPL)
 * tree, the perf power PMU, and the parsers of their small text files.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <math.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "energy.h"

/* perf_event_open's scale for RAPL is 2^-32 J on every CPU seen so far, but
 * it is read from the .scale file, never assumed. */
#define S_SMALL_FILE       256
/* How long the perf probe waits for a counter to move. RAPL updates every
 * millisecond or so; a counter still at 0 after this is not implemented
 * (virtual machines expose the PMU with dead counters). */
#define S_PERF_LIVENESS_NS (20 * 1000 * 1000)

int
emlio__energy_parse_u64(const char *buf, size_t len, uint64_t *out)
{
    size_t i = 0;
    uint64_t v = 0;
    while (i < len && buf[i] >= '0' && buf[i] <= '9') {
        unsigned d = (unsigned)(buf[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return EMLIO_EFORMAT;
        v = v * 10 + d;
        i++;
    }
    if (i == 0)
        return EMLIO_EFORMAT;
    /* Trailing whitespace, or the NUL of a C string, ends the number. */
    for (; i < len && buf[i] != '\0'; i++)
        if (!isspace((unsigned char)buf[i]))
            return EMLIO_EFORMAT;
    *out = v;
    return 0;
}

int
emlio__energy_parse_double(const char *buf, size_t len, double *out)
{
    char text[64];
    while (len && isspace((unsigned char)buf[len - 1]))
        len--;
    if (len == 0 || len >= sizeof(text) || memchr(buf, '\0', len))
        return EMLIO_EFORMAT;
    memcpy(text, buf, len);
    text[len] = '\0';
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end != text + len || !isfinite(v) || v <= 0)
        return EMLIO_EFORMAT;
    *out = v;
    return 0;
}

int
emlio__energy_parse_name(const char *buf, size_t len, char *out, size_t cap)
{
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\0'))
        len--;
    if (len == 0 || len >= cap)
        return EMLIO_EFORMAT;
    for (size_t i = 0; i < len; i++)
        if (!isgraph((unsigned char)buf[i]))
            return EMLIO_EFORMAT;
    memcpy(out, buf, len);
    out[len] = '\0';
    return 0;
}

int
emlio__energy_parse_perf_event(const char *buf, size_t len, uint64_t *config)
{
    static const char key[] = "event=";
    size_t i = 0;
    while (i < len && buf[i] != '\0' && buf[i] != '\n') {
        size_t end = i;
        while (end < len && buf[end] != ',' && buf[end] != '\n' &&
               buf[end] != '\0')
            end++;
        size_t n = end - i;
        if (n > sizeof(key) - 1 && !memcmp(buf + i, key, sizeof(key) - 1)) {
            const char *v = buf + i + sizeof(key) - 1;
            size_t vlen = n - (sizeof(key) - 1);
            if (vlen < 3 || v[0] != '0' || (v[1] != 'x' && v[1] != 'X'))
                return EMLIO_EFORMAT;
            uint64_t x = 0;
            for (size_t k = 2; k < vlen; k++) {
                int c = tolower((unsigned char)v[k]);
                unsigned d;
                if (c >= '0' && c <= '9')
                    d = (unsigned)(c - '0');
                else if (c >= 'a' && c <= 'f')
                    d = (unsigned)(c - 'a' + 10);
                else
                    return EMLIO_EFORMAT;
                if (x >> 60)
                    return EMLIO_EFORMAT;
                x = x << 4 | d;
            }
            *config = x;
            return 0;
        }
        i = end < len && buf[end] == ',' ? end + 1 : end;
    }
    return EMLIO_EFORMAT;
}

uint64_t
emlio__energy_wrap_delta(uint64_t prev, uint64_t cur, uint64_t max,
                         bool *wrapped)
{
    *wrapped = false;
    if (cur >= prev)
        return cur - prev;
    *wrapped = true;
    if (max == 0)
        return cur; /* a reset: count what accrued since */
    if (prev > max)
        prev = max;
    if (cur > max)
        cur = max;
    return (max - prev) + cur + 1;
}

bool
emlio__energy_rapl_in_total(const char *name, int depth, bool has_package)
{
    if (depth == 0 && !strncmp(name, "package", 7))
        return true;
    if (!strcmp(name, "dram") || !strncmp(name, "dram-", 5))
        return true;
    /* psys covers the whole SoC, package included; add it only alone. */
    if (!strncmp(name, "psys", 4))
        return !has_package;
    return false; /* core, uncore: parts of the package */
}

int
emlio__energy_read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t len = 0;
    while (len + 1 < cap) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int rc = -errno;
            close(fd);
            return rc;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    return (int)len;
}

/* Reads and parses a counter-valued file. */
static int
s_read_u64(const char *path, uint64_t *out, char *err)
{
    char buf[S_SMALL_FILE];
    int n = emlio__energy_read_small(path, buf, sizeof(buf));
    if (n < 0)
        return emlio__seterr(err, n, "cannot read '%s': %s", path,
                             emlio_strerror(n));
    if (emlio__energy_parse_u64(buf, (size_t)n, out) < 0)
        return emlio__seterr(err, EMLIO_EFORMAT,
                             "cannot parse '%s': not a decimal counter", path);
    return 0;
}

/* A zone directory name: intel-rapl:N (sub < 0) or intel-rapl:N:M. */
static bool
s_parse_zone(const char *name, unsigned *pkg, int *sub)
{
    static const char prefix[] = "intel-rapl:";
    if (strncmp(name, prefix, sizeof(prefix) - 1))
        return false;
    const char *p = name + sizeof(prefix) - 1;
    unsigned v[2] = { 0, 0 };
    int parts = 0;
    for (;;) {
        if (!isdigit((unsigned char)*p) || parts == 2)
            return false;
        unsigned x = 0;
        while (isdigit((unsigned char)*p)) {
            if (x > 100000)
                return false;
            x = x * 10 + (unsigned)(*p++ - '0');
        }
        v[parts++] = x;
        if (*p == '\0')
            break;
        if (*p++ != ':')
            return false;
    }
    *pkg = v[0];
    *sub = parts == 2 ? (int)v[1] : -1;
    return true;
}

typedef struct s_zone {
    char dir[64];
    unsigned pkg;
    int sub;
} s_zone_t;

static int
s_zone_cmp(const void *a, const void *b)
{
    const s_zone_t *x = a;
    const s_zone_t *y = b;
    if (x->pkg != y->pkg)
        return x->pkg < y->pkg ? -1 : 1;
    return (x->sub > y->sub) - (x->sub < y->sub);
}

/* Labels a domain: "package-0" stays; "dram" under package 0 becomes
 * "dram-0". */
static void
s_label(char *out, size_t cap, const char *name, unsigned pkg)
{
    size_t len = strlen(name);
    size_t i = len;
    while (i > 0 && isdigit((unsigned char)name[i - 1]))
        i--;
    if (i < len && i > 0 && name[i - 1] == '-')
        snprintf(out, cap, "%s", name);
    else
        snprintf(out, cap, "%.20s-%u", name, pkg);
}

/* Appends "; text" (or text) to a note buffer of EMLIO_ERRMSG_LEN bytes,
 * cutting it short when full. */
static void EMLIO_PRINTF(2, 3) s_notef(char *note, const char *fmt, ...)
{
    size_t used = strlen(note);
    if (used + 3 >= EMLIO_ERRMSG_LEN)
        return;
    if (used) {
        memcpy(note + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + used, EMLIO_ERRMSG_LEN - used, fmt, ap);
    va_end(ap);
}

/* Reads one zone into a counter. 0 or < 0 with err set. On failure
 * *optional says whether the zone may be skipped: only subzones known to
 * lie inside a package (core, uncore) may; losing a package, dram or an
 * unnamed zone would silently shrink the total. */
static int
s_rapl_zone(const char *root, const s_zone_t *z, emlio__energy_counter_t *c,
            bool *optional, char *err)
{
    char path[PATH_MAX];
    char buf[S_SMALL_FILE];
    char name[EMLIO_ENERGY_NAME_LEN];
    int rc;

    *optional = false;

    snprintf(path, sizeof(path), "%s/%s/name", root, z->dir);
    rc = emlio__energy_read_small(path, buf, sizeof(buf));
    if (rc < 0)
        return emlio__seterr(err, rc, "cannot read '%s': %s", path,
                             emlio_strerror(rc));
    if (emlio__energy_parse_name(buf, (size_t)rc, name, 21) < 0)
        return emlio__seterr(err, EMLIO_EFORMAT,
                             "cannot parse '%s': not a domain name", path);
    *optional =
        z->sub >= 0 && (!strcmp(name, "core") || !strcmp(name, "uncore"));

    snprintf(path, sizeof(path), "%s/%s/max_energy_range_uj", root, z->dir);
    uint64_t max = 0;
    rc = s_read_u64(path, &max, err);
    if (rc < 0)
        return rc;
    if (max == 0)
        return emlio__seterr(err, EMLIO_EFORMAT,
                             "cannot use '%s': the range is 0", path);

    snprintf(path, sizeof(path), "%s/%s/energy_uj", root, z->dir);
    uint64_t now = 0;
    rc = s_read_u64(path, &now, err);
    if (rc < 0)
        return rc;
    if (now > max)
        return emlio__seterr(err, EMLIO_EFORMAT,
                             "cannot use '%s': %" PRIu64
                             " is above max_energy_range_uj %" PRIu64,
                             path, now, max);

    c->path = emlio_strdup(path);
    if (!c->path)
        return emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
    s_label(c->name, sizeof(c->name), name, z->pkg);
    c->source = "rapl";
    c->kind = EMLIO__ENERGY_RAPL;
    c->unit_j = 1e-6;
    c->max = max;
    c->prev = now;
    return 0;
}

int
emlio__energy_rapl_probe(const char *root, emlio__energy_set_t *set, char *err)
{
    DIR *dir = opendir(root);
    if (!dir) {
        int e = errno;
        return emlio__seterr(err, e == ENOENT ? EMLIO_ENOTFOUND : -e,
                             "no powercap tree at '%s': %s", root,
                             emlio_strerror(-e));
    }
    s_zone_t zones[EMLIO_ENERGY_MAX_DOMAINS];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dir)) && n < EMLIO_ARRAY_SIZE(zones)) {
        s_zone_t z;
        size_t len = strlen(de->d_name);
        if (len >= sizeof(z.dir) || !s_parse_zone(de->d_name, &z.pkg, &z.sub))
            continue;
        memcpy(z.dir, de->d_name, len + 1);
        zones[n++] = z;
    }
    closedir(dir);
    if (n == 0)
        return emlio__seterr(err, EMLIO_ENOTFOUND,
                             "no intel-rapl zones under '%s'", root);
    qsort(zones, n, sizeof(zones[0]), s_zone_cmp);

    size_t first = set->n;
    char note[EMLIO_ERRMSG_LEN] = "";
    char why[EMLIO_ERRMSG_LEN] = "";
    int first_rc = 0;
    int depth[EMLIO_ENERGY_MAX_DOMAINS];
    for (size_t i = 0; i < n; i++) {
        emlio__energy_counter_t *c = emlio__energy_set_add(set);
        if (!c)
            goto nomem;
        bool optional = false;
        int rc = s_rapl_zone(root, &zones[i], c, &optional, why);
        if (rc == EMLIO_ENOMEM)
            goto nomem;
        if (rc < 0 && !optional) {
            while (set->n > first) {
                emlio_free(set->v[set->n - 1].path);
                set->n--;
            }
            return emlio__seterr(err, rc, "%s", why);
        }
        if (rc < 0) {
            set->n--; /* drop the zone, keep the reason */
            if (!first_rc)
                first_rc = rc;
            s_notef(note, "%s", why);
            continue;
        }
        depth[set->n - 1 - first] = zones[i].sub < 0 ? 0 : 1;
    }
    if (set->n == first) {
        emlio__seterr(err, first_rc, "%s", note);
        return first_rc;
    }
    bool has_package = false;
    for (size_t i = first; i < set->n; i++)
        if (depth[i - first] == 0 && !strncmp(set->v[i].name, "package", 7))
            has_package = true;
    for (size_t i = first; i < set->n; i++)
        set->v[i].in_total = emlio__energy_rapl_in_total(
            set->v[i].name, depth[i - first], has_package);
    /* Zones that were skipped while others worked are worth a note. */
    emlio__seterr(err, 0, "%s", note);
    return (int)(set->n - first);

nomem:
    while (set->n > first) {
        emlio_free(set->v[set->n - 1].path);
        set->n--;
    }
    return emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
}

/* --- The perf power PMU. --- */

static const struct {
    const char *event; /* file under events/ */
    const char *label; /* domain name before "-<package>" */
} s_perf_events[] = {
    { "energy-pkg", "package" }, { "energy-ram", "dram" },
    { "energy-cores", "core" },  { "energy-gpu", "uncore" },
    { "energy-psys", "psys" },
};

/* Parses a cpumask/cpulist such as "0", "0,24" or "0-1" into cpus. */
static int
s_parse_cpulist(const char *buf, int *cpus, int cap)
{
    int n = 0;
    const char *p = buf;
    while (*p && *p != '\n') {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p || a < 0 || a > 65535)
            return EMLIO_EFORMAT;
        long b = a;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a || b > 65535)
                return EMLIO_EFORMAT;
            p = end;
        }
        for (long c = a; c <= b && n < cap; c++)
            cpus[n++] = (int)c;
        if (*p == ',')
            p++;
        else if (*p && *p != '\n')
            return EMLIO_EFORMAT;
    }
    return n;
}

static int
s_perf_open(uint32_t type, uint64_t config, int cpu)
{
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.type = type;
    attr.size = sizeof(attr);
    attr.config = config;
    long fd =
        syscall(SYS_perf_event_open, &attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -errno : (int)fd;
}

/* Perf counts from 0 at open. Waits for any of set's counters from first
 * on to move: a PMU whose counters never do (as in many VMs) must not
 * report 0 J as a measurement; then closes them and fails. On success the
 * counters' starting values are taken. */
static int
s_perf_wait_alive(const char *root, emlio__energy_set_t *set, size_t first,
                  char *err)
{
    uint64_t deadline = emlio__now_ns() + S_PERF_LIVENESS_NS;
    bool alive = false;
    for (;;) {
        for (size_t i = first; i < set->n; i++) {
            uint64_t raw = 0;
            if (emlio__energy_read(NULL, &set->v[i], &raw) == 0 && raw > 0)
                alive = true;
        }
        if (alive || emlio__now_ns() >= deadline)
            break;
        struct timespec ts = { 0, 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    if (!alive) {
        while (set->n > first) {
            close(set->v[set->n - 1].fd);
            set->n--;
        }
        return emlio__seterr(err, EMLIO_ENOTFOUND,
                             "perf power PMU at '%s' has counters that do not "
                             "advance (a virtual machine?)",
                             root);
    }
    for (size_t i = first; i < set->n; i++) {
        uint64_t raw = 0;
        if (emlio__energy_read(NULL, &set->v[i], &raw) == 0)
            set->v[i].prev = raw;
    }
    return 0;
}

int
emlio__energy_perf_probe(const char *root, emlio__energy_set_t *set, char *err)
{
    char path[PATH_MAX];
    char buf[S_SMALL_FILE];
    uint64_t type = 0;
    int rc;

    snprintf(path, sizeof(path), "%s/type", root);
    rc = emlio__energy_read_small(path, buf, sizeof(buf));
    if (rc < 0)
        return emlio__seterr(err, rc == -ENOENT ? EMLIO_ENOTFOUND : rc,
                             "no perf power PMU at '%s': %s", root,
                             emlio_strerror(rc));
    if (emlio__energy_parse_u64(buf, (size_t)rc, &type) < 0 ||
        type > UINT32_MAX)
        return emlio__seterr(err, EMLIO_EFORMAT,
                             "cannot parse '%s': not a PMU type", path);

    int cpus[64];
    int n_cpus = 1;
    cpus[0] = 0;
    snprintf(path, sizeof(path), "%s/cpumask", root);
    rc = emlio__energy_read_small(path, buf, sizeof(buf));
    if (rc >= 0) {
        n_cpus = s_parse_cpulist(buf, cpus, (int)EMLIO_ARRAY_SIZE(cpus));
        if (n_cpus <= 0)
            return emlio__seterr(err, EMLIO_EFORMAT,
                                 "cannot parse '%s': not a CPU list", path);
    }

    size_t first = set->n;
    char note[EMLIO_ERRMSG_LEN] = "";
    int first_rc = 0;
    bool has_package = false;
    for (size_t e = 0; e < EMLIO_ARRAY_SIZE(s_perf_events); e++) {
        uint64_t config = 0;
        double scale = 0;
        snprintf(path, sizeof(path), "%s/events/%s", root,
                 s_perf_events[e].event);
        rc = emlio__energy_read_small(path, buf, sizeof(buf));
        if (rc == -ENOENT)
            continue;
        if (rc >= 0 &&
            emlio__energy_parse_perf_event(buf, (size_t)rc, &config) < 0)
            rc = EMLIO_EFORMAT;
        if (rc >= 0) {
            snprintf(path, sizeof(path), "%s/events/%s.scale", root,
                     s_perf_events[e].event);
            rc = emlio__energy_read_small(path, buf, sizeof(buf));
            if (rc >= 0 &&
                emlio__energy_parse_double(buf, (size_t)rc, &scale) < 0)
                rc = EMLIO_EFORMAT;
        }
        if (rc < 0) {
            if (!first_rc)
                first_rc = rc;
            s_notef(note, "cannot use '%s': %s", path,
                    rc == EMLIO_EFORMAT ? "garbled" : emlio_strerror(rc));
            if (e <= 1) /* package or dram: the total would shrink */
                goto fail;
            continue;
        }
        for (int p = 0; p < n_cpus; p++) {
            int fd = s_perf_open((uint32_t)type, config, cpus[p]);
            if (fd < 0) {
                if (!first_rc)
                    first_rc = fd;
                s_notef(note,
                        "cannot open perf event 'power/%s/' on cpu %d: %s",
                        s_perf_events[e].event, cpus[p], emlio_strerror(fd));
                if (e <= 1) {
                    rc = fd;
                    goto fail;
                }
                continue;
            }
            emlio__energy_counter_t *c = emlio__energy_set_add(set);
            if (!c) {
                close(fd);
                goto nomem;
            }
            snprintf(c->name, sizeof(c->name), "%s-%d", s_perf_events[e].label,
                     p);
            c->source = "perf";
            c->kind = EMLIO__ENERGY_PERF;
            c->fd = fd;
            c->unit_j = scale;
            c->in_total = e <= 1; /* package and dram */
            if (e == 0)
                has_package = true;
        }
    }
    if (set->n == first) {
        if (!note[0])
            return emlio__seterr(err, EMLIO_ENOTFOUND,
                                 "no energy events under '%s/events'", root);
        emlio__seterr(err, first_rc ? first_rc : EMLIO_ENOTFOUND, "%s", note);
        return first_rc ? first_rc : EMLIO_ENOTFOUND;
    }
    if (!has_package)
        for (size_t i = first; i < set->n; i++)
            if (!strncmp(set->v[i].name, "psys", 4))
                set->v[i].in_total = true;

    rc = s_perf_wait_alive(root, set, first, err);
    if (rc < 0)
        return rc;
    emlio__seterr(err, 0, "%s", note);
    return (int)(set->n - first);

nomem:
    rc = EMLIO_ENOMEM;
    snprintf(note, sizeof(note), "out of memory");
fail:
    while (set->n > first) {
        close(set->v[set->n - 1].fd);
        set->n--;
    }
    return emlio__seterr(err, rc, "%s", note);
}
