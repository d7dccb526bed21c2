/* y = x Wᵀ + b for the few rows of a decode step, over weights packed in panels.
 *
 * A decode step multiplies every weight matrix by a handful of rows (one per running
 * sequence). oneDNN's kernels are tuned for many rows: on this project's 2-core machines a
 * step of 8–64 rows streams its weights at ~15 GB/s of the ~25 the cores can read, and spends
 * a third of its time waiting for them (measured 2026-12-02, SmolLM2-135M: 30 layers' products
 * at 64 rows take 99 ms with the weights cold, 59 ms hot).
 *
 * Here W [out, in] is held as panels of PANEL consecutive output features: panel p is
 * [in, PANEL], input k's PANEL weights side by side (`tm_panel_width`; gpu/models/
 * packed_linear.py packs them). A tile of ROWS rows × PANEL outputs stays in registers while
 * the inputs go by: per input, PANEL / VEC weight loads and one broadcast per row feed
 * ROWS · PANEL / VEC FMAs, so the loads never bound it, and the panel (in · PANEL floats,
 * read from memory once and from L2 for the row tiles after the first) is streamed front to
 * back while the next one is prefetched, a few lines every few inputs. Measured 2026-12-03
 * (SmolLM2-135M's 121 products in one parallel region, weights cold, 2 cores whose FMA peak
 * is ~475 GFLOP/s): 64 rows 38 ms (450 GFLOP/s), 32 rows 20 ms, 16 rows 13 ms; with the next
 * panel asked for in one burst, 46, 27 and 16.5 ms. Threads take whole panels (rows too,
 * where there are few panels for many threads: tm_panel_linear). Each output is one sum
 * over the inputs in order (then + bias): the order differs from oneDNN's, the arithmetic is
 * float32 throughout.
 */
#include "weight.h"

#include <string.h>

#if VEC == 16
#define PANEL 32
#define ROWS 8
#elif VEC == 8
#define PANEL 16
#define ROWS 6
#else
#define PANEL 16
#define ROWS 4
#endif

int64_t tm_panel_width(void) { return PANEL; }

#ifdef VEC
/* acc[r][j] over the tile's `rows` (≤ ROWS) rows: a compile-time row count, unrolled. */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t x_stride,
                                                       const float *panel, int64_t in,
                                                       float *out, int64_t out_stride,
                                                       const float *ahead, int64_t reach,
                                                       const int rows) {
    vec acc[ROWS][PANEL / VEC];
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < PANEL / VEC; ++j) acc[r][j] = vzero();
    /* this tile's share of the next panel (`reach` inputs' lines from `ahead`), requested
     * evenly over the tile's inputs, `per` lines every `every` inputs. Asked
     * in a burst at the start instead, they queue behind each other and stall the loads of
     * this panel (measured: 16–32 rows ~25% slower, 64 rows ~10%) */
    int64_t lines = reach * PANEL * (int64_t)sizeof(float) / 64, line = 0;
    int64_t every = lines && lines < in ? in / lines : 1;
    int64_t per = lines > in ? (lines + in - 1) / in : 1;
    for (int64_t k = 0, wait = 0; k < in; ++k) {
        if (wait-- == 0) {
            wait = every - 1;
            for (int64_t q = 0; q < per && line < lines; ++q, ++line)
                __builtin_prefetch((const char *)ahead + line * 64, 0, 2);
        }
        vec w[PANEL / VEC];
        for (int j = 0; j < PANEL / VEC; ++j) w[j] = vload(panel + k * PANEL + j * VEC);
        for (int r = 0; r < rows; ++r) {
            vec xr = vset1(x[r * x_stride + k]);
            for (int j = 0; j < PANEL / VEC; ++j) acc[r][j] = vfma(xr, w[j], acc[r][j]);
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < PANEL / VEC; ++j) vstore(out + r * out_stride + j * VEC, acc[r][j]);
}
#else
static inline void tile(const float *x, int64_t x_stride, const float *panel, int64_t in,
                        float *out, int64_t out_stride, const float *ahead, int64_t reach,
                        const int rows) {
    (void)ahead, (void)reach;
    float acc[ROWS][PANEL];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < in; ++k)
        for (int r = 0; r < rows; ++r) {
            float xr = x[r * x_stride + k];
            for (int j = 0; j < PANEL; ++j) acc[r][j] += xr * panel[k * PANEL + j];
        }
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < PANEL; ++j) out[r * out_stride + j] = acc[r][j];
}
#endif

