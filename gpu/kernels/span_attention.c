/* Attention of the prefill chunks (or encoder inputs) of a step, laid out one after another.
 *
 * A prefill chunk with no cached context and an encoder's input attend only to themselves:
 * their keys and values are the rows of the step's own fused qkv, read there in place. A
 * chunk that continues a cached context reads all its keys, the context's and its own
 * (already written), where they lie in the KV pool, through its block table. Nothing is
 * gathered or padded, and every chunk of the step, short or long, cached or not, is one call.
 *
 * First every chunk's keys are transposed, a tile of KT keys at a time ([head_dim][KT]), once
 * for all the query tiles that read them. Then a task is (chunk, KV head, tile of QT
 * positions): the tile's rows of every query head reading that KV head. Each score row is
 * head_dim broadcast-FMAs of a query element against a key tile, SR query rows at a time (no
 * horizontal sum per score); the scores are soft-capped and masked where the tile needs it
 * (a range of keys per row), then an online softmax (the running maximum subtracted, the
 * output rescaled when it rises) adds the tile's values into the output rows, VR rows by 4
 * vectors of head_dim held in registers while the keys go by. Same sums as a softmax over all
 * keys at once, in another order. Measured 2026-12-07 (SmolLM2's heads, one 1,024-token
 * prompt, 2 cores of an AMD EPYC whose FMA peak is ~499 GFLOP/s): 3.5 ms, ~345 GFLOP/s, on
 * AVX-512; 6.9 ms, ~176 GFLOP/s, on AVX2.
 */
#include "vector.h"

#define QT 32 /* queries per task */
#ifdef VEC
#if VEC == 16
#define KV 4 /* vectors of scores per query row in a key tile */
#else
#define KV 2
#endif
#define KT (KV * VEC) /* keys per tile */
#else
#define KT 16
#endif

/* Whether key j is visible to query i: i - j <= before (before < 0: any), j - i <= after
 * (after < 0: any). Causal: after 0; a causal window of W: before W - 1; a bidirectional
 * reach of r on each side: before = after = r. */
static inline int visible(int64_t i, int64_t j, int64_t before, int64_t after) {
    return (before < 0 || i - j <= before) && (after < 0 || j - i <= after);
}

/* Query rows per block of scores: their SR · KV sums, the tile's KV key vectors and a
 * broadcast fit the registers (32 on AVX-512, 16 on AVX2) */
#define SR 6

/* Output rows per block of values: their 4 · VR sums, four value vectors and a broadcast fit
 * the registers (measured 2026-12-07: 6 rows on AVX-512 no faster than 4; 2 rows on AVX2 1.17x
 * faster than 4, whose 16 sums spill) */
#if VEC == 16
#define VR 4
#else
#define VR 2
#endif

/* scores [rows][KT] = qs [rows][d] · kt [d][KT], rows ≤ SR a compile-time count (qs rows `d`
 * apart) */
