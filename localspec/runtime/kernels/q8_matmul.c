/* y = x · Wᵀ for 8-bit weights and bfloat16 activations taken as int8 per row and group, float32 outputs:
 * q8_matmul for groups of 32 along K with a float16 scale (GGUF Q8_0: w = q·d, q in -128..127; the LM head of a GGUF
 * whose token embedding is Q8_0, read as the file stores it), q8k_matmul for groups of 16 with a float32 scale and a
 * float32 offset each, w = d·q + m (Q5_K: d·sc and q, m = −dmin·mn, each exact in float32; Q5_1: its float16 d and
 * m), and q6k_matmul for Q6_K's own scales (a float16 d per 256 and an int8 sc per 16: w = (d·sc)·(q − 32), d·sc
 * made in float32, exactly, and m = 0, so q6k gives q8k's bits from the file's own 6.5625 bits a weight instead of 12:
 * its 6-bit codes stay in 4 + 2 bit planes, unpacked once per block and group for every row of a pass).
 *
 * The arithmetic, the same in both builds (so both round alike, bit for bit):
 *   1. each row's activations, per group (32; q8k: 16), as int8 x̂ with a scale s (scalar.h's quantize_rows);
 *   2. per output, group and row, Σ q·x̂ in int32 (exact);
 *   3. acc = fma(d·s, Σ q·x̂, acc), then (q8k) acc = fma(m, Σ x, acc), groups in order; y = acc.
 * One thread computes one output in one fixed order whatever the row count, so a row's logits do not depend on the
 * other rows of the call (bitwise); the codes of 16 outputs are loaded once for up to Q8_CHUNK rows.
 *
 *   avx512bf16  vpdpbusd takes its unsigned operand from the activations, x̂ + 128 (1..255, a copy made once a
 *               call), and the codes as they are: Σ q·x̂ = Σ q·(x̂ + 128) − 128·Σ q, where Σ q comes from one more
 *               vpdpbusd per 4 codes a group, shared by every row of the pass.
 *   avx2        vpmaddubsw on |q| and x̂ with q's sign (pairs at most 2·128·127 < 32768), vpmaddwd by ones into
 *               int32, summed over the group.
 *   q6k         both builds take its codes unsigned, u = q + 32 ∈ 0..63, as the unsigned operand (vpdpbusd; vpmaddubsw,
 *               pairs at most 2·63·127), and Σ q·x̂ = Σ u·x̂ − 32·Σ x̂, with Σ x̂ per row and group summed once a call:
 *               no bias on x̂ a row and no Σ q a group, the same exact int32 sums.
 *   amx         an avx512bf16 build's calls of many rows where the CPU has AMX-INT8 (amx.h): Σ q·x̂ of up to 16
 *               rows from one tdpbssd a group, the codes as they are stored as tile B; the same bits.
 *
 * Layouts (runtime/q4_kernel.py pack_q8, pack_q8k): a lane's four consecutive codes are one int32 lane of the dot
 * product instructions.
 *   q8   codes [N/16][K/32][8][16][4] int8: block (nb, g), quad t, lane i, byte b = q[16nb+i][32g+4t+b]
 *        d     [N/16][K/32][16]        float16: d of outputs 16nb..16nb+15 in group g
 *   q8k  codes [N/16][K/16][4][16][4] int8: the same with groups of 16
 *        dm    [N/16][K/16][2][16]     float32: d, then m, of outputs 16nb..16nb+15 in group g
 *   q6k  codes [N/16][K/16][3][16][4] uint8: per block and group of 16, three planes laid out as q8k's quads, of
 *        u_t = q_t + 32 ∈ 0..63 (quad t's codes, q8k's q − 32 of Q6_K): plane 0 = u_0 & 15 | (u_1 & 15) << 4,
 *        plane 1 = u_2 & 15 | (u_3 & 15) << 4, plane 2 = Σ_t (u_t >> 4) << 2t (192 bytes for 256 codes)
 *        scales [N/16][K/256][288] bytes: d float16 [16], then sc int8 [16 groups][16 lanes]
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"    /* LOCALSPEC_AMX, amx_tiles, amx_for */
#include "limits.h" /* LOCALSPEC_AVX512BF16 / LOCALSPEC_AVX2 */
#include "scalar.h" /* rows_per_pass, quantize_rows */

