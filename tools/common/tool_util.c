/* tool_util.c - helpers of the programs' shared modules.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <time.h>

int
tool_seterr(char *errbuf, int rc, const char *fmt, ...)
{
    if (errbuf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, TOOL_ERRMSG_LEN, fmt, ap);
        va_end(ap);
    }
    return rc;
}

uint64_t
tool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
