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
 * on the thread count (one thread computes a row's query heads of one key-value head, reading each key once for
 * all of them), so a row's output is a function of its query and the keys and values it sees alone. Masked keys are skipped, not added as zeros: a tree node's keys are the same
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

/* Returns 0, -1 when out of memory, -2 for a shape it does not take. */
int exact_attention(const uint16_t *q, long q_row, long q_head, const uint16_t *keys, const uint16_t *values,
                    long kv_head, const uint8_t *visible, uint16_t *out, int rows, int heads, int kv_heads, int dim,
                    int prefix, float scaling, int threads) {
    if (dim % LANES || dim > MAX_DIM || heads % kv_heads || heads / kv_heads > MAX_GROUP) return -2;
    const int groups = heads / kv_heads, most = prefix + rows;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* per (row, key-value head): the query heads of that group, together; each one's arithmetic is the rule
         * above, whatever the grouping (the grouping only saves reading and converting each key and value) */
        float *scores = malloc(sizeof(float) * (size_t)most * groups); /* [n][group] */
        int *seen = malloc(sizeof(int) * (size_t)most);
        float *query = malloc(sizeof(float) * (size_t)groups * dim), *acc = malloc(sizeof(float) * (size_t)groups * dim);
        float key[MAX_DIM];
        if (scores == NULL || seen == NULL || query == NULL || acc == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int item = 0; item < rows * kv_heads; item++) {
            if (scores == NULL || seen == NULL || query == NULL || acc == NULL) continue;
            const int t = item / kv_heads, g = item % kv_heads;
            const uint16_t *kh = keys + (size_t)g * kv_head, *vh = values + (size_t)g * kv_head;
            for (int j = 0; j < groups; j++)
                for (int d = 0; d < dim; d++)
                    query[j * dim + d] = bf16_to_float(q[(size_t)t * q_row + (size_t)(g * groups + j) * q_head + d]);
            int n = 0;
            for (int i = 0; i < prefix; i++) seen[n++] = i;
            for (int j = 0; j < rows; j++)
                if (visible == NULL ? j <= t : visible[(size_t)t * rows + j]) seen[n++] = prefix + j;
            float top[MAX_GROUP], total[MAX_GROUP];
            for (int j = 0; j < groups; j++) top[j] = -INFINITY, total[j] = 0.0f;
            for (int i = 0; i < n; i++) {
                const uint16_t *k = kh + (size_t)seen[i] * dim;
                for (int d = 0; d < dim; d++) key[d] = bf16_to_float(k[d]);
                for (int j = 0; j < groups; j++) {
                    const float s = scaling * dot(query + j * dim, key, dim);
                    scores[(size_t)i * groups + j] = s;
                    top[j] = s > top[j] ? s : top[j];
                }
            }
            for (int x = 0; x < groups * dim; x++) acc[x] = 0.0f;
            for (int i = 0; i < n; i++) {
                const uint16_t *v = vh + (size_t)seen[i] * dim;
                for (int d = 0; d < dim; d++) key[d] = bf16_to_float(v[d]);
                for (int j = 0; j < groups; j++) {
                    const float e = expf(scores[(size_t)i * groups + j] - top[j]);
                    total[j] += e;
                    float *a = acc + j * dim;
                    for (int d = 0; d < dim; d++) a[d] = fmaf(e, key[d], a[d]);
                }
            }
            for (int j = 0; j < groups; j++) {
                uint16_t *o = out + ((size_t)t * heads + g * groups + j) * dim;
                for (int d = 0; d < dim; d++) o[d] = float_to_bf16(acc[j * dim + d] / total[j]);
            }
        }
        free(scores);
        free(seen);
        free(query);
        free(acc);
    }
    return failed ? -1 : 0;
}
