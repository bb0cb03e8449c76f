/* transform_bench.c - the transform pipeline alone, one thread: images per
 * CPU-second of emlio_transform_apply on every DIR/class/file.jpg (loaded
 * into memory first), and of a plain full libjpeg-turbo decode of the same
 * files for reference. bench/transform_bench.py runs it next to
 * torchvision's PIL pipeline and prints the ratio.
 *   build/bench/transform_bench DIR [SPEC [ROUNDS]]
 * Prints "name images cpu_s images_per_cpu_s" lines.
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>

#include "emlio.h"

#include "bench_clock.h"

typedef struct file {
    uint8_t *data;
    size_t len;
} file_t;

static int
s_load(const char *path, file_t *f)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return -1;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->data = malloc(n > 0 ? (size_t)n : 1);
    f->len = f->data ? fread(f->data, 1, (size_t)n, fp) : 0;
    fclose(fp);
    return f->data && f->len == (size_t)n ? 0 : -1;
}

/* A full decode to RGB, the way PIL and torchvision's decode_jpeg do it. */
static void
s_full_decode(const file_t *f, uint8_t **buf, size_t *cap)
{
    struct jpeg_decompress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, f->data, (unsigned long)f->len);
    jpeg_read_header(&ci, TRUE);
    ci.out_color_space = JCS_RGB;
    ci.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&ci);
    size_t stride = (size_t)ci.output_width * 3;
    if (stride * ci.output_height > *cap) {
        *cap = stride * ci.output_height;
        *buf = realloc(*buf, *cap);
    }
    while (ci.output_scanline < ci.output_height) {
        JSAMPROW row = *buf + ci.output_scanline * stride;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: transform_bench DIR [SPEC [ROUNDS]]\n");
        return 2;
    }
    const char *spec =
        argc > 2 ? argv[2] : "random_resized_crop(224),horizontal_flip";
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    char pattern[4096];
    snprintf(pattern, sizeof(pattern), "%s/*/*.jpg", argv[1]);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "transform_bench: no %s\n", pattern);
        return 1;
    }
    size_t n = g.gl_pathc;
    file_t *files = calloc(n, sizeof(*files));
    for (size_t i = 0; i < n; i++)
        if (!files || s_load(g.gl_pathv[i], &files[i]) < 0) {
            fprintf(stderr, "transform_bench: cannot read %s\n", g.gl_pathv[i]);
            return 1;
        }
    char err[EMLIO_ERRBUF_SIZE];
    emlio_transform_t *t = NULL;
    if (emlio_transform_parse(spec, &t, err, sizeof(err)) < 0) {
        fprintf(stderr, "transform_bench: %s\n", err);
        return 1;
    }
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    uint8_t *out = malloc(emlio_transform_output_bytes(t));
    /* One warm-up pass so buffers and page cache are in place. */
    for (size_t i = 0; i < n; i++)
        if (emlio_transform_apply(t, ws, files[i].data, files[i].len, 1, 0, i,
                                  out, err, sizeof(err)) < 0) {
            fprintf(stderr, "transform_bench: %s: %s\n", g.gl_pathv[i], err);
            return 1;
        }
    double t0 = bench_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < n; i++)
            emlio_transform_apply(t, ws, files[i].data, files[i].len, 1,
                                  (uint64_t)r + 1, i, out, err, sizeof(err));
    double emlio_s = bench_seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
    uint8_t *buf = NULL;
    size_t cap = 0;
    t0 = bench_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < n; i++)
            s_full_decode(&files[i], &buf, &cap);
    double full_s = bench_seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
    size_t images = n * (size_t)rounds;
    printf("emlio %zu %.4f %.1f\n", images, emlio_s, images / emlio_s);
    printf("libjpeg_full_decode %zu %.4f %.1f\n", images, full_s,
           images / full_s);
    free(buf);
    free(out);
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&t);
    for (size_t i = 0; i < n; i++)
        free(files[i].data);
    free(files);
    globfree(&g);
    return 0;
}
