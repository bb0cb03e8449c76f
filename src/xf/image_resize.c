/* image_resize.c - the transform pipeline's one resample: PIL's
 * antialiased bilinear filter (ImagingResample: a triangle whose support
 * grows with the reduction, normalised weights, 22-bit fixed point with
 * PIL's rounding), horizontal pass with the flip fused, then vertical.
 * The weights are computed in double once per image (deterministic: only
 * +, -, *, / and (int) casts); the per-pixel loops are integer only.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <math.h>
#include <stdatomic.h>

#include "transform_ws.h"

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>
#    define HAVE_AVX2_PASS 1
#else
#    define HAVE_AVX2_PASS 0
#endif

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

/* The AVX2 pass takes taps 4 at a time; its 32-bit sums of 15-bit weight
 * halves stay exact up to this many groups. */
#define MAX_GROUPS 64

static atomic_bool s_force_portable;

void
emlio__resample_force_portable(bool on)
{
    atomic_store(&s_force_portable, on);
}

static bool
s_use_avx2(void)
{
#if HAVE_AVX2_PASS
    return !atomic_load(&s_force_portable) && __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

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

/* The horizontal weights laid out for the AVX2 pass: per output pixel and
 * group of 4 taps, 16 int16 of the low 15 bits of each weight then 16 of
 * the high bits, in the lanes the byte shuffle puts pixels in:
 * [w0 w1 w0 w1 w0 w1 0 0 | w2 w3 w2 w3 w2 w3 0 0] (R, G, B pairs). Since
 * w = hi * 2^15 + lo, the two products summed give PIL's exact sum. */
static int
s_split_weights(const emlio__resample_t *rs, emlio_transform_ws_t *ws,
                const int32_t *kk, char *errbuf, size_t errlen)
{
    size_t nx = (size_t)rs->x.n, g = rs->groups;
    int rc = emlio__ws_reserve(ws, &ws->coef16, nx * g * 32 * sizeof(int16_t),
                               errbuf, errlen);
    if (rc < 0)
        return rc;
    int16_t *out = ws->coef16.p;
    memset(out, 0, nx * g * 32 * sizeof(int16_t));
    for (size_t u = 0; u < nx; u++)
        for (size_t t = 0; t < EMLIO_MIN(rs->ksize_x, 4 * g); t++) {
            int32_t w = kk[u * rs->ksize_x + t];
            int16_t lo = (int16_t)(w & 0x7fff);
            int16_t hi = (int16_t)((w - lo) / 32768);
            int16_t *grp = out + (u * g + t / 4) * 32;
            size_t lane = (t % 4) / 2 * 8 + t % 2;
            for (size_t c = 0; c < 3; c++) {
                grp[lane + 2 * c] = lo;
                grp[16 + lane + 2 * c] = hi;
            }
        }
    return 0;
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
    /* PIL's ksize bounds the taps; the widest pixel often uses fewer
     * (scale 1.4: ksize 5, at most 4 taps), and one group fewer halves the
     * AVX2 pass's work. */
    int32_t taps = 1;
    for (uint64_t u = 0; u < nx; u++)
        taps = EMLIO_MAX(taps, bx[u * 2 + 1]);
    rs->groups = (uint32_t)((taps + 3) / 4);
    if (!s_use_avx2() || rs->groups > MAX_GROUPS) {
        rs->groups = 0;
        return 0;
    }
    return s_split_weights(rs, ws, kkx, errbuf, errlen);
}

int
emlio__resample_reserve_region(const emlio__resample_t *rs,
                               emlio_transform_ws_t *ws, size_t bytes,
                               char *errbuf, size_t errlen)
{
    /* The AVX2 pass loads 16 bytes per 4 taps from a pixel's first tap. */
    size_t slack = (size_t)rs->groups * 12 + 16 + 64;
    int rc = emlio__ws_reserve(ws, &ws->region, bytes + slack, errbuf, errlen);
    if (rc == 0)
        memset((uint8_t *)ws->region.p + bytes, 0, slack);
    return rc;
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

#if HAVE_AVX2_PASS
/* s_row_horizontal with AVX2, two rows at a time (they share the weights):
 * 4 taps per step, each pixel's R, G and B pairs multiplied by 16-bit
 * weight halves (pmaddwd) and summed in 32 bits; the same integers as the
 * portable loop, so the same bytes. src1 may equal src0 (one row). */
__attribute__((target("avx2"))) static inline __m256i
s_taps_avx2(const uint8_t *p, __m256i shuf, __m256i wl, __m256i wh)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(b), shuf);
    /* hi * 2^15 + lo: the exact 32-bit sum (see s_split_weights) */
    return _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(v, wh), 15),
                            _mm256_madd_epi16(v, wl));
}

