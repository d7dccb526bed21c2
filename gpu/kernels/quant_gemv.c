/* A thread's share of a linear layer's output rows at few input rows (decode), for every
 * weight format of weight.h: float32 as it is; int8 and int4 dequantized in registers.
 *
 * At one or two rows a product is its weights streaming by once, so held quantized it reads a
 * quarter (int8) or an eighth (int4, plus its scales) of float32's bytes. Each block of 4
 * weight rows is converted to floats in registers (w = scale · q + offset, one FMA) and used
 * for up to M_MOST x rows a pass (4 AVX-512, 2 AVX2: the sums' registers) while its bytes are
 * in L1; more rows take more passes over the block. No row is ever dequantized to memory.
 * int8's one scale a row is applied once to the row's sum rather than to every weight (the
 * products 5-15% faster at one row, measured 2026-12-06 on SmolLM2's shapes).
 * (Accumulating Σ q·x per group and scaling once per group saves the dequantizing FMA but
 * needs a second set of sums, which AVX2's 16 registers do not hold for 4 rows × 2.) */
#include "weight.h"

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

/* Blocks ahead whose weights a block prefetches: the rows' hardware prefetch does not keep
 * up with streams this short (a row of 576 int8 weights is 9 lines). */
#define AHEAD 3

/* Prefetch into L2 the `bytes` from `start` (a block's weights, scales or offsets). */
static inline void prefetch_bytes(const void *start, int64_t bytes) {
    const char *at = (const char *)start;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(at + b, 0, 2);
}

#ifdef VEC
#define M_MOST (VEC == 16 ? 4 : 2) /* x rows per pass over a block (registers: R · M sums) */
/* Unrolled whole, the loops over rows leave every sum in a register of its own. */
#define UNROLL _Pragma("GCC unroll 4")

/* R rows of 8-bit W from row o times M rows of x (`xs` apart): y[r · ys + o + j] */
static inline __attribute__((always_inline)) void rows8(const tm_weight *w, int64_t o, int64_t in,
                                                        const float *x, int64_t xs, float *y,
                                                        int64_t ys, const int R, const int M) {
    int64_t group = w->group, groups = in / group;
    const int8_t *q = (const int8_t *)w->data + o * in;
    const float *s = w->scales + o * groups, *f = w->offsets ? w->offsets + o * groups : NULL;
    prefetch_bytes(q + AHEAD * R * in, R * in);
    if (groups > 1) prefetch_bytes(s + AHEAD * R * groups, R * groups * 4);
    if (f && groups > 1) prefetch_bytes(f + AHEAD * R * groups, R * groups * 4);
    vec a[4][M_MOST], S[4], F[4];
    UNROLL for (int j = 0; j < R; ++j)
        UNROLL for (int r = 0; r < M; ++r) a[j][r] = vzero();
    if (groups == 1 && !f) { /* one scale a row (int8's): Σ q·x, scaled once at the end */
        for (int64_t k = 0; k < in; k += VEC)
            UNROLL for (int j = 0; j < R; ++j) {
                vec wv = widen8(q + j * in + k);
                UNROLL for (int r = 0; r < M; ++r)
                    a[j][r] = vfma(wv, vload(x + r * xs + k), a[j][r]);
            }
        UNROLL for (int j = 0; j < R; ++j)
            UNROLL for (int r = 0; r < M; ++r) y[r * ys + o + j] = s[j] * vsum(a[j][r]);
        return;
    }
    for (int64_t g = 0; g < groups; ++g) {
        UNROLL for (int j = 0; j < R; ++j) {
            S[j] = vset1(s[j * groups + g]);
            F[j] = f ? vset1(f[j * groups + g]) : vzero();
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += VEC)
            UNROLL for (int j = 0; j < R; ++j) {
                vec wv = vfma(widen8(q + j * in + k), S[j], F[j]);
                UNROLL for (int r = 0; r < M; ++r)
                    a[j][r] = vfma(wv, vload(x + r * xs + k), a[j][r]);
            }
    }
    UNROLL for (int j = 0; j < R; ++j)
        UNROLL for (int r = 0; r < M; ++r) y[r * ys + o + j] = vsum(a[j][r]);
}

/* The same for 4-bit W, x permuted (`permuted`). A block of BLOCK4 inputs is one group's, or
 * (AVX-512, groups of 16 · odd) its halves are two groups': then the scales change per block. */
