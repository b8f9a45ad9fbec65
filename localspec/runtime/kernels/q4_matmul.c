/* y = x · Wᵀ for 4-bit weights in groups of 32 along K (w = q·d + m, q in 0..15) and bfloat16 activations taken as
 * int8 per row and group: q4_matmul with float16 d and m (GGUF Q4_1, Q4_0), q4f_matmul with float32 ones, q4k_matmul
 * with GGUF Q4_K's own scales (a float16 d and dmin per 256 and 6-bit sc and mn per 32: d·sc and −dmin·mn are exact
 * in float32, so q4k gives q4f's bits from 4.625 bits a weight instead of 6); one body, the scales' form a constant
 * of it.
 *
 * The arithmetic, the same in both builds (so both round alike, bit for bit):
 *   1. each row's activations, per group of 32, as int8 x̂ with a scale s (scalar.h's quantize_rows);
 *   2. per output, group and row, Σ q·x̂ in int32 (exact: at most 32 · 15 · 127);
 *   3. acc = fma(d·s, Σ q·x̂, acc), then acc = fma(m, Σ x, acc), groups in order; y = bf16(acc).
 * Every output element is computed by one thread in one fixed order whatever the row count M, so a row's result
 * does not depend on the other rows in the call (bitwise); the codes of 16 outputs are unpacked once for up to CHUNK
 * rows and a row then costs its integer dot products alone, which is what keeps a (K+1)-row verify cheap. The
 * integer sums are exact, so how a build splits them (vpdpbusd, maddubs) never shows in the result.
 *
 *   avx512bf16  Σ q·x̂ from vpdpbusd (AVX-512 VNNI: 64 byte products a instruction); codes unpacked by one mask
 *               and one shift per 64 of them.
 *   avx2        Σ q·x̂ from vpmaddubsw (pairs into int16: at most 2 · 15 · 127), eight of them added in int16
 *               (at most 8 · 3810 < 32768), then vpmaddwd by ones into int32.
 *   amx         an avx512bf16 build's calls of many rows where the CPU has AMX-INT8 (amx.h): Σ q·x̂ of up to 16
 *               rows from one tdpbsud a group, the codes unpacked into tile B; the same bits.
 *
 * Layout (runtime/q4_kernel.py packs it):
 *   codes [N/16][K/32][4][16][4] uint8: block (nb, g), quad t, lane i, byte b = q[16nb+i][32g+4t+b] |
 *         q[16nb+i][32g+16+4t+b] << 4 (a lane's four bytes are one int32 lane of the dot product instructions)
 *   dm    [N/16][K/32][2][16] float16 (q4f: float32): d, then m, of outputs 16nb..16nb+15 in group g
 *   q4k   [N/16][K/256][320] bytes: d, then dmin, float16 [2][16]; then per group j of the 8, sc, then mn,
 *         uint8 [2][16] (the super-block's outputs 16nb..16nb+15): d_g = d·sc, m_g = −(dmin·mn)
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"    /* LOCALSPEC_AMX, amx_tiles, amx_for */
#include "limits.h" /* LOCALSPEC_AVX512BF16 / LOCALSPEC_AVX2 */
#include "scalar.h" /* rows_per_pass, float_to_bf16, quantize_rows */

#define CHUNK 12 /* rows per pass over a block of codes */

enum { FORM_F16 = 0, FORM_F32 = 1, FORM_K = 2 }; /* the scales' form: q4, q4f, q4k */
#define K_BYTES 320                             /* q4k: a block's scales for one super-block of 256 */

/* Bytes of a block's scales for `groups` groups of 32. */
static inline size_t scale_bytes(int form, int groups) {
    return form == FORM_K ? (size_t)(groups / 8) * K_BYTES : (size_t)groups * 32 * (form == FORM_F32 ? 4 : 2);
}

#if defined(LOCALSPEC_AVX512BF16)

