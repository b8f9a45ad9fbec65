/* Decode attention that computes each (row, head) the same way whatever else is in the call: the verify rows of a
 * chain or a token tree get, bit for bit, the output plain decoding computes for the same position.
 *
 * For row t and query head h (key-value head h / (heads / kv_heads)), the keys it sees, in ascending position:
 * positions 0 .. prefix-1, then prefix + j for each row j of this call with visible[t][j] (visible NULL: j <= t,
 * a chain). Over those n keys, in that order:
 *   s_i = scaling · (q · k_i)        a dot product of 16 lanes (lane l takes dims l, l+16, ...; fused multiply-adds
 *                                    in dim order), the lanes summed as a fixed halving tree
 *   e_i = exp(s_i − max s)           libm's expf
 *   out = (Σ_i e_i · v_i) / Σ_i e_i  both sums in key order, fused multiply-adds per dim
 * then rounded to bfloat16 (nearest, ties to even). Nothing depends on the row count, on which rows are masked or
 * on the thread count (one thread computes a block of rows' query heads of one key-value head, reading each key
 * once for all of them), so a row's output is a function of its query and the keys and values it sees alone. Masked keys are skipped, not added as zeros: a tree node's keys are the same
 * sequence as the plain row's for the same position once the accepted path is moved down in the cache.
 *
 * Layouts (bfloat16 as uint16): q [rows][heads][dim] with strides q_row, q_head (elements, dim contiguous); keys and
 * values [kv_heads][capacity][dim] with head stride kv_head (elements), rows contiguous; out [rows][heads][dim]
 * contiguous. dim % 16 == 0, dim <= 512.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#define MAX_DIM 512

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

static inline float dot(const float *q, const float *k, int dim) {
    float lane[LANES] = {0};
    for (int d = 0; d < dim; d += LANES)
        for (int l = 0; l < LANES; l++) lane[l] = fmaf(q[d + l], k[d + l], lane[l]);
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++) lane[l] += lane[l + width];
    return lane[0];
}

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
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* per (block of rows, key-value head): every (row, query head) pair of it together; each pair's arithmetic
         * and key order are the rule above, whatever the grouping (the grouping only saves reading and converting
         * each key and value once per pair) */
        float *scores = malloc(sizeof(float) * (size_t)most * width); /* [key position][row in block][head] */
        float *query = malloc(sizeof(float) * (size_t)width * dim), *acc = malloc(sizeof(float) * (size_t)width * dim);
        float *top = malloc(sizeof(float) * (size_t)width), *total = malloc(sizeof(float) * (size_t)width);
        float key[MAX_DIM];
        const int ready = scores != NULL && query != NULL && acc != NULL && top != NULL && total != NULL;
        if (!ready) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int item = 0; item < blocks * kv_heads; item++) {
            if (!ready) continue;
            const int b = item / kv_heads, g = item % kv_heads;
            const int first = b * per_block, last = first + per_block < rows ? first + per_block : rows;
            const int count = last - first;
            if (count <= 0) continue;
            const uint16_t *kh = keys + (size_t)g * kv_head, *vh = values + (size_t)g * kv_head;
            for (int r = 0; r < count; r++)
                for (int j = 0; j < groups; j++)
                    for (int d = 0; d < dim; d++)
                        query[(r * groups + j) * dim + d] =
                            bf16_to_float(q[(size_t)(first + r) * q_row + (size_t)(g * groups + j) * q_head + d]);
            for (int x = 0; x < count * groups; x++) top[x] = -INFINITY, total[x] = 0.0f;
            /* keys in ascending position: the prefix (every row sees it), then this call's rows */
            for (int i = 0; i < most; i++) {
                const uint16_t *k = kh + (size_t)i * dim;
                for (int d = 0; d < dim; d++) key[d] = bf16_to_float(k[d]);
                for (int r = 0; r < count; r++) {
                    const int t = first + r, j = i - prefix;
                    if (j >= 0 && !(visible == NULL ? j <= t : visible[(size_t)t * rows + j])) continue;
                    for (int h = 0; h < groups; h++) {
                        const int x = r * groups + h;
                        const float s = scaling * dot(query + (size_t)x * dim, key, dim);
                        scores[(size_t)i * width + x] = s;
                        top[x] = s > top[x] ? s : top[x];
                    }
                }
            }
            for (int x = 0; x < count * groups * dim; x++) acc[x] = 0.0f;
            for (int i = 0; i < most; i++) {
                const uint16_t *v = vh + (size_t)i * dim;
                for (int d = 0; d < dim; d++) key[d] = bf16_to_float(v[d]);
                for (int r = 0; r < count; r++) {
                    const int t = first + r, j = i - prefix;
                    if (j >= 0 && !(visible == NULL ? j <= t : visible[(size_t)t * rows + j])) continue;
                    for (int h = 0; h < groups; h++) {
                        const int x = r * groups + h;
                        const float e = expf(scores[(size_t)i * width + x] - top[x]);
                        total[x] += e;
                        float *a = acc + (size_t)x * dim;
                        for (int d = 0; d < dim; d++) a[d] = fmaf(e, key[d], a[d]);
                    }
                }
            }
            for (int r = 0; r < count; r++)
                for (int h = 0; h < groups; h++) {
                    const int x = r * groups + h;
                    uint16_t *o = out + ((size_t)(first + r) * heads + g * groups + h) * dim;
                    for (int d = 0; d < dim; d++) o[d] = float_to_bf16(acc[(size_t)x * dim + d] / total[x]);
                }
        }
        free(scores);
        free(query);
        free(acc);
        free(top);
        free(total);
    }
    return failed ? -1 : 0;
}
