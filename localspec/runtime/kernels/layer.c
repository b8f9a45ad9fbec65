/* One llama decoder layer for the decode and verify rows of a forward, in one call: the layer as lean_llama.py's
 * LeanLayer computes it from torch ops, with the q4 matmul (q4_matmul.c) for its linears and the exact attention
 * (attention.c), so a forward of T rows costs 30 C calls instead of ~90 torch ops a layer.
 *
 * For each row t of the call, in this order (every step rounds to bfloat16 where the torch ops round):
 *   h    = w_in · bf16(x / sqrt(mean(x²) + eps))       the mean summed in dim order, in float32
 *   qkv  = h · W_qkvᵀ                                    q4_matmul, q, k and v side by side
 *   q, k = bf16(bf16(q·cos) + bf16(roll(q, D/2)·sin))    rotary (sin carries rotate_half's sign); k and v are
 *                                                        written to the cache at position prefix + t, in place
 *   a    = attention(q; the keys the row sees)           exact_attention_bf16: visible, or causal when NULL
 *   x'   = bf16(x + a · W_oᵀ)
 *   h'   = w_post · bf16(x' / sqrt(mean(x'²) + eps))
 *   g, u = h' · W_gate_upᵀ
 *   out  = bf16(x' + bf16(bf16(silu(g)) · u) · W_downᵀ)  silu(g) = g / (1 + e^-g) with exp_fixed on -|g|
 * Every step is either row by row in a fixed order or one of the two row-invariant kernels, so a row's output is
 * a function of that row and the cached keys and values it sees alone: a row of a (K+1)-row verify is bitwise the
 * same row decoded alone. It is not bitwise the torch ops' layer (their reductions and exp round differently);
 * plain decoding and verification both run it, which is what the exactness guarantee needs.
 */
#pragma GCC optimize("fp-contract=off") /* no multiply-add fused by the compiler: each rounds as written */
#pragma STDC FP_CONTRACT OFF
#include <stdint.h>
#include <stdlib.h>

#include "scalar.h"

int q4_matmul(const uint16_t *x, const uint8_t *codes, const uint16_t *dm, uint16_t *y, int rows, int k, int n,
              int threads);
int exact_attention_bf16(const uint16_t *q, long q_row, long q_head, const uint16_t *keys, const uint16_t *values,
                         long kv_head, const uint8_t *visible, uint16_t *out, int rows, int heads, int kv_heads,
                         int dim, int prefix, float scaling, int threads);

/* Shared with runtime/layer_kernel.py (a ctypes Structure of the same fields, in this order). */
typedef struct {
    /* the layer's weights: norms [H] bf16; linears in the q4 layout (codes, d and m) */
    const uint16_t *input_norm, *post_norm;
    const uint8_t *qkv_codes, *o_codes, *gate_up_codes, *down_codes;
    const uint16_t *qkv_dm, *o_dm, *gate_up_dm, *down_dm;
    float input_eps, post_eps, scaling;
    int hidden, heads, kv_heads, dim, intermediate;
    /* this call */
    const uint16_t *x;           /* [T, H] bf16 */
    uint16_t *out;               /* [T, H] bf16 */
    const uint16_t *cos, *sin;   /* [T, D] bf16, the rows' positions */
    uint16_t *keys, *values;     /* the cache's buffers [Hkv][capacity][D] bf16; rows prefix.. are written */
    long kv_head;                /* elements between key-value heads in them: capacity · D */
    const uint8_t *visible;      /* [T, T]: the rows each row sees (a tree), or NULL: rows up to itself (a chain) */
    int rows, prefix, threads;
} LayerArgs;

static void rms_norm(const uint16_t *x, const uint16_t *weight, float eps, int hidden, uint16_t *out) {
    float squares = 0.0f;
    for (int i = 0; i < hidden; i++) {
        const float v = bf16_to_float(x[i]);
        squares += v * v;
    }
    const float inverse = 1.0f / sqrtf(squares / (float)hidden + eps);
    for (int i = 0; i < hidden; i++)
        out[i] = float_to_bf16(bf16_to_float(weight[i]) * bf16_round(bf16_to_float(x[i]) * inverse));
}

/* head [D] in place: bf16(bf16(x·cos) + bf16(roll(x, D/2)·sin)); roll(x, D/2)[i] = x[(i + D/2) mod D] */
static void rotate(uint16_t *head, const uint16_t *cos, const uint16_t *sin, int dim, uint16_t *into) {
    const int half = dim / 2;
    for (int i = 0; i < dim; i++) {
        const float a = bf16_round(bf16_to_float(head[i]) * bf16_to_float(cos[i]));
        const float b = bf16_round(bf16_to_float(head[(i + half) % dim]) * bf16_to_float(sin[i]));
        into[i] = float_to_bf16(a + b);
    }
}