#define Q8_CHUNK 12 /* rows per pass over a block of codes */

enum { FORM_Q8 = 0, FORM_Q8K = 1, FORM_Q6K = 2 }; /* the scales' form: q8, q8k, q6k */
#define Q6K_BYTES 288                           /* q6k: a block's scales for one super-block of 256 */
#define Q6K_CODES 192                           /* q6k: a block's codes for one group of 16 (three planes) */

/* Bytes of a block's codes for `groups` groups (of 32 for q8, 16 otherwise). */
static inline size_t q8_code_bytes(int form, int groups) {
    return (size_t)groups * (form == FORM_Q6K ? Q6K_CODES : form == FORM_Q8K ? 256 : 512);
}

/* Bytes of a block's scales for `groups` groups (of 32 for q8, 16 otherwise). */
static inline size_t q8_scale_bytes(int form, int groups) {
    return form == FORM_Q6K ? (size_t)(groups / 16) * Q6K_BYTES : (size_t)groups * (form == FORM_Q8K ? 128 : 32);
}

#if defined(LOCALSPEC_AVX512BF16)

/* Group g's d and m (q8, q6k: m = 0) of a block's 16 outputs, in the scales' form. */
static inline __attribute__((always_inline)) void q8_scales(const void *scales, int form, int g, __m512 *d,
                                                            __m512 *m) {
    *m = _mm512_setzero_ps();
    if (form == FORM_Q6K) {
        const uint8_t *p = (const uint8_t *)scales + (size_t)(g / 16) * Q6K_BYTES;
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + (g % 16) * 16))));
        *d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), sc);
    } else if (form == FORM_Q8K) {
        *d = _mm512_loadu_ps((const float *)scales + (size_t)g * 32);
        *m = _mm512_loadu_ps((const float *)scales + (size_t)g * 32 + 16);
    } else {
        *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)scales + (size_t)g * 16)));
    }
}

/* A q6k group's three planes (c: 192 bytes) → its four quads of unsigned codes u = q + 32 ∈ 0..63. Each 16-bit
 * shift moves bits across a byte only where the mask after it drops them. */
static inline __attribute__((always_inline)) void q6k_quads(const int8_t *c, __m512i w[4]) {
    const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(0x30);
    const __m512i a = _mm512_loadu_si512((const void *)c), b = _mm512_loadu_si512((const void *)(c + 64));
    const __m512i h = _mm512_loadu_si512((const void *)(c + 128));
    w[0] = _mm512_or_si512(_mm512_and_si512(a, low), _mm512_and_si512(_mm512_slli_epi16(h, 4), high));
    w[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), low), _mm512_and_si512(_mm512_slli_epi16(h, 2), high));
    w[2] = _mm512_or_si512(_mm512_and_si512(b, low), _mm512_and_si512(h, high));
    w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), low), _mm512_and_si512(_mm512_srli_epi16(h, 2), high));
}

/* form: the scales' (FORM_*); groups of 32 for q8, 16 for q8k and q6k. */
static inline __attribute__((always_inline)) void q8_block_rows(const int8_t *codes, const void *scales, int form,
                                                                const int8_t *xq, const uint8_t *xb,
                                                                const float *scale, const float *xsum,
                                                                const int32_t *isum, int k, int groups, int rows,
                                                                float *y, int n, int n0) {
    const int quads = form == FORM_Q8 ? 8 : 4;
    __m512 acc[Q8_CHUNK];
    const __m512i ones = _mm512_set1_epi8(1);
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i w[8], offset = _mm512_setzero_si512();
        if (form == FORM_Q6K) {
            q6k_quads(codes + (size_t)g * Q6K_CODES, w); /* unsigned u: Σ u·x̂ − 32·Σ x̂ below */
        } else {
            __m512i total = _mm512_setzero_si512();
            for (int t = 0; t < quads; t++) {
                w[t] = _mm512_loadu_si512((const void *)(codes + ((size_t)g * quads + t) * 64));
                total = _mm512_dpbusd_epi32(total, ones, w[t]);
            }
            offset = _mm512_slli_epi32(total, 7); /* 128·Σ q */
        }
        __m512 d, m;
        q8_scales(scales, form, g, &d, &m);
        for (int r = 0; r < rows; r++) {
            const size_t at = (size_t)r * groups + g;
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            if (form == FORM_Q6K) {
                const int32_t *xr = (const int32_t *)(xq + (size_t)r * k + g * quads * 4);
                for (int t = 0; t < 4; t += 2) {
                    even = _mm512_dpbusd_epi32(even, w[t], _mm512_set1_epi32(xr[t]));
                    odd = _mm512_dpbusd_epi32(odd, w[t + 1], _mm512_set1_epi32(xr[t + 1]));
                }
                offset = _mm512_set1_epi32(32 * isum[at]);
            } else { /* x̂ + 128 as unsigned bytes, made once a call (q8_run) */
                const int32_t *xr = (const int32_t *)(xb + (size_t)r * k + g * quads * 4);
                for (int t = 0; t < quads; t += 2) {
                    even = _mm512_dpbusd_epi32(even, _mm512_set1_epi32(xr[t]), w[t]);
                    odd = _mm512_dpbusd_epi32(odd, _mm512_set1_epi32(xr[t + 1]), w[t + 1]);
                }
            }
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_add_epi32(even, odd), offset));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(scale[at])), dot, acc[r]);
            if (form != FORM_Q8) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[at]), acc[r]); /* q6k: m = 0 */
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * n + n0, acc[r]);
}

