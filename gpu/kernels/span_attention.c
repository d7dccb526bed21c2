/* Attention of whole sequences laid out one after another, over their own q, k and v rows.
 *
 * A prefill chunk with no cached context and an encoder's input both attend only to
 * themselves: their keys and values are the rows of the step's own fused qkv. Read there, in
 * place, nothing is gathered, padded or transposed per call, and every sequence of the step,
 * short or long, is one task list of one parallel region.
 *
 * A task is (sequence, KV head, tile of QT positions): the tile's rows of every query head
 * reading that KV head. Its keys go by in tiles of KT: the tile's K is transposed once
 * ([head_dim][KT]) for all those rows, so each score row is head_dim broadcast-FMAs of a
 * query element against KT keys, 4 query rows at a time (no horizontal sum per score); the
 * scores are soft-capped and masked where the tile needs it, then an online softmax (the
 * running maximum subtracted, the output rescaled when it rises) adds the tile's values into
 * the output rows, 4 rows by 4 vectors of head_dim held in registers while the keys go by.
 * Same sums as a softmax over all keys at once, in another order.
 */
#include "vector.h"

#define QT 32 /* queries per task */
#ifdef VEC
#define KT (2 * VEC) /* keys per tile: two vectors of scores per query row */
#else
#define KT 16
#endif

/* Whether key j is visible to query i: i - j <= before (before < 0: any), j - i <= after
 * (after < 0: any). Causal: after 0; a causal window of W: before W - 1; a bidirectional
 * reach of r on each side: before = after = r. */
static inline int visible(int64_t i, int64_t j, int64_t before, int64_t after) {
    return (before < 0 || i - j <= before) && (after < 0 || j - i <= after);
}

/* scores [rows][KT] = qs [rows][d] · kt [d][KT] for rows < 4 (qs rows `d` apart) */
static inline void score_rows(const float *qs, const float *kt, int64_t d, int64_t rows,
                              float *scores) {
#ifdef VEC
    vec acc[4][2];
    for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = vzero();
    if (rows == 4) {
        for (int64_t e = 0; e < d; ++e) {
            vec k0 = vload(kt + e * KT), k1 = vload(kt + e * KT + VEC);
            for (int r = 0; r < 4; ++r) {
                vec q = vset1(qs[r * d + e]);
                acc[r][0] = vfma(q, k0, acc[r][0]);
                acc[r][1] = vfma(q, k1, acc[r][1]);
            }
        }
    } else {
        for (int64_t e = 0; e < d; ++e) {
            vec k0 = vload(kt + e * KT), k1 = vload(kt + e * KT + VEC);
            for (int64_t r = 0; r < rows; ++r) {
                vec q = vset1(qs[r * d + e]);
                acc[r][0] = vfma(q, k0, acc[r][0]);
                acc[r][1] = vfma(q, k1, acc[r][1]);
            }
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        vstore(scores + r * KT, acc[r][0]);
        vstore(scores + r * KT + VEC, acc[r][1]);
    }
#else
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < KT; ++c) {
            float total = 0.f;
            for (int64_t e = 0; e < d; ++e) total += qs[r * d + e] * kt[e * KT + c];
            scores[r * KT + c] = total;
        }
#endif
}

/* o [rows][d] += p [rows][KT] · v [kn][d] (v's rows `v_stride` apart), 4 rows by 4 vectors
 * of d at a time, held in registers while the kn keys go by */