__attribute__((target("avx2"))) static void
s_rows_horizontal_avx2(const uint8_t *src0, const uint8_t *src1,
                       uint32_t x_first, uint8_t *dst0, uint8_t *dst1,
                       uint32_t nx, const int32_t *bounds, const int16_t *k16,
                       uint32_t groups, bool flip)
{
    const __m256i shuf = _mm256_setr_epi8(
        0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 6, -1, 9, -1,
        7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
    const __m256i half = _mm256_set1_epi32(HALF);
    for (uint32_t u = 0; u < nx; u++) {
        size_t off = 0;
        if (bounds[u * 2 + 1] > 0)
            off = (size_t)(bounds[u * 2] - (int32_t)x_first) * 3;
        const int16_t *k = k16 + (size_t)u * groups * 32;
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (uint32_t g = 0; g < groups; g++) {
            __m256i wl = _mm256_loadu_si256((const __m256i *)(k + g * 32));
            __m256i wh = _mm256_loadu_si256((const __m256i *)(k + g * 32 + 16));
            size_t at = off + 12 * (size_t)g;
            s0 = _mm256_add_epi32(s0, s_taps_avx2(src0 + at, shuf, wl, wh));
            s1 = _mm256_add_epi32(s1, s_taps_avx2(src1 + at, shuf, wl, wh));
        }
        /* Lanes: taps 0-1 and 2-3 of each row; add them, row 0 low. */
        __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(s0, s1, 0x20),
                                     _mm256_permute2x128_si256(s0, s1, 0x31));
        s = _mm256_srai_epi32(_mm256_add_epi32(s, half), PRECISION_BITS);
        s = _mm256_packs_epi32(s, s);  /* clip8: saturate to int16, */
        s = _mm256_packus_epi16(s, s); /* then to 0..255 */
        uint32_t px0 = (uint32_t)_mm256_extract_epi32(s, 0);
        uint32_t px1 = (uint32_t)_mm256_extract_epi32(s, 4);
        size_t d = (size_t)(flip ? nx - 1 - u : u) * 3;
        dst0[d] = (uint8_t)px0;
        dst0[d + 1] = (uint8_t)(px0 >> 8);
        dst0[d + 2] = (uint8_t)(px0 >> 16);
        dst1[d] = (uint8_t)px1;
        dst1[d + 1] = (uint8_t)(px1 >> 8);
        dst1[d + 2] = (uint8_t)(px1 >> 16);
    }
}
#endif

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
    for (size_t r = 0; r < rows; r++) {
#if HAVE_AVX2_PASS
        if (rs->groups) {
            size_t r1 = r + 1 < rows ? r + 1 : r; /* the last row alone */
            s_rows_horizontal_avx2(region + r * stride, region + r1 * stride,
                                   region_x0, temp + r * row_bytes,
                                   temp + r1 * row_bytes, (uint32_t)nx, bx,
                                   ws->coef16.p, rs->groups, rs->flip);
            r = r1;
            continue;
        }
#endif
        s_row_horizontal(region + r * stride, region_x0, temp + r * row_bytes,
                         (uint32_t)nx, bx, kkx, rs->ksize_x, rs->flip);
    }
    for (size_t v = 0; v < ny; v++)
        s_row_vertical(temp, row_bytes, (int32_t)rs->y0, by + 2 * v,
                       kky + v * rs->ksize_y, ws->acc.p, out + v * row_bytes);
    return 0;
}
