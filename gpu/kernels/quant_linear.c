/* A linear layer y = x · Wᵀ + bias at any number of rows, W in any format of weight.h.
 *
 * Up to SMALL_ROWS rows the product is its weights streaming by once: each thread takes a
 * share of the output rows and dequantizes them in registers (quant_gemv.c). Past that, the
 * arithmetic is what counts. x is transposed once per call into xT [in, rows padded to VEC]
 * (gathers), so that one vector holds VEC rows' value of one input. A unit of work is BAND
 * output rows × CHUNK_ROWS x rows: TILE weight rows at a time are dequantized into a float32
 * tile of the thread's own (TILE · in floats, L1), which the micro-kernel multiplies with
 * every x row of the chunk. It holds MV vectors of x rows × TILE output rows of sums (24
 * AVX-512 or 12 AVX2 registers); per input it loads MV vectors of xT, broadcasts TILE weights
 * and does MV · TILE FMAs. float32 arithmetic throughout; w = scale · q + offset is one FMA,
 * so an element may differ from the reference's two roundings in its last bit.
 *
 * Measured 2026-12-01 (ops/bench/qlinear_timing.py, 2 cores of an AVX-512 EPYC, medians, ms;
 * oneDNN float32 PackedLinear / int8 per channel / int4 g32):
 *   gate_up 576→3072   1 row 0.069 / 0.032 / 0.042   64 rows 0.560 / 0.606 / 0.636
 *   down 1536→576      1 row 0.061 / 0.024 / 0.032   64 rows 0.343 / 0.340 / 0.355
 *   lm_head 576→49152  1 row 2.56  / 0.70  / 0.81    64 rows 10.27 / 10.78 / 10.58
 * (16 rows, on the tiles with one vector of rows, is 1.1–1.5× oneDNN.) SmolLM2-135M's whole
 * batch-1 decode step in one call: float32 11.2, int8 3.8, int4 g32 3.9, int4 g64 3.5.
 */
#include "weight.h"

#define SMALL_ROWS 12  /* up to this many rows: the streaming kernels (measured crossover) */
#define TILE 6         /* output rows per dequantized tile (and per micro-kernel call) */
#define BAND 48        /* output rows per unit of work (8 tiles) */
#define CHUNK_ROWS 128 /* x rows per unit of work: a tile is dequantized once per chunk */

/* Row o of W as floats into out[in], 4-bit inputs in the permuted order (weight.h). */
static void dequant_row(const tm_weight *w, int64_t o, int64_t in, float *out) {
    int64_t group = w->group, groups = in / group;
    const float *s = w->scales + o * groups, *f = w->offsets ? w->offsets + o * groups : NULL;
    if (w->bits == 8) {
        const int8_t *q = (const int8_t *)w->data + o * in;
        for (int64_t g = 0; g < groups; ++g) {
            float sg = s[g], fg = f ? f[g] : 0.f;
            int64_t k = g * group;
#ifdef VEC
            vec S = vset1(sg), F = vset1(fg);
            for (; k < (g + 1) * group; k += VEC) vstore(out + k, vfma(widen8(q + k), S, F));
#endif
            for (; k < (g + 1) * group; ++k) out[k] = sg * (float)q[k] + fg;
        }
        return;
    }
    const uint8_t *q = (const uint8_t *)w->data + o * (in / 2);
#ifdef VEC
    int64_t whole = in / BLOCK4 * BLOCK4;
    vec S = vzero(), F = vzero();
    group_walk walk = {0, 0, group / 16};
    for (int64_t k = 0, held = -1, g, h; k < whole; k += BLOCK4) {
        next_block(&walk, &g, &h);
        if (g != held || h != g) { /* a group starts, or the block is two groups' */
            S = g == h ? vset1(s[g]) : halves(s[g], s[h]);
            F = !f ? vzero() : g == h ? vset1(f[g]) : halves(f[g], f[h]);
            held = g;
        }
        vec lo, hi;
        unpack4(q + k / 2, &lo, &hi);
        vstore(out + k, vfma(lo, S, F));
        vstore(out + k + VEC, vfma(hi, S, F));
    }
#if VEC == 16
    if (whole < in) { /* the last 16 inputs, the last group's */
        int64_t g = groups - 1;
        vstore(out + whole, vfma(unpack4_tail(q + whole / 2), vset1(s[g]), vset1(f ? f[g] : 0.f)));
    }
#endif
#else
    for (int64_t k = 0; k < in; ++k) {
        int64_t g = k / group;
        float v = (float)(k & 1 ? q[k / 2] >> 4 : q[k / 2] & 15);
        out[k] = s[g] * v + (f ? f[g] : 0.f);
    }
#endif
}