/* Group g's d and m of a block's 16 outputs, in the scales' form. */
static inline __attribute__((always_inline)) void scales(const void *dm, int form, int g, __m512 *d, __m512 *m) {
    if (form == FORM_K) {
        const uint8_t *p = (const uint8_t *)dm + (size_t)(g / 8) * K_BYTES;
        const uint8_t *j = p + 64 + (g % 8) * 32;
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)j)));
        const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(j + 16))));
        *d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), sc);
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        *m = _mm512_xor_ps(_mm512_mul_ps(dmin, mn), _mm512_set1_ps(-0.0f)); /* −(dmin·mn), as q4f's m */
    } else if (form == FORM_F32) {
        const float *p = (const float *)dm + (size_t)g * 32;
        *d = _mm512_loadu_ps(p);
        *m = _mm512_loadu_ps(p + 16);
    } else {
        const uint16_t *p = (const uint16_t *)dm + (size_t)g * 32;
        *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
    }
}

/* `rows` rows (a constant where inlined) through a block's 16 outputs, every group. */
static inline __attribute__((always_inline)) void block_rows(const uint8_t *codes, const void *dm, int form,
                                                             const int8_t *xq, const float *scale, const float *xsum,
                                                             int k, int groups, int rows, uint16_t *y, int n, int n0) {
    __m512 acc[CHUNK];
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i w[8]; /* w[t]: k = 4t..4t+3 of each lane; w[4 + t]: k = 16 + 4t.. */
        for (int t = 0; t < 4; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(codes + (size_t)g * 256 + t * 64));
            w[t] = _mm512_and_si512(v, low);
            w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        __m512 d, m;
        scales(dm, form, g, &d, &m);
        for (int r = 0; r < rows; r++) {
            const int32_t *xr = (const int32_t *)(xq + (size_t)r * k + g * 32); /* 8 quads of x̂ */
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            for (int t = 0; t < 8; t += 2) {
                even = _mm512_dpbusd_epi32(even, w[t], _mm512_set1_epi32(xr[t]));
                odd = _mm512_dpbusd_epi32(odd, w[t + 1], _mm512_set1_epi32(xr[t + 1]));
            }
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
            const size_t at = (size_t)r * groups + g;
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(scale[at])), dot, acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[at]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (size_t)r * n + n0), (__m256i)_mm512_cvtneps_pbh(acc[r]));
}

#if defined(LOCALSPEC_AMX)
/* A block's codes, every group, unpacked for tile B: [groups][8 quads][16 lanes][4] bytes, quad t of the low nibbles
 * (k = 4t..4t+3) as row t, of the high ones (k = 16 + 4t..) as row 4 + t. */
static inline void unpack_block(const uint8_t *codes, int groups, uint8_t *out) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int g = 0; g < groups; g++)
        for (int t = 0; t < 4; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(codes + (size_t)g * 256 + t * 64));
            _mm512_store_si512((void *)(out + (size_t)g * 512 + t * 64), _mm512_and_si512(v, low));
            _mm512_store_si512((void *)(out + (size_t)g * 512 + 256 + t * 64),
                               _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        }
}

/* block_rows' arithmetic with the int32 sums from the tiles (amx_begin's): `rows` ≤ AMX_CHUNK of a pass. */
static inline __attribute__((always_inline)) void block_rows_amx(const uint8_t *unpacked, const void *dm, int form,
                                                                 const int8_t *xq, const float *scale,
                                                                 const float *xsum, int k, int groups, int rows,
                                                                 uint16_t *y, int n, int n0) {
    __m512 acc[AMX_CHUNK];
    int32_t dots[AMX_CHUNK][16] __attribute__((aligned(64)));
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        _tile_loadd(2, unpacked + (size_t)g * 512, 64);
        _tile_loadd(1, xq + g * 32, k);
        _tile_zero(0);
        _tile_dpbsud(0, 1, 2);
        _tile_stored(0, dots, 64);
        __m512 d, m;
        scales(dm, form, g, &d, &m);
        for (int r = 0; r < rows; r++) {
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)dots[r]));
            const size_t at = (size_t)r * groups + g;
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(scale[at])), dot, acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[at]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (size_t)r * n + n0), (__m256i)_mm512_cvtneps_pbh(acc[r]));
}
#endif

