/* y = x · Wᵀ for 4-bit weights in groups of 32 along K (w = q·d + m, q in 0..15) and bfloat16 activations, float32
 * sums: q4_matmul with float16 d and m (GGUF Q4_1, Q4_0), q4f_matmul with float32 ones (GGUF Q4_K, whose d·sc and
 * dmin·m of a sub-block are exact in float32 and not in float16); one body, the scales' width a constant of it. Every output element is computed by one thread in one fixed order whatever the row
 * count M, so a row's result does not depend on the other rows in the call (bitwise); the weights of 16 outputs are
 * expanded once for up to CHUNK rows, which is what keeps a (K+1)-row verify cheap. Two builds of the same contract,
 * picked by the compiler's target (-march=native):
 *
 *   avx512bf16  AVX-512 BF16 dot products (AMD Zen 4+, Intel Sapphire Rapids+). A code q becomes the bfloat16 of
 *               128 + q by bit pattern alone (0x4300 | q: 128..143 are exact in bfloat16), so Σ(128 + q_k)·x_k comes
 *               from vdpbf16ps with exact products, and per group Σ w·x = d·Σ(128 + q)·x + (m − 128·d)·Σ x.
 *   avx2        AVX2 + FMA + F16C (most desktop CPUs: Intel Haswell+, AMD Zen 1-3). Codes become float32, x
 *               float32 (exact from bfloat16); per group Σ w·x = d·Σ q·x + m·Σ x, Σ q·x as two partial sums
 *               (even and odd k, fused multiply-adds in k order) added at the end.
 *
 * The two round differently from each other (each is row-invariant on its own; a machine runs one).
 *
 * Layout (runtime/q4_kernel.py packs it):
 *   codes [N/16][K/32][16][16] uint8: block (nb, g), pair j, lane i = q[16nb+i][32g+2j] | q[16nb+i][32g+2j+1] << 4
 *   dm    [N/16][K/32][2][16]  float16 (q4f: float32): d, then m, of outputs 16nb..16nb+15 in group g
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "limits.h" /* LOCALSPEC_AVX512BF16 / LOCALSPEC_AVX2 */
#include "scalar.h" /* rows_per_pass, float_to_bf16, group_sums */

#if defined(LOCALSPEC_AVX512BF16)

#define CHUNK 12 /* rows per pass over a block of weights: 2 accumulators a row, 24 of the 32 registers */

/* Group g's d and m of a block's 16 outputs, from its (d, m) pairs: float16, or float32 where `wide`. */
static inline __attribute__((always_inline)) void scales(const void *dm, int wide, int g, __m512 *d, __m512 *m) {
    if (wide) {
        const float *p = (const float *)dm + (size_t)g * 32;
        *d = _mm512_loadu_ps(p);
        *m = _mm512_loadu_ps(p + 16);
    } else {
        const uint16_t *p = (const uint16_t *)dm + (size_t)g * 32;
        *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
    }
}


static inline __attribute__((always_inline)) void block_rows(const uint8_t *codes, const void *dm, int wide,
                                                             const uint16_t *x, const float *xsum, int k, int groups,
                                                             int rows, uint16_t *y, int n, int n0) {
    __m512 acc[CHUNK], part[CHUNK];
    const __m512i nibbles = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
    const __m512 minus128 = _mm512_set1_ps(-128.0f);
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *c = codes + (size_t)g * 256;
        const uint32_t *xg = (const uint32_t *)(x + (size_t)g * 32); /* bf16 pairs (2j, 2j+1) */
        for (int r = 0; r < rows; r++) part[r] = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) {
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + j * 16)));
            /* (b | b << 12) & 0x000F000F puts the low nibble at bits 0..3, the high one at 16..19 */
            __m512i w = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), nibbles, 0xA8);
            w = _mm512_or_si512(w, bias);
            for (int r = 0; r < rows; r++)
                part[r] = _mm512_dpbf16_ps(part[r], (__m512bh)w, (__m512bh)_mm512_set1_epi32(xg[(size_t)r * k / 2 + j]));
        }
        __m512 d, m;
        scales(dm, wide, g, &d, &m);
        m = _mm512_fmadd_ps(minus128, d, m);
        for (int r = 0; r < rows; r++) {
            acc[r] = _mm512_fmadd_ps(d, part[r], acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[(size_t)r * groups + g]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (size_t)r * n + n0), (__m256i)_mm512_cvtneps_pbh(acc[r]));
}