/* weight.h. The edge panel's tile goes through a local buffer, so y is never written past
 * `out`; bias is added after the sums. */
void tm_panel_range(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                    const float *panels, const float *bias, float *y, int64_t y_stride,
                    int64_t p_begin, int64_t p_end) {
    float edge[ROWS * PANEL]; /* the last panel's tile, when it reaches past `out` */
    /* the next panel is fetched while this one computes, spread over its row tiles */
    int64_t tiles = (m + ROWS - 1) / ROWS, chunk = (in + tiles - 1) / tiles;
    for (int64_t p = p_begin; p < p_end; ++p) {
        const float *panel = panels + p * in * PANEL;
        int64_t first = p * PANEL, width = out - first < PANEL ? out - first : PANEL;
        for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
            int64_t rows = m - r0 < ROWS ? m - r0 : ROWS, from = r0 / ROWS * chunk;
            int64_t reach = p + 1 < p_end ? (in - from < chunk ? in - from : chunk) : 0;
            const float *ahead = panel + (in + from) * PANEL;
            const float *xt = x + r0 * x_stride;
            float *yt = width == PANEL ? y + r0 * y_stride + first : edge;
            int64_t yt_stride = width == PANEL ? y_stride : PANEL;
            switch (rows) {
#define TILE(R) \
    case R: tile(xt, x_stride, panel, in, yt, yt_stride, ahead, reach, R); break;
                TILE(1)
                TILE(2)
                TILE(3)
                TILE(4)
#if ROWS > 4
                TILE(5)
                TILE(6)
#endif
#if ROWS > 6
                TILE(7)
                TILE(8)
#endif
#undef TILE
            }
            if (width < PANEL)
                for (int64_t r = 0; r < rows; ++r)
                    memcpy(y + (r0 + r) * y_stride + first, edge + r * PANEL,
                           (size_t)width * sizeof(float));
            if (bias)
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t j = 0; j < width; ++j)
                        y[(r0 + r) * y_stride + first + j] += bias[first + j];
        }
    }
}

/* weight.h */
void tm_panel_share(int64_t out, int64_t *begin, int64_t *end) {
    int64_t count = (out + PANEL - 1) / PANEL;
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t per = count / n, extra = count % n;
    *begin = t * per + (t < extra ? t : extra);
    *end = *begin + per + (t < extra);
}

/* The same product over all of W's panels, its own parallel region. Each thread takes a
 * contiguous run of panels (tm_panel_share), all rows of each, the next panel prefetched;
 * where that leaves a thread fewer than PANELS_EACH panels of a product of many rows (many
 * threads, a narrow W), tasks of one panel × ROW_BLOCK rows instead, each thread a contiguous
 * run of them (a panel stays in its cache for all its rows), so every thread works. */
#define ROW_BLOCK 64
#define PANELS_EACH 8
void tm_panel_linear(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                     const float *panels, const float *bias, float *y, int64_t y_stride) {
    int64_t count = (out + PANEL - 1) / PANEL, blocks = (m + ROW_BLOCK - 1) / ROW_BLOCK;
    if (blocks <= 1 || count >= PANELS_EACH * omp_get_max_threads()) {
#pragma omp parallel
        {
            int64_t b, e;
            tm_panel_share(out, &b, &e);
            tm_panel_range(m, in, out, x, x_stride, panels, bias, y, y_stride, b, e);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < count * blocks; ++task) {
        int64_t p = task / blocks, r0 = task % blocks * ROW_BLOCK;
        int64_t rows = m - r0 < ROW_BLOCK ? m - r0 : ROW_BLOCK;
        tm_panel_range(rows, in, out, x + r0 * x_stride, x_stride, panels, bias,
                       y + r0 * y_stride, y_stride, p, p + 1);
    }
}
