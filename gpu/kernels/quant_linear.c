/* A linear layer y = x · Wᵀ + bias at any number of rows, W in any format of weight.h.
 *
 * Up to SMALL_ROWS rows the product is its weights streaming by once: each thread takes a
 * share of the output rows and dequantizes them in registers (quant_gemv.c). Past that, the
 * arithmetic is what counts: a thread dequantizes TILE rows of W at a time into a float32
 * tile of its own (TILE · in floats, in L1 or L2), which a register-blocked micro-kernel then
 * multiplies with every x row. The micro-kernel holds MV vectors of x rows × TILE output rows
 * of sums (24 AVX-512 or 12 AVX2 registers): per input it loads MV vectors of x, transposed
 * once per call into [in, rows] so a vector is VEC rows' value of one input, broadcasts TILE
 * weights and does MV · TILE FMAs. float32 arithmetic throughout; w = scale · q + offset is
 * one FMA, so an element may differ from the reference's two roundings in its last bit. */
#include "weight.h"

#define SMALL_ROWS 4   /* up to this many rows: the streaming kernels */
#define TILE 6         /* output rows per dequantized tile (and per micro-kernel call) */
#define CHUNK_ROWS 256 /* x rows per unit of work: a tile is dequantized once per chunk */

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
    int split = group % BLOCK4 != 0;
    int64_t whole = in / BLOCK4 * BLOCK4;
    vec S = vzero(), F = vzero();
    for (int64_t k = 0, next = 0; k < whole; k += BLOCK4) {
        if (k >= next) {
            int64_t g = k / group, h = (k + BLOCK4 / 2) / group;
            S = halves(s[g], s[h]);
            F = f ? halves(f[g], f[h]) : vzero();
            next = split ? k + BLOCK4 : k + group;
        }
        vec lo, hi;
        unpack4(q + k / 2, &lo, &hi);
        vstore(out + k, vfma(lo, S, F));
        vstore(out + k + VEC, vfma(hi, S, F));
    }
#if VEC == 16
    if (whole < in) { /* the last 16 inputs, one group's */
        int64_t g = whole / group;
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

/* t[j][v · VEC + i] = Σ_k xT[k, v · VEC + i] · wt[j, k] for v < MV, j < NR: MV vectors of x
 * rows (xT [in, m_pad], columns from the first row's) times NR rows of wt (`w_stride` apart) */
static inline __attribute__((always_inline)) void micro(const float *xT, int64_t m_pad,
                                                        const float *wt, int64_t w_stride,
                                                        int64_t in, float *t, const int MV,
                                                        const int NR) {
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
        for (int v = 0; v < MV; ++v) vstore(t + (j * MV + v) * VEC, a[v][j]);
}

/* micro for MV (1 .. MV_MOST) known only at run time */
static void micro_any(const float *xT, int64_t m_pad, const float *wt, int64_t w_stride,
                      int64_t in, float *t, int mv, int nr) {
#define CASE(MV)                                                                                 \
    if (mv == MV) {                                                                              \
        if (nr == TILE) micro(xT, m_pad, wt, w_stride, in, t, MV, TILE);                        \
        else micro(xT, m_pad, wt, w_stride, in, t, MV, 1);                                      \
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

/* y rows [r_begin, r_end) × tile rows [o, o + nr) from wt [nr, in] */
static void tile_rows(const float *xT, int64_t m, int64_t m_pad, const float *wt,
                      int64_t w_stride, int64_t in, int64_t out, int64_t o, int64_t nr,
                      int64_t r_begin, int64_t r_end, const float *bias, float *y) {
    float t[TILE * MV_MOST * VEC];
    for (int64_t r0 = r_begin; r0 < r_end; r0 += MV_MOST * VEC) {
        int64_t rows = r_end - r0 < MV_MOST * VEC ? r_end - r0 : MV_MOST * VEC;
        int mv = (int)((rows + VEC - 1) / VEC), width = mv * VEC;
        if (nr == TILE) {
            micro_any(xT + r0, m_pad, wt, w_stride, in, t, mv, TILE);
        } else { /* the last, short tile: row by row */
            for (int64_t j = 0; j < nr; ++j)
                micro_any(xT + r0, m_pad, wt + j * w_stride, w_stride, in, t + j * width, mv, 1);
        }
        for (int64_t j = 0; j < nr; ++j) {
            float b = bias ? bias[o + j] : 0.f;
            for (int64_t r = r0; r < r0 + rows && r < m; ++r)
                y[r * out + o + j] = t[j * width + r - r0] + b;
        }
    }
}

/* The many-rows path: x transposed into [in, m_pad] once, then tiles × chunks of rows. */
static void many_rows(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                      const tm_weight *w, const float *bias, float *y) {
    int64_t m_pad = (m + VEC - 1) / VEC * VEC;
    int64_t tiles = (out + TILE - 1) / TILE, chunks = (m + CHUNK_ROWS - 1) / CHUNK_ROWS;
    float *xT = malloc((size_t)(in * m_pad) * sizeof(float));
    if (!xT) abort();
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t k0 = 0; k0 < in; k0 += 16)
            for (int64_t r = 0; r < m_pad; ++r)
                for (int64_t k = k0; k < k0 + 16; ++k) {
                    int64_t at = w->bits == 4 ? permuted(k, in) : k;
                    xT[at * m_pad + r] = r < m ? x[r * x_stride + k] : 0.f;
                }
        float *wt = w->bits == 32 ? NULL : malloc((size_t)(TILE * in) * sizeof(float));
        if (w->bits != 32 && !wt) abort();
#pragma omp for schedule(static)
        for (int64_t u = 0; u < tiles * chunks; ++u) {
            int64_t o = u % tiles * TILE, c = u / tiles * CHUNK_ROWS;
            int64_t nr = out - o < TILE ? out - o : TILE;
            const float *rows = wt;
            if (w->bits == 32) rows = (const float *)w->data + o * in;
            else
                for (int64_t j = 0; j < nr; ++j) dequant_row(w, o + j, in, wt + j * in);
            int64_t c_end = c + CHUNK_ROWS < m_pad ? c + CHUNK_ROWS : m_pad;
            tile_rows(xT, m, m_pad, rows, in, in, out, o, nr, c, c_end, bias, y);
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