#define FEW 3   /* row counts up to this take block_few_rows */
#define SPREAD 4 /* groups whose dot-product chains block_few_rows runs side by side */

/* The same arithmetic as block_rows, for a few rows: a group's 16 dot products are one dependent chain per row, so
 * with one row the chain's latency, not the bytes read, set the pace. This runs SPREAD groups' chains side by side
 * (each group's partial sum still starts at zero and takes its 16 products in j order) and folds them into acc in
 * group order, so every output has exactly block_rows' bits. */
static inline __attribute__((always_inline)) void block_few_rows(const uint8_t *codes, const void *dm, int wide,
                                                                 const uint16_t *x, const float *xsum, int k,
                                                                 int groups, int rows, uint16_t *y, int n, int n0) {
    __m512 acc[FEW], part[SPREAD][FEW];
    const __m512i nibbles = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
    const __m512 minus128 = _mm512_set1_ps(-128.0f);
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g0 = 0; g0 < groups; g0 += SPREAD) {
        const int spread = groups - g0 < SPREAD ? groups - g0 : SPREAD;
        for (int s = 0; s < spread; s++)
            for (int r = 0; r < rows; r++) part[s][r] = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++)
            for (int s = 0; s < spread; s++) {
                const int g = g0 + s;
                __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + (size_t)g * 256 + j * 16)));
                __m512i w = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), nibbles, 0xA8);
                w = _mm512_or_si512(w, bias);
                const uint32_t *xg = (const uint32_t *)(x + (size_t)g * 32);
                for (int r = 0; r < rows; r++)
                    part[s][r] = _mm512_dpbf16_ps(part[s][r], (__m512bh)w,
                                                  (__m512bh)_mm512_set1_epi32(xg[(size_t)r * k / 2 + j]));
            }
        for (int s = 0; s < spread; s++) {
            const int g = g0 + s;
            __m512 d, m;
            scales(dm, wide, g, &d, &m);
            m = _mm512_fmadd_ps(minus128, d, m);
            for (int r = 0; r < rows; r++) {
                acc[r] = _mm512_fmadd_ps(d, part[s][r], acc[r]);
                acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[(size_t)r * groups + g]), acc[r]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (size_t)r * n + n0), (__m256i)_mm512_cvtneps_pbh(acc[r]));
}

/* The rows of a call through output block nb, `per` rows a pass. */
static inline __attribute__((always_inline)) void output_block(const uint16_t *x, const float *xsum,
                                                               const uint8_t *codes, const void *dm, int wide,
                                                               uint16_t *y, int rows, int per, int k, int n, int nb) {
    const int groups = k / 32;
    const uint8_t *c = codes + (size_t)nb * groups * 256;
    const void *p = (const char *)dm + (size_t)nb * groups * 32 * (wide ? 4 : 2);
    for (int r0 = 0; r0 < rows; r0 += per) {
        const int count = rows - r0 < per ? rows - r0 : per;
        const uint16_t *xr = x + (size_t)r0 * k;
        const float *sr = xsum + (size_t)r0 * groups;
        uint16_t *yr = y + (size_t)r0 * n;
        switch (count) { /* a constant row count per case keeps the accumulators in registers */
#define FEW_ROWS(R) \
    case R: block_few_rows(c, p, wide, xr, sr, k, groups, R, yr, n, nb * 16); break;
#define ROWS(R) \
    case R: block_rows(c, p, wide, xr, sr, k, groups, R, yr, n, nb * 16); break;
            FEW_ROWS(1) FEW_ROWS(2) FEW_ROWS(3)
            ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
#undef FEW_ROWS
        }
    }
}

static int q4_run(const uint16_t *x, const uint8_t *codes, const void *dm, int wide, uint16_t *y, int rows, int k,
                  int n, int threads) {
    const int groups = k / 32, blocks = n / 16;
    float *xsum = malloc(sizeof(float) * (size_t)rows * groups); /* [M, K/32]: Σ x over each group, in order */
    if (xsum == NULL) return -1;
    group_sums(x, rows, k, 32, xsum);
    const int per = rows_per_pass(rows, CHUNK);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int nb = 0; nb < blocks; nb++) { /* a constant width per branch: each is its own specialized code */
        if (wide)
            output_block(x, xsum, codes, dm, 1, y, rows, per, k, n, nb);
        else
            output_block(x, xsum, codes, dm, 0, y, rows, per, k, n, nb);
    }
    free(xsum);
    return 0;
}

