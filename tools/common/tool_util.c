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

/* One endpoint of len bytes at ep; see tool_check_endpoints. */
static int
s_check_endpoint(const char *ep, size_t len, bool bind, char *errbuf)
{
    static const char *const other[] = { "ipc://", "inproc://" };
    for (size_t i = 0; i < TOOL_ARRAY_SIZE(other); i++) {
        size_t n = strlen(other[i]);
        if (len > n && strncmp(ep, other[i], n) == 0)
            return 0;
    }
    const char *host = ep + 6;
    const char *colon = len > 6 ? memrchr(host, ':', len - 6) : NULL;
    const char *want = bind ? "tcp://HOST:PORT, e.g. tcp://*:5555 or "
                              "tcp://127.0.0.1:* for any free port"
                            : "tcp://HOST:PORT, e.g. tcp://node1:5555";
    if (len < 6 || strncmp(ep, "tcp://", 6) != 0 || !colon || colon == host)
        return tool_seterr(errbuf, -1, "invalid endpoint '%.*s': expected %s",
                           (int)len, ep, want);
    const char *port = colon + 1;
    size_t plen = len - (size_t)(port - ep);
    if (bind && plen == 1 && port[0] == '*')
        return 0;
    unsigned long v = 0;
    for (size_t i = 0; i < plen && v <= 65535; i++) {
        if (port[i] < '0' || port[i] > '9') {
            v = 0;
            break;
        }
        v = v * 10 + (unsigned long)(port[i] - '0');
    }
    if (plen == 0 || v == 0 || v > 65535)
        return tool_seterr(errbuf, -1,
                           "invalid port '%.*s' in endpoint '%.*s': expected "
                           "1..65535%s",
                           (int)plen, port, (int)len, ep,
                           bind ? " or * (any free port)" : "");
    return 0;
}

int
tool_check_endpoints(const char *list, bool bind, char *errbuf)
{
    const char *p = list;
    do {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (s_check_endpoint(p, len, bind, errbuf) < 0)
            return -1;
        p = end ? end + 1 : NULL;
    } while (p);
    return 0;
}
