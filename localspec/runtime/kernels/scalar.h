/* Scalar helpers the kernels share: bfloat16 conversions and a fixed exp (a pure function of its input, the same
 * bits whether a compiler runs it 16 lanes at a time or one) and the matmuls' row split. Included by every kernel
 * source. */
#ifndef LOCALSPEC_SCALAR_H
#define LOCALSPEC_SCALAR_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even (finite inputs) */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

static inline float bf16_round(float f) { return bf16_to_float(float_to_bf16(f)); }

/* Rows per pass when a matmul takes a call's rows through a block of weights at most `chunk` at a time: the fewest
 * passes, as even as they come (13 rows, chunk 12: 7 + 6). Only the work split depends on it, never a row's bits. */
static inline int rows_per_pass(int rows, int chunk) {
    const int passes = (rows + chunk - 1) / chunk;
    return passes ? (rows + passes - 1) / passes : 1;
}

/* Σ x over each group of `len` of each bfloat16 row, in order: xsum [M, K/len] (the factor of a group's offset m). */
static inline void group_sums(const uint16_t *x, int rows, int k, int len, float *xsum) {
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < k / len; g++) {
            float s = 0.0f;
            for (int i = 0; i < len; i++) s += bf16_to_float(x[(size_t)r * k + g * len + i]);
            xsum[(size_t)r * (k / len) + g] = s;
        }
}

/* exp(x) for x <= 0 (a score minus its row's maximum, or -|x|): 0 below -87 (exp(-87) < 2^-125: against the
 * values it is added to, far under float32's resolution); otherwise x = n·ln 2 + r with n = round(x / ln 2)
 * (Cody-Waite, ln 2 in two parts), e^r by its Taylor series to r^7 in Horner form (|r| <= ln 2 / 2: truncation under
 * 2^-27), times 2^n built in the exponent bits. Within 2 ulp of e^x; a pure function of x. */
static inline float exp_fixed(float x) {
    const float clamped = x < -87.0f ? -87.0f : x;
    const float shifted = fmaf(clamped, 1.44269504088896341f, 12582912.0f); /* 1.5·2^23: rounds to an integer */
    const float n = shifted - 12582912.0f;
    float r = fmaf(n, -0.693145751953125f, clamped); /* ln 2's first 16 bits: n·that is exact */
    r = fmaf(n, -1.428606765330187e-06f, r);          /* the rest of ln 2 */
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const int32_t bits = ((int32_t)n + 127) << 23; /* n in [-126, 0]: a normal power of two */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}
#endif
