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
 * then rounded to bfloat16 (nearest, ties to even). Nothing depends on the row count, on which rows are masked or
 * on the thread count (one thread computes a block of rows' query heads of one key-value head, reading each key
 * once for all of them), so a row's output is a function of its query and the keys and values it sees alone.
 * A masked key adds nothing to any sum (its e_i is exactly 0, and x + 0 = x), so a tree node's sums run over the
 * same sequence as the plain row's for the same position once the accepted path is moved down in the cache.
 *
 * Layouts (bfloat16 as uint16): q [rows][heads][dim] with strides q_row, q_head (elements, dim contiguous); keys and
 * values [kv_heads][capacity][dim] with head stride kv_head (elements), rows contiguous; out [rows][heads][dim]
 * contiguous. dim % 16 == 0, dim <= 512.
 */
#pragma GCC optimize("fp-contract=off") /* every fused multiply-add below is written as fmaf: none added by the
                                        * compiler, so a vectorised loop and its scalar tail round alike */
#pragma STDC FP_CONTRACT OFF
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vfloat;
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vbroadcast(x) _mm256_set1_ps(x)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vadd(a, b) _mm256_add_ps(a, b)
#else
#define VW 1
typedef float vfloat;
#define vzero() 0.0f
#define vload(p) (*(p))
#define vstore(p, v) (*(p) = (v))
#define vbroadcast(x) (x)
#define vfma(a, b, c) fmaf(a, b, c)
#define vadd(a, b) ((a) + (b))
#endif

#define LANES 16
#define MAX_DIM 512
#define TILE 16 /* keys whose dot products one pass over the pairs' queries sums */
#define KEYS 8  /* of them side by side, in registers */
#define DIMS 8  /* output dims whose value sums run side by side, in registers */

#define MAX_GROUP 16 /* query heads per key-value head computed together (each key read once for all of them) */
#define MAX_BLOCK 16 /* rows of one call computed together (each key read once for all of them) */

/* How many blocks of rows each key-value head's rows are split into: enough that every thread gets the same number
 * of (block, key-value head) items where it can, and no block over MAX_BLOCK rows. Only the work split depends on
 * this, never a row's arithmetic. */
static int row_blocks(int rows, int kv_heads, int threads) {
    int blocks = 1;
    while (blocks < rows && (blocks * kv_heads) % threads) blocks++;
    while ((rows + blocks - 1) / blocks > MAX_BLOCK) blocks++;
    return blocks;
}

