/* test_transform.c - unit tests of the transform pipeline: the spec
 * grammar and its errors, the counter-based generator, determinism across
 * workspaces and epochs, every decoder path (baseline, grayscale, CMYK and
 * progressive JPEG; 8- and 16-bit, palette, grey, alpha and interlaced
 * PNG), and bad input (truncated, garbage, empty, decompression bombs).
 * Test images are encoded here with libjpeg and libpng.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <math.h>

#include <jpeglib.h>

#include <png.h>

#include "counter_rng.h"
#include "test_images.h"
#include "transform_ws.h"

static void
s_png_write(png_structp png, png_bytep data, size_t n)
{
    assert_int_equal(emlio_buf_add(png_get_io_ptr(png), data, n), 0);
}

static void
s_png_flush(png_structp png)
{
    (void)png;
}

/* Encodes a w x h PNG of the test picture: color_type and bit depth as
 * libpng names them, interlaced (Adam7) or not. Palette images use an
 * 8-colour palette of the picture's first 8 columns' colours. */
static emlio_buf_t
s_png(uint32_t w, uint32_t h, int color, int depth, bool interlace)
{
    emlio_buf_t b = EMLIO_BUF_INIT;
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    assert_non_null(info);
    png_set_write_fn(png, &b, s_png_write, s_png_flush);
    png_set_IHDR(png, info, w, h, depth, color,
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_color pal[8];
    for (int i = 0; i < 8; i++) {
        pal[i].red = s_pixel((uint32_t)i, 0, 0);
        pal[i].green = s_pixel((uint32_t)i, 0, 1);
        pal[i].blue = s_pixel((uint32_t)i, 0, 2);
    }
    if (color == PNG_COLOR_TYPE_PALETTE)
        png_set_PLTE(png, info, pal, 8);
    png_write_info(png, info);
    int chans = color == PNG_COLOR_TYPE_RGB         ? 3
                : color == PNG_COLOR_TYPE_RGB_ALPHA ? 4
                : color == PNG_COLOR_TYPE_GA        ? 2
                                                    : 1;
    size_t bps = depth == 16 ? 2 : 1;
    uint8_t *row = calloc((size_t)w * (size_t)chans * bps, 1);
    assert_non_null(row);
    int passes = png_set_interlace_handling(png);
    for (int pass = 0; pass < passes; pass++)
        for (uint32_t y = 0; y < h; y++) {
            for (uint32_t x = 0; x < w; x++)
                for (int c = 0; c < chans; c++) {
                    uint8_t v =
                        color == PNG_COLOR_TYPE_PALETTE      ? (uint8_t)(x % 8)
                        : (c == 3 || (chans == 2 && c == 1)) ? 128 /* alpha */
                                                             : s_pixel(x, y, c);
                    size_t at = ((size_t)x * (size_t)chans + (size_t)c) * bps;
                    row[at] = v;
                    if (bps == 2)
                        row[at + 1] = v; /* v * 257: strips back to v */
                }
            png_write_row(png, row);
        }
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(row);
    return b;
}

/* Parses spec, failing the test on an error. */
static emlio_transform_t *
s_parse(const char *spec)
{
    char err[EMLIO_ERRBUF_SIZE] = "";
    emlio_transform_t *t = NULL;
    int rc = emlio_transform_parse(spec, &t, err, sizeof(err));
    if (rc < 0)
        fail_msg("parse \"%s\": %s", spec, err);
    return t;
}

/* Runs t on data; returns rc and the output in a fresh buffer (*out). */
static int
s_apply(const emlio_transform_t *t, emlio_transform_ws_t *ws,
        const uint8_t *data, size_t len, uint64_t epoch, uint64_t key,
        uint8_t **out, char *err)
{
    size_t n = emlio_transform_output_bytes(t);
    *out = malloc(n + 16);
    assert_non_null(*out);
    memset(*out, 0xab, n + 16);
    err[0] = '\0';
    int rc = emlio_transform_apply(t, ws, data, len, 42, epoch, key, *out, err,
                                   EMLIO_ERRBUF_SIZE);
    for (size_t i = n; i < n + 16; i++)
        assert_int_equal((*out)[i], 0xab); /* writes exactly n bytes */
    return rc;
}

static void
test_transform_parse_canonical(void **state)
{
    (void)state;

    static const struct {
        const char *spec, *canonical;
        uint32_t h, w;
    } cases[] = {
        { "random_resized_crop(224)",
          "random_resized_crop(224,scale=0.08:1,ratio=0.75:1.3333333333333333)",
          224, 224 },
        { " random_resized_crop( size = 224 , scale=0.08:1.0,"
          "ratio=0.75:1.3333333333333333 ) , horizontal_flip ",
          "random_resized_crop(224,scale=0.08:1,ratio=0.75:1.3333333333333333)"
          ",horizontal_flip(p=0.5)",
          224, 224 },
        { "resize(256),center_crop(224)", "resize(256),center_crop(224)", 224,
          224 },
        { "center_crop(size=32),horizontal_flip(p=1),resize(16)",
          "center_crop(32),horizontal_flip(p=1),resize(16)", 16, 16 },
        { "random_resized_crop(64,scale=0.5:0.5,ratio=1:1),horizontal_flip()",
          "random_resized_crop(64,scale=0.5:0.5,ratio=1:1),"
          "horizontal_flip(p=0.5)",
          64, 64 },
    };

    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(cases); i++) {
        emlio_transform_t *t = s_parse(cases[i].spec);
        assert_string_equal(emlio_transform_spec(t), cases[i].canonical);
        assert_int_equal(emlio_transform_height(t), cases[i].h);
        assert_int_equal(emlio_transform_width(t), cases[i].w);
        assert_int_equal(emlio_transform_output_bytes(t),
                         (size_t)cases[i].h * cases[i].w * 3);
        /* The canonical text parses to itself. */
        emlio_transform_t *again = s_parse(emlio_transform_spec(t));
        assert_string_equal(emlio_transform_spec(again), cases[i].canonical);
        emlio_transform_destroy(&again);
        emlio_transform_destroy(&t);
        assert_null(t);
    }
    emlio_transform_destroy(NULL);
}