#if defined(LOCALSPEC_AMX)
/* q8_block_rows' arithmetic with the int32 sums from the tiles (amx_begin's): `rows` ≤ AMX_CHUNK of a pass. */
static inline __attribute__((always_inline)) void q8_block_rows_amx(const int8_t *codes, const void *scales,
                                                                    int form, const int8_t *xq, const float *scale,
                                                                    const float *xsum, int k, int groups, int rows,
                                                                    float *y, int n, int n0) {
    const int len = form == FORM_Q8 ? 32 : 16;
    __m512 acc[AMX_CHUNK];
    int32_t dots[AMX_CHUNK][16] __attribute__((aligned(64)));
    int8_t six[256] __attribute__((aligned(64))); /* q6k: the group's quads unpacked, as tile B */
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        if (form == FORM_Q6K) {
            __m512i w[4];
            q6k_quads(codes + (size_t)g * Q6K_CODES, w);
            for (int t = 0; t < 4; t++) /* the signed codes q = u − 32, as tdpbssd takes them */
                _mm512_store_si512((void *)(six + t * 64), _mm512_sub_epi8(w[t], _mm512_set1_epi8(32)));
            _tile_loadd(2, six, 64);
        } else {
            _tile_loadd(2, codes + (size_t)g * len * 16, 64);
        }
        _tile_loadd(1, xq + (size_t)g * len, k);
        _tile_zero(0);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, dots, 64);
        __m512 d, m;
        q8_scales(scales, form, g, &d, &m);
        for (int r = 0; r < rows; r++) {
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)dots[r]));
            const size_t at = (size_t)r * groups + g;
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(scale[at])), dot, acc[r]);
            if (form != FORM_Q8) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[at]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * n + n0, acc[r]);
}
#endif

#elif defined(LOCALSPEC_AVX2)

/* The AVX-512 build's q6k_quads on one half of a group's lanes (c: the group's planes, offset to the half). */
static inline __attribute__((always_inline)) void q6k_quads(const int8_t *c, __m256i w[4]) {
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
    const __m256i a = _mm256_loadu_si256((const __m256i *)c), b = _mm256_loadu_si256((const __m256i *)(c + 64));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(c + 128));
    w[0] = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), high));
    w[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), _mm256_and_si256(_mm256_slli_epi16(h, 2), high));
    w[2] = _mm256_or_si256(_mm256_and_si256(b, low), _mm256_and_si256(h, high));
    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low), _mm256_and_si256(_mm256_srli_epi16(h, 2), high));
}

/* As the AVX-512 build's q8_block_rows, one half of the block's lanes (8 outputs) at a time (vpmaddubsw takes x̂
 * signed: no biased copy, xb is NULL). */
