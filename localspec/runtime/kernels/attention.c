/* Decode attention that computes each (row, head) the same way whatever else is in the call: the verify rows of a
 * chain or a token tree get, bit for bit, the output plain decoding computes for the same position.
 *
 * For row t and query head h (key-value head h / (heads / kv_heads)), the keys it sees, in ascending position:
 * positions 0 .. prefix-1, then prefix + j for each row j of this call with visible[t][j] (visible NULL: j <= t,
 * a chain). Over those n keys, in that order:
 *   s_i = scaling · (q · k_i)        the dot product summed in dim order, one fused multiply-add per dim
 *   e_i = exp(s_i − max s)           exp_fixed (scalar.h): a fixed sequence of float32 operations (no libm), so the
 *                                    same bits whether the compiler runs it 16 lanes at a time or one
 *   out = (Σ_i e_i · v_i) / Σ_i e_i  both sums in key order (Σ e_i·v_i: a fused multiply-add per key and dim)
 * then rounded to the element type (nearest, ties to even; float32 as it is). Nothing depends on the row count, on
 * which rows are masked, on the thread count or on the layout a call takes (attention_body.h's key_lanes or
 * pair_lanes: each number is computed by one thread in that order), so a row's output is a function of its query
 * and the keys and values it sees alone.
 * A masked key adds nothing to any sum (its e_i is exactly 0, and x + 0 = x), so a tree node's sums run over the
 * same sequence as the plain row's for the same position once the accepted path is moved down in the cache.
 *
 * Element types: bfloat16 and float16 (as uint16) and float32, exact_attention_bf16 / _f16 / _f32, one body
 * (attention_body.h) for the three, every sum in float32. Layouts: q [rows][heads][dim] with strides q_row, q_head
 * (elements, dim contiguous); keys and values [kv_heads][capacity][dim] with head stride kv_head (elements), rows
 * contiguous; out [rows][heads][dim] contiguous. dim % 16 == 0, dim <= 512.
 */
#pragma GCC optimize("fp-contract=off") /* every fused multiply-add below is written as fmaf: none added by the
                                        * compiler, so a vectorised loop and its scalar tail round alike */
#pragma STDC FP_CONTRACT OFF
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "limits.h"
#include "scalar.h" /* bf16_to_float, float_to_bf16, exp_fixed */

/* Vectors of VW float32 lanes for the dot products: the lanes are (row, head) pairs, each lane's sum its own, so the
 * width changes no result (a lane's fused multiply-adds are the scalar ones). */
#if defined(__AVX512F__)
#define VW 16
typedef __m512 vfloat;
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vbroadcast(x) _mm512_set1_ps(x)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vmax(a, b) _mm512_max_ps(a, b) /* a > b ? a : b, lane by lane */
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vfloat;
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vbroadcast(x) _mm256_set1_ps(x)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vmax(a, b) _mm256_max_ps(a, b)
#else
#define VW 1
typedef float vfloat;
#define vzero() 0.0f
#define vload(p) (*(p))
#define vstore(p, v) (*(p) = (v))
#define vbroadcast(x) (x)
#define vfma(a, b, c) fmaf(a, b, c)
#define vadd(a, b) ((a) + (b))
#define vmul(a, b) ((a) * (b))
#define vmax(a, b) ((a) > (b) ? (a) : (b))
#endif

#define LANES LOCALSPEC_LANES
#define MAX_DIM LOCALSPEC_MAX_DIM
#define MAX_GROUP LOCALSPEC_MAX_GROUP /* query heads per key-value head */
#define HEAD_CHUNK 4 /* key_lanes: (row, head) pairs whose chains run side by side, in registers */
#define TILE 16      /* pair_lanes: keys whose dot products one pass over the pairs' queries sums */
#define KEYS 8       /* of them side by side, in registers */
#define DIMS 8       /* output dims whose value sums run side by side, in registers */
#define MAX_BLOCK 16 /* rows of one call computed together (each key read once for all of them) */
/* Which layout a call takes (the same bits either way): the keys in the lanes (key_lanes) for one row, and for a
 * verify's few rows over a cache at least as long as they are; the pairs in the lanes (pair_lanes) for many rows
 * on a short cache (a head's catch-up over a prompt, 1,024 rows on an empty cache: 10.4 ms a layer against 41 in
 * the keys' layout, which holds the whole call's scores). Measured on the Zen 4 EPYC, 2026-12-07, 9 / 12 / 32 query heads over 3 / 2 /
 * 8 / 32: the keys' layout 1.0–2.5× the pairs' from 5 to 64 rows on 64–600 cached positions (0.9× on the 12-head,
 * 6-group shape at 64), the pairs' 1.1–2× the keys' on an empty cache. */
#define KEY_LANE_ROWS 64
#define KEY_LANES(rows, prefix) ((rows) == 1 || ((rows) <= KEY_LANE_ROWS && (prefix) >= (rows)))

/* How many blocks of rows each key-value head's rows are split into (pair_lanes): enough that every thread gets the
 * same number of (block, key-value head) items where it can, and no block over MAX_BLOCK rows. Only the work split
 * depends on this, never a row's arithmetic. */
static int row_blocks(int rows, int kv_heads, int threads) {
    int blocks = 1;
    while (blocks < rows && (blocks * kv_heads) % threads) blocks++;
    while ((rows + blocks - 1) / blocks > MAX_BLOCK) blocks++;
    return blocks;
}


/* float16 through the compiler's _Float16 (IEEE binary16; the conversions are exact one way and round to nearest
 * even the other, in software where the CPU has no F16C) */
static inline float f16_to_float(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;
}

static inline uint16_t float_to_f16(float f) {
    const _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, sizeof h);
    return h;
}

#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define NAME(f) CAT(f, SUFFIX)

#define ELEM uint16_t
#define TO_FLOAT(x) bf16_to_float(x)
#define FROM_FLOAT(f) float_to_bf16(f)
#define SUFFIX bf16
#include "attention_body.h"
#undef ELEM
#undef TO_FLOAT
#undef FROM_FLOAT
#undef SUFFIX

#define ELEM float
#define TO_FLOAT(x) (x)
#define FROM_FLOAT(f) (f)
#define SUFFIX f32
#include "attention_body.h"
#undef ELEM
#undef TO_FLOAT
#undef FROM_FLOAT
#undef SUFFIX

#define ELEM uint16_t
#define TO_FLOAT(x) f16_to_float(x)
#define FROM_FLOAT(f) float_to_f16(f)
#define SUFFIX f16
#include "attention_body.h"