static void
test_transform_parse_errors_name_the_problem(void **state)
{
    (void)state;

    static const struct {
        const char *spec, *says;
    } cases[] = {
        { "", "expected an operation" },
        { "foo(3)", "unknown operation \"foo\"" },
        { "resize(256)", "depends on the input" },
        { "resize(256),horizontal_flip", "depends on the input" },
        { "random_resized_crop", "random_resized_crop: missing size" },
        { "random_resized_crop()", "random_resized_crop: missing size" },
        { "random_resized_crop(0)", "size must be an integer" },
        { "random_resized_crop(99999)", "size must be an integer" },
        { "random_resized_crop(22.5)", "size must be an integer" },
        { "random_resized_crop(224,scale=1:0.5)", "scale wants LO:HI" },
        { "random_resized_crop(224,scale=0.5)", "scale wants LO:HI" },
        { "random_resized_crop(224,ratio=0:1)", "ratio wants LO:HI" },
        { "random_resized_crop(224,ratio=nan:1)", "ratio wants LO:HI" },
        { "random_resized_crop(224,bogus=1)", "unknown argument \"bogus\"" },
        { "random_resized_crop(224,224)", "size given twice" },
        { "center_crop(224,p=0.5)", "center_crop: unknown argument \"p\"" },
        { "horizontal_flip(p=2)", "p must be in [0, 1]" },
        { "horizontal_flip(0.5)", "unknown argument \"0.5\"" },
        { "center_crop(224", "missing \")\"" },
        { "center_crop(224) x", "unexpected \"x\"" },
        { "center_crop(224),", "expected an operation" },
        { "center_crop(224),,center_crop(2)", "expected an operation" },
        { "center_crop(224,)", "empty argument" },
        /* Client bytes are escaped, and a non-ASCII name named whole. */
        { "cr\xc3\xb8p(3)", "unknown operation \"cr\\xc3\\xb8p\"" },
        { "center_crop(\x1b[2J)", "got \"\\x1b[2J\"" },
        { "center_crop(224,k\"=1)", "unknown argument \"k\\x22\"" },
        { "an_operation_name_far_longer_than_any_real_one_is_cut_here_xyz",
          "_cut_here_x...\" (known" },
        { "center_crop(1),center_crop(1),center_crop(1),center_crop(1),"
          "center_crop(1),center_crop(1),center_crop(1),center_crop(1),"
          "center_crop(1),center_crop(1),center_crop(1),center_crop(1),"
          "center_crop(1),center_crop(1),center_crop(1),center_crop(1),"
          "center_crop(1)",
          "more than 16 operations" },
    };

    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(cases); i++) {
        char err[EMLIO_ERRBUF_SIZE] = "";
        emlio_transform_t *t = (emlio_transform_t *)&err; /* must be reset */
        int rc = emlio_transform_parse(cases[i].spec, &t, err, sizeof(err));
        if (rc != EMLIO_EINVAL || t || !strstr(err, cases[i].says))
            fail_msg("\"%s\": rc %d, error \"%s\", wanted \"%s\"",
                     cases[i].spec, rc, err, cases[i].says);
    }
    emlio_transform_t *t = NULL;
    assert_int_equal(emlio_transform_parse(NULL, &t, NULL, 0), EMLIO_EINVAL);
    /* A short buffer is cut, not overrun. */
    char tiny[8];
    memset(tiny, 'x', sizeof(tiny));
    assert_int_equal(emlio_transform_parse("nope", &t, tiny, 4), EMLIO_EINVAL);
    assert_int_equal(tiny[3], '\0');
    assert_int_equal(tiny[4], 'x');
}

