/* cmd_energy.c - `emlio energy -- CMD [ARGS...]`: runs a command and reports
 * its wall time, CPU time and energy, like `perf stat`.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emlio.h"
#include "emlio/energy.h"

#include "commands.h"

/* The child to forward signals to. A signal handler can reach nothing
 * else, so this one static is unavoidable; it lives in the tool, never in
 * the library. */
static volatile sig_atomic_t s_child = 0;
/* A signal that arrived before the child existed, forwarded after fork. */
static volatile sig_atomic_t s_pending = 0;

static void
s_usage(FILE *out)
{
    fprintf(out,
            "usage: emlio energy [options] -- CMD [ARGS...]\n"
            "\n"
            "Runs CMD, then reports wall time, CPU-seconds of CMD and its\n"
            "children, and energy: a summary on stderr, and one JSON object\n"
            "as the last line of stdout. Exits with CMD's status (128+N when\n"
            "CMD was killed by signal N).\n"
            "\n"
            "options:\n"
            "  --interval MS        sample counters every MS ms (default "
            "%d; 0: start/stop only)\n"
            "  --backend NAME       auto, rapl, perf, model or none (default "
            "auto)\n"
            "  --gpu POLICY         auto, off or require (default auto)\n"
            "  --model-idle-w W     model: idle watts over the wall time "
            "(default %.1f)\n"
            "  --model-core-w W     model: watts per busy CPU (default %.1f)\n"
            "  --nvml-lib PATH      NVML library to dlopen (default "
            "libnvidia-ml.so.1)\n"
            "\n"
            "environment:\n"
            "  EMLIO_POWERCAP_ROOT  powercap tree to read instead of "
            "/sys/class/powercap\n"
            "  EMLIO_NVML_LIB       like --nvml-lib\n",
            EMLIO_ENERGY_DEFAULT_INTERVAL_MS, EMLIO_ENERGY_DEFAULT_IDLE_W,
            EMLIO_ENERGY_DEFAULT_CORE_W);
}

static void
s_forward(int sig, siginfo_t *info, void *ucontext)
{
    (void)ucontext;
    pid_t child = (pid_t)s_child;
    /* A terminal's ^C (si_code SI_KERNEL) already reached the child, which
     * shares our process group; forward only signals sent to us alone.
     * Before the fork, any signal is kept for the child. */
    if (child <= 0)
        s_pending = sig;
    else if (!info || info->si_code != SI_KERNEL)
        kill(child, sig);
}

static bool
s_parse_double(const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < 0)
        return false;
    *out = v;
    return true;
}

static int
s_lookup(const char *text, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(text, names[i]))
            return i;
    return -1;
}

/* Writes s as a JSON string. */
static void
s_json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", out);
        else if (*p == '\t')
            fputs("\\t", out);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* Writes the joined command line, for the summary. */
static void
s_print_cmd(FILE *out, char **cmd)
{
    for (int i = 0; cmd[i]; i++)
        fprintf(out, "%s%s", i ? " " : "", cmd[i]);
}

static void
s_summary(const emlio_energy_report_t *r, char **cmd, int exit_code,
          const char *notes)
{
    fprintf(stderr, "\n Energy stats for '");
    s_print_cmd(stderr, cmd);
    fprintf(stderr, "':\n\n");
    for (size_t i = 0; i < r->n_domains; i++) {
        const emlio_energy_domain_t *d = &r->domains[i];
        fprintf(stderr, "  %14.3f J   %-12s (%s%s", d->joules, d->name,
                d->source, d->in_total ? "" : ", part of another domain");
        if (d->wraps)
            fprintf(stderr, ", %u wrap%s", d->wraps, d->wraps == 1 ? "" : "s");
        if (d->read_errors)
            fprintf(stderr, ", %u read error%s", d->read_errors,
                    d->read_errors == 1 ? "" : "s");
        fprintf(stderr, ")\n");
    }
    fprintf(stderr, "  %14.3f J   energy       (%s%s)\n", r->energy_j,
            r->source, r->modelled ? "; an estimate, not a measurement" : "");
    fprintf(
        stderr,
        "  %14.3f s   CPU time     (command and children; user %.3f, sys %.3f)\n",
        r->cpu_s, r->user_s, r->sys_s);
    fprintf(stderr, "  %14.3f s   wall time    (exit status %d)\n", r->wall_s,
            exit_code);
    /* One note a line: the library separates them with "; ". */
    if (notes && notes[0]) {
        fprintf(stderr, "\n");
        for (const char *p = notes; *p;) {
            const char *end = strstr(p, "; ");
            int len = end ? (int)(end - p) : (int)strlen(p);
            fprintf(stderr, "  note: %.*s\n", len, p);
            p = end ? end + 2 : p + len;
        }
    }
    fprintf(stderr, "\n");
}