static inline __attribute__((always_inline)) void q8_block_rows(const int8_t *codes, const void *scales, int form,
                                                                const int8_t *xq, const uint8_t *xb,
                                                                const float *scale, const float *xsum,
                                                                const int32_t *isum, int k, int groups, int rows,
                                                                float *y, int n, int n0) {
    (void)xb;
    const int quads = form == FORM_Q8 ? 8 : 4;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; half++) {
        __m256 acc[Q8_CHUNK];
        for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            __m256i w[8], magnitude[8];
            if (form == FORM_Q6K) {
                q6k_quads(codes + (size_t)g * Q6K_CODES + half * 32, w);
            } else {
                for (int t = 0; t < quads; t++) {
                    w[t] = _mm256_loadu_si256((const __m256i *)(codes + ((size_t)g * quads + t) * 64 + half * 32));
                    magnitude[t] = _mm256_abs_epi8(w[t]); /* -128 becomes 128 as an unsigned byte */
                }
            }
            __m256 d, m = _mm256_setzero_ps();
            if (form == FORM_Q6K) {
                const uint8_t *p = (const uint8_t *)scales + (size_t)(g / 16) * Q6K_BYTES;
                const __m128i sc8 = _mm_loadl_epi64((const __m128i *)(p + 32 + (g % 16) * 16 + half * 8));
                const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8));
                d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + half * 16))), sc);
            } else if (form == FORM_Q8K) {
                d = _mm256_loadu_ps((const float *)scales + (size_t)g * 32 + half * 8);
                m = _mm256_loadu_ps((const float *)scales + (size_t)g * 32 + 16 + half * 8);
            } else {
                d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)scales + (size_t)g * 16 + half * 8)));
            }
            for (int r = 0; r < rows; r++) {
                const int32_t *xr = (const int32_t *)(xq + (size_t)r * k + g * quads * 4);
                const size_t at = (size_t)r * groups + g;
                __m256i sum = _mm256_setzero_si256();
                if (form == FORM_Q6K) {
                    for (int t = 0; t < 4; t++)
                        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w[t], _mm256_set1_epi32(xr[t])), ones));
                    sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(32 * isum[at]));
                } else {
                    for (int t = 0; t < quads; t++) {
                        const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(xr[t]), w[t]);
                        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[t], signed_x), ones));
                    }
                }
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(scale[at])), _mm256_cvtepi32_ps(sum), acc[r]);
                if (form != FORM_Q8) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum[at]), acc[r]);
            }
        }
        for (int r = 0; r < rows; r++) _mm256_storeu_ps(y + (size_t)r * n + n0 + half * 8, acc[r]);
    }
}

#endif

#if defined(LOCALSPEC_AVX512BF16) || defined(LOCALSPEC_AVX2)

/* The rows of a call through output block nb: on the tiles (amx) passes of AMX_CHUNK rows while at least
 * localspec_amx_min_rows are left, the rest on the dot products, up to Q8_CHUNK rows a pass. */
static inline __attribute__((always_inline)) void q8_output_block(const int8_t *xq, const uint8_t *xb,
                                                                  const float *scale, const float *xsum,
                                                                  const int32_t *isum, const int8_t *codes,
                                                                  const void *scales, int form, float *y, int rows,
                                                                  int amx, int k, int n, int nb) {
    const int len = form == FORM_Q8 ? 32 : 16, groups = k / len;
    const int8_t *c = codes + (size_t)nb * q8_code_bytes(form, groups);
    const void *p = (const char *)scales + (size_t)nb * q8_scale_bytes(form, groups);
    int r0 = 0;
#if defined(LOCALSPEC_AMX)
    if (amx) {
        for (int count; (count = rows - r0 < AMX_CHUNK ? rows - r0 : AMX_CHUNK) >= localspec_amx_min_rows; r0 += count) {
            const int8_t *xr = xq + (size_t)r0 * k;
            const float *sr = scale + (size_t)r0 * groups, *xs = xsum + (size_t)r0 * groups;
            float *yr = y + (size_t)r0 * n;
            switch (count) {
#define ROWS(R) \
    case R: q8_block_rows_amx(c, p, form, xr, sr, xs, k, groups, R, yr, n, nb * 16); break;
                ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
                ROWS(13) ROWS(14) ROWS(15) ROWS(16)
#undef ROWS
            }
        }
    }
#else
    (void)amx;
#endif
    const int per = rows_per_pass(rows - r0, Q8_CHUNK);
    for (; r0 < rows; r0 += per) {
        const int count = rows - r0 < per ? rows - r0 : per;
        const int8_t *xr = xq + (size_t)r0 * k;
        const uint8_t *br = xb == NULL ? NULL : xb + (size_t)r0 * k;
        const float *sr = scale + (size_t)r0 * groups, *xs = xsum + (size_t)r0 * groups;
        const int32_t *is = isum + (size_t)r0 * groups;
        float *yr = y + (size_t)r0 * n;
        switch (count) { /* a constant row count per case keeps the accumulators in registers */
#define ROWS(R) \
    case R: q8_block_rows(c, p, form, xr, br, sr, xs, is, k, groups, R, yr, n, nb * 16); break;
            ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10) ROWS(11) ROWS(12)
#undef ROWS
        }
    }
}