static void
test_transform_rng_is_splitmix64_and_libm_free(void **state)
{
    (void)state;
    /* Key 0 is SplitMix64 seeded 0: its published first outputs. */
    uint64_t key = emlio__rng_key(0, 0, 0, 0);
    assert_int_equal(key, 0);
    assert_true(emlio__rng_draw(key, 0) == 0xe220a8397b1dcdafull);
    assert_true(emlio__rng_draw(key, 1) == 0x6e789e6aa1b965f4ull);
    assert_true(emlio__rng_draw(key, 2) == 0x06c45d188009454full);
    /* Every word of the key matters. */
    assert_true(emlio__rng_key(1, 0, 0, 0) != emlio__rng_key(0, 1, 0, 0));
    assert_true(emlio__rng_key(0, 0, 1, 0) != emlio__rng_key(0, 0, 0, 1));
    for (uint64_t n = 0; n < 1000; n++) {
        double u = emlio__rng_uniform(12345, n);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(emlio__rng_below(12345, n, 7) < 7);
    }
    for (double x = 0.05; x < 20.0; x *= 1.37) {
        assert_true(fabs(emlio__det_log(x) - log(x)) <=
                    4e-16 * fmax(1, fabs(log(x))));
        assert_true(fabs(emlio__det_exp(log(x)) - x) <= 4e-16 * x);
    }
    assert_true(emlio__det_round(2.5) == 2.0);
    assert_true(emlio__det_round(3.5) == 4.0);
    assert_true(emlio__det_round(-0.5) == 0.0);
    assert_true(emlio__det_round(7.4999) == 7.0);
    /* Sample keys: FNV-1a of the name, mixed with the record. */
    uint64_t a = emlio_transform_sample_key("train-00000.tfrecord", 0);
    assert_true(a != emlio_transform_sample_key("train-00000.tfrecord", 1));
    assert_true(a != emlio_transform_sample_key("train-00001.tfrecord", 0));
    assert_true(emlio_transform_sample_key("", 0) ==
                emlio__rng_mix(0xcbf29ce484222325ull ^ emlio__rng_mix(1)));
}

static void
test_transform_same_key_same_bytes_epoch_changes_them(void **state)
{
    (void)state;
    size_t len;
    uint8_t *jpeg = s_rgb_jpeg(160, 120, false, &len);
    emlio_transform_t *t = s_parse("random_resized_crop(32),horizontal_flip");
    emlio_transform_ws_t *ws1 = emlio_transform_ws_new();
    emlio_transform_ws_t *ws2 = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    size_t n = emlio_transform_output_bytes(t);
    int changed = 0;
    for (uint64_t k = 0; k < 200; k++) {
        uint8_t *a, *b, *c;
        assert_int_equal(s_apply(t, ws1, jpeg, len, 0, k, &a, err), 0);
        /* Another workspace, after other samples: the same bytes. */
        assert_int_equal(s_apply(t, ws2, jpeg, len, 0, k, &b, err), 0);
        assert_memory_equal(a, b, n);
        assert_int_equal(s_apply(t, ws2, jpeg, len, 1, k, &c, err), 0);
        changed += memcmp(a, c, n) != 0;
        free(a);
        free(b);
        free(c);
    }
    assert_true(changed > 190);                     /* > 95% of 200 */
    assert_true(emlio_transform_ws_bytes(ws1) > 0); /* buffers are kept */
    emlio_transform_ws_destroy(&ws1);
    emlio_transform_ws_destroy(&ws2);
    assert_null(ws1);
    emlio_transform_ws_destroy(NULL);
    emlio_transform_destroy(&t);
    free(jpeg);
}