#elif defined(LOCALSPEC_AVX2)

static inline __attribute__((always_inline)) void scales(const void *dm, int form, size_t g, int half, __m256 *d,
                                                         __m256 *m) {
    if (form == FORM_K) {
        const uint8_t *p = (const uint8_t *)dm + (g / 8) * K_BYTES;
        const uint8_t *j = p + 64 + (g % 8) * 32 + half * 8;
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)j)));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(j + 16))));
        *d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + half * 16))), sc);
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + half * 16)));
        *m = _mm256_xor_ps(_mm256_mul_ps(dmin, mn), _mm256_set1_ps(-0.0f));
    } else if (form == FORM_F32) {
        const float *p = (const float *)dm + g * 32 + half * 8;
        *d = _mm256_loadu_ps(p);
        *m = _mm256_loadu_ps(p + 16);
    } else {
        const uint16_t *p = (const uint16_t *)dm + g * 32 + half * 8;
        *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        *m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
    }
}

/* As the AVX-512 build's block_rows, one half of the block's lanes (8 outputs) at a time. */
static inline __attribute__((always_inline)) void block_rows(const uint8_t *codes, const void *dm, int form,
                                                             const int8_t *xq, const float *scale, const float *xsum,
                                                             int k, int groups, int rows, uint16_t *y, int n, int n0) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; half++) {
        __m256 acc[CHUNK];
        for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            __m256i w[8];
            for (int t = 0; t < 4; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + (size_t)g * 256 + t * 64 + half * 32));
                w[t] = _mm256_and_si256(v, low);
                w[4 + t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            }
            __m256 d, m;
            scales(dm, form, (size_t)g, half, &d, &m);
            for (int r = 0; r < rows; r++) {
                const int32_t *xr = (const int32_t *)(xq + (size_t)r * k + g * 32);
                __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xr[0]));
                for (int t = 1; t < 8; t++)
                    pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[t], _mm256_set1_epi32(xr[t])));
                const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                const size_t at = (size_t)r * groups + g;
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(scale[at])), dot, acc[r]);
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum[at]), acc[r]);
            }
        }
        for (int r = 0; r < rows; r++) {
            float out[8];
            _mm256_storeu_ps(out, acc[r]);
            for (int i = 0; i < 8; i++) y[(size_t)r * n + n0 + half * 8 + i] = float_to_bf16(out[i]);
        }
    }
}

#endif

#if defined(LOCALSPEC_AVX512BF16) || defined(LOCALSPEC_AVX2)

/* The rows of a call through output block nb: on the tiles (unpacked: this thread's buffer) passes of AMX_CHUNK rows
 * while at least localspec_amx_min_rows are left, the rest on the dot products, up to CHUNK rows a pass. */
static inline __attribute__((always_inline)) void output_block(const int8_t *xq, const float *scale,
                                                               const float *xsum, const uint8_t *codes,
                                                               const void *dm, int form, uint16_t *y, int rows,
                                                               uint8_t *unpacked, int k, int n, int nb) {
    const int groups = k / 32;
    const uint8_t *c = codes + (size_t)nb * groups * 256;
    const void *p = (const char *)dm + (size_t)nb * scale_bytes(form, groups);
    int r0 = 0;
#if defined(LOCALSPEC_AMX)
    if (unpacked != NULL) {
        unpack_block(c, groups, unpacked); /* once for every pass */
        for (int count; (count = rows - r0 < AMX_CHUNK ? rows - r0 : AMX_CHUNK) >= localspec_amx_min_rows; r0 += count) {
            const int8_t *xr = xq + (size_t)r0 * k;
            const float *sr = scale + (size_t)r0 * groups, *xs = xsum + (size_t)r0 * groups;
            uint16_t *yr = y + (size_t)r0 * n;
            switch (count) {
#define ROWS(R) \
    case R: block_rows_amx(unpacked, p, form, xr, sr, xs, k, groups, R, yr, n, nb * 16); break;
                ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
                ROWS(13) ROWS(14) ROWS(15) ROWS(16)
#undef ROWS
            }
        }
    }
#else
    (void)unpacked;
#endif
    const int per = rows_per_pass(rows - r0, CHUNK);
    for (; r0 < rows; r0 += per) {
        const int count = rows - r0 < per ? rows - r0 : per;
        const int8_t *xr = xq + (size_t)r0 * k;
        const float *sr = scale + (size_t)r0 * groups, *xs = xsum + (size_t)r0 * groups;
        uint16_t *yr = y + (size_t)r0 * n;
        switch (count) { /* a constant row count per case keeps the accumulators in registers */
#define ROWS(R) \
    case R: block_rows(c, p, form, xr, sr, xs, k, groups, R, yr, n, nb * 16); break;
            ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
        }
    }
}

