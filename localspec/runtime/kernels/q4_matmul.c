/* y = x · Wᵀ for 4-bit weights in groups of 32 along K (w = q·d + m, q in 0..15, d and m float16) and bfloat16
 * activations, on AVX-512 with BF16 dot products. Every output element is computed by one thread in one fixed order
 * whatever the row count M, so a row's result does not depend on the other rows in the call (bitwise); the weights
 * of 16 outputs are expanded once for up to CHUNK rows, which is what keeps a (K+1)-row verify cheap.
 *
 * Layout (runtime/q4_kernel.py packs it):
 *   codes [N/16][K/32][16][16] uint8: block (nb, g), pair j, lane i = q[16nb+i][32g+2j] | q[16nb+i][32g+2j+1] << 4
 *   dm    [N/16][K/32][2][16]  float16: d, then m, of outputs 16nb..16nb+15 in group g
 *
 * A code q becomes the bfloat16 of 128 + q by bit pattern alone (0x4300 | q: 128..143 are exact in bfloat16), so
 * Σ_k (128 + q_k)·x_k comes from vdpbf16ps with exact products, and per group
 *   Σ_k w_k·x_k = d·Σ(128 + q_k)·x_k + (m − 128·d)·Σ x_k.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 12 /* rows per pass over a block of weights: 2 accumulators a row, 24 of the 32 registers */

static inline __attribute__((always_inline)) void block_rows(const uint8_t *codes, const uint16_t *dm,
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
        const uint16_t *p = dm + (size_t)g * 32;
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 m = _mm512_fmadd_ps(minus128, d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16))));
        for (int r = 0; r < rows; r++) {
            acc[r] = _mm512_fmadd_ps(d, part[r], acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[(size_t)r * groups + g]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (size_t)r * n + n0), (__m256i)_mm512_cvtneps_pbh(acc[r]));
}

/* x [M, K] bf16, y [M, N] bf16, both contiguous; K % 32 == 0, N % 16 == 0. Returns 0, or -1 when out of memory. */
int q4_matmul(const uint16_t *x, const uint8_t *codes, const uint16_t *dm, uint16_t *y, int rows, int k, int n,
              int threads) {
    const int groups = k / 32, blocks = n / 16;
    float *xsum = malloc(sizeof(float) * (size_t)rows * groups); /* [M, K/32]: Σ x over each group, in order */
    if (xsum == NULL) return -1;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int i = 0; i < 32; i++) {
                uint32_t bits = (uint32_t)x[(size_t)r * k + g * 32 + i] << 16;
                float f;
                memcpy(&f, &bits, sizeof f);
                s += f;
            }
            xsum[(size_t)r * groups + g] = s;
        }
    const int passes = (rows + CHUNK - 1) / CHUNK, per = (rows + passes - 1) / passes;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int nb = 0; nb < blocks; nb++) {
        const uint8_t *c = codes + (size_t)nb * groups * 256;
        const uint16_t *p = dm + (size_t)nb * groups * 32;
        for (int r0 = 0; r0 < rows; r0 += per) {
            const int count = rows - r0 < per ? rows - r0 : per;
            const uint16_t *xr = x + (size_t)r0 * k;
            const float *sr = xsum + (size_t)r0 * groups;
            uint16_t *yr = y + (size_t)r0 * n;
            switch (count) { /* a constant row count per case keeps the accumulators in registers */
#define ROWS(R) \
    case R: block_rows(c, p, xr, sr, k, groups, R, yr, n, nb * 16); break;
                ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
            }
        }
    }
    free(xsum);
    return 0;
}