/* The crop box follows torchvision's get_params: inside the image, area
 * fraction and ratio in range when an attempt succeeds, the centre-crop
 * fallback otherwise. */
static void
test_transform_crop_params_follow_torchvision(void **state)
{
    (void)state;
    emlio_transform_t *t = s_parse("horizontal_flip,random_resized_crop(224)");
    emlio_transform_box_t b;
    assert_int_equal(emlio_transform_crop_params(t, 0, 500, 375, 1, 0, 0, &b),
                     EMLIO_EINVAL); /* op 0 is the flip */
    assert_int_equal(emlio_transform_crop_params(t, 1, 0, 375, 1, 0, 0, &b),
                     EMLIO_EINVAL);
    for (uint64_t k = 0; k < 2000; k++) {
        assert_int_equal(
            emlio_transform_crop_params(t, 1, 500, 375, 1, 0, k, &b), 0);
        assert_true(b.width >= 1 && b.left + b.width <= 500);
        assert_true(b.height >= 1 && b.top + b.height <= 375);
        double area = (double)b.width * b.height / (500.0 * 375.0);
        assert_true(area >= 0.079 && area <= 1.0);
    }
    emlio_transform_destroy(&t);
    /* A ratio range no crop can meet falls back to the centre crop. */
    t = s_parse("random_resized_crop(8,scale=1:1,ratio=3:4)");
    assert_int_equal(emlio_transform_crop_params(t, 0, 100, 100, 1, 0, 0, &b),
                     0);
    assert_int_equal(b.width, 100);
    assert_int_equal(b.height, 33); /* round(100 / 3) */
    assert_int_equal(b.top, 33);    /* (100 - 33) // 2 */
    assert_int_equal(b.left, 0);
    emlio_transform_destroy(&t);
}

/* center_crop without a resize copies pixels: exact, flips included,
 * through every PNG layout (16 bits strip to the high byte as in PIL). */
static void
test_transform_png_layouts_decode_exactly(void **state)
{
    (void)state;

    static const struct {
        int color, depth;
        bool interlace;
    } cases[] = {
        { PNG_COLOR_TYPE_RGB, 8, false },
        { PNG_COLOR_TYPE_RGB, 16, false },
        { PNG_COLOR_TYPE_RGB, 8, true },
        { PNG_COLOR_TYPE_RGB_ALPHA, 8, false },
        { PNG_COLOR_TYPE_RGB_ALPHA, 16, true },
        { PNG_COLOR_TYPE_GRAY, 8, false },
        { PNG_COLOR_TYPE_GRAY, 16, false },
        { PNG_COLOR_TYPE_GA, 8, false },
        { PNG_COLOR_TYPE_PALETTE, 8, false },
    };

    emlio_transform_t *keep = s_parse("center_crop(16)");
    emlio_transform_t *flip = s_parse("center_crop(16),horizontal_flip(p=1)");
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(cases); i++) {
        emlio_buf_t png =
            s_png(40, 30, cases[i].color, cases[i].depth, cases[i].interlace);
        uint8_t *a, *b;
        int rc = s_apply(keep, ws, png.data, png.len, 0, 1, &a, err);
        if (rc != 0)
            fail_msg("png case %zu: %s", i, err);
        assert_int_equal(s_apply(flip, ws, png.data, png.len, 0, 1, &b, err),
                         0);
        bool gray = cases[i].color == PNG_COLOR_TYPE_GRAY ||
                    cases[i].color == PNG_COLOR_TYPE_GA;
        for (uint32_t y = 0; y < 16; y++)
            for (uint32_t x = 0; x < 16; x++)
                for (int c = 0; c < 3; c++) {
                    /* top = round((30 - 16) / 2) = 7, left = 12 */
                    uint32_t sx = x + 12, sy = y + 7;
                    uint8_t want = cases[i].color == PNG_COLOR_TYPE_PALETTE
                                       ? s_pixel(sx % 8, 0, c)
                                       : s_pixel(sx, sy, gray ? 0 : c);
                    assert_int_equal(a[(y * 16 + x) * 3 + (uint32_t)c], want);
                    assert_int_equal(b[(y * 16 + 15 - x) * 3 + (uint32_t)c],
                                     want);
                }
        free(a);
        free(b);
        emlio_buf_release(&png);
    }
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&keep);
    emlio_transform_destroy(&flip);
}