static inline void add_values(float *o, const float *p, const float *v, int64_t v_stride,
                              int64_t kn, int64_t d, int64_t rows) {
    int64_t e = 0;
#ifdef VEC
    for (; e + 4 * VEC <= d; e += 4 * VEC)
        for (int64_t r = 0; r < rows; r += 4) {
            int64_t rb = rows - r < 4 ? rows - r : 4;
            vec acc[4][4];
            for (int64_t a = 0; a < rb; ++a)
                for (int x = 0; x < 4; ++x) acc[a][x] = vload(o + (r + a) * d + e + x * VEC);
            for (int64_t c = 0; c < kn; ++c) {
                const float *vr = v + c * v_stride + e;
                vec v0 = vload(vr), v1 = vload(vr + VEC), v2 = vload(vr + 2 * VEC);
                vec v3 = vload(vr + 3 * VEC);
                for (int64_t a = 0; a < rb; ++a) {
                    vec pa = vset1(p[(r + a) * KT + c]);
                    acc[a][0] = vfma(pa, v0, acc[a][0]);
                    acc[a][1] = vfma(pa, v1, acc[a][1]);
                    acc[a][2] = vfma(pa, v2, acc[a][2]);
                    acc[a][3] = vfma(pa, v3, acc[a][3]);
                }
            }
            for (int64_t a = 0; a < rb; ++a)
                for (int x = 0; x < 4; ++x) vstore(o + (r + a) * d + e + x * VEC, acc[a][x]);
        }
    for (; e + VEC <= d; e += VEC)
        for (int64_t r = 0; r < rows; ++r) {
            vec acc = vload(o + r * d + e);
            for (int64_t c = 0; c < kn; ++c)
                acc = vfma(vset1(p[r * KT + c]), vload(v + c * v_stride + e), acc);
            vstore(o + r * d + e, acc);
        }
#endif
    for (; e < d; ++e)
        for (int64_t r = 0; r < rows; ++r) {
            float acc = o[r * d + e];
            for (int64_t c = 0; c < kn; ++c) acc += p[r * KT + c] * v[c * v_stride + e];
            o[r * d + e] = acc;
        }
}

/* One task: positions [i0, i1) of a sequence of n, for the `group` query heads of one KV
 * head: q points at the first of them in row 0 (query head g of row i at q + i · q_stride +
 * g · d), k and v at the KV head in row 0 (rows k_stride, v_stride apart); out alike, rows
 * `out_stride` apart. Rows of the task: g · m + (i - i0), m = i1 - i0. `scratch` holds
 * QT · group · d (scaled queries) + d · KT (transposed keys) + QT · group · KT (scores) +
 * QT · group · d (outputs) + 2 QT · group floats. */
static void attend_tile(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                        const float *v, int64_t v_stride, int64_t n, int64_t i0, int64_t i1,
                        int64_t group, int64_t d, int64_t before, int64_t after, float scale,
                        float softcap, float *out, int64_t out_stride, float *scratch) {
    int64_t m = i1 - i0, rows = group * m, most = QT * group;
    float *qs = scratch, *kt = qs + most * d, *scores = kt + d * KT, *o = scores + most * KT;
    float *top = o + most * d, *total = top + most;
    for (int64_t r = 0; r < rows; ++r) {
        const float *src = q + (i0 + r % m) * q_stride + r / m * d;
        for (int64_t e = 0; e < d; ++e) qs[r * d + e] = src[e] * scale;
        for (int64_t e = 0; e < d; ++e) o[r * d + e] = 0.f;
        top[r] = -INFINITY;
        total[r] = 0.f;
    }
    int64_t jlo = before < 0 ? 0 : (i0 - before > 0 ? i0 - before : 0);
    int64_t jhi = after < 0 ? n : (i1 + after < n ? i1 + after : n);
    for (int64_t j0 = jlo; j0 < jhi; j0 += KT) {
        int64_t kn = jhi - j0 < KT ? jhi - j0 : KT;
        for (int64_t c = 0; c < kn; ++c) {
            const float *row = k + (j0 + c) * k_stride;
            for (int64_t e = 0; e < d; ++e) kt[e * KT + c] = row[e];
        }
        for (int64_t c = kn; c < KT; ++c)
            for (int64_t e = 0; e < d; ++e) kt[e * KT + c] = 0.f;
        for (int64_t r = 0; r < rows; r += 4)
            score_rows(qs + r * d, kt, d, rows - r < 4 ? rows - r : 4, scores + r * KT);
        if (softcap > 0.f)
            for (int64_t t = 0; t < rows * KT; ++t)
                scores[t] = softcap * tanhf(scores[t] / softcap);
        /* masked where some (query, key) pair of the tile is out of sight */
        int whole = kn == KT && visible(i1 - 1, j0, before, after) &&
                    visible(i0, j0 + KT - 1, before, after);
        for (int64_t r = 0; r < rows; ++r) {
            float *s = scores + r * KT;
            int64_t i = i0 + r % m;
            if (!whole)
                for (int64_t c = 0; c < KT; ++c)
                    if (c >= kn || !visible(i, j0 + c, before, after)) s[c] = -INFINITY;
            float best = -INFINITY;
            for (int64_t c = 0; c < KT; ++c) best = s[c] > best ? s[c] : best;
            if (best == -INFINITY) { /* nothing of this tile in sight of this row */
                for (int64_t c = 0; c < KT; ++c) s[c] = 0.f;
                continue;
            }
            float now = best > top[r] ? best : top[r];
            if (now > top[r] && top[r] != -INFINITY) {
                float shrink = exp_clamped(top[r] - now);
                total[r] *= shrink;
                for (int64_t e = 0; e < d; ++e) o[r * d + e] *= shrink;
            }
            top[r] = now;
            total[r] += exp_shifted_sum(s, KT, now);
            if (!whole) /* e^-87 is not 0: out of sight adds nothing */
                for (int64_t c = 0; c < KT; ++c)
                    if (c >= kn || !visible(i, j0 + c, before, after)) s[c] = 0.f;
        }
        add_values(o, scores, v + j0 * v_stride, v_stride, kn, d, rows);
    }
    for (int64_t r = 0; r < rows; ++r) {
        float *dst = out + (i0 + r % m) * out_stride + r / m * d;
        float inv = total[r] > 0.f ? 1.f / total[r] : 0.f;
        for (int64_t e = 0; e < d; ++e) dst[e] = o[r * d + e] * inv;
    }
}

