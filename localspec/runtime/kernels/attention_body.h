/* attention.c's kernels for one element type, included once per type with
 *   ELEM           the stored type of q, keys, values and out (uint16_t for bfloat16 and float16, float)
 *   TO_FLOAT(x)    an element to float32 (exact for every type)
 *   FROM_FLOAT(f)  a float32 result to an element (nearest, ties to even; float32: itself)
 *   NAME(f)        f with the type's suffix (exact_attention_bf16, exact_attention_f32, exact_attention_f16)
 * Every number is computed in float32 from the converted elements, by the rule attention.c states, so the three
 * types differ only in how elements are read and how the output is rounded. */
/* tile[d][l] = key l's dim d, l < VW (keys past n: zeros), from keys [key][dim]: data movement only */
static inline void NAME(key_tile)(const ELEM *keys, int n, int dim, float *rows, float *tile) {
#if defined(__AVX512F__)
    for (int l = 0; l < VW; l++) /* rows [key][dim] in float32 first, then 16 × 16 blocks transposed in registers */
        for (int d = 0; d < dim; d++) rows[(size_t)l * dim + d] = l < n ? TO_FLOAT(keys[(size_t)l * dim + d]) : 0.0f;
    for (int c = 0; c < dim; c += 16) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(rows + (size_t)i * dim + c);
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
            r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
            r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
            r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        }
        for (int i = 0; i < 4; i++) {
            t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
            t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
            t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
            t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
        }
        for (int i = 0; i < 8; i++) {
            _mm512_storeu_ps(tile + (size_t)(c + i) * 16, _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
            _mm512_storeu_ps(tile + (size_t)(c + i + 8) * 16, _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD));
        }
    }
#else
    (void)rows;
    for (int d = 0; d < dim; d++)
        for (int l = 0; l < VW; l++) tile[(size_t)d * VW + l] = l < n ? TO_FLOAT(keys[(size_t)l * dim + d]) : 0.0f;
#endif
}

/* The rule for one row, and for a verify's few rows over a cache at least as long as they are (attention.c
 * KEY_LANES), in three passes split evenly over the threads, a vector holding VW keys' (or output dims') sums of one
 * (row, query head) pair:
 *   1. s_i for every (key-value head, tile of VW keys): the keys are the lanes, each lane summing its key's
 *      products in dim order (from the tile transposed), HEAD_CHUNK pairs' chains side by side;
 *   2. per pair: scale or mask, the max, e_i = exp_fixed(s_i − max); then Σ e_i in key order, a chunk's pairs'
 *      sums side by side;
 *   3. Σ e_i·v_i for every (key-value head, VW output dims): the dims are the lanes, each adding its terms in key
 *      order over every key of the call (a masked key's e_i = 0 leaves the sum as it was), HEAD_CHUNK pairs' sums in
 *      registers; then divided and rounded.
 * Every number is the rule's, computed by one thread in the rule's order, whatever the rows beside it and whichever
 * layout the call takes; the self-check compares a row alone against the same row inside tree-masked calls of 9
 * rows in both layouts. Pair p of key-value head g is row p / groups, query head g · groups + p % groups. These
 * passes hold the whole call's scores, which pair_lanes below does not; pair_lanes fills few lanes on a few rows of
 * a grouped-query model (3 of 16 for 2 rows of a 9-head, 3-group model split over 2 threads), and cost 2–2.6× these
 * passes on 400–1,000 cached positions. */