/* Mean absolute difference of two images of n bytes. */
static double
s_mad(const uint8_t *a, const uint8_t *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += abs((int)a[i] - (int)b[i]);
    return s / (double)n;
}

static void
test_transform_jpeg_gray_cmyk_progressive(void **state)
{
    (void)state;
    emlio_transform_t *t = s_parse("resize(48),center_crop(40)");
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    size_t n = emlio_transform_output_bytes(t);
    uint8_t *base, *prog, *gray, *cmyk;
    size_t len;
    /* Progressive and baseline encodings of one picture agree closely. */
    uint8_t *j = s_rgb_jpeg(200, 150, false, &len);
    assert_int_equal(s_apply(t, ws, j, len, 0, 0, &base, err), 0);
    free(j);
    j = s_rgb_jpeg(200, 150, true, &len);
    if (s_apply(t, ws, j, len, 0, 0, &prog, err) != 0)
        fail_msg("progressive: %s", err);
    free(j);
    assert_true(s_mad(base, prog, n) < 3.0);
    /* Grayscale: R = G = B. */
    uint8_t *g = s_picture(200, 150, 1);
    j = s_jpeg(g, 200, 150, 1, JCS_GRAYSCALE, false, &len);
    if (s_apply(t, ws, j, len, 0, 0, &gray, err) != 0)
        fail_msg("grayscale: %s", err);
    free(j);
    free(g);
    for (size_t i = 0; i < n; i += 3) {
        assert_int_equal(gray[i], gray[i + 1]);
        assert_int_equal(gray[i], gray[i + 2]);
    }
    /* CMYK (libjpeg writes an Adobe marker; values stored inverted, as
     * Photoshop does): C = 255 stored means no cyan ink, so stored
     * (255, 0, 0, 255) is pure magenta + yellow ink = red. */
    uint8_t *c = malloc(64 * 64 * 4);
    assert_non_null(c);
    for (size_t i = 0; i < 64 * 64; i++) {
        c[i * 4] = 255;
        c[i * 4 + 1] = 0;
        c[i * 4 + 2] = 0;
        c[i * 4 + 3] = 255;
    }
    j = s_jpeg(c, 64, 64, 4, JCS_CMYK, false, &len);
    if (s_apply(t, ws, j, len, 0, 0, &cmyk, err) != 0)
        fail_msg("cmyk: %s", err);
    free(j);
    free(c);
    for (size_t i = 0; i < n; i += 3) {
        assert_true(cmyk[i] > 245);
        assert_true(cmyk[i + 1] < 10 && cmyk[i + 2] < 10);
    }
    free(base);
    free(prog);
    free(gray);
    free(cmyk);
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&t);
}

/* A big JPEG whose crop allows DCT reduction still matches a full-size
 * decode of the same crop closely. */
static void
test_transform_dct_reduction_stays_close(void **state)
{
    (void)state;
    size_t len;
    uint8_t *j = s_rgb_jpeg(640, 480, false, &len);
    emlio_transform_t *small = s_parse("resize(60),center_crop(56)");
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    uint8_t *out;
    assert_int_equal(s_apply(small, ws, j, len, 0, 0, &out, err), 0);
    /* The picture's colour at the output's centre, roughly. */
    size_t mid = (28 * 56 + 28) * 3;
    uint32_t sx = 320, sy = 240;
    assert_true(abs((int)out[mid] - (int)s_pixel(sx, sy, 0)) < 24);
    assert_true(abs((int)out[mid + 1] - (int)s_pixel(sx, sy, 1)) < 24);
    free(out);
    free(j);
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&small);
}

/* The AVX2 resample loops and the portable ones give the same bytes, for
 * every filter width (upscales, mild and strong downscales, DCT-reduced
 * JPEGs, flips, padding). */
