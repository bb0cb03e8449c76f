/* error.c - error codes to text, and the per-handle error-message helper.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

static const struct {
    int rc;
    const char *text;
} s_errors[] = {
    { EMLIO_EPROTO, "protocol error" },
    { EMLIO_EINCOMPLETE, "input is incomplete" },
    { EMLIO_ECLOSED, "closed" },
    { EMLIO_ECORRUPT, "data is corrupt" },
    { EMLIO_EFORMAT, "bad file format" },
    { EMLIO_ENOMEM, "out of memory" },
    { EMLIO_ETIMEDOUT, "timed out" },
    { EMLIO_EVERSION, "incompatible protocol version" },
    { EMLIO_ENOTFOUND, "not found" },
    { EMLIO_EINVAL, "invalid argument" },
    { EMLIO_EDENIED, "access denied" },
    { EMLIO_EMISMATCH, "dataset does not match" },
    { EMLIO_ELIMIT, "limit exceeded" },
    { EMLIO_ESTATE, "saved state does not fit this run" },
    { EMLIO_ECREDIT, "too many requests in flight on one connection" },
};

int
emlio_version(void)
{
    return EMLIO_VERSION;
}

const char *
emlio_version_string(void)
{
    return EMLIO_VERSION_STRING;
}

size_t
emlio_struct_size(int which)
{
    switch (which) {
    case EMLIO_STRUCT_CLIENT_CONFIG:
        return sizeof(emlio_client_config_t);
    case EMLIO_STRUCT_CLIENT_STATS:
        return sizeof(emlio_client_stats_t);
    case EMLIO_STRUCT_SAMPLE:
        return sizeof(emlio_sample_t);
    case EMLIO_STRUCT_SERVER_CONFIG:
        return sizeof(emlio_server_config_t);
    case EMLIO_STRUCT_PLAN_SAMPLE:
        return sizeof(emlio_plan_sample_t);
    case EMLIO_STRUCT_STREAM_STATS:
        return sizeof(emlio_stream_stats_t);
    default:
        return 0;
    }
}

const char *
emlio_strerror(int rc)
{
    if (rc >= 0)
        return "success";
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(s_errors); i++)
        if (s_errors[i].rc == rc)
            return s_errors[i].text;
    if (rc > -1000) {
        /* strerror() may share a static buffer; strerrordesc_np (glibc 2.32)
         * returns a constant string and is thread-safe. */
        const char *text = strerrordesc_np(-rc);
        return text ? text : "unknown system error";
    }
    return "unknown error";
}

int
emlio__seterr(char *errbuf, int rc, const char *fmt, ...)
{
    if (errbuf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, EMLIO_ERRMSG_LEN, fmt, ap);
        va_end(ap);
    }
    return rc;
}
