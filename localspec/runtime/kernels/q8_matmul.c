/* y = x · Wᵀ for 8-bit weights in groups of 32 along K (GGUF Q8_0: w = q·d, q in -128..127, d float16), bfloat16
 * activations, float32 sums and float32 outputs: the LM head of a GGUF whose token embedding is Q8_0, read as the
 * file stores it (30 MB for SmolLM2's 49,152 × 576 instead of 57 MB of bfloat16).
 *
 * One thread computes one output in one fixed order whatever the row count, so a row's logits do not depend on the
 * other rows of the call (bitwise); the codes of 16 outputs are expanded once for up to Q8_CHUNK rows. Two builds of
 * that contract, picked by the compiler's target like the q4 kernel's (a machine runs one; they round differently):
 *
 *   avx512bf16  per group and lane, Σ q_k·x_k from vdpbf16ps over the pairs (2j, 2j+1) in j order (a code is exact
 *               in bfloat16, so every product is exact), then acc = fma(d, Σ, acc). A pair of codes is expanded
 *               once for every row of the pass; a row costs a quarter of the AVX2 build's multiply-adds.
 *   avx2        two partial sums of q_k·x_k by fused multiply-add in k order, even k and odd k, then
 *               acc = fma(d, s_even + s_odd, acc) (every CPU the q4 kernel runs on has AVX2, FMA and F16C).
 *
 * q8k_matmul is the same body for GGUF K-quant sub-blocks: groups of 16 along K with a float32 scale and a float32
 * offset each, w = d·q + m (Q6_K: d·sc and q − 32, m = 0; Q5_K: d·sc and q, m = −dmin·mn, each exact in float32;
 * Q5_1: its float16 d and m), the offset added per group as acc = fma(m, Σx, acc) after the group's d.
 *
 * Layouts (runtime/q4_kernel.py pack_q8, pack_q8k):
 *   q8   codes [N/16][K/32][32][16] int8: block (nb, g), k, lane i = q[16nb+i][32g+k]
 *        d     [N/16][K/32][16]     float16: d of outputs 16nb..16nb+15 in group g
 *   q8k  codes [N/16][K/16][16][16] int8: lane i = q[16nb+i][16g+k]
 *        dm    [N/16][K/16][2][16]  float32: d, then m, of outputs 16nb..16nb+15 in group g
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "limits.h" /* LOCALSPEC_AVX512BF16 / LOCALSPEC_AVX2 */
#include "scalar.h" /* rows_per_pass, group_sums */

#if defined(LOCALSPEC_AVX512BF16)

#define Q8_CHUNK 12 /* rows per pass over a block of codes: one accumulator and one partial sum a row */

/* Pair j of a group's codes as bfloat16 pairs: lane i = (q[2j][i], q[2j+1][i]) (even k in the low half). A small
 * integer's float32 is exact, and its upper half is its bfloat16. */
static inline __m512i q8_pair(const int8_t *c, int j) {
    const __m512 even = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + 32 * j))));
    const __m512 odd = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + 32 * j + 16))));
    return _mm512_mask_blend_epi16(0xAAAAAAAAu, _mm512_srli_epi32(_mm512_castps_si512(even), 16),
                                   _mm512_castps_si512(odd));
}

/* wide: the q8k layout (groups of 16, float32 d and m, xsum its Σx per group); else q8's (32, float16 d). */
static inline __attribute__((always_inline)) void q8_block_rows(const int8_t *codes, const void *scales, int wide,
                                                                const uint16_t *x, const float *xsum, int k,
                                                                int groups, int rows, float *y, int n, int n0) {
    const int len = wide ? 16 : 32;
    __m512 acc[Q8_CHUNK], part[Q8_CHUNK];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const int8_t *c = codes + (size_t)g * len * 16;
        const uint32_t *xg = (const uint32_t *)(x + (size_t)g * len); /* bf16 pairs (2j, 2j+1) */
        for (int r = 0; r < rows; r++) part[r] = _mm512_setzero_ps();
        for (int j = 0; j < len / 2; j++) {
            const __m512i w = q8_pair(c, j);
            for (int r = 0; r < rows; r++)
                part[r] = _mm512_dpbf16_ps(part[r], (__m512bh)w, (__m512bh)_mm512_set1_epi32(xg[(size_t)r * k / 2 + j]));
        }
        if (wide) {
            const float *p = (const float *)scales + (size_t)g * 32;
            const __m512 d = _mm512_loadu_ps(p), m = _mm512_loadu_ps(p + 16);
            for (int r = 0; r < rows; r++) {
                acc[r] = _mm512_fmadd_ps(d, part[r], acc[r]);
                acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[(size_t)r * groups + g]), acc[r]);
            }
        } else {
            const uint16_t *p = (const uint16_t *)scales + (size_t)g * 16;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
            for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(d, part[r], acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * n + n0, acc[r]);
}