/* Returns 0, -1 when out of memory, -2 for a shape it does not take. */
int exact_attention(const uint16_t *q, long q_row, long q_head, const uint16_t *keys, const uint16_t *values,
                    long kv_head, const uint8_t *visible, uint16_t *out, int rows, int heads, int kv_heads, int dim,
                    int prefix, float scaling, int threads) {
    if (dim % LANES || dim > MAX_DIM || heads % kv_heads || heads / kv_heads > MAX_GROUP) return -2;
    const int groups = heads / kv_heads, most = prefix + rows, blocks = row_blocks(rows, kv_heads, threads);
    const int per_block = (rows + blocks - 1) / blocks, width = per_block * groups; /* (row, head) pairs a block */
    const int padded = (width + VW - 1) / VW * VW; /* the pairs as whole vectors (zero queries past the last) */
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* per (block of rows, key-value head): every (row, query head) pair of it together, a vector lane each, so
         * each key and value is read and converted once for all of them; each lane's arithmetic and key order are
         * the rule above, whatever the grouping */
        float *scores = malloc(sizeof(float) * (size_t)(most + TILE) * padded); /* [key position][pair]: s, then e */
        float *query = malloc(sizeof(float) * (size_t)dim * padded);            /* [dim][pair] */
        float *acc = malloc(sizeof(float) * (size_t)dim * padded);              /* [dim][pair]: Σ e·v */
        float *top = malloc(sizeof(float) * (size_t)padded), *total = malloc(sizeof(float) * (size_t)padded);
        float *kv = malloc(sizeof(float) * (size_t)TILE * dim); /* [key in tile][dim]: keys, then values, float32 */
        const int ready = scores && query && acc && top && total && kv;
        if (!ready) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int item = 0; item < blocks * kv_heads; item++) {
            if (!ready) continue;
            const int b = item / kv_heads, g = item % kv_heads;
            const int first = b * per_block, last = first + per_block < rows ? first + per_block : rows;
            const int count = last - first, pairs = count * groups, lanes = (pairs + VW - 1) / VW * VW;
            if (count <= 0) continue;
            const uint16_t *kh = keys + (size_t)g * kv_head, *vh = values + (size_t)g * kv_head;
            for (int z = 0; z < dim * lanes; z++) query[z] = 0.0f, acc[z] = 0.0f;
            for (int r = 0; r < count; r++)
                for (int j = 0; j < groups; j++)
                    for (int d = 0; d < dim; d++)
                        query[(size_t)d * lanes + r * groups + j] =
                            bf16_to_float(q[(size_t)(first + r) * q_row + (size_t)(g * groups + j) * q_head + d]);
            for (int x = 0; x < lanes; x++) top[x] = x < pairs ? -INFINITY : 0.0f, total[x] = 0.0f;
            /* 1. s_i, TILE keys at a time in ascending position (the prefix, then this call's rows): for each dim in
             * order, every (key, pair) sum takes its fused multiply-add; then scaled, or -inf where masked */
            for (int i0 = 0; i0 < most; i0 += TILE) {
                const int n = most - i0 < TILE ? most - i0 : TILE;
                for (int l = 0; l < TILE; l++) /* keys past the end: zeros, their sums unused */
                    for (int d = 0; d < dim; d++)
                        kv[l * dim + d] = l < n ? bf16_to_float(kh[(size_t)(i0 + l) * dim + d]) : 0.0f;
                for (int l0 = 0; l0 < n; l0 += KEYS)
                    for (int x0 = 0; x0 < lanes; x0 += VW) {
                        vfloat sum[KEYS];
                        for (int c = 0; c < KEYS; c++) sum[c] = vzero();
                        for (int d = 0; d < dim; d++) {
                            const vfloat qd = vload(query + (size_t)d * lanes + x0);
                            const float *kd = kv + l0 * dim + d;
                            for (int c = 0; c < KEYS; c++) sum[c] = vfma(qd, vbroadcast(kd[c * dim]), sum[c]);
                        }
                        for (int c = 0; c < KEYS; c++) vstore(scores + (size_t)(i0 + l0 + c) * lanes + x0, sum[c]);
                    }
                for (int l = 0; l < n; l++) {
                    const int j = i0 + l - prefix;
                    float *s = scores + (size_t)(i0 + l) * lanes;
                    for (int r = 0; r < count; r++) {
                        const int t = first + r;
                        const int seen = j < 0 || (visible == NULL ? j <= t : visible[(size_t)t * rows + j]);
                        for (int h = 0; h < groups; h++) {
                            const int x = r * groups + h;
                            s[x] = seen ? scaling * s[x] : -INFINITY;
                            top[x] = s[x] > top[x] ? s[x] : top[x];
                        }
                    }
                }
            }
            /* 2. e_i = exp(s_i - max s) in place, exactly 0 where masked (lanes past the pairs: unused) */
            for (int i = 0; i < most; i++) {
                float *e = scores + (size_t)i * lanes;
                for (int x = 0; x < lanes; x++) e[x] = exp_fixed(e[x] - top[x]);
            }
            /* 3. Σ e_i and Σ e_i·v_i in ascending position over every key: a masked key's e_i = 0 leaves both sums
             * exactly as they were (x + 0 = x, and no sum is -0), so each is the sum over the keys its pair sees */
            for (int i0 = 0; i0 < most; i0 += TILE) {
                const int n = most - i0 < TILE ? most - i0 : TILE;
                for (int l = 0; l < n; l++)
                    for (int d = 0; d < dim; d++) kv[l * dim + d] = bf16_to_float(vh[(size_t)(i0 + l) * dim + d]);
                const float *e = scores + (size_t)i0 * lanes;
                for (int x0 = 0; x0 < lanes; x0 += VW) {
                    vfloat sum = vload(total + x0);
                    for (int l = 0; l < n; l++) sum = vadd(sum, vload(e + (size_t)l * lanes + x0));
                    vstore(total + x0, sum);
                }
                for (int d0 = 0; d0 < dim; d0 += DIMS)
                    for (int x0 = 0; x0 < lanes; x0 += VW) {
                        vfloat sum[DIMS];
                        for (int c = 0; c < DIMS; c++) sum[c] = vload(acc + (size_t)(d0 + c) * lanes + x0);
                        for (int l = 0; l < n; l++) {
                            const vfloat el = vload(e + (size_t)l * lanes + x0);
                            const float *vl = kv + l * dim + d0;
                            for (int c = 0; c < DIMS; c++) sum[c] = vfma(el, vbroadcast(vl[c]), sum[c]);
                        }
                        for (int c = 0; c < DIMS; c++) vstore(acc + (size_t)(d0 + c) * lanes + x0, sum[c]);
                    }
            }
            for (int r = 0; r < count; r++)
                for (int h = 0; h < groups; h++) {
                    const int x = r * groups + h;
                    uint16_t *o = out + ((size_t)(first + r) * heads + g * groups + h) * dim;
                    for (int d = 0; d < dim; d++) o[d] = float_to_bf16(acc[(size_t)d * lanes + x] / total[x]);
                }
        }
        free(scores);
        free(query);
        free(acc);
        free(top);
        free(total);
        free(kv);
    }
    return failed ? -1 : 0;
}
