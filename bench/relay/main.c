/* main.c - `emlio-relay`, a benchmark tool: a TCP relay that adds a fixed delay
 * (and an optional rate cap) in each direction, to emulate RTT without netem.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "relay.h"

static void
s_usage(FILE *out)
{
    fprintf(
        out,
        "usage: emlio-relay --listen HOST:PORT --connect HOST:PORT --delay-ms D\n"
        "                   [--rate-mbit R] [--max-conns N] [--stats-interval S]\n"
        "                   [--max-buffer-mb M] [--spin-us U] [--mode copy|splice]\n"
        "\n"
        "Accepts TCP connections on --listen, opens one to --connect for each,\n"
        "and forwards bytes both ways, holding every byte D ms in each\n"
        "direction (RTT = 2 D). Half-closes are passed on after the delay too.\n"
        "\n"
        "  --listen HOST:PORT     where to accept; port 0 picks a free one. When\n"
        "                         ready it prints 'emlio-relay: listening on\n"
        "                         HOST:PORT' (the real port) on stdout\n"
        "  --connect HOST:PORT    the server to relay to\n"
        "  --delay-ms D           one-way delay in milliseconds (0 allowed)\n"
        "  --rate-mbit R          cap each direction of each connection at R\n"
        "                         Mbit/s (token bucket); default no cap\n"
        "  --max-conns N          concurrent connections (default 1024)\n"
        "  --stats-interval S     print stats to stderr every S seconds; they\n"
        "                         are always printed on exit\n"
        "  --max-buffer-mb M      bytes held per direction before reading stops\n"
        "                         (backpressure; default 64). Caps throughput\n"
        "                         at about M / D\n"
        "  --spin-us U            busy-poll the last U us before each release\n"
        "                         (default 150; 0 saves CPU, costs accuracy)\n"
        "  --mode copy|splice     hold bytes in pooled, pre-touched user-space\n"
        "                         buffers (default) or in kernel pipes (splice,\n"
        "                         no copy; needs 2 descriptors per held MiB)\n"
        "\n"
        "Stats: bytes each way, chunks released, how late they were released\n"
        "(p50/p99/max in us) and the relay's CPU seconds per GB.\n"
        "SIGINT or SIGTERM stops it cleanly.\n"
        "\n"
        "Where the kernel has netem, 'tc qdisc add dev lo root netem delay 5ms'\n"
        "does the same without a relay; this is the fallback for kernels\n"
        "without it.\n");
}

/* Parses a finite number >= min into *out; false if text is not one. */
static bool
s_parse_num(const char *text, double min, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < min)
        return false;
    *out = v;
    return true;
}

/* Parses argv into o. Returns -1 to go on, else the exit status (0 after
 * --help, 2 for a usage error, said on stderr). */
