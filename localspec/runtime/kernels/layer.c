/* One llama (or qwen2 / qwen3) decoder layer for the decode and verify rows of a forward, in one call: the layer as lean_llama.py's
 * LeanLayer computes it from torch ops, with the q4 matmul (q4_matmul.c) for its linears and the exact attention
 * (attention.c), so a forward of T rows costs 30 C calls instead of ~90 torch ops a layer. Each linear is in the
 * layout of its block type's kernel (a LinearRef: q4, q4f, q4k, q8, q8k or q6k); q, k, v and gate, up are one matmul where
 * they share a layout, else each part is computed alone and its columns placed side by side. The q8 kernels sum in
 * float32, rounded to bfloat16 once, as Q8Linear does.
 *
 * For each row t of the call, in this order (every step rounds to bfloat16 where the torch ops round):
 *   h    = w_in · bf16(x / sqrt(mean(x²) + eps))       the mean summed in dim order, in float32
 *   qkv  = h · W_qkvᵀ (+ bias)                           q4_matmul, q, k and v side by side (qwen2: + each bias)
 *   q, k = each head w_q / w_k · bf16(q / sqrt(mean(q²) + eps))   qwen3 only, as the norms above
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
int q4f_matmul(const uint16_t *x, const uint8_t *codes, const float *dm, uint16_t *y, int rows, int k, int n,
               int threads);
int q4k_matmul(const uint16_t *x, const uint8_t *codes, const uint8_t *scales, uint16_t *y, int rows, int k, int n,
               int threads);
int q8_matmul(const uint16_t *x, const int8_t *codes, const uint16_t *dscale, float *y, int rows, int k, int n,
              int threads);
int q8k_matmul(const uint16_t *x, const int8_t *codes, const float *dm, float *y, int rows, int k, int n,
               int threads);
int q6k_matmul(const uint16_t *x, const int8_t *codes, const uint8_t *scales, float *y, int rows, int k, int n,
               int threads);
int exact_attention_bf16(const uint16_t *q, long q_row, long q_head, const uint16_t *keys, const uint16_t *values,
                         long kv_head, const uint8_t *visible, uint16_t *out, int rows, int heads, int kv_heads,
                         int dim, int prefix, float scaling, int threads);

enum { LINEAR_Q4 = 0, LINEAR_Q4F = 1, LINEAR_Q8 = 2, LINEAR_Q8K = 3, LINEAR_Q4K = 4, LINEAR_Q6K = 5 };
#define MAX_PARTS 3
/* Rows from which the row-by-row steps (norms, rotary, silu) split over the threads, each row on one of them (the
 * same bits): below it a thread's share is shorter than waking the other. */
#define ROWS_IN_PARALLEL 2

/* One linear's weights in its kernel's layout. Shared with runtime/layer_kernel.py, as LayerArgs is. */
typedef struct {
    int kind;             /* LINEAR_*: which matmul reads it */
    int n;                /* outputs */
    const void *codes;    /* q4 / q4f: uint8 codes; q8 / q8k: int8 codes */
    const void *scales;   /* q4: d and m float16; q4f, q8k: float32; q8: d float16; q4k, q6k: the file's own */
    const uint16_t *bias; /* [n] bf16 added to the rounded outputs (qwen2's q, k, v), or NULL */
} LinearRef;

