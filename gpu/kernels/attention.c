/* Decode attention straight from the paged KV pool: no copy of any context. */
#include "attention.h"
#include "vector.h"

/* Gemma 2's attention logit soft-capping, on the scaled scores: s = cap · tanh(s / cap). */
static void softcap_scores(float *scores, int64_t n, float cap) {
    for (int64_t t = 0; t < n; ++t) scores[t] = cap * tanhf(scores[t] / cap);
}

#if VEC == 16
/* One KV head of one sequence for head_dim 64 and G ≤ 4 query heads: the G query rows and
 * the G output rows stay in registers (4 vectors each) while the context streams by, the
 * next block's lines of this head prefetched a position at a time (prefetch_position64).
 * Same sums as the generic loops below. */
static inline __attribute__((always_inline)) void attend_head64(
    const float *qh, const float *k, const float *v, const int64_t *table, int64_t first,
    int64_t ctx, int64_t block_size, int64_t block_floats, int64_t token_stride, float scale,
    float softcap, float *scores, float *oh, const int G) {
    int64_t span = ctx - first; /* positions attended: first .. ctx - 1 */
    vec qr[4][4], acc[4][4];
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < 4; ++c) {
            qr[g][c] = vload(qh + g * 64 + c * 16);
            acc[g][c] = vzero();
        }
    for (int64_t t0 = first, n; t0 < ctx; t0 += n) {
        int64_t b = t0 / block_size, off = t0 % block_size;
        const float *kb = k + table[b] * block_floats + off * token_stride;
        n = ctx - t0 < block_size - off ? ctx - t0 : block_size - off;
        const float *knext = (b + 1) * block_size < ctx ? k + table[b + 1] * block_floats : NULL;
        for (int64_t j = 0; j < n; ++j) {
            const float *kt = kb + j * token_stride;
            prefetch_position64((const char *)knext, j, token_stride);
            vec k0 = vload(kt), k1 = vload(kt + 16), k2 = vload(kt + 32), k3 = vload(kt + 48);
            for (int g = 0; g < G; ++g) {
                vec a = _mm512_mul_ps(qr[g][0], k0);
                vec b = _mm512_mul_ps(qr[g][1], k1);
                a = vfma(qr[g][2], k2, a);
                b = vfma(qr[g][3], k3, b);
                scores[g * span + t0 - first + j] = vsum(_mm512_add_ps(a, b)) * scale;
            }
        }
    }
    if (softcap > 0.f) softcap_scores(scores, G * span, softcap);
    float inv[4];
    for (int g = 0; g < G; ++g) {
        float *sg = scores + g * span;
        int64_t whole = span / 16 * 16, t = 0;
        vec tops = vset1(-INFINITY);
        for (; t < whole; t += 16) tops = _mm512_max_ps(tops, vload(sg + t));
        float top = _mm512_reduce_max_ps(tops);
        for (; t < span; ++t) top = sg[t] > top ? sg[t] : top;
        vec top_v = vset1(top), totals = vzero();
        for (t = 0; t < whole; t += 16) {
            vec e = vexp(_mm512_sub_ps(vload(sg + t), top_v));
            vstore(sg + t, e);
            totals = _mm512_add_ps(totals, e);
        }
        float total = _mm512_reduce_add_ps(totals);
        for (; t < span; ++t) {
            sg[t] = exp_clamped(sg[t] - top);
            total += sg[t];
        }
        inv[g] = 1.f / total;
    }
    for (int64_t t0 = first, n; t0 < ctx; t0 += n) {
        int64_t b = t0 / block_size, off = t0 % block_size;
        const float *vb = v + table[b] * block_floats + off * token_stride;
        n = ctx - t0 < block_size - off ? ctx - t0 : block_size - off;
        const float *vnext = (b + 1) * block_size < ctx ? v + table[b + 1] * block_floats : NULL;
        for (int64_t j = 0; j < n; ++j) {
            const float *vt = vb + j * token_stride;
            prefetch_position64((const char *)vnext, j, token_stride);
            vec v0 = vload(vt), v1 = vload(vt + 16), v2 = vload(vt + 32), v3 = vload(vt + 48);
            for (int g = 0; g < G; ++g) {
                vec p = vset1(scores[g * span + t0 - first + j]);
                acc[g][0] = vfma(p, v0, acc[g][0]);
                acc[g][1] = vfma(p, v1, acc[g][1]);
                acc[g][2] = vfma(p, v2, acc[g][2]);
                acc[g][3] = vfma(p, v3, acc[g][3]);
            }
        }
    }
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < 4; ++c)
            vstore(oh + g * 64 + c * 16, _mm512_mul_ps(acc[g][c], vset1(inv[g])));
}
#endif

