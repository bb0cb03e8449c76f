/* emlio/transform.h - decode and augment images in C: one spec string in,
 * uint8 RGB tensors of one fixed shape out, the same bytes wherever and
 * whenever a sample is transformed.
 * SPDX-License-Identifier: MIT
 *
 * Example:
 *   char err[EMLIO_ERRBUF_SIZE];
 *   emlio_transform_t *t = NULL;
 *   if (emlio_transform_parse("random_resized_crop(224),horizontal_flip",
 *                             &t, err, sizeof(err)) < 0)
 *       die(err);
 *   emlio_transform_ws_t *ws = emlio_transform_ws_new();
 *   uint8_t *out = malloc(emlio_transform_output_bytes(t));
 *   uint64_t key = emlio_transform_sample_key("train-00000.tfrecord", 17);
 *   if (ws && out && emlio_transform_apply(t, ws, jpeg, jpeg_len, 42, 0, key,
 *                                          out, err, sizeof(err)) == 0)
 *       consume(out, emlio_transform_output_bytes(t));
 *   free(out);
 *   emlio_transform_ws_destroy(&ws);
 *   emlio_transform_destroy(&t);
 *
 * The spec. Operations separated by commas, applied left to right:
 *   random_resized_crop(SIZE[,scale=LO:HI][,ratio=LO:HI])
 *       torchvision's RandomResizedCrop(SIZE): a box of area fraction
 *       uniform in [LO,HI] (default 0.08:1) and aspect ratio log-uniform in
 *       [LO,HI] (default 3/4:4/3), resized to SIZE x SIZE. SIZE may also be
 *       written size=SIZE.
 *   resize(SIZE)           shorter side to SIZE, the longer one to
 *                          int(SIZE * long / short) (torchvision's rule).
 *   center_crop(SIZE)      SIZE x SIZE from the centre, top-left at
 *                          int(round((h - SIZE) / 2.0)); pads with black
 *                          where the image is smaller, as torchvision does.
 *   horizontal_flip[(p=P)] mirrors left-right with probability P (0.5).
 * White space around names and values is ignored. Sizes are 1..16384. The
 * output must have one shape whatever the input's: "resize(256)" alone is
 * refused, "resize(256),center_crop(224)" is 224 x 224.
 *
 * The output is uint8 RGB, height x width x 3 (HWC), one fixed shape per
 * spec, so a batch is one contiguous B x H x W x 3 block. Normalising to
 * float is left to the consumer (the GPU): float32 would carry 4x the bytes.
 *
 * Determinism. Every random draw comes from a counter-based generator keyed
 * on (seed, epoch, sample key, op index), with no state carried from one
 * sample to the next: a sample's tensor is the same whatever thread,
 * process, daemon or resume point produced it, and changes with the epoch.
 * The generator (docs/transform.md has the reference):
 *   mix(z):  z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
 *            z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31
 *            (the SplitMix64 finaliser, all arithmetic mod 2^64)
 *   key    = mix(mix(mix(mix(seed) ^ epoch) ^ sample_key) ^ op_index)
 *   draw n = mix(key + (n + 1) * 0x9e3779b97f4a7c15)
 *   uniform double in [0,1) = (draw >> 11) * 2^-53
 *   integer in [0, n)       = (draw * n) >> 64 (high half of the product)
 * op_index counts the spec's operations from 0. random_resized_crop uses
 * draws 4a..4a+3 of attempt a (area, log-ratio, top, left);
 * horizontal_flip flips when uniform(draw 0) < p. The pixel arithmetic is
 * integer (fixed point) and the crop arithmetic uses only IEEE-754 +, -,
 * *, / and sqrt (log and exp are computed by this library, not libm), so
 * the bytes are the same on any x86-64 or other IEEE-754 machine.
 *
 * Decoding. JPEG through libjpeg(-turbo), PNG through libpng. A JPEG is
 * decoded only over the rows and columns the crop needs, at the strongest
 * DCT reduction (1/2, 1/4 or 1/8) that keeps the crop at least as large as
 * the output; grayscale and CMYK/YCCK become RGB; progressive files work.
 * PNG of any bit depth and colour type becomes 8-bit RGB (16-bit samples
 * keep their high byte, alpha is dropped).
 * Resampling is PIL's antialiased bilinear filter, in PIL's fixed point;
 * with no DCT scaling the bytes equal torchvision's PIL pipeline for
 * random_resized_crop, center_crop and flips, and for resize(S) followed by
 * center_crop (one resample). Other chains resample once, where PIL would
 * resample twice.
 *
 * Threads. An emlio_transform_t is immutable after parse (and
 * set_max_pixels): share it between threads. A workspace belongs to one
 * thread at a time; it keeps its buffers between images (fresh pages are
 * expensive) up to a memory cap.
 */
#ifndef EMLIO_TRANSFORM_H
#define EMLIO_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A size for error buffers that always holds the whole message. */
#ifndef EMLIO_ERRBUF_SIZE
#    define EMLIO_ERRBUF_SIZE 512
#endif

/* Images above this many pixels are refused (a decompression bomb). */
#define EMLIO_TRANSFORM_MAX_PIXELS_DEFAULT   100000000ull
/* What a workspace may hold, all buffers together, by default. */
#define EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT (512ull << 20)

