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

#include "cli.h"
#include "commands.h"

#define ENERGY_STR_(x) #x
#define ENERGY_STR(x)  ENERGY_STR_(x)

/* The child to forward signals to. A signal handler can reach nothing
 * else, so this one static is unavoidable; it lives in the tool, never in
 * the library. */
static volatile sig_atomic_t s_child = 0;
/* A signal that arrived before the child existed, forwarded after fork. */
static volatile sig_atomic_t s_pending = 0;

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(out,
            "usage: emlio energy [options] -- CMD [ARGS...]\n"
            "\n"
            "Runs CMD, then reports wall time, CPU-seconds of CMD and its\n"
            "children, and energy: a summary on stderr, and one JSON object\n"
            "as the last line of stdout. Exits with CMD's status (128+N when\n"
            "CMD was killed by signal N).\n"
            "\n"
            "options:\n");
    opt_usage(out, tables);
    fprintf(out, "\n"
                 "environment:\n"
                 "  EMLIO_POWERCAP_ROOT  powercap tree to read instead of "
                 "/sys/class/powercap\n"
                 "  EMLIO_NVML_LIB       like --nvml-lib\n");
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
    fprintf(out, ",\"modelled\":%s,\"exit_code\":%d,\"meter_readings\":%llu,",
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

/* Parses the options into the meter. Returns the index of CMD in argv
 * (argv[1..] then holds CMD and its arguments, NULL-terminated), or -1
 * after printing why (-2 for --help). */
static int
s_options(int argc, char **argv, emlio_energy_t *meter)
{
    static const opt_choice_t backends[] = {
        { "auto", EMLIO_ENERGY_AUTO }, { "rapl", EMLIO_ENERGY_RAPL },
        { "perf", EMLIO_ENERGY_PERF }, { "model", EMLIO_ENERGY_MODEL },
        { "none", EMLIO_ENERGY_NONE }, { NULL, 0 },
    };
    static const opt_choice_t gpus[] = {
        { "auto", EMLIO_ENERGY_GPU_AUTO },
        { "off", EMLIO_ENERGY_GPU_OFF },
        { "require", EMLIO_ENERGY_GPU_REQUIRE },
        { NULL, 0 },
    };
    uint32_t interval = EMLIO_ENERGY_DEFAULT_INTERVAL_MS;
    int backend = EMLIO_ENERGY_AUTO;
    int gpu = EMLIO_ENERGY_GPU_AUTO;
    double idle_w = EMLIO_ENERGY_DEFAULT_IDLE_W;
    double core_w = EMLIO_ENERGY_DEFAULT_CORE_W;
    const char *nvml = NULL;
    const opt_t table[] = {
        OPT("interval", 0, OPT_U32, &interval, "MS",
            "sample counters every MS ms (default " ENERGY_STR(
                EMLIO_ENERGY_DEFAULT_INTERVAL_MS) ";\n0: start/stop only)",
            .max = 3600000),
        OPT("backend", 0, OPT_CHOICE, &backend, "NAME",
            "auto, rapl, perf, model or none (default auto)",
            .choices = backends),
        OPT("gpu", 0, OPT_CHOICE, &gpu, "POLICY",
            "auto, off or require (default auto)", .choices = gpus),
        OPT("model-idle-w", 0, OPT_DOUBLE, &idle_w, "W",
            "model: idle watts over the wall time (default " ENERGY_STR(
                EMLIO_ENERGY_DEFAULT_IDLE_W) ")",
            .dmin = 0, .dmax = 1e9),
        OPT("model-core-w", 0, OPT_DOUBLE, &core_w, "W",
            "model: watts per busy CPU (default " ENERGY_STR(
                EMLIO_ENERGY_DEFAULT_CORE_W) ")",
            .dmin = 0, .dmax = 1e9),
        OPT("nvml-lib", 0, OPT_STR, &nvml, "PATH",
            "NVML library to dlopen (default libnvidia-ml.so.1)"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "show this help"),
        OPT_END,
    };
    const opt_t *tables[] = { table, NULL };
    int npos = 0;
    int status = cli_parse_args("energy", tables, argc, argv, OPT_STOP_AT_ARG,
                                &npos, s_usage);
    if (status >= 0)
        return status == 0 ? -2 : -1;
    argv[1 + npos] = NULL;
    int rc = emlio_energy_set_interval_ms(meter, interval);
    if (rc == 0)
        rc = emlio_energy_set_backend(meter, backend);
    if (rc == 0)
        rc = emlio_energy_set_gpu(meter, gpu);
    if (rc == 0 && nvml)
        rc = emlio_energy_set_nvml_path(meter, nvml);
    if (rc == 0)
        rc = emlio_energy_set_model(meter, idle_w, core_w,
                                    EMLIO_ENERGY_DEFAULT_J_PER_BYTE);
    if (rc < 0) {
        fprintf(stderr, "emlio energy: %s\n", emlio_energy_errmsg(meter));
        return -1;
    }
    if (npos == 0) {
        fprintf(stderr, "emlio energy: no command to run\n");
        s_usage(stderr, tables);
        return -1;
    }
    return 1;
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
