/* fuzz_url.c - libFuzzer harness for the InfluxDB URL parser (a value from
 * the command line or a config, parsed with bounded buffers).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "influx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The parser takes a C string: give it a NUL-terminated copy. */
    char *url = emlio_malloc(size + 1);
    if (!url)
        return 0;
    memcpy(url, data, size);
    url[size] = 0;
    tool_influx_url_t out;
    char err[EMLIO_ERRMSG_LEN];
    if (tool_influx_url_parse(&out, url, err) == 0) {
        assert(out.port >= 1);
        assert(out.path[0] == '/');
        assert(strlen(out.host) > 0);
    }
    emlio_free(url);
    return 0;
}