static int NAME(key_lanes)(const ELEM *q, long q_row, long q_head, const ELEM *keys, const ELEM *values,
                           long kv_head, const uint8_t *visible, ELEM *out, int rows, int heads, int kv_heads,
                           int dim, int prefix, float scaling, int threads) {
    const int groups = heads / kv_heads, pairs = rows * groups, most = prefix + rows, tiles = (most + VW - 1) / VW;
    const int chunks = (pairs + HEAD_CHUNK - 1) / HEAD_CHUNK, padded = chunks * HEAD_CHUNK;
    const int stride = tiles * VW, dim_blocks = dim / VW; /* a pair's scores, whole vectors */
    float *query = malloc(sizeof(float) * (size_t)kv_heads * padded * dim);    /* [kv head][pair][dim], zero padded */
    float *scores = malloc(sizeof(float) * (size_t)kv_heads * padded * stride); /* [kv head][pair][key]: s, then e */
    float *totals = malloc(sizeof(float) * (size_t)kv_heads * padded);         /* Σ e_i per pair */
    if (query == NULL || scores == NULL || totals == NULL) {
        free(query);
        free(scores);
        free(totals);
        return -1;
    }
    for (int g = 0; g < kv_heads; g++)
        for (int p = 0; p < padded; p++)
            for (int d = 0; d < dim; d++)
                query[((size_t)g * padded + p) * dim + d] =
                    p < pairs ? TO_FLOAT(q[(size_t)(p / groups) * q_row + (size_t)(g * groups + p % groups) * q_head + d])
                              : 0.0f;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *tile = malloc(sizeof(float) * (size_t)dim * VW);     /* [dim][key in tile]: keys, float32 */
        float *key_rows = malloc(sizeof(float) * (size_t)VW * dim); /* a tile's keys [key][dim], float32 */
        float *lane_values = malloc(sizeof(float) * (size_t)most * VW); /* [key][dim in block]: values, float32 */
        const int ready = tile && key_rows && lane_values;
        if (!ready) {
#pragma omp atomic write
            failed = 1;
        }
        /* 1. s_i */
#pragma omp for schedule(static)
        for (int item = 0; item < kv_heads * tiles; item++) {
            if (!ready) continue;
            const int g = item / tiles, i0 = (item % tiles) * VW, n = most - i0 < VW ? most - i0 : VW;
            NAME(key_tile)(keys + (size_t)g * kv_head + (size_t)i0 * dim, n, dim, key_rows, tile);
            for (int c = 0; c < chunks; c++) {
                const float *qc = query + ((size_t)g * padded + (size_t)c * HEAD_CHUNK) * dim;
                vfloat sum[HEAD_CHUNK];
                for (int h = 0; h < HEAD_CHUNK; h++) sum[h] = vzero();
                for (int d = 0; d < dim; d++) {
                    const vfloat kd = vload(tile + (size_t)d * VW);
                    for (int h = 0; h < HEAD_CHUNK; h++) sum[h] = vfma(vbroadcast(qc[(size_t)h * dim + d]), kd, sum[h]);
                }
                for (int h = 0; h < HEAD_CHUNK; h++)
                    vstore(scores + ((size_t)g * padded + c * HEAD_CHUNK + h) * stride + i0, sum[h]);
            }
        }
        /* 2. scaled or masked, the max (the same whatever order it is taken in), e_i = exp(s_i - max s) (exactly 0
         * where masked), and Σ e_i in key order: a chunk's pairs' sums side by side (each its own chain) */
#pragma omp for schedule(static)
        for (int item = 0; item < kv_heads * chunks; item++) {
            const int g = item / chunks, c = item % chunks;
            float *first = scores + ((size_t)g * padded + (size_t)c * HEAD_CHUNK) * stride;
            float sum[HEAD_CHUNK];
            for (int h = 0; h < HEAD_CHUNK; h++) {
                const int p = c * HEAD_CHUNK + h, t = p / groups;
                float *sh = first + (size_t)h * stride, top = -INFINITY;
                sum[h] = 0.0f;
                if (p >= pairs) continue; /* a padding pair: its scores are never read */
                int i = 0;
                vfloat tops = vbroadcast(-INFINITY);
                for (; i + VW <= prefix; i += VW) { /* the cached keys: seen by every row */
                    const vfloat s = vmul(vbroadcast(scaling), vload(sh + i));
                    vstore(sh + i, s);
                    tops = vmax(s, tops);
                }
                float lanes[VW];
                vstore(lanes, tops);
                for (int l = 0; l < VW; l++) top = lanes[l] > top ? lanes[l] : top;
                for (; i < most; i++) {
                    const int j = i - prefix;
                    const int seen = j < 0 || (visible == NULL ? j <= t : visible[(size_t)t * rows + j]);
                    sh[i] = seen ? scaling * sh[i] : -INFINITY;
                    top = sh[i] > top ? sh[i] : top;
                }
                for (i = 0; i < most; i++) sh[i] = exp_fixed(sh[i] - top);
            }
            for (int i = 0; i < most; i++)
                for (int h = 0; h < HEAD_CHUNK; h++) sum[h] = sum[h] + first[(size_t)h * stride + i];
            for (int h = 0; h < HEAD_CHUNK && c * HEAD_CHUNK + h < pairs; h++)
                totals[(size_t)g * padded + c * HEAD_CHUNK + h] = sum[h];
        }
        /* 3. Σ e_i·v_i in key order, divided by Σ e_i, rounded */
#pragma omp for schedule(static)
        for (int item = 0; item < kv_heads * dim_blocks; item++) {
            if (!ready) continue;
            const int g = item / dim_blocks, d0 = (item % dim_blocks) * VW;
            const ELEM *vh = values + (size_t)g * kv_head + d0;
            for (int i = 0; i < most; i++) /* converted once for every chunk of pairs */
                for (int l = 0; l < VW; l++) lane_values[(size_t)i * VW + l] = TO_FLOAT(vh[(size_t)i * dim + l]);
            for (int c = 0; c < chunks; c++) {
                const float *ec = scores + ((size_t)g * padded + (size_t)c * HEAD_CHUNK) * stride;
                vfloat acc[HEAD_CHUNK];
                for (int h = 0; h < HEAD_CHUNK; h++) acc[h] = vzero();
                for (int i = 0; i < most; i++) {
                    const vfloat vi = vload(lane_values + (size_t)i * VW);
                    for (int h = 0; h < HEAD_CHUNK; h++) acc[h] = vfma(vbroadcast(ec[(size_t)h * stride + i]), vi, acc[h]);
                }
                for (int h = 0; h < HEAD_CHUNK && c * HEAD_CHUNK + h < pairs; h++) {
                    const int p = c * HEAD_CHUNK + h, head = g * groups + p % groups;
                    const float total = totals[(size_t)g * padded + p];
                    float a[VW];
                    vstore(a, acc[h]);
                    for (int l = 0; l < VW; l++)
                        out[((size_t)(p / groups) * heads + head) * dim + d0 + l] = FROM_FLOAT(a[l] / total);
                }
            }
        }
        free(tile);
        free(key_rows);
        free(lane_values);
    }
    free(query);
    free(scores);
    free(totals);
    return failed ? -1 : 0;
}