#elif defined(LOCALSPEC_AVX2)

#define CHUNK 12 /* rows per pass over a block of weights (their sums live in memory, not registers) */


/* The 16 pairs of a block's group as float32 codes, k-major: q[k][lane], k = 0..31, lane = 0..15. */
static inline void expand(const uint8_t *c, float *q) {
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (int j = 0; j < 16; j++)
        for (int half = 0; half < 2; half++) {
            __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + j * 16 + half * 8)));
            _mm256_storeu_ps(q + (2 * j) * 16 + half * 8, _mm256_cvtepi32_ps(_mm256_and_si256(b, low)));
            _mm256_storeu_ps(q + (2 * j + 1) * 16 + half * 8, _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)));
        }
}

/* The rule every row follows, per group and lane: two partial sums of q_k·x_k by fused multiply-add in k order,
 * even k and odd k, then acc = fma(m, Σx, fma(d, s_even + s_odd, acc)). The three functions below apply it to one
 * row (codes expanded in registers), and to one or two rows at a time from q (expanded once for up to CHUNK rows);
 * they differ in which registers hold what, never in the operations, so a row's bits are the same in any call
 * (the self-check compares rows alone and inside calls of 1..13 rows). */
static inline __attribute__((always_inline)) void scales(const void *dm, int wide, size_t g, __m256 *d, __m256 *m) {
    for (int half = 0; half < 2; half++)
        if (wide) {
            const float *p = (const float *)dm + g * 32;
            d[half] = _mm256_loadu_ps(p + half * 8);
            m[half] = _mm256_loadu_ps(p + 16 + half * 8);
        } else {
            const uint16_t *p = (const uint16_t *)dm + g * 32;
            d[half] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + half * 8)));
            m[half] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 + half * 8)));
        }
}

static inline void finish(__m256 p[2][2], const __m256 *d, const __m256 *m, float xsum, float *acc) {
    const __m256 xs = _mm256_set1_ps(xsum);
    for (int half = 0; half < 2; half++) {
        __m256 a = _mm256_fmadd_ps(d[half], _mm256_add_ps(p[0][half], p[1][half]), _mm256_loadu_ps(acc + half * 8));
        _mm256_storeu_ps(acc + half * 8, _mm256_fmadd_ps(m[half], xs, a));
    }
}

static inline void group_one_row(const uint8_t *c, const float *x, const __m256 *d, const __m256 *m, float xsum,
                                 float *acc) {
    const __m256i low = _mm256_set1_epi32(0x0F);
    __m256 p[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int j = 0; j < 16; j++) {
        const __m256 x0 = _mm256_broadcast_ss(x + 2 * j), x1 = _mm256_broadcast_ss(x + 2 * j + 1);
        for (int half = 0; half < 2; half++) {
            __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + j * 16 + half * 8)));
            p[0][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, low)), x0, p[0][half]);
            p[1][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), x1, p[1][half]);
        }
    }
    finish(p, d, m, xsum, acc);
}

static inline void group_row(const float *q, const float *x, const __m256 *d, const __m256 *m, float xsum,
                             float *acc) {
    __m256 p[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int k = 0; k < 32; k += 2)
        for (int e = 0; e < 2; e++) { /* e: even / odd k, a constant index once unrolled */
            const __m256 xb = _mm256_broadcast_ss(x + k + e);
            p[e][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (k + e) * 16), xb, p[e][0]);
            p[e][1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (k + e) * 16 + 8), xb, p[e][1]);
        }
    finish(p, d, m, xsum, acc);
}