static void
test_transform_avx2_and_portable_loops_agree(void **state)
{
    (void)state;
    static const char *const specs[] = {
        "random_resized_crop(64),horizontal_flip",
        "random_resized_crop(200,scale=0.01:0.05)", /* upscaling */
        "resize(20),center_crop(16)",               /* 10x down, 21 taps */
        "resize(7),center_crop(7),horizontal_flip(p=1)",
        "center_crop(300)", /* padding */
        "resize(150),center_crop(97)",
    };
    size_t len;
    uint8_t *j = s_rgb_jpeg(303, 211, false, &len);
    emlio_buf_t png = s_png(211, 303, PNG_COLOR_TYPE_RGB, 8, false);
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(specs); i++) {
        emlio_transform_t *t = s_parse(specs[i]);
        size_t n = emlio_transform_output_bytes(t);
        for (uint64_t k = 0; k < 8; k++) {
            const uint8_t *img = k % 2 ? png.data : j;
            size_t img_len = k % 2 ? png.len : len;
            uint8_t *fast, *portable;
            assert_int_equal(s_apply(t, ws, img, img_len, 0, k, &fast, err), 0);
            emlio__resample_force_portable(true);
            int rc = s_apply(t, ws, img, img_len, 0, k, &portable, err);
            emlio__resample_force_portable(false);
            assert_int_equal(rc, 0);
            if (memcmp(fast, portable, n))
                fail_msg("%s, sample %" PRIu64 ": the loops differ", specs[i],
                         k);
            free(fast);
            free(portable);
        }
        emlio_transform_destroy(&t);
    }
    emlio_buf_release(&png);
    free(j);
    emlio_transform_ws_destroy(&ws);
}

/* Points at the SOF0 marker's height field of a baseline JPEG. */
static uint8_t *
s_sof_dims(uint8_t *jpeg, size_t len)
{
    for (size_t i = 2; i + 9 < len; i++)
        if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0)
            return jpeg + i + 5;
    fail_msg("no SOF0 marker");
    return NULL;
}

static uint32_t
s_crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void
test_transform_bad_input_is_an_error_not_a_crash(void **state)
{
    (void)state;
    emlio_transform_t *t = s_parse("random_resized_crop(24),horizontal_flip");
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    uint8_t *out;
    size_t len;
    uint8_t *j = s_rgb_jpeg(120, 90, false, &len);
    /* Truncated at many points, including inside the header. */
    for (size_t cut = 0; cut < len; cut += len / 13 + 1) {
        int rc = s_apply(t, ws, j, cut, 0, 0, &out, err);
        if (rc >= 0 || !err[0])
            fail_msg("cut at %zu of %zu: rc %d", cut, len, rc);
        assert_int_equal(rc, EMLIO_EFORMAT);
        free(out);
    }
    /* Garbage after a JPEG signature, and no signature at all. */
    uint8_t junk[4096];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(emlio__rng_draw(99, i) >> 13);
    junk[0] = 0xff;
    junk[1] = 0xd8;
    junk[2] = 0xff;
    assert_int_equal(s_apply(t, ws, junk, sizeof(junk), 0, 0, &out, err),
                     EMLIO_EFORMAT);
    free(out);
    junk[0] = 'G';
    assert_int_equal(s_apply(t, ws, junk, sizeof(junk), 0, 0, &out, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "not a JPEG or PNG"));
    free(out);
    assert_int_equal(s_apply(t, ws, NULL, 0, 0, 0, &out, err), EMLIO_EFORMAT);
    free(out);
    /* Corrupt entropy-coded data in the middle: an error or an image,
     * never a crash (libjpeg may resynchronise). */
    uint8_t *bad = malloc(len);
    assert_non_null(bad);
    memcpy(bad, j, len);
    for (size_t i = len / 2; i < len / 2 + 64; i++)
        bad[i] ^= 0x5a;
    int rc = s_apply(t, ws, bad, len, 0, 0, &out, err);
    assert_true(rc == 0 || rc == EMLIO_EFORMAT);
    free(out);
    free(bad);
    /* A baseline JPEG cut short is refused whatever the crop: a crop of
     * its top rows never reaches the missing ones (issue 34: it passed or
     * failed with the epoch's draw). */
    {
        emlio_transform_t *top = s_parse("center_crop(8)");
        size_t tl = 0;
        uint8_t *tall = s_rgb_jpeg(16, 512, false, &tl);
        for (size_t cut = tl - 2; cut > tl / 2; cut -= tl / 8) {
            rc = s_apply(top, ws, tall, cut, 0, 0, &out, err);
            free(out);
            assert_int_equal(rc, EMLIO_EFORMAT);
            assert_non_null(strstr(err, "truncated"));
        }
        /* Cut short and given its end-of-image marker again: refused too,
         * whether the cut is above the crop's rows (libjpeg would pad
         * them grey) or below them (the crop would never see it). */
        uint8_t *patched = malloc(tl);
        assert_non_null(patched);
        for (size_t cut = tl - 64; cut > tl / 4; cut -= tl / 8) {
            memcpy(patched, tall, cut);
            patched[cut] = 0xff;
            patched[cut + 1] = 0xd9;
            rc = s_apply(top, ws, patched, cut + 2, 0, 0, &out, err);
            free(out);
            if (rc != EMLIO_EFORMAT)
                fail_msg("cut at %zu of %zu, EOI appended: rc %d", cut, tl, rc);
        }
        free(patched);
        /* Whole, and with bytes after its end: decoded. */
        assert_int_equal(s_apply(top, ws, tall, tl, 0, 0, &out, err), 0);
        free(out);
        uint8_t *more = malloc(tl + 100);
        assert_non_null(more);
        memcpy(more, tall, tl);
        memset(more + tl, 0x33, 100);
        assert_int_equal(s_apply(top, ws, more, tl + 100, 0, 0, &out, err), 0);
        free(out);
        free(more);
        free(tall);
        emlio_transform_destroy(&top);
    }
    /* A truncated PNG. */
    emlio_buf_t png = s_png(40, 30, PNG_COLOR_TYPE_RGB, 8, false);
    assert_int_equal(s_apply(t, ws, png.data, png.len / 2, 0, 0, &out, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "png:"));
    free(out);
    emlio_buf_release(&png);
    free(j);
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&t);
}