static int q4_run(const uint16_t *x, const uint8_t *codes, const void *dm, int form, uint16_t *y, int rows, int k,
                  int n, int threads) {
    const int groups = k / 32, blocks = n / 16;
    const int amx = amx_for(rows); /* 0 wherever the build or the CPU has no tiles */
    const size_t sums = (size_t)rows * groups, padded = (size_t)amx_padded(rows, amx) * k;
    /* [M, K/32] scales s, then [M, K/32] Σ x, then [M, K] x̂ (on the tiles: zero rows to whole passes) */
    float *scale = malloc(sizeof(float) * 2 * sums + padded);
    if (scale == NULL) return -1;
    float *xsum = scale + sums;
    int8_t *xq = (int8_t *)(xsum + sums);
    quantize_rows(x, rows, k, 32, xq, scale, xsum, threads);
    memset(xq + (size_t)rows * k, 0, padded - (size_t)rows * k);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        uint8_t *unpacked = amx ? aligned_alloc(64, (size_t)groups * 512) : NULL; /* this thread's block on the tiles */
        failed = amx && unpacked == NULL;
        if (unpacked != NULL) amx_begin(32);
#pragma omp for schedule(static)
        for (int nb = 0; nb < blocks; nb++) { /* a constant form per branch: each is its own specialized code */
            if (failed) continue;
            if (form == FORM_K)
                output_block(xq, scale, xsum, codes, dm, FORM_K, y, rows, unpacked, k, n, nb);
            else if (form == FORM_F32)
                output_block(xq, scale, xsum, codes, dm, FORM_F32, y, rows, unpacked, k, n, nb);
            else
                output_block(xq, scale, xsum, codes, dm, FORM_F16, y, rows, unpacked, k, n, nb);
        }
        if (unpacked != NULL) amx_end();
        free(unpacked);
    }
    free(scale);
    return failed ? -1 : 0;
}

/* x [M, K] bf16, y [M, N] bf16, both contiguous; K % 32 == 0, N % 16 == 0. Returns 0, or -1 when out of memory. */
int q4_matmul(const uint16_t *x, const uint8_t *codes, const uint16_t *dm, uint16_t *y, int rows, int k, int n,
              int threads) {
    return q4_run(x, codes, dm, FORM_F16, y, rows, k, n, threads);
}

/* The same with float32 d and m (dm [N/16][K/32][2][16] float32). */
int q4f_matmul(const uint16_t *x, const uint8_t *codes, const float *dm, uint16_t *y, int rows, int k, int n,
               int threads) {
    return q4_run(x, codes, dm, FORM_F32, y, rows, k, n, threads);
}

/* The same with Q4_K's scales (the q4k form above); K % 256 == 0. */
int q4k_matmul(const uint16_t *x, const uint8_t *codes, const uint8_t *scales, uint16_t *y, int rows, int k, int n,
               int threads) {
    return q4_run(x, codes, scales, FORM_K, y, rows, k, n, threads);
}
#endif