/* The rule for a call of many rows, with (row, head) pairs in the vector lanes: per (block of up to MAX_BLOCK rows,
 * key-value head), every pair of the block together, so each key and value is read and converted once for all of
 * them, and the scores held are a block's, not the call's. */
static int NAME(pair_lanes)(const ELEM *q, long q_row, long q_head, const ELEM *keys, const ELEM *values,
                            long kv_head, const uint8_t *visible, ELEM *out, int rows, int heads, int kv_heads,
                            int dim, int prefix, float scaling, int threads) {
    const int groups = heads / kv_heads, most = prefix + rows, blocks = row_blocks(rows, kv_heads, threads);
    const int per_block = (rows + blocks - 1) / blocks, width = per_block * groups; /* (row, head) pairs a block */
    const int padded = (width + VW - 1) / VW * VW; /* the pairs as whole vectors (zero queries past the last) */
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* each lane's arithmetic and key order are the rule (attention.c), whatever the grouping */
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
#pragma omp for schedule(static, 1) /* round robin: a chain's later blocks read more keys */
        for (int item = 0; item < blocks * kv_heads; item++) {
            if (!ready) continue;
            const int b = item / kv_heads, g = item % kv_heads;
            const int first = b * per_block, last = first + per_block < rows ? first + per_block : rows;
            const int count = last - first, pairs = count * groups, lanes = (pairs + VW - 1) / VW * VW;
            if (count <= 0) continue;
            /* a chain's block sees no key past its last row: those would add exactly 0 to every sum of the block */
            const int end = visible == NULL ? prefix + last : most;
            const ELEM *kh = keys + (size_t)g * kv_head, *vh = values + (size_t)g * kv_head;
            for (int z = 0; z < dim * lanes; z++) query[z] = 0.0f, acc[z] = 0.0f;
            for (int r = 0; r < count; r++)
                for (int j = 0; j < groups; j++)
                    for (int d = 0; d < dim; d++)
                        query[(size_t)d * lanes + r * groups + j] =
                            TO_FLOAT(q[(size_t)(first + r) * q_row + (size_t)(g * groups + j) * q_head + d]);
            for (int x = 0; x < lanes; x++) top[x] = x < pairs ? -INFINITY : 0.0f, total[x] = 0.0f;
            /* 1. s_i, TILE keys at a time in ascending position (the prefix, then this call's rows): for each dim in
             * order, every (key, pair) sum takes its fused multiply-add; then scaled, or -inf where masked */
            for (int i0 = 0; i0 < end; i0 += TILE) {
                const int n = end - i0 < TILE ? end - i0 : TILE;
                for (int l = 0; l < TILE; l++) /* keys past the end: zeros, their sums unused */
                    for (int d = 0; d < dim; d++)
                        kv[l * dim + d] = l < n ? TO_FLOAT(kh[(size_t)(i0 + l) * dim + d]) : 0.0f;
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
            for (int i = 0; i < end; i++) {
                float *e = scores + (size_t)i * lanes;
                for (int x = 0; x < lanes; x++) e[x] = exp_fixed(e[x] - top[x]);
            }
            /* 3. Σ e_i and Σ e_i·v_i in ascending position over every key: a masked key's e_i = 0 leaves both sums
             * exactly as they were (x + 0 = x, and no sum is -0), so each is the sum over the keys its pair sees */
            for (int i0 = 0; i0 < end; i0 += TILE) {
                const int n = end - i0 < TILE ? end - i0 : TILE;
                for (int l = 0; l < n; l++)
                    for (int d = 0; d < dim; d++) kv[l * dim + d] = TO_FLOAT(vh[(size_t)(i0 + l) * dim + d]);
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
                    ELEM *o = out + ((size_t)(first + r) * heads + g * groups + h) * dim;
                    for (int d = 0; d < dim; d++) o[d] = FROM_FLOAT(acc[(size_t)d * lanes + x] / total[x]);
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

/* Returns 0, -1 when out of memory, -2 for a shape it does not take. */
int NAME(exact_attention)(const ELEM *q, long q_row, long q_head, const ELEM *keys, const ELEM *values,
                          long kv_head, const uint8_t *visible, ELEM *out, int rows, int heads, int kv_heads,
                          int dim, int prefix, float scaling, int threads) {
    if (dim % LANES || dim > MAX_DIM || heads % kv_heads || heads / kv_heads > MAX_GROUP) return -2;
    if (KEY_LANES(rows, prefix))
        return NAME(key_lanes)(q, q_row, q_head, keys, values, kv_head, visible, out, rows, heads, kv_heads, dim,
                               prefix, scaling, threads);
    return NAME(pair_lanes)(q, q_row, q_head, keys, values, kv_head, visible, out, rows, heads, kv_heads, dim, prefix,
                            scaling, threads);
}