typedef struct emlio_transform emlio_transform_t;
typedef struct emlio_transform_ws emlio_transform_ws_t;

/* Parses spec into *out. Returns 0, or EMLIO_EINVAL with errbuf (errlen
 * bytes, may be NULL) naming the bad operation or argument and *out NULL;
 * EMLIO_ENOMEM when out of memory. */
EMLIO_EXPORT int emlio_transform_parse(const char *spec,
                                       emlio_transform_t **out, char *errbuf,
                                       size_t errlen);

/* Destroys the pipeline. Accepts NULL and *self_p == NULL; sets *self_p
 * NULL (core.h's convention). */
EMLIO_EXPORT void emlio_transform_destroy(emlio_transform_t **self_p);

/* The canonical spec: every argument written out, defaults included, so
 * two specs that describe the same pipeline give the same text (and equal
 * text means equal output). Owned by self. */
EMLIO_EXPORT const char *emlio_transform_spec(const emlio_transform_t *self);

/* The output's height, width, and height * width * 3. */
EMLIO_EXPORT uint32_t emlio_transform_height(const emlio_transform_t *self);
EMLIO_EXPORT uint32_t emlio_transform_width(const emlio_transform_t *self);
EMLIO_EXPORT size_t emlio_transform_output_bytes(const emlio_transform_t *self);

/* Images with more than max_pixels pixels (width * height of the file) are
 * refused with EMLIO_ELIMIT before any pixel memory is allocated. Default
 * EMLIO_TRANSFORM_MAX_PIXELS_DEFAULT; 0 restores it. Call before sharing
 * the pipeline between threads. */
EMLIO_EXPORT void emlio_transform_set_max_pixels(emlio_transform_t *self,
                                                 uint64_t max_pixels);

/* A per-thread workspace. NULL when out of memory. */
EMLIO_EXPORT emlio_transform_ws_t *emlio_transform_ws_new(void);

/* Destroys the workspace. Accepts NULL and *ws_p == NULL; sets *ws_p
 * NULL. */
EMLIO_EXPORT void emlio_transform_ws_destroy(emlio_transform_ws_t **ws_p);

/* Caps what the workspace may allocate, all buffers and the decoder's own
 * memory together (default EMLIO_TRANSFORM_WS_MAX_BYTES_DEFAULT; 0 restores
 * it). An image that needs more fails with EMLIO_ELIMIT. */
EMLIO_EXPORT void emlio_transform_ws_set_max_bytes(emlio_transform_ws_t *ws,
                                                   uint64_t max_bytes);

/* The bytes the workspace holds now (its reused buffers). */
EMLIO_EXPORT uint64_t emlio_transform_ws_bytes(const emlio_transform_ws_t *ws);

/* The identity of a sample for the generator, stable whatever daemon, rank
 * or stream serves it: mix(fnv1a64(shard_name) ^ mix(record + 1)), with
 * FNV-1a over the name's bytes (no NUL) and mix() as above. shard_name is
 * the shard's name as the dataset lists it (relative, not a local path). */
EMLIO_EXPORT uint64_t emlio_transform_sample_key(const char *shard_name,
                                                 uint64_t record);

/* Decodes data (JPEG or PNG, len bytes) and runs the pipeline, writing
 * exactly emlio_transform_output_bytes(self) bytes to out (uint8 RGB, HWC).
 * The random draws depend on (seed, epoch, sample_key, op index) only.
 * Returns 0, or:
 *   EMLIO_EFORMAT  not a JPEG or PNG, truncated, corrupt or unsupported;
 *   EMLIO_ELIMIT   more pixels than the pipeline's max_pixels, or more memory
 *                  than the workspace's cap;
 *   EMLIO_ENOMEM   out of memory;
 *   EMLIO_EINVAL   a NULL argument;
 * with errbuf (errlen bytes, may be NULL) saying why; the caller adds the
 * shard and record. A truncated JPEG whose header and needed rows decode
 * is an error too (libjpeg's "premature end" warning is treated as one).
 * out is left unspecified on error. */
EMLIO_EXPORT int emlio_transform_apply(const emlio_transform_t *self,
                                       emlio_transform_ws_t *ws,
                                       const uint8_t *data, size_t len,
                                       uint64_t seed, uint64_t epoch,
                                       uint64_t sample_key, uint8_t *out,
                                       char *errbuf, size_t errlen);

/* The crop box random_resized_crop draws for an image of width x height,
 * in that image's pixels, as torchvision's RandomResizedCrop.get_params
 * returns it (top, left, height, width), for op op_index of the spec (which
 * must be a random_resized_crop) with the generator keyed as in apply.
 * For tests and for other implementations to check against. 0, or
 * EMLIO_EINVAL when op_index is not a random_resized_crop or a size is 0. */
typedef struct emlio_transform_box {
    uint32_t top, left, height, width;
} emlio_transform_box_t;

EMLIO_EXPORT int emlio_transform_crop_params(const emlio_transform_t *self,
                                             size_t op_index, uint32_t width,
                                             uint32_t height, uint64_t seed,
                                             uint64_t epoch,
                                             uint64_t sample_key,
                                             emlio_transform_box_t *box);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_TRANSFORM_H */
