/* fuzz_example.c - libFuzzer harness for tf.train.Example parsing.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "emlio/example.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touches every key byte so a key pointing outside the input is caught. */
static int
s_visit(void *userdata, const uint8_t *key, size_t key_len, int kind,
        size_t count)
{
    size_t *sum = userdata;
    for (size_t i = 0; i < key_len; i++)
        *sum += key[i];
    *sum += (size_t)kind + count;
    return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    emlio_example_field_t fields[4] = {
        { .key = "image/encoded", .key_len = 13 },
        { .key = "image/class/label", .key_len = 17 },
        { .key = "k", .key_len = 1 },
        { .key = "", .key_len = 0 },
    };
    const uint8_t *buf = size ? data : NULL;
    int rc = emlio_example_parse(buf, size, fields, 4);
    if (rc != EMLIO_EPROTO && (rc < 0 || rc > 4))
        abort();
    for (size_t i = 0; i < 4; i++) {
        const emlio_example_field_t *f = &fields[i];
        if (f->kind == EMLIO_FEATURE_BYTES && f->count &&
            (f->bytes < data || f->bytes_len > size ||
             f->bytes - data > (ptrdiff_t)(size - f->bytes_len)))
            abort();
    }
    size_t sum = 0;
    int each = emlio_example_foreach(buf, size, s_visit, &sum);
    /* Both walks see the same bytes, so they agree on well-formedness. */
    if ((each == EMLIO_EPROTO) != (rc == EMLIO_EPROTO))
        abort();
    return 0;
}
