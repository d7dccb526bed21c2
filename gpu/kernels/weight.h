/* A linear layer's weight matrix W [out, in] as the kernels take it: float32, or held
 * quantized in gpu/quantized_weight.py's layout (w = scale · q + offset per group of inputs).
 *
 *   bits 32: data float32 [out, in]; group, scales and offsets unused.
 *   bits 8:  data int8 [out, in], q in [-128, 127].
 *   bits 4:  data uint8 [out, in / 2], q in [0, 15]: element 2j in the low nibble of byte j,
 *            element 2j + 1 in the high one.
 *   scales float32 [out, in / group]; offsets the same, or NULL for 0.
 *   panels: for bits 32, the same W in panel_linear.c's panels, or NULL (then data alone).
 *
 * `in` and `group` are multiples of 16 (gpu/kernels/native_weight.py checks), so a group never
 * splits a vector of 16 or 8 lanes. The 4-bit kernels unpack a block of bytes into the low
 * nibbles' vector and the high nibbles' one and keep each in place; what they multiply is x
 * permuted the same way, block by block (`block4`, `permuted`), which costs nothing per weight. */
#ifndef TOKENMILL_WEIGHT_H
#define TOKENMILL_WEIGHT_H

#include "vector.h"

typedef struct {
    int64_t bits;
    int64_t group;
    const void *data;
    const float *scales;
    const float *offsets;
    const float *panels;
} tm_weight;

/* Inputs per 4-bit block: the bytes one load unpacks into two vectors (0: the plain loops,
 * which read x as it is). */
#ifdef VEC
#define BLOCK4 (2 * VEC)
#else
#define BLOCK4 0
#endif

/* Where input k of a 4-bit row of `in` lies in the kernels' order: each block's even elements
 * (low nibbles), then its odd ones. A row of 16 · odd inputs ends (AVX-512) in a block of 16. */
static inline int64_t permuted(int64_t k, int64_t in) {
#if BLOCK4
    if (k < in / BLOCK4 * BLOCK4) {
        int64_t at = k % BLOCK4;
        return k - at + (at & 1) * (BLOCK4 / 2) + at / 2;
    }
    int64_t at = k % 16;
    return k - at + (at & 1) * 8 + at / 2;
#else
    (void)in;
    return k;
#endif
}

#if VEC == 16
/* 16 int8 weights as floats */
static inline vec widen8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* A block of 32 4-bit weights (16 bytes) as floats: even elements in lo, odd ones in hi */
static inline void unpack4(const uint8_t *p, vec *lo, vec *hi) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
/* A row's last block of 16 (8 bytes) where in is 16 · odd: even elements, then odd ones */
static inline vec unpack4_tail(const uint8_t *p) {
    __m128i v = _mm_loadl_epi64((const __m128i *)p), low = _mm_set1_epi8(15);
    __m128i n = _mm_unpacklo_epi64(_mm_and_si128(v, low), _mm_and_si128(_mm_srli_epi16(v, 4), low));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(n));
}
/* a in the lanes of a block's first 16 elements, b in its last 16's (groups of 16) */
static inline vec halves(float a, float b) { return _mm512_mask_blend_ps(0xFF00, vset1(a), vset1(b)); }
#elif VEC == 8
static inline vec widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* 16 4-bit weights (8 bytes) */
static inline void unpack4(const uint8_t *p, vec *lo, vec *hi) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
static inline vec halves(float a, float b) { return (void)b, vset1(a); } /* a block is one group */
#endif

/* The groups of a 4-bit row's blocks in turn, without a division per block: `first` of the
 * block's first 16 inputs, `second` of its last 16 (the same but for AVX-512 blocks of two
 * groups of 16 · odd). */
typedef struct {
    int64_t group, used, per16; /* the current group, its 16s gone by, 16s per group */
} group_walk;

static inline void walk_16(group_walk *walk) {
    if (++walk->used == walk->per16) {
        walk->used = 0;
        ++walk->group;
    }
}

static inline void next_block(group_walk *walk, int64_t *first, int64_t *second) {
    *first = walk->group;
    walk_16(walk);
    *second = *first;
    if (BLOCK4 == 32) {
        *second = walk->group;
        walk_16(walk);
    }
}

/* x's m rows (`stride` apart) in the order 4-bit rows are multiplied in, into out [m, in] */
static inline void permute_rows(const float *x, int64_t stride, int64_t m, int64_t in, float *out) {
    for (int64_t r = 0; r < m; ++r)
        for (int64_t k = 0; k < in; ++k) out[r * in + permuted(k, in)] = x[r * stride + k];
}

/* y[r, o] = W[o] · x[r] (+ bias[o]) for r < m and o in [begin, end): a thread's share of the
 * output rows, called inside a parallel region (gpu/kernels/decode_step.c). Each block of W's
 * rows is read once and dequantized in registers for all m rows (m small: decode). x's rows
 * are `x_stride` apart, y's `y_stride`. For 4-bit weights `scratch` holds m · in floats (x
 * permuted there), or is NULL where x is already permuted. quant_gemv.c. */
void tm_linear_share(const tm_weight *w, const float *bias, const float *x, int64_t x_stride,
                     int64_t m, int64_t in, int64_t y_stride, int64_t begin, int64_t end,
                     float *y, float *scratch);

/* Output features per panel (panel_linear.c). */
int64_t tm_panel_width(void);

/* Panels [*begin, *end) of a weight with `out` features: the calling thread's share of them,
 * inside a parallel region. panel_linear.c. */
void tm_panel_share(int64_t out, int64_t *begin, int64_t *end);

/* y [m, out] (rows `y_stride` apart) = x [m, in] (rows `x_stride` apart) · Wᵀ + bias over
 * panels [p_begin, p_end) of W's panels: a thread's share, inside a parallel region.
 * panel_linear.c. */
void tm_panel_range(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                    const float *panels, const float *bias, float *y, int64_t y_stride,
                    int64_t p_begin, int64_t p_end);

/* y [m, out] = x [m, in] · Wᵀ + bias (bias may be NULL), its own parallel region. x's rows are
 * `x_stride` apart, y is contiguous. quant_linear.c. */
void tm_qlinear(int64_t m, int64_t in, int64_t out, const float *x, int64_t x_stride,
                const tm_weight *w, const float *bias, float *y);

#endif
