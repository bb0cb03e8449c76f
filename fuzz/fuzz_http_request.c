/* fuzz_http_request.c - libFuzzer harness for the metrics endpoint's HTTP
 * request parser, which reads bytes from any peer that can connect.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "metrics.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tool_metrics_request_t req;
    int rc = tool_metrics_parse_request(&req, (const char *)data, size);
    if (rc >= 0) {
        /* What it points at must lie inside the input. */
        assert((size_t)rc <= size);
        assert(req.method >= (const char *)data &&
               req.method + req.method_len <= (const char *)data + size);
        assert(req.target >= (const char *)data &&
               req.target + req.target_len <= (const char *)data + size);
        (void)tool_metrics_route(&req);
    } else {
        assert(rc == EMLIO_EINCOMPLETE || rc == EMLIO_EPROTO);
    }
    return 0;
}