static int q8_run(const uint16_t *x, const int8_t *codes, const void *scales, int form, float *y, int rows, int k,
                  int n, int threads) {
    const int len = form == FORM_Q8 ? 32 : 16, blocks = n / 16;
    const int amx = amx_for(rows); /* 0 wherever the build or the CPU has no tiles */
    const size_t sums = (size_t)rows * (k / len), padded = (size_t)amx_padded(rows, amx) * k;
#if defined(LOCALSPEC_AVX512BF16)
    const size_t biased = form == FORM_Q6K ? 0 : (size_t)rows * k; /* vpdpbusd's unsigned x̂ + 128 */
#else
    const size_t biased = 0;
#endif
    /* s, then Σ x, then Σ x̂ (q6k), then x̂ (zero rows to whole passes), then x̂ + 128 */
    float *scale = malloc(sizeof(float) * 2 * sums + sizeof(int32_t) * sums + padded + biased);
    if (scale == NULL) return -1;
    float *xsum = scale + sums;
    int32_t *isum = (int32_t *)(xsum + sums);
    int8_t *xq = (int8_t *)(isum + sums);
    uint8_t *xb = biased ? (uint8_t *)(xq + padded) : NULL;
    quantize_rows(x, rows, k, len, xq, scale, xsum, threads);
    memset(xq + (size_t)rows * k, 0, padded - (size_t)rows * k);
    for (size_t i = 0; i < biased; i++) xb[i] = (uint8_t)xq[i] ^ 0x80; /* the sign bit flipped: x̂ + 128 */
    if (form == FORM_Q6K)
        for (size_t at = 0; at < sums; at++) {
            int32_t total = 0;
            for (int i = 0; i < len; i++) total += xq[at * len + i]; /* row r, group g: at = r·groups + g */
            isum[at] = total;
        }
#pragma omp parallel num_threads(threads)
    {
        if (amx) amx_begin(len);
#pragma omp for schedule(static)
        for (int nb = 0; nb < blocks; nb++) { /* a constant form per branch: each is its own specialized code */
            if (form == FORM_Q6K)
                q8_output_block(xq, xb, scale, xsum, isum, codes, scales, FORM_Q6K, y, rows, amx, k, n, nb);
            else if (form == FORM_Q8K)
                q8_output_block(xq, xb, scale, xsum, isum, codes, scales, FORM_Q8K, y, rows, amx, k, n, nb);
            else
                q8_output_block(xq, xb, scale, xsum, isum, codes, scales, FORM_Q8, y, rows, amx, k, n, nb);
        }
        if (amx) amx_end();
    }
    free(scale);
    return 0;
}

/* x [M, K] bf16, y [M, N] float32, both contiguous; K % 32 == 0, N % 16 == 0. Returns 0, or -1 when out of memory. */
int q8_matmul(const uint16_t *x, const int8_t *codes, const uint16_t *dscale, float *y, int rows, int k, int n,
              int threads) {
    return q8_run(x, codes, dscale, FORM_Q8, y, rows, k, n, threads);
}

/* The q8k layout: K % 16 == 0, dm [N/16][K/16][2][16] float32. */
int q8k_matmul(const uint16_t *x, const int8_t *codes, const float *dm, float *y, int rows, int k, int n,
               int threads) {
    return q8_run(x, codes, dm, FORM_Q8K, y, rows, k, n, threads);
}

/* Q6_K's own scales (the q6k form above); K % 256 == 0. */
int q6k_matmul(const uint16_t *x, const int8_t *codes, const uint8_t *scales, float *y, int rows, int k, int n,
               int threads) {
    return q8_run(x, codes, scales, FORM_Q6K, y, rows, k, n, threads);
}
#endif