static void
s_json(const emlio_energy_report_t *r, char **cmd, int exit_code,
       const char *notes)
{
    FILE *out = stdout;
    fprintf(out, "{\"command\":[");
    for (int i = 0; cmd[i]; i++) {
        if (i)
            fputc(',', out);
        s_json_str(out, cmd[i]);
    }
    fprintf(out,
            "],\"seconds\":%.6f,\"cpu_s\":%.6f,\"user_s\":%.6f,"
            "\"sys_s\":%.6f,\"energy_j\":%.6f,\"energy_source\":",
            r->wall_s, r->cpu_s, r->user_s, r->sys_s, r->energy_j);
    s_json_str(out, r->source);
    fprintf(out, ",\"modelled\":%s,\"exit_code\":%d,\"samples\":%llu,",
            r->modelled ? "true" : "false", exit_code,
            (unsigned long long)r->samples);
    fprintf(out, "\"domains\":[");
    for (size_t i = 0; i < r->n_domains; i++) {
        const emlio_energy_domain_t *d = &r->domains[i];
        fprintf(out, "%s{\"name\":", i ? "," : "");
        s_json_str(out, d->name);
        fprintf(out, ",\"joules\":%.6f,\"source\":", d->joules);
        s_json_str(out, d->source);
        fprintf(out, ",\"in_total\":%s,\"wraps\":%u,\"read_errors\":%u}",
                d->in_total ? "true" : "false", d->wraps, d->read_errors);
    }
    fprintf(out, "],\"notes\":");
    s_json_str(out, notes ? notes : "");
    fprintf(out, "}\n");
    fflush(out);
}

/* Parses the options into the meter. Returns the index of CMD in argv,
 * or -1 after printing why (-2 for --help). */
static int
s_options(int argc, char **argv, emlio_energy_t *meter)
{
    static const char *const backends[] = { "auto", "rapl", "perf", "model",
                                            "none" };
    static const char *const gpus[] = { "auto", "off", "require" };
    double idle_w = EMLIO_ENERGY_DEFAULT_IDLE_W;
    double core_w = EMLIO_ENERGY_DEFAULT_CORE_W;
    int cmd = -1;
    for (int i = 1; i < argc && cmd < 0; i++) {
        const char *opt = argv[i];
        if (!strcmp(opt, "--")) {
            cmd = i + 1;
            break;
        }
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help")) {
            s_usage(stdout);
            return -2;
        }
        if (opt[0] != '-') {
            cmd = i; /* the command, without a "--" */
            break;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "emlio energy: option '%s' needs a value\n", opt);
            return -1;
        }
        const char *val = argv[++i];
        int rc = 0;
        if (!strcmp(opt, "--interval")) {
            double ms = 0;
            if (!s_parse_double(val, &ms) || ms != floor(ms) || ms > 3600000)
                rc = -1;
            else
                rc = emlio_energy_set_interval_ms(meter, (uint32_t)ms);
        } else if (!strcmp(opt, "--backend")) {
            int b = s_lookup(val, backends, 5);
            rc = b < 0 ? -1 : emlio_energy_set_backend(meter, b);
        } else if (!strcmp(opt, "--gpu")) {
            int g = s_lookup(val, gpus, 3);
            rc = g < 0 ? -1 : emlio_energy_set_gpu(meter, g);
        } else if (!strcmp(opt, "--model-idle-w")) {
            rc = s_parse_double(val, &idle_w) ? 0 : -1;
        } else if (!strcmp(opt, "--model-core-w")) {
            rc = s_parse_double(val, &core_w) ? 0 : -1;
        } else if (!strcmp(opt, "--nvml-lib")) {
            rc = emlio_energy_set_nvml_path(meter, val);
        } else {
            fprintf(stderr, "emlio energy: unknown option '%s'\n", opt);
            s_usage(stderr);
            return -1;
        }
        if (rc < 0) {
            fprintf(stderr, "emlio energy: invalid value '%s' for '%s'\n", val,
                    opt);
            return -1;
        }
    }
    if (emlio_energy_set_model(meter, idle_w, core_w,
                               EMLIO_ENERGY_DEFAULT_J_PER_BYTE) < 0) {
        fprintf(stderr, "emlio energy: %s\n", emlio_energy_errmsg(meter));
        return -1;
    }
    if (cmd < 0 || cmd >= argc) {
        fprintf(stderr, "emlio energy: no command to run\n");
        s_usage(stderr);
        return -1;
    }
    return cmd;
}

