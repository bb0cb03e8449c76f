/* counter_rng.c - a counter-based generator (SplitMix64 mixing keyed on
 * seed, epoch, sample and op) and libm-free exp/log, so the transform's
 * random crops are the same bits on any machine and in any order.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <math.h>

#include "counter_rng.h"

#define GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

uint64_t
emlio__rng_mix(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z;
}

uint64_t
emlio__rng_key(uint64_t seed, uint64_t epoch, uint64_t sample, uint64_t op)
{
    uint64_t h = emlio__rng_mix(seed);
    h = emlio__rng_mix(h ^ epoch);
    h = emlio__rng_mix(h ^ sample);
    return emlio__rng_mix(h ^ op);
}

uint64_t
emlio__rng_draw(uint64_t key, uint64_t n)
{
    return emlio__rng_mix(key + (n + 1) * GOLDEN_GAMMA);
}

double
emlio__rng_uniform(uint64_t key, uint64_t n)
{
    return (double)(emlio__rng_draw(key, n) >> 11) * 0x1.0p-53;
}

uint64_t
emlio__rng_below(uint64_t key, uint64_t n, uint64_t bound)
{
    /* Lemire's multiply-shift without the rejection step: the bias is
     * bound / 2^64, far below anything a crop distribution can show, and a
     * fixed number of draws keeps the stream layout simple to document. */
    unsigned __int128 p = (unsigned __int128)emlio__rng_draw(key, n) * bound;
    return (uint64_t)(p >> 64);
}

/* log(x) = e * ln2 + 2 * atanh((m - 1) / (m + 1)) with x = m * 2^e and m in
 * [sqrt(1/2), sqrt(2)), so |s| < 0.172 and the odd series converges fast:
 * terms up to s^41 bring the error below 1e-17. ln2 is split in a high
 * part with trailing zero bits and a low part so e * ln2_hi is exact. */
double
emlio__det_log(double x)
{
    static const double ln2_hi = 6.93147180369123816490e-01;
    static const double ln2_lo = 1.90821492927058770002e-10;
    int e = 0;
    double m = frexp(x, &e); /* exact: a bit-field operation */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0);
    double s2 = s * s;
    double sum = 0.0;
    for (int k = 41; k >= 3; k -= 2)
        sum = (sum + 1.0 / k) * s2;
    double atanh2 = 2.0 * s + 2.0 * s * sum;
    return (double)e * ln2_hi + ((double)e * ln2_lo + atanh2);
}

/* exp(x) = 2^k * exp(r) with k = round(x / ln2) and |r| <= ln2 / 2, then a
 * Taylor series to r^20 (error below 1e-17 for |r| <= 0.347). */
double
emlio__det_exp(double x)
{
    static const double ln2_hi = 6.93147180369123816490e-01;
    static const double ln2_lo = 1.90821492927058770002e-10;
    static const double inv_ln2 = 1.44269504088896338700e+00;
    double k = emlio__det_round(x * inv_ln2);
    double r = (x - k * ln2_hi) - k * ln2_lo;
    double sum = 1.0;
    for (int n = 20; n >= 1; n--)
        sum = 1.0 + sum * r / n;
    return ldexp(sum, (int)k); /* exact: changes the exponent only */
}

double
emlio__det_round(double x)
{
    double f = floor(x); /* exact in IEEE-754 */
    double d = x - f;    /* exact: f and x share the binade's grid */
    if (d > 0.5)
        return f + 1.0;
    if (d < 0.5)
        return f;
    return fmod(f, 2.0) == 0.0 ? f : f + 1.0; /* fmod is exact too */
}