static inline __attribute__((always_inline)) void q8_output_block(const uint16_t *x, const float *xsum,
                                                                  const int8_t *codes, const void *scales, int wide,
                                                                  float *y, int rows, int per, int k, int n, int nb) {
    const int len = wide ? 16 : 32, groups = k / len;
    const int8_t *c = codes + (size_t)nb * groups * len * 16;
    const void *p = (const char *)scales + (size_t)nb * groups * (wide ? 32 * 4 : 16 * 2);
    for (int r0 = 0; r0 < rows; r0 += per) {
        const int count = rows - r0 < per ? rows - r0 : per;
        const uint16_t *xr = x + (size_t)r0 * k;
        const float *sr = wide ? xsum + (size_t)r0 * groups : NULL;
        float *yr = y + (size_t)r0 * n;
        switch (count) { /* a constant row count per case keeps the accumulators in registers */
#define ROWS(R) \
    case R: q8_block_rows(c, p, wide, xr, sr, k, groups, R, yr, n, nb * 16); break;
            ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
        }
    }
}

static int q8_run(const uint16_t *x, const int8_t *codes, const void *scales, int wide, float *y, int rows, int k,
                  int n, int threads) {
    const int blocks = n / 16;
    float *xsum = NULL;
    if (wide) {
        xsum = malloc(sizeof(float) * ((size_t)rows * (k / 16) + 1));
        if (xsum == NULL) return -1;
        group_sums(x, rows, k, 16, xsum);
    }
    const int per = rows_per_pass(rows, Q8_CHUNK);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int nb = 0; nb < blocks; nb++) { /* a constant layout per branch: each is its own specialized code */
        if (wide)
            q8_output_block(x, xsum, codes, scales, 1, y, rows, per, k, n, nb);
        else
            q8_output_block(x, xsum, codes, scales, 0, y, rows, per, k, n, nb);
    }
    free(xsum);
    return 0;
}

#elif defined(LOCALSPEC_AVX2)

#define Q8_CHUNK 12

static inline void q8_expand(const int8_t *c, int len, float *q) { /* q[k][lane], k = 0..len-1, lane = 0..15 */
    for (int k = 0; k < len; k++) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(c + k * 16));
        _mm256_storeu_ps(q + k * 16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
        _mm256_storeu_ps(q + k * 16 + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
    }
}

/* acc = fma(d, s_even + s_odd, acc), then (q8k: m not NULL) acc = fma(m, Σx, acc). */
static inline void q8_finish(__m256 p[2][2], const __m256 *d, const __m256 *m, float xsum, float *acc) {
    for (int half = 0; half < 2; half++) {
        __m256 a = _mm256_fmadd_ps(d[half], _mm256_add_ps(p[0][half], p[1][half]), _mm256_loadu_ps(acc + half * 8));
        if (m != NULL) a = _mm256_fmadd_ps(m[half], _mm256_set1_ps(xsum), a);
        _mm256_storeu_ps(acc + half * 8, a);
    }
}

static inline void q8_one_row(const int8_t *c, int len, const float *x, const __m256 *d, const __m256 *m,
                              float xsum, float *acc) {
    __m256 p[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int k = 0; k < len; k += 2)
        for (int e = 0; e < 2; e++) { /* e: even / odd k, a constant index once unrolled */
            const __m128i b = _mm_loadu_si128((const __m128i *)(c + (k + e) * 16));
            const __m256 xb = _mm256_broadcast_ss(x + k + e);
            p[e][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), xb, p[e][0]);
            p[e][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), xb, p[e][1]);
        }
    q8_finish(p, d, m, xsum, acc);
}

