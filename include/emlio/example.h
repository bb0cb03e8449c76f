/* emlio/example.h - in-place parsing and building of tf.train.Example
 * protobufs. SPDX-License-Identifier: MIT
 *
 * The wire schema (tensorflow/core/example/{example,feature}.proto):
 *   Example   { Features features = 1; }
 *   Features  { map<string, Feature> feature = 1; }   (entries: key = 1,
 *                                                       value = 2)
 *   Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list
 *               = 2; Int64List int64_list = 3; } }
 *   BytesList { repeated bytes value = 1; }
 *   FloatList { repeated float value = 1 [packed]; }
 *   Int64List { repeated int64 value = 1 [packed]; }
 *
 * The parser never copies: results point into the caller's buffer. It
 * accepts both packed and unpacked repeated scalars, skips unknown fields of
 * every wire type, and never reads past len. Every function is reentrant
 * and keeps no state.
 *
 * Example:
 *   emlio_buf_t rec = EMLIO_BUF_INIT;
 *   if (emlio_example_build(&rec, "image/encoded", jpeg, jpeg_len,
 *                           "image/class/label", 7) < 0)
 *       die("out of memory");
 *   emlio_example_field_t f[2] = { { .key = "image/encoded", .key_len = 13 },
 *                                  { .key = "image/class/label",
 *                                    .key_len = 17 } };
 *   if (emlio_example_parse(rec.data, rec.len, f, 2) == 2)
 *       train_on(f[0].bytes, f[0].bytes_len, f[1].int64);
 *   emlio_buf_release(&rec);
 */
#ifndef EMLIO_EXAMPLE_H
#define EMLIO_EXAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum emlio_feature_kind {
    EMLIO_FEATURE_NONE = 0, /* key not present */
    EMLIO_FEATURE_BYTES = 1,
    EMLIO_FEATURE_FLOAT = 2,
    EMLIO_FEATURE_INT64 = 3
};

/* One feature to look up. The caller fills key/key_len; parse fills the
 * rest. For a repeated feature the first value is reported and count says
 * how many there are. */
typedef struct emlio_example_field {
    const char *key;      /* in: not necessarily NUL-terminated */
    size_t key_len;       /* in */
    int kind;             /* out: enum emlio_feature_kind */
    size_t count;         /* out: number of values in the list */
    const uint8_t *bytes; /* out: first value of a BytesList (borrowed) */
    size_t bytes_len;     /* out */
    int64_t int64;        /* out: first value of an Int64List */
    float f32;            /* out: first value of a FloatList */
} emlio_example_field_t;

/* Parses the serialized Example in buf[0, len) and fills every field whose
 * key appears (fields not found get kind EMLIO_FEATURE_NONE). When a key
 * appears twice, the last entry wins, as protobuf map semantics say.
 * Returns the number of fields found (0..n) or EMLIO_EPROTO when the bytes
 * are not a well-formed Example (truncated varint or length, bad wire type,
 * a length running past its enclosing message). */
EMLIO_EXPORT int emlio_example_parse(const uint8_t *buf, size_t len,
                                     emlio_example_field_t *fields, size_t n);

/* Calls fn once per feature entry with its key and kind, in wire order.
 * fn returns 0 to continue or non-zero to stop (which is then returned).
 * Returns 0, fn's value, or EMLIO_EPROTO. Used by `emlio inspect`. */

typedef int emlio_example_key_fn(void *userdata, const uint8_t *key,
                                 size_t key_len, int kind, size_t count);
EMLIO_EXPORT int emlio_example_foreach(const uint8_t *buf, size_t len,
                                       emlio_example_key_fn *fn,
                                       void *userdata);

/* Appends to out a serialized Example with a single-value BytesList under
 * bytes_key and a single-value Int64List under int64_key (the ImageNet
 * TFRecord layout: "image/encoded" and "image/class/label").
 * Returns 0 or EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_example_build(emlio_buf_t *out, const char *bytes_key,
                                     const uint8_t *bytes, size_t bytes_len,
                                     const char *int64_key, int64_t int64);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_EXAMPLE_H */
