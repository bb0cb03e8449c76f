/* transform_ws.h - the per-thread workspace of the transform pipeline and
 * the resampling plan the decoder and the resampler share (private).
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TRANSFORM_WS_H
#define EMLIO_TRANSFORM_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emlio/transform.h"

/* One reused buffer of a workspace. */
typedef struct emlio__wsbuf {
    void *p;
    size_t cap;
} emlio__wsbuf_t;

struct emlio_transform_ws {
    uint64_t max_bytes;    /* cap on held, and on the decoder's own memory */
    uint64_t held;         /* sum of the buffers' caps */
    emlio__wsbuf_t region; /* decoded pixels the resample reads */
    emlio__wsbuf_t temp;   /* the horizontal pass's output */
    emlio__wsbuf_t coef;   /* both axes' bounds and coefficients */
    emlio__wsbuf_t acc;    /* the vertical pass's accumulators */
    emlio__wsbuf_t coef16; /* horizontal weights split for the AVX2 pass */
    void *jpeg;            /* the reused libjpeg decoder (image_decode.c) */
};

/* Makes b hold at least bytes, within the workspace's cap: 0, EMLIO_ELIMIT
 * or EMLIO_ENOMEM (errbuf says which). The contents are not kept. */
int emlio__ws_reserve(emlio_transform_ws_t *ws, emlio__wsbuf_t *b, size_t bytes,
                      char *errbuf, size_t errlen);

/* Frees buffers above the size worth keeping between images. */
void emlio__ws_trim(emlio_transform_ws_t *ws);

/* Formats into a caller's error buffer of errlen bytes; returns rc. */
int emlio__tf_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* One axis of the single resample the pipeline reduces to. Output pixel u
 * (before any flip) is centred, in source pixels, at
 *     base + ((double)(u + off) + 0.5) * scale
 * and PIL's bilinear filter is clipped to the source interval
 * [clip_lo, clip_hi) (the image the last resize saw); a centre outside
 * [ext_lo, ext_hi) (the current image, padding excluded) is black. */
typedef struct emlio__axis {
    double base, scale;
    int64_t off;
    double clip_lo, clip_hi;
    double ext_lo, ext_hi;
    int64_t n; /* the size of the current (virtual) image on this axis */
} emlio__axis_t;

typedef struct emlio__resample {
    emlio__axis_t x, y;
    bool flip; /* mirror the output left-right */
    /* Filled by emlio__resample_prepare: the decoded image's size and the
     * rows and columns of it the resample reads. */
    uint32_t src_w, src_h;
    uint32_t x0, x1, y0, y1;
    uint32_t ksize_x, ksize_y;
    uint32_t groups; /* 4-tap groups of the AVX2 pass; 0: scalar pass */
} emlio__resample_t;

/* The DCT reduction (1, 2, 4 or 8) a JPEG decoder may apply: the largest
 * that leaves at least one source pixel per output pixel on both axes. */
uint32_t emlio__resample_max_reduction(const emlio__resample_t *rs);

/* Computes the coefficient tables for a source of src_w x src_h pixels
 * (the image reduced by `reduction`, whose coordinates are the plan's
 * divided by it) into ws, and the region of it the resample reads. */
int emlio__resample_prepare(emlio__resample_t *rs, emlio_transform_ws_t *ws,
                            uint32_t reduction, uint32_t src_w, uint32_t src_h,
                            char *errbuf, size_t errlen);

/* Reserves ws->region for bytes of decoded pixels plus the slack the
 * horizontal pass may read past the last row (zeroed). */
int emlio__resample_reserve_region(const emlio__resample_t *rs,
                                   emlio_transform_ws_t *ws, size_t bytes,
                                   char *errbuf, size_t errlen);

/* Tests only: true makes every resample use the portable loops, so a test
 * can compare them with the AVX2 ones. Process-wide. */
void emlio__resample_force_portable(bool on);

/* Runs the two passes (horizontal, flip fused, then vertical) from the
 * decoded region (RGB, rows rs->y0.. at stride bytes, first column
 * region_x0 <= rs->x0) into out (n_y x n_x x 3). */
int emlio__resample_run(const emlio__resample_t *rs, emlio_transform_ws_t *ws,
                        const uint8_t *region, size_t stride,
                        uint32_t region_x0, uint8_t *out, char *errbuf,
                        size_t errlen);

/* The decoder's view of the pipeline: called once the image's size is
 * known, it fills the resample plan (ctx is the caller's). */
typedef int emlio__geometry_fn(void *ctx, uint32_t width, uint32_t height,
                               emlio__resample_t *rs, char *errbuf,
                               size_t errlen);

/* Decodes data (JPEG or PNG) over the region the plan needs and resamples
 * it into out. Refuses images above max_pixels before allocating. */
int emlio__image_transform(emlio_transform_ws_t *ws, const uint8_t *data,
                           size_t len, uint64_t max_pixels,
                           emlio__geometry_fn *geometry, void *ctx,
                           emlio__resample_t *rs, uint8_t *out, char *errbuf,
                           size_t errlen);

/* Frees the workspace's decoder state. */
void emlio__image_ws_release(emlio_transform_ws_t *ws);

#endif /* EMLIO_TRANSFORM_WS_H */
