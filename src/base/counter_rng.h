/* counter_rng.h - the transform pipeline's counter-based generator and the
 * deterministic maths its draws go through (no libm: exp and log here use
 * only IEEE-754 +, -, *, /, so every machine computes the same bits).
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_COUNTER_RNG_H
#define EMLIO_COUNTER_RNG_H

#include <stdint.h>

/* The SplitMix64 finaliser (a bijection of 64-bit words). */
uint64_t emlio__rng_mix(uint64_t z);

/* The key of one op's stream: mix(mix(mix(mix(seed) ^ epoch) ^ sample) ^ op).
 */
uint64_t emlio__rng_key(uint64_t seed, uint64_t epoch, uint64_t sample,
                        uint64_t op);

/* Draw n of the stream key: mix(key + (n + 1) * golden gamma). */
uint64_t emlio__rng_draw(uint64_t key, uint64_t n);

/* Draw n as a double uniform in [0, 1): the top 53 bits times 2^-53. */
double emlio__rng_uniform(uint64_t key, uint64_t n);

/* Draw n as an integer in [0, bound): the high word of draw * bound. */
uint64_t emlio__rng_below(uint64_t key, uint64_t n, uint64_t bound);

/* Natural logarithm and exponential for finite, positive (log) or
 * moderate (|x| < 700, exp) arguments, to ~1 ulp, the same bits on every
 * IEEE-754 machine. */
double emlio__det_log(double x);
double emlio__det_exp(double x);

/* Rounds half to even, as Python's round(): the same bits everywhere. */
double emlio__det_round(double x);

#endif /* EMLIO_COUNTER_RNG_H */