/* Attention of `spans` sequences, sequence s at rows [begins[s], ends[s]) of the step, each
 * attending to its own rows only. Row t's query head h is at q + t · q_stride + h · head_dim
 * (its KV head's key at k + t · k_stride + (h / group) · head_dim, value alike: views of the
 * step's fused qkv rows); its output at out + t · heads · head_dim + h · head_dim. A key is
 * in sight of a query as `visible` says (before, after); softcap > 0: Gemma 2's soft-capping
 * of the scaled scores. */
void tm_span_attention(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                       const float *v, int64_t v_stride, const int64_t *begins,
                       const int64_t *ends, int64_t spans, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, int64_t before, int64_t after, float scale,
                       float softcap, float *out) {
    int64_t group = heads / kv_heads, d = head_dim, out_stride = heads * head_dim;
    int64_t *first = malloc((size_t)(spans + 1) * sizeof(int64_t)); /* tiles before span s */
    if (!first) abort();
    first[0] = 0;
    for (int64_t s = 0; s < spans; ++s) first[s + 1] = first[s] + (ends[s] - begins[s] + QT - 1) / QT;
    int64_t tasks = first[spans] * kv_heads, most = QT * group;
#pragma omp parallel
    {
        float *scratch = malloc((size_t)(2 * most * d + d * KT + most * KT + 2 * most) * sizeof(float));
        if (!scratch) abort();
        int64_t s = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            int64_t tile = task / kv_heads, kvh = task % kv_heads;
            if (tile < first[s] || tile >= first[s + 1]) { /* find its span: tasks rise */
                int64_t lo = 0, hi = spans - 1;
                while (lo < hi) {
                    int64_t mid = (lo + hi + 1) / 2;
                    if (first[mid] <= tile) lo = mid; else hi = mid - 1;
                }
                s = lo;
            }
            int64_t b = begins[s], n = ends[s] - b, i0 = (tile - first[s]) * QT;
            int64_t i1 = i0 + QT < n ? i0 + QT : n, h = kvh * group;
            attend_tile(q + b * q_stride + h * d, q_stride, k + b * k_stride + kvh * d, k_stride,
                        v + b * v_stride + kvh * d, v_stride, n, i0, i1, group, d, before,
                        after, scale, softcap, out + b * out_stride + h * d, out_stride, scratch);
        }
        free(scratch);
    }
    free(first);
}
