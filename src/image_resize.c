/* image_resize.c - the transform pipeline's one resample: PIL's
 * antialiased bilinear filter (ImagingResample: a triangle whose support
 * grows with the reduction, normalised weights, 22-bit fixed point with
 * PIL's rounding), horizontal pass with the flip fused, then vertical.
 * The weights are computed in double once per image (deterministic: only
 * +, -, *, / and (int) casts); the per-pixel loops are integer only.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <math.h>

#include "transform_ws.h"

/* PIL's precision for 8-bit images: 32 - 8 - 2 bits. */
#define PRECISION_BITS 22
#define HALF           (1 << (PRECISION_BITS - 1))

/* The two pixel loops are compiled for AVX2 as well, picked at load time
 * (GCC's function multiversioning): integer arithmetic, so both versions
 * give the same bytes. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#    define EMLIO_HOT                                              \
        __attribute__((noinline, target_clones("avx2", "default"), \
                       optimize("O3")))
#else
#    define EMLIO_HOT __attribute__((noinline))
#endif

uint32_t
emlio__resample_max_reduction(const emlio__resample_t *rs)
{
    double s = EMLIO_MIN(rs->x.scale, rs->y.scale);
    uint32_t r = 1;
    while (r < 8 && s >= 2.0 * r)
        r *= 2;
    return r;
}

static double
s_triangle(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* PIL's normalize_coeffs_8bpc for one weight. */
static int32_t
s_fixed(double w)
{
    if (w < 0)
        return (int32_t)(-0.5 + w * (1 << PRECISION_BITS));
    return (int32_t)(0.5 + w * (1 << PRECISION_BITS));
}

/* The filter's width in taps for axis a reduced by r (PIL's ksize). */
static uint64_t
s_ksize(const emlio__axis_t *a, uint32_t r)
{
    double filterscale = a->scale / r;
    if (filterscale < 1.0)
        filterscale = 1.0;
    return (uint64_t)ceil(filterscale) * 2 + 1;
}

/* PIL's precompute_coeffs for one axis, in the reduced image's pixels,
 * relative to the clip interval the way PIL sees a cropped image: bounds
 * gets (first source pixel, taps) per output pixel, kk the fixed-point
 * weights (ksize per output pixel). Pixels in padding get 0 taps. */
static void
s_axis_coeffs(const emlio__axis_t *a, uint32_t r, uint32_t size, uint32_t ksize,
              int32_t *bounds, int32_t *kk)
{
    double scale = a->scale / r;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;
    double ss = 1.0 / filterscale;
    /* The clip interval in whole reduced pixels; exact (integers) in
     * every chain that PIL resamples once. */
    int64_t lo = (int64_t)floor(a->clip_lo / r);
    int64_t hi = (int64_t)ceil(a->clip_hi / r);
    lo = EMLIO_MAX(lo, 0);
    hi = EMLIO_MIN(hi, (int64_t)size);
    int64_t in_size = hi - lo;
    double in0 = a->base / r - (double)lo;
    double ext_lo = a->ext_lo / r - (double)lo;
    double ext_hi = a->ext_hi / r - (double)lo;
    for (int64_t xx = 0; xx < a->n; xx++) {
        double center = in0 + ((double)(xx + a->off) + 0.5) * scale;
        int32_t *k = &kk[xx * ksize];
        memset(k, 0, ksize * sizeof(*k));
        bounds[xx * 2] = (int32_t)lo;
        bounds[xx * 2 + 1] = 0;
        if (in_size <= 0 || center < ext_lo || center >= ext_hi)
            continue; /* padding: black */
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        for (int64_t x = 0; x < xmax; x++)
            ww += s_triangle(((double)(x + xmin) - center + 0.5) * ss);
        for (int64_t x = 0; x < xmax; x++) {
            double w = s_triangle(((double)(x + xmin) - center + 0.5) * ss);
            k[x] = s_fixed(ww != 0.0 ? w / ww : w);
        }
        bounds[xx * 2] = (int32_t)(xmin + lo);
        bounds[xx * 2 + 1] = (int32_t)xmax;
    }
}

/* The [first, end) source range an axis's taps read. */
static void
s_range(const int32_t *bounds, int64_t n, uint32_t *first, uint32_t *end)
{
    int64_t f = INT64_MAX, e = 0;
    for (int64_t i = 0; i < n; i++) {
        if (bounds[i * 2 + 1] == 0)
            continue;
        f = EMLIO_MIN(f, (int64_t)bounds[i * 2]);
        e = EMLIO_MAX(e, (int64_t)bounds[i * 2] + bounds[i * 2 + 1]);
    }
    if (f == INT64_MAX) { /* all padding: read one pixel anyway */
        f = 0;
        e = 1;
    }
    *first = (uint32_t)f;
    *end = (uint32_t)e;
}