static float silu(float g) {
    const float e = exp_fixed(g < 0.0f ? g : -g); /* e^-|g| */
    return g < 0.0f ? g * e / (1.0f + e) : g / (1.0f + e);
}

/* Returns 0, -1 when out of memory, -2 for a shape the attention kernel does not take. */
int lean_layer(const LayerArgs *a) {
    const int rows = a->rows, hidden = a->hidden, dim = a->dim, inter = a->intermediate;
    const int q_width = a->heads * dim, kv_width = a->kv_heads * dim, width = q_width + 2 * kv_width;
    const size_t scratch = (size_t)rows * (2 * (size_t)hidden + (size_t)width + (size_t)q_width + 3 * (size_t)inter +
                                           (size_t)dim);
    uint16_t *h = malloc(sizeof(uint16_t) * scratch);
    if (h == NULL) return -1;
    uint16_t *mid = h + (size_t)rows * hidden;        /* [T, H]: x' */
    uint16_t *qkv = mid + (size_t)rows * hidden;      /* [T, width] */
    uint16_t *att = qkv + (size_t)rows * width;       /* [T, H·D] */
    uint16_t *gate_up = att + (size_t)rows * q_width; /* [T, 2I] */
    uint16_t *act = gate_up + (size_t)rows * 2 * inter; /* [T, I] */
    uint16_t *turned = act + (size_t)rows * inter;    /* [D]: a head after rotary */
    int status = 0;
    for (int t = 0; t < rows; t++)
        rms_norm(a->x + (size_t)t * hidden, a->input_norm, a->input_eps, hidden, h + (size_t)t * hidden);
    if ((status = q4_matmul(h, a->qkv_codes, a->qkv_dm, qkv, rows, hidden, width, a->threads))) goto done;
    for (int t = 0; t < rows; t++) {
        uint16_t *row = qkv + (size_t)t * width;
        const uint16_t *cos = a->cos + (size_t)t * dim, *sin = a->sin + (size_t)t * dim;
        const size_t at = (size_t)(a->prefix + t) * dim;
        for (int j = 0; j < a->heads; j++) {
            rotate(row + (size_t)j * dim, cos, sin, dim, turned);
            memcpy(row + (size_t)j * dim, turned, sizeof(uint16_t) * dim);
        }
        for (int g = 0; g < a->kv_heads; g++) {
            rotate(row + q_width + (size_t)g * dim, cos, sin, dim, a->keys + (size_t)g * a->kv_head + at);
            memcpy(a->values + (size_t)g * a->kv_head + at, row + q_width + kv_width + (size_t)g * dim,
                   sizeof(uint16_t) * dim);
        }
    }
    status = exact_attention_bf16(qkv, width, dim, a->keys, a->values, a->kv_head, a->visible, att, rows, a->heads,
                                  a->kv_heads, dim, a->prefix, a->scaling, a->threads);
    if (status) goto done;
    if ((status = q4_matmul(att, a->o_codes, a->o_dm, mid, rows, q_width, hidden, a->threads))) goto done;
    for (size_t i = 0; i < (size_t)rows * hidden; i++) mid[i] = float_to_bf16(bf16_to_float(a->x[i]) + bf16_to_float(mid[i]));
    for (int t = 0; t < rows; t++)
        rms_norm(mid + (size_t)t * hidden, a->post_norm, a->post_eps, hidden, h + (size_t)t * hidden);
    if ((status = q4_matmul(h, a->gate_up_codes, a->gate_up_dm, gate_up, rows, hidden, 2 * inter, a->threads)))
        goto done;
    for (int t = 0; t < rows; t++) {
        const uint16_t *g = gate_up + (size_t)t * 2 * inter, *u = g + inter;
        for (int i = 0; i < inter; i++)
            act[(size_t)t * inter + i] =
                float_to_bf16(bf16_round(silu(bf16_to_float(g[i]))) * bf16_to_float(u[i]));
    }
    if ((status = q4_matmul(act, a->down_codes, a->down_dm, a->out, rows, inter, hidden, a->threads))) goto done;
    for (size_t i = 0; i < (size_t)rows * hidden; i++)
        a->out[i] = float_to_bf16(bf16_to_float(mid[i]) + bf16_to_float(a->out[i]));
done:
    free(h);
    return status;
}
