#include "vector.h"

/* ---- One token through a whole Llama-family model, in one parallel region -------------------
 *
 * A batch-1 decode step is nothing but streaming every weight once; PyTorch spends it in a
 * few hundred separate ops, each its own fork and join of the thread pool, with Python in
 * between. Here every thread stays in one region for the whole step and takes its share of
 * each product's rows; a barrier separates the phases that depend on each other. Weights are
 * the plain [out, in] matrices. The arithmetic is the layers' own (RMSNorm, rotary in the
 * rotate-half layout, grouped-query attention over the paged pool, SwiGLU), in float32.
 */

/* Rows [begin, end) of the thread's share of `rows` (in blocks of 4). */
static inline void share(int64_t rows, int64_t *begin, int64_t *end) {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t blocks = (rows + 3) / 4, per = (blocks + n - 1) / n;
    *begin = t * per * 4 < rows ? t * per * 4 : rows;
    *end = (t + 1) * per * 4 < rows ? (t + 1) * per * 4 : rows;
}

/* y[r, o] = w[o] · x[r] (+ bias[o]) for r < m, o in [begin, end), x's rows `x_stride` apart:
 * rows of w in blocks of 4, each block used for every x row while it is in L1, so the
 * weights stream by once. */
static inline void gemv_share(const float *w, const float *bias, const float *x,
                              int64_t x_stride, int64_t m, int64_t in, int64_t out,
                              int64_t begin, int64_t end, float *y) {
    int64_t o = begin;
#ifdef VEC
    if (in % VEC == 0 && m == 1) /* one token: the plain stream */
        for (; o + 4 <= end; o += 4) {
            const float *w0 = w + o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
            vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
            for (int64_t i = 0; i < in; i += VEC) {
                vec xv = vload(x + i);
                a0 = vfma(vload(w0 + i), xv, a0);
                a1 = vfma(vload(w1 + i), xv, a1);
                a2 = vfma(vload(w2 + i), xv, a2);
                a3 = vfma(vload(w3 + i), xv, a3);
            }
            y[o] = vsum(a0);
            y[o + 1] = vsum(a1);
            y[o + 2] = vsum(a2);
            y[o + 3] = vsum(a3);
        }
    if (in % VEC == 0) /* two tokens at a time: each weight vector loaded once for both */
        for (; o + 4 <= end; o += 4) {
            const float *w0 = w + o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
            for (int64_t r = 0; r < m; r += 2) {
                const float *x0 = x + r * x_stride, *x1 = r + 1 < m ? x0 + x_stride : x0;
                vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
                vec b0 = vzero(), b1 = vzero(), b2 = vzero(), b3 = vzero();
                for (int64_t i = 0; i < in; i += VEC) {
                    vec u = vload(x0 + i), t = vload(x1 + i);
                    vec v0 = vload(w0 + i), v1 = vload(w1 + i), v2 = vload(w2 + i), v3 = vload(w3 + i);
                    a0 = vfma(v0, u, a0);
                    a1 = vfma(v1, u, a1);
                    a2 = vfma(v2, u, a2);
                    a3 = vfma(v3, u, a3);
                    b0 = vfma(v0, t, b0);
                    b1 = vfma(v1, t, b1);
                    b2 = vfma(v2, t, b2);
                    b3 = vfma(v3, t, b3);
                }
                float *y0 = y + r * out + o;
                y0[0] = vsum(a0);
                y0[1] = vsum(a1);
                y0[2] = vsum(a2);
                y0[3] = vsum(a3);
                if (r + 1 < m) {
                    float *y1 = y0 + out;
                    y1[0] = vsum(b0);
                    y1[1] = vsum(b1);
                    y1[2] = vsum(b2);
                    y1[3] = vsum(b3);
                }
            }
        }
#endif
    for (; o < end; ++o)
        for (int64_t r = 0; r < m; ++r) y[r * out + o] = dot(w + o * in, x + r * x_stride, in);
    if (bias)
        for (int64_t r = 0; r < m; ++r)
            for (o = begin; o < end; ++o) y[r * out + o] += bias[o];
}

/* residual[r] += h[r], then normed[r] = RMSNorm(residual[r]), for the m rows */
static inline void add_and_norm(float *residual, const float *h, int64_t m, int64_t hidden,
                                const float *weight, float eps, float *normed) {
    for (int64_t r = 0; r < m; ++r) {
        float *res = residual + r * hidden;
        for (int64_t i = 0; i < hidden; ++i) res[i] += h[r * hidden + i];
        rms_norm_row(res, weight, eps, hidden, normed + r * hidden);
    }
}

/* m decode tokens, one per sequence, through every layer and the LM head.
 *
 * Per layer, `layer_weights` holds 8 pointers: input norm, qkv [q + 2 kv, hidden], qkv bias
 * (or NULL), o [hidden, q], o bias (or NULL), post-attention norm, gate_up [2 inter,
 * hidden], down [hidden, inter]; `k_layers`/`v_layers` each layer's pool [blocks, block_size,
 * kv_heads, head_dim]. Token r is at `positions[r]` (its rows of the rotary tables cos, sin
 * [positions, head_dim]), writes its K and V to `slots[r]` and attends to `lengths[r]`
 * positions through block table r of `tables` [m, width]. `residual` [m, hidden] holds the
 * embeddings and ends as the last layer's residual stream; `work` has room for
 * m · (2 hidden + 2 (heads + kv_heads) · head_dim + 2 inter) + m · heads · max(lengths)
 * floats; `logits` is [m, vocab]. */