/* attention.h */
void tm_attend(const float *qs, float *os, const float *k, const float *v, const int64_t *table,
               int64_t first, int64_t ctx, int64_t h0, int64_t h1, int64_t block_size,
               int64_t kv_heads, int64_t group, int64_t head_dim, float scale, float softcap) {
    int64_t token_stride = kv_heads * head_dim; /* from one position to the next in a block */
    int64_t block_floats = block_size * token_stride;
    int64_t span = ctx - first; /* positions attended: first .. ctx - 1 */
    int64_t rows = (h1 - h0) * group; /* query heads of this task */
    float *scores = malloc(sizeof(float) * (size_t)(rows * span > 0 ? rows * span : 1));
#if VEC == 16
    if (head_dim == 64 && group <= 4 && span > 0) {
        for (int64_t h = h0; h < h1; ++h) {
            const float *qh = qs + (h - h0) * group * 64;
            float *oh = os + (h - h0) * group * 64;
            const float *kh = k + h * 64, *vh = v + h * 64;
#define ATTEND(G)                                                                             \
    attend_head64(qh, kh, vh, table, first, ctx, block_size, block_floats, token_stride, scale, \
                  softcap, scores, oh, G)
            switch (group) {
            case 1: ATTEND(1); break;
            case 2: ATTEND(2); break;
            case 3: ATTEND(3); break;
            default: ATTEND(4); break;
            }
#undef ATTEND
        }
        free(scores);
        return;
    }
#endif
    /* scores[r, t - first] = scale · q_r · k_t, r = (h - h0) * group + g */
    for (int64_t t0 = first, n; t0 < ctx; t0 += n) {
        int64_t b = t0 / block_size, off = t0 % block_size;
        const float *kb = k + table[b] * block_floats + off * token_stride;
        if ((b + 1) * block_size < ctx)
            prefetch_floats(k + table[b + 1] * block_floats, block_floats);
        n = ctx - t0 < block_size - off ? ctx - t0 : block_size - off;
        for (int64_t j = 0; j < n; ++j)
            for (int64_t h = h0; h < h1; ++h) {
                const float *kt = kb + j * token_stride + h * head_dim;
                for (int64_t g = 0; g < group; ++g) {
                    int64_t r = (h - h0) * group + g;
                    float score = dot(qs + r * head_dim, kt, head_dim) * scale;
                    scores[r * span + t0 - first + j] = score;
                }
            }
    }
    if (softcap > 0.f) softcap_scores(scores, rows * span, softcap);
    /* softmax over t, per query head */
    for (int64_t r = 0; r < rows; ++r) {
        float *sr = scores + r * span;
        for (int64_t d = 0; d < head_dim; ++d) os[r * head_dim + d] = 0.f;
        if (span == 0) continue;
        float top = sr[0];
        for (int64_t t = 1; t < span; ++t) top = sr[t] > top ? sr[t] : top;
        float inv = 1.f / exp_shifted_sum(sr, span, top);
#pragma omp simd
        for (int64_t t = 0; t < span; ++t) sr[t] *= inv;
    }
    /* out_r = sum_t p[r, t] v_t */
    for (int64_t t0 = first, n; t0 < ctx; t0 += n) {
        int64_t b = t0 / block_size, off = t0 % block_size;
        const float *vb = v + table[b] * block_floats + off * token_stride;
        if ((b + 1) * block_size < ctx)
            prefetch_floats(v + table[b + 1] * block_floats, block_floats);
        n = ctx - t0 < block_size - off ? ctx - t0 : block_size - off;
        for (int64_t j = 0; j < n; ++j)
            for (int64_t h = h0; h < h1; ++h) {
                const float *vt = vb + j * token_stride + h * head_dim;
                for (int64_t g = 0; g < group; ++g) {
                    int64_t r = (h - h0) * group + g;
                    axpy(os + r * head_dim, scores[r * span + t0 - first + j], vt, head_dim);
                }
            }
    }
    free(scores);
}

/* Decode attention straight from the paged KV pool: no copy of any context.
 *
 * q, out:  [seqs, kv_heads * group, head_dim]; query head h * group + g reads KV head h.
 * k, v:    [num_blocks, block_size, kv_heads, head_dim], one layer of the pool.
 * tables:  [seqs, width] block tables; lengths: [seqs] how many positions each attends to.
 * starts:  [seqs] the first position each attends to (a sliding window: blocks before it are
 *          never read), or NULL for 0.
 * softcap: > 0: scores become softcap · tanh(score / softcap) before the softmax (Gemma 2).
 * A task is one sequence and a range of its KV heads: all of them when there are sequences
 * enough to keep every thread busy, so each block (block_size × kv_heads × head_dim floats,
 * contiguous) is read front to back while the next one is prefetched; one KV head each when
 * there are fewer sequences than threads. Scores are kept whole (exact softmax with the
 * maximum subtracted), then the values summed.
 */
void tm_paged_decode_attention(const float *q, const float *k, const float *v,
                               const int64_t *tables, int64_t width, const int64_t *lengths,
                               const int64_t *starts, int64_t seqs, int64_t block_size,
                               int64_t kv_heads, int64_t group, int64_t head_dim, float scale,
                               float softcap, float *out) {
    int64_t heads = kv_heads * group;
    int64_t split = seqs < omp_get_max_threads() ? kv_heads : 1; /* tasks per sequence */
    int64_t per_task = kv_heads / split;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < seqs * split; ++task) {
        int64_t s = task / split, h0 = task % split * per_task, ctx = lengths[s];
        int64_t first = starts ? starts[s] : 0;
        first = first < 0 ? 0 : (first > ctx ? ctx : first);
        int64_t at = (s * heads + h0 * group) * head_dim;
        tm_attend(q + at, out + at, k, v, tables + s * width, first, ctx, h0, h0 + per_task,
                  block_size, kv_heads, group, head_dim, scale, softcap);
    }
}
