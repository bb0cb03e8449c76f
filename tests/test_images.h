/* test_images.h - test pictures encoded as JPEG with libjpeg, for the
 * transform tests (unit and end to end). Header-only: each test program
 * includes it once. SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TEST_IMAGES_H
#define EMLIO_TEST_IMAGES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <jpeglib.h>

/* A smooth, textured test picture: gradients plus a checker, so crops and
 * flips of it differ. Channel c of pixel (x, y). */
static uint8_t
s_pixel(uint32_t x, uint32_t y, int c)
{
    uint32_t v = (x * 255 / 97) * (c == 0) + (y * 255 / 89) * (c == 1) +
                 (((x / 8) + (y / 8)) % 2 ? 200 : 40) * (c == 2);
    return (uint8_t)(v + (uint32_t)c * 13);
}

static uint8_t *
s_picture(uint32_t w, uint32_t h, int comps)
{
    uint8_t *p = malloc((size_t)w * h * (size_t)comps);
    assert_non_null(p);
    for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++)
            for (int c = 0; c < comps; c++)
                p[((size_t)y * w + x) * (size_t)comps + (size_t)c] =
                    s_pixel(x, y, c % 3);
    return p;
}

/* Encodes pixels (comps of colour space cs) as a JPEG; free() the result. */
static uint8_t *
s_jpeg(const uint8_t *pixels, uint32_t w, uint32_t h, int comps,
       J_COLOR_SPACE cs, bool progressive, size_t *len)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    unsigned char *out = NULL;
    unsigned long out_len = 0;
    jpeg_mem_dest(&ci, &out, &out_len);
    ci.image_width = w;
    ci.image_height = h;
    ci.input_components = comps;
    ci.in_color_space = cs;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 92, TRUE);
    if (progressive)
        jpeg_simple_progression(&ci);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < h) {
        JSAMPROW row =
            (JSAMPROW)pixels + (size_t)ci.next_scanline * w * (size_t)comps;
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    *len = out_len;
    return out;
}

static uint8_t *
s_rgb_jpeg(uint32_t w, uint32_t h, bool progressive, size_t *len)
{
    uint8_t *p = s_picture(w, h, 3);
    uint8_t *j = s_jpeg(p, w, h, 3, JCS_RGB, progressive, len);
    free(p);
    return j;
}

#endif /* EMLIO_TEST_IMAGES_H */