int
emlio__resample_prepare(emlio__resample_t *rs, emlio_transform_ws_t *ws,
                        uint32_t reduction, uint32_t src_w, uint32_t src_h,
                        char *errbuf, size_t errlen)
{
    uint64_t kx = s_ksize(&rs->x, reduction);
    uint64_t ky = s_ksize(&rs->y, reduction);
    uint64_t nx = (uint64_t)rs->x.n, ny = (uint64_t)rs->y.n;
    if (kx > src_w * 2ull + 3 || ky > src_h * 2ull + 3)
        return emlio__tf_err(errbuf, errlen, EMLIO_ELIMIT,
                             "resample filter wider than the image");
    uint64_t ints = nx * (2 + kx) + ny * (2 + ky);
    if (ints > SIZE_MAX / 8)
        return emlio__tf_err(errbuf, errlen, EMLIO_ELIMIT,
                             "resample tables too large");
    int rc = emlio__ws_reserve(ws, &ws->coef, (size_t)ints * sizeof(int32_t),
                               errbuf, errlen);
    if (rc < 0)
        return rc;
    int32_t *bx = ws->coef.p;
    int32_t *kkx = bx + 2 * nx;
    int32_t *by = kkx + nx * kx;
    int32_t *kky = by + 2 * ny;
    s_axis_coeffs(&rs->x, reduction, src_w, (uint32_t)kx, bx, kkx);
    s_axis_coeffs(&rs->y, reduction, src_h, (uint32_t)ky, by, kky);
    rs->src_w = src_w;
    rs->src_h = src_h;
    rs->ksize_x = (uint32_t)kx;
    rs->ksize_y = (uint32_t)ky;
    s_range(bx, (int64_t)nx, &rs->x0, &rs->x1);
    s_range(by, (int64_t)ny, &rs->y0, &rs->y1);
    return 0;
}

static inline uint8_t
s_clip8(int32_t v)
{
    v >>= PRECISION_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* One row of the horizontal pass: nx output pixels from src (whose first
 * pixel is source column x_first), mirrored when flip. */
EMLIO_HOT static void
s_row_horizontal(const uint8_t *src, uint32_t x_first, uint8_t *dst,
                 uint32_t nx, const int32_t *bounds, const int32_t *kk,
                 uint32_t ksize, bool flip)
{
    for (uint32_t u = 0; u < nx; u++) {
        int32_t taps = bounds[u * 2 + 1];
        const int32_t *k = kk + (size_t)u * ksize;
        int32_t s0 = HALF, s1 = HALF, s2 = HALF;
        const uint8_t *p = src;
        if (taps > 0)
            p += (size_t)(bounds[u * 2] - (int32_t)x_first) * 3;
        for (int32_t t = 0; t < taps; t++) {
            s0 += p[t * 3 + 0] * k[t];
            s1 += p[t * 3 + 1] * k[t];
            s2 += p[t * 3 + 2] * k[t];
        }
        uint8_t *d = dst + (size_t)(flip ? nx - 1 - u : u) * 3;
        d[0] = s_clip8(s0);
        d[1] = s_clip8(s1);
        d[2] = s_clip8(s2);
    }
}

/* One output row of the vertical pass: acc is n int32s of scratch. The
 * tap loop runs over whole rows so the compiler can vectorise it. */
EMLIO_HOT static void
s_row_vertical(const uint8_t *temp, size_t n, int32_t y_first,
               const int32_t *bound, const int32_t *k, int32_t *acc,
               uint8_t *dst)
{
    for (size_t i = 0; i < n; i++)
        acc[i] = HALF;
    for (int32_t t = 0; t < bound[1]; t++) {
        const uint8_t *row = temp + (size_t)(bound[0] - y_first + t) * n;
        int32_t w = k[t];
        for (size_t i = 0; i < n; i++)
            acc[i] += row[i] * w;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = s_clip8(acc[i]);
}

int
emlio__resample_run(const emlio__resample_t *rs, emlio_transform_ws_t *ws,
                    const uint8_t *region, size_t stride, uint32_t region_x0,
                    uint8_t *out, char *errbuf, size_t errlen)
{
    size_t nx = (size_t)rs->x.n, ny = (size_t)rs->y.n;
    size_t rows = rs->y1 - rs->y0;
    size_t row_bytes = nx * 3;
    int rc = emlio__ws_reserve(ws, &ws->temp, rows * row_bytes, errbuf, errlen);
    if (rc == 0)
        rc = emlio__ws_reserve(ws, &ws->acc, row_bytes * sizeof(int32_t),
                               errbuf, errlen);
    if (rc < 0)
        return rc;
    const int32_t *bx = ws->coef.p;
    const int32_t *kkx = bx + 2 * nx;
    const int32_t *by = kkx + nx * rs->ksize_x;
    const int32_t *kky = by + 2 * ny;
    uint8_t *temp = ws->temp.p;
    for (size_t r = 0; r < rows; r++)
        s_row_horizontal(region + r * stride, region_x0, temp + r * row_bytes,
                         (uint32_t)nx, bx, kkx, rs->ksize_x, rs->flip);
    for (size_t v = 0; v < ny; v++)
        s_row_vertical(temp, row_bytes, (int32_t)rs->y0, by + 2 * v,
                       kky + v * rs->ksize_y, ws->acc.p, out + v * row_bytes);
    return 0;
}
