/* tool_util.h - the tools' prelude: the first include of every .c file in
 * tools/ and bench/relay (git's git-compat-util.h rule). Feature macros,
 * system headers, libemlio's public API and the tools' own helpers, all
 * named tool_ / TOOL_: `emlio_` is the installed API and `emlio__` stays
 * inside the library (libuv's rule), so nothing here re-declares either.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOL_UTIL_H
#define EMLIO_TOOL_UTIL_H

#ifndef _GNU_SOURCE
#    define _GNU_SOURCE
#endif

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emlio.h"

#define TOOL_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define TOOL_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define TOOL_MAX(a, b)     ((a) > (b) ? (a) : (b))

/* Size of the error-message buffers of the tools' modules. */
#define TOOL_ERRMSG_LEN 512

/* Logging through the context's sink; the level is tested first so the
 * arguments cost nothing when it is off. */
#define tool_log(ctx, level, module, ...)                         \
    do {                                                          \
        if ((level) <= emlio_ctx_log_level(ctx))                  \
            emlio_ctx_log((ctx), (level), (module), __VA_ARGS__); \
    } while (0)

/* Formats into errbuf (TOOL_ERRMSG_LEN bytes) and returns rc. */
int tool_seterr(char *errbuf, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Checks the syntax of a comma-separated list of ZeroMQ endpoints before
 * anything connects or binds, so a mistake gets a message that shows the
 * expected form instead of ZeroMQ's bare "Invalid argument": each one must
 * be tcp://HOST:PORT (PORT 1..65535; for a bind, HOST may be * and PORT *
 * for any free port), ipc://PATH or inproc://NAME. Returns 0, or -1 with
 * the reason in errbuf (TOOL_ERRMSG_LEN bytes), naming the endpoint. */
int tool_check_endpoints(const char *list, bool bind, char *errbuf);

/* Monotonic clock in nanoseconds. */
uint64_t tool_now_ns(void);

#endif /* EMLIO_TOOL_UTIL_H */