static inline __attribute__((always_inline)) void score_block(const float *qs, const float *kt,
                                                              int64_t d, float *scores,
                                                              const int rows) {
#ifdef VEC
    vec acc[SR][KV];
    for (int r = 0; r < rows; ++r)
        for (int x = 0; x < KV; ++x) acc[r][x] = vzero();
    for (int64_t e = 0; e < d; ++e) {
        vec kx[KV];
        for (int x = 0; x < KV; ++x) kx[x] = vload(kt + e * KT + x * VEC);
        for (int r = 0; r < rows; ++r) {
            vec q = vset1(qs[r * d + e]);
            for (int x = 0; x < KV; ++x) acc[r][x] = vfma(q, kx[x], acc[r][x]);
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int x = 0; x < KV; ++x) vstore(scores + r * KT + x * VEC, acc[r][x]);
#else
    for (int r = 0; r < rows; ++r)
        for (int64_t c = 0; c < KT; ++c) {
            float total = 0.f;
            for (int64_t e = 0; e < d; ++e) total += qs[r * d + e] * kt[e * KT + c];
            scores[r * KT + c] = total;
        }
#endif
}

/* scores [rows][KT] = qs [rows][d] · kt [d][KT] */
static void score_rows(const float *qs, const float *kt, int64_t d, int64_t rows,
                       float *scores) {
    int64_t r = 0;
    for (; r + SR <= rows; r += SR) score_block(qs + r * d, kt, d, scores + r * KT, SR);
    switch (rows - r) {
#define BLOCK(R) \
    case R: score_block(qs + r * d, kt, d, scores + r * KT, R); break;
        BLOCK(1)
        BLOCK(2)
        BLOCK(3)
        BLOCK(4)
        BLOCK(5)
#undef BLOCK
    }
}

/* Where a chunk's keys and values are: its own rows (`table` NULL: key j at k + j · k_stride)
 * or the pool (key j at slot table[j / block_size] · block_size + j % block_size, slot t at
 * k + t · k_stride); v alike. k and v point at the KV head's first element. */
typedef struct {
    const float *k, *v;
    int64_t k_stride, v_stride;
    const int64_t *table;
    int64_t block_size;
} key_source;

/* The slot of key j (its row among k's and v's) */
static inline int64_t key_slot(const key_source *src, int64_t j) {
    return src->table ? src->table[j / src->block_size] * src->block_size + j % src->block_size
                      : j;
}

/* kt [d][KT] = keys j0 .. j0 + kn - 1, transposed; columns past kn zero */
static void transpose_keys(const key_source *src, int64_t j0, int64_t kn, int64_t d,
                           float *kt) {
    for (int64_t c = 0; c < kn; ++c) {
        const float *row = src->k + key_slot(src, j0 + c) * src->k_stride;
        for (int64_t e = 0; e < d; ++e) kt[e * KT + c] = row[e];
    }
    for (int64_t c = kn; c < KT; ++c)
        for (int64_t e = 0; e < d; ++e) kt[e * KT + c] = 0.f;
}

/* o [rows][d] += p [rows][KT] · v [kn][d] (value c at vrow[c]), 4 rows by 4 vectors of d at a
 * time, held in registers while the kn keys go by */
static inline __attribute__((always_inline)) void add_values_block(
    float *o, const float *p, const float *const *vrow, int64_t kn, int64_t d, int64_t e,
    const int rows) {
#ifdef VEC
    vec acc[VR][4];
    for (int a = 0; a < rows; ++a)
        for (int x = 0; x < 4; ++x) acc[a][x] = vload(o + a * d + e + x * VEC);
    for (int64_t c = 0; c < kn; ++c) {
        const float *vr = vrow[c] + e;
        vec v0 = vload(vr), v1 = vload(vr + VEC), v2 = vload(vr + 2 * VEC);
        vec v3 = vload(vr + 3 * VEC);
        for (int a = 0; a < rows; ++a) {
            vec pa = vset1(p[a * KT + c]);
            acc[a][0] = vfma(pa, v0, acc[a][0]);
            acc[a][1] = vfma(pa, v1, acc[a][1]);
            acc[a][2] = vfma(pa, v2, acc[a][2]);
            acc[a][3] = vfma(pa, v3, acc[a][3]);
        }
    }
    for (int a = 0; a < rows; ++a)
        for (int x = 0; x < 4; ++x) vstore(o + a * d + e + x * VEC, acc[a][x]);
#else
    (void)o, (void)p, (void)vrow, (void)kn, (void)d, (void)e, (void)rows;
#endif
}

static inline void add_values(float *o, const float *p, const float *const *vrow, int64_t kn,
                              int64_t d, int64_t rows) {
    int64_t e = 0;
#ifdef VEC
    for (; e + 4 * VEC <= d; e += 4 * VEC) {
        int64_t r = 0;
        for (; r + VR <= rows; r += VR) add_values_block(o + r * d, p + r * KT, vrow, kn, d, e, VR);
        switch (rows - r) { /* a compile-time row count each: the sums stay in registers */
#if VR > 4
        case 5: add_values_block(o + r * d, p + r * KT, vrow, kn, d, e, 5); break;
        case 4: add_values_block(o + r * d, p + r * KT, vrow, kn, d, e, 4); break;
#endif
        case 3: add_values_block(o + r * d, p + r * KT, vrow, kn, d, e, 3); break;
        case 2: add_values_block(o + r * d, p + r * KT, vrow, kn, d, e, 2); break;
        case 1: add_values_block(o + r * d, p + r * KT, vrow, kn, d, e, 1); break;
        }
    }
    for (; e + VEC <= d; e += VEC)
        for (int64_t r = 0; r < rows; ++r) {
            vec acc = vload(o + r * d + e);
            for (int64_t c = 0; c < kn; ++c)
                acc = vfma(vset1(p[r * KT + c]), vload(vrow[c] + e), acc);
            vstore(o + r * d + e, acc);
        }
#endif
    for (; e < d; ++e)
        for (int64_t r = 0; r < rows; ++r) {
            float acc = o[r * d + e];
            for (int64_t c = 0; c < kn; ++c) acc += p[r * KT + c] * vrow[c][e];
            o[r * d + e] = acc;
        }
}

/* The largest of a row's KT scores */
static inline float row_max(const float *s) {
#ifdef VEC
    vec best = vload(s);
    for (int x = 1; x < KV; ++x) best = vmax(best, vload(s + x * VEC));
    return vhmax(best);
#else
    float best = -INFINITY;
    for (int64_t c = 0; c < KT; ++c) best = s[c] > best ? s[c] : best;
    return best;
#endif
}

/* One task: rows [i0, i1) of a chunk of n whose keys are 0 .. keys - 1, for the `group` query
 * heads of one KV head. Row i is at position keys - n + i among the keys. q points at the
 * first of those heads in row 0 (query head g of row i at q + i · q_stride + g · d); out
 * alike, rows `out_stride` apart. The keys are `kts`, transposed a tile of KT at a time ([tile][d]
 * [KT]); the values where `src` says. Rows of the task: g · m + (i - i0), m = i1 - i0.
 * `scratch` holds QT · group · d (scaled queries) + QT · group · KT (scores) + QT · group · d
 * (outputs) + 2 QT · group floats. */
static void attend_tile(const float *q, int64_t q_stride, const float *kts, const key_source *src,
                        int64_t n, int64_t keys, int64_t i0, int64_t i1, int64_t group,
                        int64_t d, int64_t before, int64_t after, float scale, float softcap,
                        float *out, int64_t out_stride, float *scratch) {
    int64_t m = i1 - i0, rows = group * m, most = QT * group;
    float *qs = scratch, *scores = qs + most * d, *o = scores + most * KT;
    float *top = o + most * d, *total = top + most;
    for (int64_t r = 0; r < rows; ++r) {
        const float *qrow = q + (i0 + r % m) * q_stride + r / m * d;
        for (int64_t e = 0; e < d; ++e) qs[r * d + e] = qrow[e] * scale;
        for (int64_t e = 0; e < d; ++e) o[r * d + e] = 0.f;
        top[r] = -INFINITY;
        total[r] = 0.f;
    }
    const float *vrow[KT];
    int64_t shift = keys - n, p0 = i0 + shift, p1 = i1 + shift; /* the rows' positions */
    int64_t jlo = before < 0 ? 0 : (p0 - before > 0 ? p0 - before : 0);
    int64_t jhi = after < 0 ? keys : (p1 + after < keys ? p1 + after : keys);
    for (int64_t j0 = jlo / KT * KT; j0 < jhi; j0 += KT) { /* whole tiles of kts */
        int64_t kn = jhi - j0 < KT ? jhi - j0 : KT;
        const float *kt = kts + j0 * d; /* tile j0 / KT: d · KT floats */
        for (int64_t c = 0; c < kn; ++c) vrow[c] = src->v + key_slot(src, j0 + c) * src->v_stride;
        score_rows(qs, kt, d, rows, scores);
        if (softcap > 0.f)
            for (int64_t t = 0; t < rows * KT; ++t)
                scores[t] = softcap * tanhf(scores[t] / softcap);
        /* masked where some (query, key) pair of the tile is out of sight */
        int whole = kn == KT && visible(p1 - 1, j0, before, after) &&
                    visible(p0, j0 + KT - 1, before, after);
        for (int64_t r = 0; r < rows; ++r) {
            float *s = scores + r * KT;
            /* keys lo .. hi - 1 of the tile are in sight of this row (all of them, mostly) */
            int64_t lo = 0, hi = KT;
            if (!whole) {
                int64_t i = p0 + r % m;
                lo = before < 0 ? 0 : i - before - j0;
                hi = after < 0 ? kn : i + after - j0 + 1;
                lo = lo < 0 ? 0 : lo;
                hi = hi > kn ? kn : hi;
                if (hi <= lo) { /* nothing of this tile in sight of this row */
                    for (int64_t c = 0; c < KT; ++c) s[c] = 0.f;
                    continue;
                }
                for (int64_t c = 0; c < lo; ++c) s[c] = -INFINITY;
                for (int64_t c = hi; c < KT; ++c) s[c] = -INFINITY;
            }
            float best = row_max(s);
            float now = best > top[r] ? best : top[r];
            if (now > top[r] && top[r] != -INFINITY) {
                float shrink = exp_clamped(top[r] - now);
                total[r] *= shrink;
                for (int64_t e = 0; e < d; ++e) o[r * d + e] *= shrink;
            }
            top[r] = now;
            total[r] += exp_shifted_sum(s, KT, now);
            if (!whole) { /* e^-87 is not 0: out of sight adds nothing */
                for (int64_t c = 0; c < lo; ++c) s[c] = 0.f;
                for (int64_t c = hi; c < KT; ++c) s[c] = 0.f;
            }
        }
        add_values(o, scores, vrow, kn, d, rows);
    }
    for (int64_t r = 0; r < rows; ++r) {
        float *dst = out + (i0 + r % m) * out_stride + r / m * d;
        float inv = total[r] > 0.f ? 1.f / total[r] : 0.f;
        for (int64_t e = 0; e < d; ++e) dst[e] = o[r * d + e] * inv;
    }
}

/* The chunk that tile `tile` belongs to, given first[s] (tiles before chunk s, rising) and a
 * guess (tiles come in order, so mostly the last one found) */
static inline int64_t find_span(const int64_t *first, int64_t spans, int64_t tile, int64_t s) {
    if (tile >= first[s] && tile < first[s + 1]) return s;
    int64_t lo = 0, hi = spans - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (first[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* Where chunk s's keys and values for KV head kvh are: its own rows, or the pool */
static inline key_source source(int64_t s, int64_t kvh, const float *k, int64_t k_stride,
                                const float *v, int64_t v_stride, const int64_t *begins,
                                const float *k_pool, const float *v_pool, int64_t pool_stride,
                                int64_t block_size, const int64_t *offsets,
                                const int64_t *tables, int64_t d) {
    if (tables && offsets[s] >= 0)
        return (key_source){k_pool + kvh * d, v_pool + kvh * d, pool_stride, pool_stride,
                            tables + offsets[s], block_size};
    return (key_source){k + begins[s] * k_stride + kvh * d, v + begins[s] * v_stride + kvh * d,
                        k_stride, v_stride, NULL, 1};
}

/* Attention of `spans` chunks, chunk s at rows [begins[s], ends[s]) of the step. Row t's query
 * head h is at q + t · q_stride + h · head_dim; its output at out + t · heads · head_dim +
 * h · head_dim. A chunk without a table (`tables` NULL, or offsets[s] < 0) attends to its own
 * rows: its KV head's key at k + t · k_stride + (h / group) · head_dim, value alike (views of
 * the step's fused qkv rows). A chunk with one attends to keys[s] positions, the last
 * ends[s] - begins[s] its own, read in the pool (k_pool, v_pool: [slots, kv_heads,
 * head_dim]) through its block table at tables + offsets[s]. A key is in sight of a query as
 * `visible` says (before, after); softcap > 0: Gemma 2's soft-capping of the scaled scores. */
void tm_span_attention(const float *q, int64_t q_stride, const float *k, int64_t k_stride,
                       const float *v, int64_t v_stride, const int64_t *begins,
                       const int64_t *ends, int64_t spans, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, int64_t before, int64_t after, float scale,
                       float softcap, float *out, const float *k_pool, const float *v_pool,
                       int64_t block_size, const int64_t *keys, const int64_t *offsets,
                       const int64_t *tables) {
    int64_t group = heads / kv_heads, d = head_dim, out_stride = heads * head_dim;
    /* first[s]: query tiles (QT) before chunk s; kfirst[s]: key tiles (KT) before it */
    int64_t *first = malloc((size_t)(2 * spans + 2) * sizeof(int64_t)), *kfirst = first + spans + 1;
    if (!first) abort();
    first[0] = kfirst[0] = 0;
    for (int64_t s = 0; s < spans; ++s) {
        int64_t n = ends[s] - begins[s], count = tables && offsets[s] >= 0 ? keys[s] : n;
        first[s + 1] = first[s] + (n + QT - 1) / QT;
        kfirst[s + 1] = kfirst[s] + (count + KT - 1) / KT;
    }
    int64_t tasks = first[spans] * kv_heads, most = QT * group, ktiles = kfirst[spans];
    /* every chunk's keys, transposed once for all its query tiles: KV head h's key tile t of
     * chunk s at kts + ((h · ktiles) + kfirst[s] + t) · d · KT */
    float *kts = malloc((size_t)(kv_heads * ktiles * d * KT) * sizeof(float));
    if (!kts) abort();
#pragma omp parallel
    {
        float *scratch = malloc((size_t)(2 * most * d + most * KT + 2 * most) * sizeof(float));
        if (!scratch) abort();
        int64_t s = 0;
#pragma omp for schedule(static)
        for (int64_t job = 0; job < kv_heads * ktiles; ++job) {
            int64_t kvh = job / ktiles, t = job % ktiles;
            s = find_span(kfirst, spans, t, s);
            key_source src = source(s, kvh, k, k_stride, v, v_stride, begins, k_pool, v_pool,
                                    kv_heads * d, block_size, offsets, tables, d);
            int64_t count = src.table ? keys[s] : ends[s] - begins[s], j0 = (t - kfirst[s]) * KT;
            transpose_keys(&src, j0, count - j0 < KT ? count - j0 : KT, d, kts + job * d * KT);
        }
        s = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            int64_t tile = task / kv_heads, kvh = task % kv_heads;
            s = find_span(first, spans, tile, s);
            int64_t b = begins[s], n = ends[s] - b, i0 = (tile - first[s]) * QT;
            int64_t i1 = i0 + QT < n ? i0 + QT : n, h = kvh * group;
            key_source src = source(s, kvh, k, k_stride, v, v_stride, begins, k_pool, v_pool,
                                    kv_heads * d, block_size, offsets, tables, d);
            attend_tile(q + b * q_stride + h * d, q_stride,
                        kts + (kvh * ktiles + kfirst[s]) * d * KT, &src, n,
                        src.table ? keys[s] : n, i0, i1, group, d, before, after, scale, softcap,
                        out + b * out_stride + h * d, out_stride, scratch);
        }
        free(scratch);
    }
    free(kts);
    free(first);
}