/* Waits for pid, retrying after interrupted waits. Returns the exit code
 * in shell convention. */
static int
s_wait(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "emlio energy: cannot wait for the command: %s\n",
                    strerror(errno));
            return 1;
        }
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

int
cmd_energy(int argc, char **argv)
{
    emlio_energy_t *meter = emlio_energy_new();
    if (!meter) {
        fprintf(stderr, "emlio energy: out of memory\n");
        return 1;
    }
    int first = s_options(argc, argv, meter);
    if (first < 0) {
        emlio_energy_destroy(&meter);
        return first == -2 ? 0 : 2;
    }
    /* The library reads no environment; the tool does it for the user. */
    const char *root = getenv("EMLIO_POWERCAP_ROOT");
    const char *nvml = getenv("EMLIO_NVML_LIB");
    int rc = emlio_energy_set_powercap_root(meter, root);
    if (rc == 0 && nvml && nvml[0])
        rc = emlio_energy_set_nvml_path(meter, nvml);
    if (rc == 0)
        rc = emlio_energy_set_cpu_scope(meter, EMLIO_ENERGY_CPU_CHILDREN);
    if (rc == 0)
        rc = emlio_energy_start(meter);
    if (rc < 0) {
        fprintf(stderr, "emlio energy: cannot start the meter: %s\n",
                emlio_energy_errmsg(meter));
        emlio_energy_destroy(&meter);
        return 1;
    }
    char **cmd = argv + first;

    struct sigaction sa;
    struct sigaction old_int;
    struct sigaction old_term;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = s_forward;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "emlio energy: cannot fork: %s\n", strerror(errno));
        emlio_energy_destroy(&meter);
        return 1;
    }
    if (pid == 0) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        execvp(cmd[0], cmd);
        int err = errno;
        fprintf(stderr, "emlio energy: cannot run '%s': %s\n", cmd[0],
                strerror(err));
        _exit(err == ENOENT ? 127 : 126);
    }
    s_child = (sig_atomic_t)pid;
    if (s_pending)
        kill(pid, (int)s_pending);
    int exit_code = s_wait(pid);
    s_child = 0;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);

    emlio_energy_report_t report;
    rc = emlio_energy_stop(meter, &report);
    if (rc < 0) {
        fprintf(stderr, "emlio energy: cannot stop the meter: %s\n",
                emlio_energy_errmsg(meter));
        emlio_energy_destroy(&meter);
        return exit_code ? exit_code : 1;
    }
    const char *notes = emlio_energy_notes(meter);
    s_summary(&report, cmd, exit_code, notes);
    s_json(&report, cmd, exit_code, notes);
    emlio_energy_destroy(&meter);
    return exit_code;
}