static void
test_transform_bombs_are_refused_before_allocating(void **state)
{
    (void)state;
    emlio_transform_t *t = s_parse("random_resized_crop(224)");
    emlio_transform_ws_t *ws = emlio_transform_ws_new();
    char err[EMLIO_ERRBUF_SIZE];
    uint8_t *out;
    size_t len;
    uint8_t *j = s_rgb_jpeg(64, 48, false, &len);
    uint8_t *dims = s_sof_dims(j, len);
    dims[0] = 60000 >> 8; /* height */
    dims[1] = 60000 & 0xff;
    dims[2] = 60000 >> 8; /* width */
    dims[3] = 60000 & 0xff;
    emlio__alloc_fail_at(0);
    assert_int_equal(s_apply(t, ws, j, len, 0, 0, &out, err), EMLIO_ELIMIT);
    /* One allocation: the libjpeg state of a fresh workspace; no pixels. */
    assert_true(emlio__alloc_count() <= 2);
    assert_int_equal(emlio_transform_ws_bytes(ws), 0);
    assert_non_null(strstr(err, "60000x60000"));
    free(out);
    free(j);
    /* The same for a PNG header (IHDR's CRC recomputed). */
    emlio_buf_t png = s_png(40, 30, PNG_COLOR_TYPE_RGB, 8, false);
    uint8_t *ihdr = png.data + 12; /* "IHDR" then width, height */
    for (int i = 0; i < 2; i++) {
        ihdr[4 + i * 4] = 0;
        ihdr[5 + i * 4] = 0;
        ihdr[6 + i * 4] = 60000 >> 8;
        ihdr[7 + i * 4] = 60000 & 0xff;
    }
    uint32_t crc = s_crc32(ihdr, 17);
    for (int i = 0; i < 4; i++)
        ihdr[17 + i] = (uint8_t)(crc >> (24 - 8 * i));
    assert_int_equal(s_apply(t, ws, png.data, png.len, 0, 0, &out, err),
                     EMLIO_ELIMIT);
    assert_int_equal(emlio_transform_ws_bytes(ws), 0);
    free(out);
    emlio_buf_release(&png);
    /* A per-pipeline pixel cap and a per-workspace memory cap. */
    j = s_rgb_jpeg(64, 48, false, &len);
    emlio_transform_set_max_pixels(t, 64 * 48 - 1);
    assert_int_equal(s_apply(t, ws, j, len, 0, 0, &out, err), EMLIO_ELIMIT);
    free(out);
    emlio_transform_set_max_pixels(t, 0); /* back to the default */
    emlio_transform_ws_set_max_bytes(ws, 1000);
    assert_int_equal(s_apply(t, ws, j, len, 0, 0, &out, err), EMLIO_ELIMIT);
    assert_non_null(strstr(err, "cap"));
    free(out);
    /* A progressive JPEG's coefficients go past the cap inside libjpeg:
     * said as the decode memory limit, not as libjpeg's "Backing store
     * not supported" (issue 34). */
    {
        size_t plen = 0;
        uint8_t *prog = s_rgb_jpeg(2048, 2048, true, &plen);
        emlio_transform_ws_set_max_bytes(ws, 4u << 20);
        assert_int_equal(s_apply(t, ws, prog, plen, 0, 0, &out, err),
                         EMLIO_ELIMIT);
        assert_null(strstr(err, "Backing store"));
        assert_non_null(strstr(err, "2048x2048 needs more memory to decode"));
        free(out);
        free(prog);
    }
    emlio_transform_ws_set_max_bytes(ws, 1u << 20);
    /* libpng's row buffers count too: a 100000 x 1 PNG, 1 MB cap. */
    png = s_png(100000, 1, PNG_COLOR_TYPE_RGB, 8, false);
    assert_int_equal(s_apply(t, ws, png.data, png.len, 0, 0, &out, err),
                     EMLIO_ELIMIT);
    assert_non_null(strstr(err, "rows of 100000 pixels"));
    free(out);
    emlio_buf_release(&png);
    emlio_transform_ws_set_max_bytes(ws, 0);
    assert_int_equal(s_apply(t, ws, j, len, 0, 0, &out, err), 0);
    free(out);
    free(j);
    emlio_transform_ws_destroy(&ws);
    emlio_transform_destroy(&t);
}