static inline void group_two_rows(const float *q, const float *x, const float *x2, const __m256 *d, const __m256 *m,
                                  float xsum, float xsum2, float *acc, float *acc2) {
    __m256 p[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    __m256 p2[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int k = 0; k < 32; k += 2)
        for (int e = 0; e < 2; e++) {
            const __m256 w0 = _mm256_loadu_ps(q + (k + e) * 16), w1 = _mm256_loadu_ps(q + (k + e) * 16 + 8);
            const __m256 xb = _mm256_broadcast_ss(x + k + e), xb2 = _mm256_broadcast_ss(x2 + k + e);
            p[e][0] = _mm256_fmadd_ps(w0, xb, p[e][0]);
            p[e][1] = _mm256_fmadd_ps(w1, xb, p[e][1]);
            p2[e][0] = _mm256_fmadd_ps(w0, xb2, p2[e][0]);
            p2[e][1] = _mm256_fmadd_ps(w1, xb2, p2[e][1]);
        }
    finish(p, d, m, xsum, acc);
    finish(p2, d, m, xsum2, acc2);
}

/* The rows of a call through output block nb, CHUNK rows a pass (xf: x in float32, then Σ x per group). */
static inline __attribute__((always_inline)) void output_block(const float *xf, const float *xsum,
                                                               const uint8_t *codes, const void *dm, int wide,
                                                               uint16_t *y, int rows, int k, int n, int nb) {
    const int groups = k / 32;
    float q[32 * 16] __attribute__((aligned(32))), acc[CHUNK * 16];
    for (int r0 = 0; r0 < rows; r0 += CHUNK) {
        const int count = rows - r0 < CHUNK ? rows - r0 : CHUNK;
        memset(acc, 0, sizeof(float) * 16 * count);
        for (int g = 0; g < groups; g++) {
            __m256 d[2], m[2];
            scales(dm, wide, (size_t)nb * groups + g, d, m);
            const uint8_t *c = codes + ((size_t)nb * groups + g) * 256;
            if (count == 1) {
                group_one_row(c, xf + (size_t)r0 * k + g * 32, d, m, xsum[(size_t)r0 * groups + g], acc);
                continue;
            }
            expand(c, q);
            int r = 0;
            for (; r + 1 < count; r += 2) {
                const size_t a = (size_t)(r0 + r), b = a + 1;
                group_two_rows(q, xf + a * k + g * 32, xf + b * k + g * 32, d, m, xsum[a * groups + g],
                               xsum[b * groups + g], acc + r * 16, acc + (r + 1) * 16);
            }
            if (r < count)
                group_row(q, xf + (size_t)(r0 + r) * k + g * 32, d, m, xsum[(size_t)(r0 + r) * groups + g],
                          acc + r * 16);
        }
        for (int r = 0; r < count; r++)
            for (int i = 0; i < 16; i++) y[(size_t)(r0 + r) * n + nb * 16 + i] = float_to_bf16(acc[r * 16 + i]);
    }
}

static int q4_run(const uint16_t *x, const uint8_t *codes, const void *dm, int wide, uint16_t *y, int rows, int k,
                  int n, int threads) {
    const int groups = k / 32, blocks = n / 16;
    float *xf = malloc(sizeof(float) * ((size_t)rows * k + (size_t)rows * groups)); /* x in float32, then Σ x */
    if (xf == NULL) return -1;
    float *xsum = xf + (size_t)rows * k; /* [M, K/32]: Σ x over each group, in order */
    for (size_t i = 0; i < (size_t)rows * k; i++) {
        uint32_t bits = (uint32_t)x[i] << 16;
        memcpy(xf + i, &bits, sizeof bits);
    }
    group_sums(x, rows, k, 32, xsum);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int nb = 0; nb < blocks; nb++) { /* a constant width per branch: each is its own specialized code */
        if (wide)
            output_block(xf, xsum, codes, dm, 1, y, rows, k, n, nb);
        else
            output_block(xf, xsum, codes, dm, 0, y, rows, k, n, nb);
    }
    free(xf);
    return 0;
}

#endif

#if defined(LOCALSPEC_AVX512BF16) || defined(LOCALSPEC_AVX2)
/* x [M, K] bf16, y [M, N] bf16, both contiguous; K % 32 == 0, N % 16 == 0. Returns 0, or -1 when out of memory. */
int q4_matmul(const uint16_t *x, const uint8_t *codes, const uint16_t *dm, uint16_t *y, int rows, int k, int n,
              int threads) {
    return q4_run(x, codes, dm, 0, y, rows, k, n, threads);
}

/* The same with float32 d and m (dm [N/16][K/32][2][16] float32). */
int q4f_matmul(const uint16_t *x, const uint8_t *codes, const float *dm, uint16_t *y, int rows, int k, int n,
               int threads) {
    return q4_run(x, codes, dm, 1, y, rows, k, n, threads);
}
#endif