static inline void q8_rows(const float *q, int len, const float *x, const float *x2, const __m256 *d,
                           const __m256 *m, float xsum, float xsum2, float *acc,
                           float *acc2) { /* one row (x2 NULL) or two from the expanded codes */
    __m256 p[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    __m256 p2[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int k = 0; k < len; k += 2)
        for (int e = 0; e < 2; e++) {
            const __m256 w0 = _mm256_loadu_ps(q + (k + e) * 16), w1 = _mm256_loadu_ps(q + (k + e) * 16 + 8);
            const __m256 xb = _mm256_broadcast_ss(x + k + e);
            p[e][0] = _mm256_fmadd_ps(w0, xb, p[e][0]);
            p[e][1] = _mm256_fmadd_ps(w1, xb, p[e][1]);
            if (x2 != NULL) {
                const __m256 xb2 = _mm256_broadcast_ss(x2 + k + e);
                p2[e][0] = _mm256_fmadd_ps(w0, xb2, p2[e][0]);
                p2[e][1] = _mm256_fmadd_ps(w1, xb2, p2[e][1]);
            }
        }
    q8_finish(p, d, m, xsum, acc);
    if (x2 != NULL) q8_finish(p2, d, m, xsum2, acc2);
}

/* wide: the q8k layout (groups of 16, float32 d and m); else q8's (32, float16 d). */
static inline __attribute__((always_inline)) void q8_output_block(const float *xf, const float *xsum,
                                                                  const int8_t *codes, const void *scales, int wide,
                                                                  float *y, int rows, int k, int n, int nb) {
    const int len = wide ? 16 : 32, groups = k / len;
    float q[32 * 16] __attribute__((aligned(32))), acc[Q8_CHUNK * 16];
    for (int r0 = 0; r0 < rows; r0 += Q8_CHUNK) {
        const int count = rows - r0 < Q8_CHUNK ? rows - r0 : Q8_CHUNK;
        memset(acc, 0, sizeof(float) * 16 * count);
        for (int g = 0; g < groups; g++) {
            const size_t at = (size_t)nb * groups + g;
            __m256 d[2], m[2];
            for (int half = 0; half < 2; half++)
                if (wide) {
                    d[half] = _mm256_loadu_ps((const float *)scales + at * 32 + half * 8);
                    m[half] = _mm256_loadu_ps((const float *)scales + at * 32 + 16 + half * 8);
                } else {
                    d[half] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)scales + at * 16 + half * 8)));
                }
            const __m256 *mm = wide ? m : NULL;
            const int8_t *c = codes + at * len * 16;
            const float *xr = xf + (size_t)r0 * k + g * len;
            const float *sr = wide ? xsum + (size_t)r0 * groups + g : NULL; /* row r's: sr[r * groups] */
#define XSUM(r) (wide ? sr[(size_t)(r) * groups] : 0.0f)
            if (count == 1) {
                q8_one_row(c, len, xr, d, mm, XSUM(0), acc);
                continue;
            }
            q8_expand(c, len, q);
            int r = 0;
            for (; r + 1 < count; r += 2)
                q8_rows(q, len, xr + (size_t)r * k, xr + (size_t)(r + 1) * k, d, mm, XSUM(r), XSUM(r + 1),
                        acc + r * 16, acc + (r + 1) * 16);
            if (r < count) q8_rows(q, len, xr + (size_t)r * k, NULL, d, mm, XSUM(r), 0.0f, acc + r * 16, NULL);
#undef XSUM
        }
        for (int r = 0; r < count; r++) memcpy(y + (size_t)(r0 + r) * n + nb * 16, acc + r * 16, sizeof(float) * 16);
    }
}

static int q8_run(const uint16_t *x, const int8_t *codes, const void *scales, int wide, float *y, int rows, int k,
                  int n, int threads) {
    const int blocks = n / 16;
    float *xf = malloc(sizeof(float) * ((size_t)rows * k + (size_t)rows * (k / 16) + 1)); /* x, then Σx (q8k) */
    if (xf == NULL) return -1;
    float *xsum = xf + (size_t)rows * k;
    for (size_t i = 0; i < (size_t)rows * k; i++) xf[i] = bf16_to_float(x[i]);
    if (wide) group_sums(x, rows, k, 16, xsum);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int nb = 0; nb < blocks; nb++) { /* a constant layout per branch: each is its own specialized code */
        if (wide)
            q8_output_block(xf, xsum, codes, scales, 1, y, rows, k, n, nb);
        else
            q8_output_block(xf, xsum, codes, scales, 0, y, rows, k, n, nb);
    }
    free(xf);
    return 0;
}

#endif

#if defined(LOCALSPEC_AVX512BF16) || defined(LOCALSPEC_AVX2)
/* x [M, K] bf16, y [M, N] float32, both contiguous; K % 32 == 0, N % 16 == 0. Returns 0, or -1 when out of memory. */
int q8_matmul(const uint16_t *x, const int8_t *codes, const uint16_t *dscale, float *y, int rows, int k, int n,
              int threads) {
    return q8_run(x, codes, dscale, 0, y, rows, k, n, threads);
}

/* The q8k layout: K % 16 == 0, dm [N/16][K/16][2][16] float32. */
int q8k_matmul(const uint16_t *x, const int8_t *codes, const float *dm, float *y, int rows, int k, int n,
               int threads) {
    return q8_run(x, codes, dm, 1, y, rows, k, n, threads);
}
#endif