/* Every allocation of parse, workspace and apply may fail: an error, no
 * crash, no leak (run under ASan by `make check`). */
static void
test_transform_survives_allocation_failures(void **state)
{
    (void)state;
    size_t len;
    uint8_t *j = s_rgb_jpeg(96, 64, false, &len);
    uint8_t out[32 * 32 * 3];
    char err[EMLIO_ERRBUF_SIZE];
    bool finished = false;
    for (long n = 1; n < 200 && !finished; n++) {
        emlio__alloc_fail_at(n);
        emlio_transform_t *t = NULL;
        emlio_transform_ws_t *ws = NULL;
        int rc = emlio_transform_parse("random_resized_crop(32),"
                                       "horizontal_flip",
                                       &t, err, sizeof(err));
        if (rc == 0)
            ws = emlio_transform_ws_new();
        if (rc == 0 && ws)
            rc = emlio_transform_apply(t, ws, j, len, 1, 2, 3, out, err,
                                       sizeof(err));
        bool done = rc == 0 && ws && emlio__alloc_count() < n;
        emlio__alloc_fail_at(0);
        assert_true(rc == 0 || rc == EMLIO_ENOMEM);
        emlio_transform_ws_destroy(&ws);
        emlio_transform_destroy(&t);
        finished = done;
    }
    assert_true(finished); /* every allocation was made to fail once */
    free(j);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transform_parse_canonical),
        cmocka_unit_test(test_transform_parse_errors_name_the_problem),
        cmocka_unit_test(test_transform_rng_is_splitmix64_and_libm_free),
        cmocka_unit_test(test_transform_same_key_same_bytes_epoch_changes_them),
        cmocka_unit_test(test_transform_crop_params_follow_torchvision),
        cmocka_unit_test(test_transform_png_layouts_decode_exactly),
        cmocka_unit_test(test_transform_jpeg_gray_cmyk_progressive),
        cmocka_unit_test(test_transform_dct_reduction_stays_close),
        cmocka_unit_test(test_transform_avx2_and_portable_loops_agree),
        cmocka_unit_test(test_transform_bad_input_is_an_error_not_a_crash),
        cmocka_unit_test(test_transform_bombs_are_refused_before_allocating),
        cmocka_unit_test(test_transform_survives_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