#ifdef VEC
#define MV_MOST (VEC == 16 ? 4 : 2) /* vectors of x rows per micro-kernel call */

/* t[j · t_stride + v · VEC + i] = Σ_k xT[k, v · VEC + i] · wt[j, k] for v < MV, j < NR: MV
 * vectors of x rows (xT [in, m_pad], from the first row's column) times NR rows of wt
 * (`w_stride` apart) */
static inline __attribute__((always_inline)) void micro(const float *xT, int64_t m_pad,
                                                        const float *wt, int64_t w_stride,
                                                        int64_t in, float *t, int64_t t_stride,
                                                        const int MV, const int NR) {
    vec a[MV_MOST][TILE];
    for (int v = 0; v < MV; ++v)
        for (int j = 0; j < NR; ++j) a[v][j] = vzero();
    for (int64_t k = 0; k < in; ++k) {
        const float *xk = xT + k * m_pad;
        vec xv[MV_MOST];
        for (int v = 0; v < MV; ++v) xv[v] = vload(xk + v * VEC);
        for (int j = 0; j < NR; ++j) {
            vec b = vset1(wt[j * w_stride + k]);
            for (int v = 0; v < MV; ++v) a[v][j] = vfma(xv[v], b, a[v][j]);
        }
    }
    for (int j = 0; j < NR; ++j)
        for (int v = 0; v < MV; ++v) vstore(t + j * t_stride + v * VEC, a[v][j]);
}

/* micro for MV (1 .. MV_MOST) known only at run time; NR TILE or 1 */
static void micro_any(const float *xT, int64_t m_pad, const float *wt, int64_t w_stride,
                      int64_t in, float *t, int64_t t_stride, int mv, int nr) {
#define CASE(MV)                                                                                 \
    if (mv == MV) {                                                                              \
        if (nr == TILE) micro(xT, m_pad, wt, w_stride, in, t, t_stride, MV, TILE);              \
        else micro(xT, m_pad, wt, w_stride, in, t, t_stride, MV, 1);                            \
        return;                                                                                  \
    }
    CASE(1)
    CASE(2)
#if MV_MOST > 2
    CASE(3)
    CASE(4)
#endif
#undef CASE
}

/* One unit of work: y's columns [o, o + cols) of rows [c, c_end) (c_end padded to VEC), TILE
 * weight rows dequantized at a time into wt [TILE, in]. The sums gather in `sums` [cols,
 * c_end - c] and go to y row by row at the end: written straight from the micro-kernel, a
 * tile's column of y would touch a line per row, rows 4 KiB apart (out a multiple of 1024),
 * all in one cache set. */
static void band(const tm_weight *w, const float *xT, int64_t m, int64_t m_pad, int64_t in,
                 int64_t out, int64_t o, int64_t cols, int64_t c, int64_t c_end,
                 const float *bias, float *wt, float *sums, float *y) {
    int64_t span = c_end - c;
    for (int64_t t0 = 0; t0 < cols; t0 += TILE) {
        int64_t nr = cols - t0 < TILE ? cols - t0 : TILE;
        const float *rows = wt;
        if (w->bits == 32) rows = (const float *)w->data + (o + t0) * in;
        else
            for (int64_t j = 0; j < nr; ++j) dequant_row(w, o + t0 + j, in, wt + j * in);
        for (int64_t r0 = c; r0 < c_end; r0 += MV_MOST * VEC) {
            int mv = (int)((c_end - r0) / VEC < MV_MOST ? (c_end - r0) / VEC : MV_MOST);
            float *at = sums + t0 * span + (r0 - c);
            if (nr == TILE) {
                micro_any(xT + r0, m_pad, rows, in, in, at, span, mv, TILE);
            } else { /* the last, short tile: row by row */
                for (int64_t j = 0; j < nr; ++j)
                    micro_any(xT + r0, m_pad, rows + j * in, in, in, at + j * span, span, mv, 1);
            }
        }
    }
    for (int64_t r = c; r < c_end && r < m; ++r)
        for (int64_t j = 0; j < cols; ++j)
            y[r * out + o + j] = sums[j * span + r - c] + (bias ? bias[o + j] : 0.f);
}

/* xT[at(k), r] = x[r, k] for k in [k_begin, k_end) and r < m_pad (0 from m on), at(k) the
 * 4-bit order (`permuted`) or k: a gather of VEC rows' k-th values per vector. */
