/* fetch_sources.h - the sources file of `emlio fetch --sources FILE`
 * (docs/planner.md, "Sources").
 * SPDX-License-Identifier: MIT
 *
 * A JSON array of objects, one per source:
 *
 *   [{"name": "web", "endpoints": ["tcp://n1:5555", "tcp://n2:5555"],
 *     "weight": 1},
 *    {"name": "curated", "endpoints": "tcp://n3:5555", "samples": 5000}]
 *
 * name and endpoints (a string, comma-separated, or an array of strings)
 * are required; weight (a positive number, default 1) or samples (an
 * exact count per epoch) are optional. Any other key, a duplicate key,
 * bytes after the array, or a file over 1 MiB is refused, naming the file,
 * the line and the reason.
 */
#ifndef EMLIO_TOOLS_FETCH_SOURCES_H
#define EMLIO_TOOLS_FETCH_SOURCES_H

#include <stddef.h>

#include "emlio.h"

/* Reads path into out[0 .. *n) (at most cap). The names and endpoints
 * point into *text, which the caller frees. Returns 0, or -1 with err
 * (errlen bytes) saying why. */
int fetch_sources_load(const char *path, emlio_source_t *out, size_t cap,
                       size_t *n, char **text, char *err, size_t errlen);

#endif /* EMLIO_TOOLS_FETCH_SOURCES_H */