void tm_llama_decode(int64_t m, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
                     int64_t head_dim, int64_t inter, int64_t vocab,
                     const float *const *layer_weights, const float *final_norm,
                     const float *lm_head, float eps, float scale, const float *cos,
                     const float *sin, const int64_t *positions, float *const *k_layers,
                     float *const *v_layers, const int64_t *tables, int64_t width,
                     const int64_t *lengths, const int64_t *slots, int64_t block_size,
                     float *residual, float *work, float *logits) {
    int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, group = heads / kv_heads;
    int64_t qkv_size = q_size + 2 * kv_size, token_stride = kv_heads * head_dim, longest = 0;
    for (int64_t r = 0; r < m; ++r) longest = lengths[r] > longest ? lengths[r] : longest;
    float *normed = work, *qkv = normed + m * hidden, *attn = qkv + m * qkv_size;
    float *h = attn + m * q_size, *gate_up = h + m * hidden, *scores = gate_up + m * 2 * inter;
#pragma omp parallel
    {
        int64_t b, e;
#pragma omp single
        for (int64_t r = 0; r < m; ++r)
            rms_norm_row(residual + r * hidden, layer_weights[0], eps, hidden, normed + r * hidden);
        for (int64_t l = 0; l < layers; ++l) {
            const float *const *lw = layer_weights + 8 * l;
            share(qkv_size, &b, &e);
            gemv_share(lw[1], lw[2], normed, hidden, m, hidden, qkv_size, b, e, qkv);
#pragma omp barrier
#pragma omp single
            for (int64_t r = 0; r < m; ++r) {
                float *row = qkv + r * qkv_size;
                rope_row(row, heads + kv_heads, head_dim, cos + positions[r] * head_dim,
                         sin + positions[r] * head_dim);
                float *kslot = k_layers[l] + slots[r] * token_stride;
                float *vslot = v_layers[l] + slots[r] * token_stride;
                for (int64_t i = 0; i < kv_size; ++i) {
                    kslot[i] = row[q_size + i];
                    vslot[i] = row[q_size + kv_size + i];
                }
            }
            /* attention: (token, query head) pairs shared among the threads */
#pragma omp for schedule(static)
            for (int64_t task = 0; task < m * heads; ++task) {
                int64_t r = task / heads, qh = task % heads, kvh = qh / group, ctx = lengths[r];
                const int64_t *table = tables + r * width;
                const float *qv = qkv + r * qkv_size + qh * head_dim;
                float *sc = scores + task * longest, top = -INFINITY;
                const float *kl = k_layers[l] + kvh * head_dim, *vl = v_layers[l] + kvh * head_dim;
                for (int64_t t = 0; t < ctx; ++t) {
                    int64_t at = position_offset(table, t, block_size, token_stride);
                    sc[t] = dot(qv, kl + at, head_dim) * scale;
                    top = sc[t] > top ? sc[t] : top;
                }
                float inv = 1.f / exp_shifted_sum(sc, ctx, top);
                float *o = attn + r * q_size + qh * head_dim;
                for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.f;
                for (int64_t t = 0; t < ctx; ++t) {
                    int64_t at = position_offset(table, t, block_size, token_stride);
                    axpy(o, sc[t] * inv, vl + at, head_dim);
                }
            } /* implicit barrier */
            share(hidden, &b, &e);
            gemv_share(lw[3], lw[4], attn, q_size, m, q_size, hidden, b, e, h);
#pragma omp barrier
#pragma omp single
            add_and_norm(residual, h, m, hidden, lw[5], eps, normed);
            /* gate and up rows of the same features in one share: each thread then has both
             * halves of its features and applies silu(gate) · up itself */
            share(inter, &b, &e);
            gemv_share(lw[6], NULL, normed, hidden, m, hidden, 2 * inter, b, e, gate_up);
            gemv_share(lw[6] + inter * hidden, NULL, normed, hidden, m, hidden, 2 * inter, b, e,
                       gate_up + inter);
            for (int64_t r = 0; r < m; ++r)
                silu_mul_row(gate_up + r * 2 * inter + b, gate_up + r * 2 * inter + inter + b, e - b,
                             gate_up + r * 2 * inter + b);
#pragma omp barrier
            /* down reads each row's activations: the first `inter` of its 2 · inter */
            share(hidden, &b, &e);
            gemv_share(lw[7], NULL, gate_up, 2 * inter, m, inter, hidden, b, e, h);
#pragma omp barrier
#pragma omp single
            add_and_norm(residual, h, m, hidden,
                         l + 1 < layers ? layer_weights[8 * (l + 1)] : final_norm, eps, normed);
        }
        share(vocab, &b, &e);
        gemv_share(lm_head, NULL, normed, hidden, m, hidden, vocab, b, e, logits);
    }
}