static void transpose(const float *x, int64_t x_stride, int64_t m, int64_t m_pad, int64_t in,
                      int64_t k_begin, int64_t k_end, int permute, float *xT) {
    int64_t r0 = 0;
    if (x_stride * VEC < INT32_MAX) {
#if VEC == 16
        __m512i apart = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32((int)x_stride));
        for (; r0 < m_pad; r0 += VEC) {
            __mmask16 valid = m - r0 >= 16 ? 0xFFFF : (__mmask16)((1u << (m - r0)) - 1);
            for (int64_t k = k_begin; k < k_end; ++k) {
                int64_t at = permute ? permuted(k, in) : k;
                vec v = _mm512_mask_i32gather_ps(vzero(), valid, apart, x + r0 * x_stride + k, 4);
                vstore(xT + at * m_pad + r0, v);
            }
        }
#else
        __m256i apart = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)x_stride));
        for (; r0 < m_pad; r0 += VEC) {
            __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            __m256 valid = _mm256_castsi256_ps(
                _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(m - r0 < 8 ? m - r0 : 8)), lanes));
            for (int64_t k = k_begin; k < k_end; ++k) {
                int64_t at = permute ? permuted(k, in) : k;
                vec v = _mm256_mask_i32gather_ps(vzero(), x + r0 * x_stride + k, apart, valid, 4);
                vstore(xT + at * m_pad + r0, v);
            }
        }
#endif
    }
    for (; r0 < m_pad; ++r0) /* x too far apart for 32-bit gather offsets */
        for (int64_t k = k_begin; k < k_end; ++k)
            xT[(permute ? permuted(k, in) : k) * m_pad + r0] = r0 < m ? x[r0 * x_stride + k] : 0.f;
}

/* The many-rows path: x transposed into [in, m_pad] once, then bands × chunks of rows. */
static void many_rows(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                      const tm_weight *w, const float *bias, float *y) {
    int64_t m_pad = (m + VEC - 1) / VEC * VEC;
    int64_t bands = (out + BAND - 1) / BAND, chunks = (m_pad + CHUNK_ROWS - 1) / CHUNK_ROWS;
    float *xT = malloc((size_t)(in * m_pad) * sizeof(float));
    if (!xT) abort();
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t k0 = 0; k0 < in; k0 += 16)
            transpose(x, x_stride, m, m_pad, in, k0, k0 + 16, w->bits == 4, xT);
        float *wt = malloc((size_t)(TILE * in + BAND * CHUNK_ROWS) * sizeof(float));
        if (!wt) abort();
#pragma omp for schedule(static)
        for (int64_t u = 0; u < bands * chunks; ++u) {
            int64_t o = u % bands * BAND, c = u / bands * CHUNK_ROWS;
            int64_t cols = out - o < BAND ? out - o : BAND;
            int64_t c_end = c + CHUNK_ROWS < m_pad ? c + CHUNK_ROWS : m_pad;
            band(w, xT, m, m_pad, in, out, o, cols, c, c_end, bias, wt, wt + TILE * in, y);
        }
        free(wt);
    }
    free(xT);
}
#else
/* The plain loops: each tile row dequantized once per chunk, then a dot with each x row. */
static void many_rows(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                      const tm_weight *w, const float *bias, float *y) {
    int64_t chunks = (m + CHUNK_ROWS - 1) / CHUNK_ROWS;
#pragma omp parallel
    {
        float *row = malloc((size_t)in * sizeof(float));
        if (!row) abort();
#pragma omp for schedule(static)
        for (int64_t u = 0; u < out * chunks; ++u) {
            int64_t o = u % out, c = u / out * CHUNK_ROWS;
            const float *wo = (const float *)w->data + o * in;
            if (w->bits != 32) {
                dequant_row(w, o, in, row);
                wo = row;
            }
            for (int64_t r = c; r < c + CHUNK_ROWS && r < m; ++r)
                y[r * out + o] = dot(wo, x + r * x_stride, in) + (bias ? bias[o] : 0.f);
        }
        free(row);
    }
}
#endif

void tm_qlinear(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                const tm_weight *w, const float *bias, float *y) {
    if (m > SMALL_ROWS) {
        many_rows(m, in, out, x, x_stride, w, bias, y);
        return;
    }
    float *permuted_x = NULL; /* 4-bit weights: x permuted once, for every thread */
    if (w->bits == 4 && BLOCK4) {
        permuted_x = malloc((size_t)(m * in) * sizeof(float));
        if (!permuted_x) abort();
        permute_rows(x, x_stride, m, in, permuted_x);
        x = permuted_x;
        x_stride = in;
    }
#pragma omp parallel
    {
        int64_t b, e;
        share(out, &b, &e);
        tm_linear_share(w, bias, x, x_stride, m, in, out, b, e, y, NULL);
    }
    free(permuted_x);
}
