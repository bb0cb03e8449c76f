/* fuzz_transform.c - libFuzzer harness for the transform pipeline: the
 * spec parser, the JPEG and PNG decoders and the resample, driven together.
 * Input: a spec line ("...\n"), then the image bytes. A spec that does not
 * parse (or has a large output) is replaced by a fixed one, so the
 * decoders see every input.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Pipelines are applied to images of at most this many pixels and outputs
 * of at most this many bytes, so each run stays fast. */
#define FUZZ_MAX_PIXELS (4u << 20)
#define FUZZ_MAX_OUTPUT (1u << 20)

static emlio_transform_t *
s_pipeline(const uint8_t *data, size_t line)
{
    char spec[256];
    char err[EMLIO_ERRBUF_SIZE];
    emlio_transform_t *t = NULL;
    if (line < sizeof(spec)) {
        memcpy(spec, data, line);
        spec[line] = '\0';
        if (emlio_transform_parse(spec, &t, err, sizeof(err)) == 0) {
            /* The canonical text reads back as itself. */
            emlio_transform_t *again = NULL;
            if (emlio_transform_parse(emlio_transform_spec(t), &again, err,
                                      sizeof(err)) != 0 ||
                strcmp(emlio_transform_spec(t), emlio_transform_spec(again)))
                abort();
            emlio_transform_destroy(&again);
        } else if (t || !err[0])
            abort();
    }
    if (t && emlio_transform_output_bytes(t) <= FUZZ_MAX_OUTPUT)
        return t;
    emlio_transform_destroy(&t);
    if (emlio_transform_parse("random_resized_crop(40),horizontal_flip", &t,
                              err, sizeof(err)) != 0)
        abort();
    return t;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = size ? memchr(data, '\n', size) : NULL;
    size_t line = nl ? (size_t)(nl - data) : 0;
    const uint8_t *img = nl ? nl + 1 : data;
    size_t len = size - (size_t)(img - data);
    emlio_transform_t *t = s_pipeline(data, line);
    if (!t)
        return 0;
    emlio_transform_set_max_pixels(t, FUZZ_MAX_PIXELS);
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    size_t n = emlio_transform_output_bytes(t);
    uint8_t *a = emlio_malloc(n);
    uint8_t *b = emlio_malloc(n);
    char err[EMLIO_ERRBUF_SIZE];
    if (ws && a && b) {
        emlio_transform_ws_set_max_bytes(ws, 64u << 20);
        uint64_t key = size;
        int rc = emlio_transform_apply(t, ws, len ? img : NULL, len, 7, 1, key,
                                       a, err, sizeof(err));
        if (rc != 0 && rc != EMLIO_EFORMAT && rc != EMLIO_ELIMIT &&
            rc != EMLIO_ENOMEM)
            abort();
        /* Same inputs, same bytes, whatever the workspace held before. */
        int again = emlio_transform_apply(t, ws, len ? img : NULL, len, 7, 1,
                                          key, b, err, sizeof(err));
        if (again != rc || (rc == 0 && memcmp(a, b, n)))
            abort();
    }
    free(a);
    free(b);
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&t);
    return 0;
}