static int
s_parse_args(int argc, char **argv, relay_opts_t *o)
{
    static const struct option longopts[] = {
        { "listen", required_argument, NULL, 'l' },
        { "connect", required_argument, NULL, 'c' },
        { "delay-ms", required_argument, NULL, 'd' },
        { "rate-mbit", required_argument, NULL, 'r' },
        { "max-conns", required_argument, NULL, 'n' },
        { "stats-interval", required_argument, NULL, 's' },
        { "max-buffer-mb", required_argument, NULL, 'b' },
        { "spin-us", required_argument, NULL, 'p' },
        { "mode", required_argument, NULL, 'm' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    bool have_delay = false;
    double v;

    relay_opts_init(o);
    optind = 1;
    opterr = 0;
    for (;;) {
        int ch = getopt_long(argc, argv, "h", longopts, NULL);
        if (ch == -1)
            break;
        const char *name = NULL;
        bool ok = true;
        switch (ch) {
        case 'h':
            s_usage(stdout);
            return 0;
        case 'l':
            o->listen = optarg;
            break;
        case 'c':
            o->connect = optarg;
            break;
        case 'd':
            name = "--delay-ms";
            ok = s_parse_num(optarg, 0, &o->delay_ms) && o->delay_ms <= 600000;
            have_delay = true;
            break;
        case 'r':
            name = "--rate-mbit";
            ok = s_parse_num(optarg, 0, &o->rate_mbit);
            break;
        case 'n':
            name = "--max-conns";
            ok = s_parse_num(optarg, 1, &v) && v <= 1000000 && v == floor(v);
            o->max_conns = ok ? (int)v : 0;
            break;
        case 's':
            name = "--stats-interval";
            ok = s_parse_num(optarg, 0, &o->stats_interval_s);
            break;
        case 'b':
            name = "--max-buffer-mb";
            ok = s_parse_num(optarg, 1, &v) && v <= 65536;
            o->max_buffer = ok ? (size_t)(v * 1024 * 1024) : 0;
            break;
        case 'p':
            name = "--spin-us";
            ok = s_parse_num(optarg, 0, &v) && v <= 100000;
            o->spin_us = ok ? (int)v : 0;
            break;
        case 'm':
            name = "--mode";
            if (!strcmp(optarg, "splice"))
                o->mode = RELAY_SPLICE;
            else if (!strcmp(optarg, "copy"))
                o->mode = RELAY_COPY;
            else
                ok = false;
            break;
        default:
            if (optopt)
                fprintf(stderr, "emlio-relay: option '%s' needs a value\n",
                        argv[optind - 1]);
            else
                fprintf(stderr, "emlio-relay: unknown option '%s'\n",
                        argv[optind - 1]);
            fprintf(stderr, "Run 'emlio-relay --help' for usage.\n");
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "emlio-relay: invalid %s '%s'\n", name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "emlio-relay: unexpected argument '%s'\n",
                argv[optind]);
        return 2;
    }
    if (!o->listen || !o->connect || !have_delay) {
        fprintf(stderr, "emlio-relay: missing %s\n",
                !o->listen    ? "--listen"
                : !o->connect ? "--connect"
                              : "--delay-ms");
        s_usage(stderr);
        return 2;
    }
    return -1;
}

int
main(int argc, char **argv)
{
    relay_opts_t opts;
    int parsed = s_parse_args(argc, argv, &opts);
    if (parsed >= 0)
        return parsed;

    /* Addresses are arguments: a bad one is a usage error (exit 2), while
     * a failure to bind a good one is a runtime error (exit 1). */
    struct sockaddr_storage addr;
    unsigned addr_len;
    char why[256];
    if (relay_parse_addr(opts.listen, &addr, &addr_len, why, sizeof(why)) < 0) {
        fprintf(stderr, "emlio-relay: cannot listen on '%s': %s\n", opts.listen,
                why);
        return 2;
    }
    if (relay_parse_addr(opts.connect, &addr, &addr_len, why, sizeof(why)) <
        0) {
        fprintf(stderr, "emlio-relay: cannot connect to '%s': %s\n",
                opts.connect, why);
        return 2;
    }

    /* Signals arrive on a descriptor the loop watches, so a stop is an
     * ordinary event and the stats still print. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    signal(SIGPIPE, SIG_IGN);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) {
        fprintf(stderr, "emlio-relay: cannot block signals: %s\n",
                strerror(errno));
        return 1;
    }
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        fprintf(stderr, "emlio-relay: cannot create signalfd: %s\n",
                strerror(errno));
        return 1;
    }

    int status = 1;
    relay_t *relay = relay_new(&opts);
    if (!relay) {
        fprintf(stderr, "emlio-relay: out of memory\n");
    } else if (relay_bind(relay) < 0) {
        fprintf(stderr, "emlio-relay: %s\n", relay_errmsg(relay));
    } else {
        printf("emlio-relay: listening on %s\n", relay_endpoint(relay));
        fflush(stdout);
        if (relay_run(relay, sfd) < 0)
            fprintf(stderr, "emlio-relay: %s\n", relay_errmsg(relay));
        else
            status = 0;
        relay_print_stats(relay, stderr);
    }
    relay_destroy(&relay);
    close(sfd);
    return status;
}