static inline __attribute__((always_inline)) void rows4(const tm_weight *w, int64_t o, int64_t in,
                                                        const float *x, int64_t xs, float *y,
                                                        int64_t ys, const int R, const int M) {
    int64_t group = w->group, groups = in / group, row = in / 2, whole = in / BLOCK4 * BLOCK4;
    const uint8_t *q = (const uint8_t *)w->data + o * row;
    const float *s = w->scales + o * groups, *f = w->offsets ? w->offsets + o * groups : NULL;
    prefetch_bytes(q + AHEAD * R * row, R * row);
    if (groups > 1) prefetch_bytes(s + AHEAD * R * groups, R * groups * 4);
    if (f && groups > 1) prefetch_bytes(f + AHEAD * R * groups, R * groups * 4);
    vec a[4][M_MOST], S[4], F[4];
    UNROLL for (int j = 0; j < R; ++j) {
        S[j] = F[j] = vzero();
        UNROLL for (int r = 0; r < M; ++r) a[j][r] = vzero();
    }
    group_walk walk = {0, 0, group / 16};
    for (int64_t k = 0, held = -1, g, h; k < whole; k += BLOCK4) {
        next_block(&walk, &g, &h);
        if (g != held || h != g) { /* a group starts, or the block is two groups' */
            UNROLL for (int j = 0; j < R; ++j) {
                const float *sj = s + j * groups, *fj = f ? f + j * groups : NULL;
                S[j] = g == h ? vset1(sj[g]) : halves(sj[g], sj[h]);
                F[j] = !fj ? vzero() : g == h ? vset1(fj[g]) : halves(fj[g], fj[h]);
            }
            held = g;
        }
        UNROLL for (int j = 0; j < R; ++j) {
            vec lo, hi;
            unpack4(q + j * row + k / 2, &lo, &hi);
            lo = vfma(lo, S[j], F[j]);
            hi = vfma(hi, S[j], F[j]);
            UNROLL for (int r = 0; r < M; ++r) {
                a[j][r] = vfma(lo, vload(x + r * xs + k), a[j][r]);
                a[j][r] = vfma(hi, vload(x + r * xs + k + VEC), a[j][r]);
            }
        }
    }
#if VEC == 16
    if (whole < in) { /* the last 16 inputs, the last group's */
        int64_t g = groups - 1;
        UNROLL for (int j = 0; j < R; ++j) {
            vec wv = vfma(unpack4_tail(q + j * row + whole / 2), vset1(s[j * groups + g]),
                          f ? vset1(f[j * groups + g]) : vzero());
            UNROLL for (int r = 0; r < M; ++r)
                a[j][r] = vfma(wv, vload(x + r * xs + whole), a[j][r]);
        }
    }
#endif
    UNROLL for (int j = 0; j < R; ++j)
        UNROLL for (int r = 0; r < M; ++r) y[r * ys + o + j] = vsum(a[j][r]);
}

static inline __attribute__((always_inline)) void rows(const tm_weight *w, int64_t o, int64_t in,
                                                       const float *x, int64_t xs, float *y,
                                                       int64_t ys, const int R, const int M) {
    if (w->bits == 8) rows8(w, o, in, x, xs, y, ys, R, M);
    else rows4(w, o, in, x, xs, y, ys, R, M);
}

/* rows for R (4 or 1) and M (1 .. M_MOST) known only at run time */
static void rows_any(const tm_weight *w, int64_t o, int64_t in, const float *x, int64_t xs,
                     float *y, int64_t ys, int r_count, int m) {
#define CASE(R, M)                                                                               \
    if (r_count == R && m == M) {                                                                \
        rows(w, o, in, x, xs, y, ys, R, M);                                                      \
        return;                                                                                  \
    }
    CASE(4, 1)
    CASE(4, 2)
    CASE(1, 1)
    CASE(1, 2)
#if M_MOST > 2
    CASE(4, 3)
    CASE(4, 4)
    CASE(1, 3)
    CASE(1, 4)
#endif
#undef CASE
}

/* Rows [begin, end) for every x row: blocks of 4 weight rows, each for M_MOST x rows at a
 * time while its bytes are in L1 */
static void quantized_share(const tm_weight *w, const float *x, int64_t x_stride, int64_t m,
                            int64_t in, int64_t y_stride, int64_t begin, int64_t end, float *y) {
    for (int64_t o = begin; o < end; o += 4) {
        int64_t n = end - o < 4 ? end - o : 4; /* the last block may be short: row by row */
        for (int64_t r = 0; r < m; r += M_MOST) {
            int count = (int)(m - r < M_MOST ? m - r : M_MOST);
            const float *xr = x + r * x_stride;
            float *yr = y + r * y_stride;
            if (n == 4) rows_any(w, o, in, xr, x_stride, yr, y_stride, 4, count);
            else
                for (int64_t i = o; i < o + n; ++i)
                    rows_any(w, i, in, xr, x_stride, yr, y_stride, 1, count);
        }
    }
}
#else
/* The plain loops: w = scale · q + offset, element by element, as the reference does. */
static void quantized_share(const tm_weight *w, const float *x, int64_t x_stride, int64_t m,
                            int64_t in, int64_t y_stride, int64_t begin, int64_t end, float *y) {
    int64_t group = w->group, groups = in / group;
    for (int64_t o = begin; o < end; ++o) {
        const float *s = w->scales + o * groups, *f = w->offsets ? w->offsets + o * groups : NULL;
        const int8_t *q8 = (const int8_t *)w->data + o * in;
        const uint8_t *q4 = (const uint8_t *)w->data + o * (in / 2);
        for (int64_t r = 0; r < m; ++r) {
            const float *xr = x + r * x_stride;
            float total = 0.f;
            for (int64_t g = 0; g < groups; ++g) {
                float sg = s[g], fg = f ? f[g] : 0.f;
                for (int64_t k = g * group; k < (g + 1) * group; ++k) {
                    int q = w->bits == 8 ? q8[k] : k & 1 ? q4[k / 2] >> 4 : q4[k / 2] & 15;
                    total += (sg * (float)q + fg) * xr[k];
                }
            }
            y[r * y_stride + o] = total;
        }
    }
}
#endif

void tm_linear_share(const tm_weight *w, const float *bias, const float *x, int64_t x_stride,
                     int64_t m, int64_t in, int64_t y_stride, int64_t begin, int64_t end,
                     float *y, float *scratch) {
    if (w->bits == 32) {
        gemv_share((const float *)w->data, bias, x, x_stride, m, in, y_stride, begin, end, y);
        return;
    }
    if (begin >= end) return;
    if (w->bits == 4 && BLOCK4 && scratch) {
        permute_rows(x, x_stride, m, in, scratch);
        x = scratch;
        x_stride = in;
    }
    quantized_share(w, x, x_stride, m, in, y_stride, begin, end, y);
    if (bias)
        for (int64_t r = 0; r < m; ++r)
            for (int64_t o = begin; o < end; ++o) y[r * y_stride + o] += bias[o];
}