/* Shared with runtime/layer_kernel.py (a ctypes Structure of the same fields, in this order). */
typedef struct {
    /* the layer's weights: norms [H] bf16; each projection as 1..MAX_PARTS linears whose outputs lie side by side */
    const uint16_t *input_norm, *post_norm;
    LinearRef qkv[MAX_PARTS], o[MAX_PARTS], gate_up[MAX_PARTS], down[MAX_PARTS];
    int qkv_parts, o_parts, gate_up_parts, down_parts;
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
    /* qwen3: each head's q and k RMS-normalised before rotary, weights [D] bf16 (NULL: none) */
    const uint16_t *q_norm, *k_norm;
    float qk_eps;
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

/* into[i] = bf16(bf16(x[i]·cos[i]) + bf16(partner[i]·sin[i])) for i < len: lane by lane, so the compiler's vectors
 * give the same bits as one element at a time. */
static void rotate_half(const uint16_t *restrict x, const uint16_t *restrict partner, const uint16_t *restrict cos,
                        const uint16_t *restrict sin, int len, uint16_t *restrict into) {
    for (int i = 0; i < len; i++) {
        const float a = bf16_round(bf16_to_float(x[i]) * bf16_to_float(cos[i]));
        const float b = bf16_round(bf16_to_float(partner[i]) * bf16_to_float(sin[i]));
        into[i] = float_to_bf16(a + b);
    }
}

/* into [D] = bf16(bf16(head·cos) + bf16(roll(head, D/2)·sin)); roll(head, D/2)[i] = head[(i + D/2) mod D] */
static void rotate(const uint16_t *head, const uint16_t *cos, const uint16_t *sin, int dim, uint16_t *into) {
    const int half = dim / 2;
    rotate_half(head, head + half, cos, sin, half, into);
    rotate_half(head + half, head, cos + half, sin + half, dim - half, into + half);
}

static float silu(float g) {
    const float e = exp_fixed(g < 0.0f ? g : -g); /* e^-|g| */
    return g < 0.0f ? g * e / (1.0f + e) : g / (1.0f + e);
}

/* y [T, N] = x [T, K] · Wᵀ on the part's kernel, then + bias (each rounded to bf16, as BiasedLinear's two torch
 * ops round); sums: [T, N] float32 scratch for the q8 kernels. */
static int linear(const LinearRef *w, const uint16_t *x, uint16_t *y, float *sums, int rows, int k, int threads) {
    int status, rounded = 0;
    switch (w->kind) {
    case LINEAR_Q4: status = q4_matmul(x, w->codes, w->scales, y, rows, k, w->n, threads); break;
    case LINEAR_Q4F: status = q4f_matmul(x, w->codes, w->scales, y, rows, k, w->n, threads); break;
    case LINEAR_Q4K: status = q4k_matmul(x, w->codes, w->scales, y, rows, k, w->n, threads); break;
    case LINEAR_Q8: status = q8_matmul(x, w->codes, w->scales, sums, rows, k, w->n, threads), rounded = 1; break;
    case LINEAR_Q8K: status = q8k_matmul(x, w->codes, w->scales, sums, rows, k, w->n, threads), rounded = 1; break;
    case LINEAR_Q6K: status = q6k_matmul(x, w->codes, w->scales, sums, rows, k, w->n, threads), rounded = 1; break;
    default: return -3;
    }
    if (status) return status;
    if (rounded)
        for (size_t i = 0; i < (size_t)rows * w->n; i++) y[i] = float_to_bf16(sums[i]);
    if (w->bias != NULL)
        for (int t = 0; t < rows; t++)
            for (int i = 0; i < w->n; i++) {
                uint16_t *out = y + (size_t)t * w->n + i;
                *out = float_to_bf16(bf16_to_float(*out) + bf16_to_float(w->bias[i]));
            }
    return 0;
}

/* y [T, ΣN] = the parts' outputs side by side; part: [T, max N] bf16 scratch when there are several. */
static int projection(const LinearRef *parts, int count, const uint16_t *x, uint16_t *y, uint16_t *part, float *sums,
                      int rows, int k, int threads) {
    if (count == 1) return linear(parts, x, y, sums, rows, k, threads);
    int width = 0, status;
    for (int p = 0; p < count; p++) width += parts[p].n;
    for (int p = 0, at = 0; p < count; at += parts[p].n, p++) {
        if ((status = linear(&parts[p], x, part, sums, rows, k, threads))) return status;
        for (int t = 0; t < rows; t++)
            memcpy(y + (size_t)t * width + at, part + (size_t)t * parts[p].n, sizeof(uint16_t) * parts[p].n);
    }
    return 0;
}

/* Returns 0, -1 when out of memory, -2 for a shape the attention kernel does not take, -3 for an unknown kind. */
int lean_layer(const LayerArgs *a) {
    const int rows = a->rows, hidden = a->hidden, dim = a->dim, inter = a->intermediate;
    const int q_width = a->heads * dim, kv_width = a->kv_heads * dim, width = q_width + 2 * kv_width;
    const size_t scratch = (size_t)rows * (2 * (size_t)hidden + (size_t)width + (size_t)q_width + 3 * (size_t)inter +
                                           (size_t)dim);
    size_t widest = (size_t)(width > 2 * inter ? width : 2 * inter); /* the largest projection's outputs */
    if ((size_t)hidden > widest) widest = (size_t)hidden;
    uint16_t *h = malloc(sizeof(uint16_t) * (scratch + (size_t)rows * widest));
    float *sums = malloc(sizeof(float) * (size_t)rows * widest);
    if (h == NULL || sums == NULL) {
        free(h);
        free(sums);
        return -1;
    }
    uint16_t *part = h + scratch;                     /* [T, widest]: one part of a projection */
    uint16_t *mid = h + (size_t)rows * hidden;        /* [T, H]: x' */
    uint16_t *qkv = mid + (size_t)rows * hidden;      /* [T, width] */
    uint16_t *att = qkv + (size_t)rows * width;       /* [T, H·D] */
    uint16_t *gate_up = att + (size_t)rows * q_width; /* [T, 2I] */
    uint16_t *act = gate_up + (size_t)rows * 2 * inter; /* [T, I] */
    uint16_t *turned = act + (size_t)rows * inter;    /* [T, D]: each row's head after rotary */
    int status = 0;
#pragma omp parallel for schedule(static) num_threads(a->threads) if (rows >= ROWS_IN_PARALLEL)
    for (int t = 0; t < rows; t++)
        rms_norm(a->x + (size_t)t * hidden, a->input_norm, a->input_eps, hidden, h + (size_t)t * hidden);
    if ((status = projection(a->qkv, a->qkv_parts, h, qkv, part, sums, rows, hidden, a->threads))) goto done;
#pragma omp parallel for schedule(static) num_threads(a->threads) if (rows >= ROWS_IN_PARALLEL)
    for (int t = 0; t < rows; t++) {
        uint16_t *row = qkv + (size_t)t * width, *spare = turned + (size_t)t * dim;
        const uint16_t *cos = a->cos + (size_t)t * dim, *sin = a->sin + (size_t)t * dim;
        const size_t at = (size_t)(a->prefix + t) * dim;
        if (a->q_norm != NULL)
            for (int j = 0; j < a->heads + a->kv_heads; j++) { /* q heads, then k heads */
                rms_norm(row + (size_t)j * dim, j < a->heads ? a->q_norm : a->k_norm, a->qk_eps, dim, spare);
                memcpy(row + (size_t)j * dim, spare, sizeof(uint16_t) * dim);
            }
        for (int j = 0; j < a->heads; j++) {
            rotate(row + (size_t)j * dim, cos, sin, dim, spare);
            memcpy(row + (size_t)j * dim, spare, sizeof(uint16_t) * dim);
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
    if ((status = projection(a->o, a->o_parts, att, mid, part, sums, rows, q_width, a->threads))) goto done;
    for (size_t i = 0; i < (size_t)rows * hidden; i++) mid[i] = float_to_bf16(bf16_to_float(a->x[i]) + bf16_to_float(mid[i]));
#pragma omp parallel for schedule(static) num_threads(a->threads) if (rows >= ROWS_IN_PARALLEL)
    for (int t = 0; t < rows; t++)
        rms_norm(mid + (size_t)t * hidden, a->post_norm, a->post_eps, hidden, h + (size_t)t * hidden);
    if ((status = projection(a->gate_up, a->gate_up_parts, h, gate_up, part, sums, rows, hidden, a->threads)))
        goto done;
#pragma omp parallel for schedule(static) num_threads(a->threads) if (rows >= ROWS_IN_PARALLEL)
    for (int t = 0; t < rows; t++) {
        const uint16_t *g = gate_up + (size_t)t * 2 * inter, *u = g + inter;
        for (int i = 0; i < inter; i++)
            act[(size_t)t * inter + i] =
                float_to_bf16(bf16_round(silu(bf16_to_float(g[i]))) * bf16_to_float(u[i]));
    }
    if ((status = projection(a->down, a->down_parts, act, a->out, part, sums, rows, inter, a->threads))) goto done;
    for (size_t i = 0; i < (size_t)rows * hidden; i++)
        a->out[i] = float_to_bf16(bf16_to_float(mid[i]) + bf16_to_float(a->out[i]));
done:
    free(h);
    free(sums);
    return status;
}
