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

#if defined(__AVX2__)
#include <immintrin.h>

/* 8 bfloat16 → float32 (exact). */
static inline __m256 bf16x8(const uint16_t *x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x)), 16));
}

/* The sum of a vector's 8 lanes in one fixed order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
static inline float lanes_sum(__m256 v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* li + l(i+4) */
    const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));                      /* h0 + h2, h1 + h3 */
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

static inline float lanes_max(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* 16 int32 in -127..127 (two vectors) → 16 int8 in order. */
static inline __m128i to_int8(__m256i a, __m256i b) {
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8); /* a0..7, b0..7 as int16 */
    return _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}

/* Each row's activations as int8, per group of `len` (16 or 32; ggml's Q8 activations): a = max |x|, s = a / 127
 * and x̂ = rint(x · (127 / a)) in float32 (0 where a is 0; rounding half to even, as cvtps2dq does); and Σ x of the
 * group, summed in one fixed order: lane j of 8 takes x_j + x_(j+8) (+ x_(j+16) + x_(j+24)), left to right, then
 * lanes_sum. Vectors of 8 lanes (AVX2, which every build's CPU has), so every build computes the same bits; each row
 * is computed alone (a pure function of the row), the rows split over `threads`. xq [M, K] int8, scale and xsum
 * [M, K/len] float. */
static inline void quantize_rows(const uint16_t *x, int rows, int k, int len, int8_t *xq, float *scale, float *xsum,
                                 int threads) {
    const int groups = k / len, parts = len / 8;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i top_code = _mm256_set1_epi32(127), bottom_code = _mm256_set1_epi32(-127);
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 8)
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            const uint16_t *xg = x + (size_t)r * k + (size_t)g * len;
            __m256 v[4], sum, top;
            for (int p = 0; p < parts; p++) v[p] = bf16x8(xg + 8 * p);
            sum = v[0];
            top = _mm256_andnot_ps(sign, v[0]);
            for (int p = 1; p < parts; p++) {
                sum = _mm256_add_ps(sum, v[p]);
                top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[p]));
            }
            const size_t at = (size_t)r * groups + g;
            const float a = lanes_max(top);
            const float inverse = a > 0.0f ? 127.0f / a : 0.0f;
            xsum[at] = lanes_sum(sum);
            scale[at] = a / 127.0f;
            __m256i q[4];
            for (int p = 0; p < parts; p++) {
                q[p] = _mm256_cvtps_epi32(_mm256_mul_ps(v[p], _mm256_set1_ps(inverse)));
                q[p] = _mm256_max_epi32(_mm256_min_epi32(q[p], top_code), bottom_code);
            }
            int8_t *out = xq + (size_t)r * k + (size_t)g * len;
            for (int p = 0; p < parts; p += 2) _mm_storeu_si128((__m128i *)(out + 8 * p), to_int8(q[p], q[p + 1]));
        }
}
#endif

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
