/* What tokenmill's CPU kernels share (the .c files beside it, built into one library by
 * gpu/kernels/native_build.py with -O3 -march=native -fopenmp): the host's vector type (AVX-512,
 * AVX2 or none), e^x in scalar and 16-lane forms, and the row operations the kernels are made
 * of. OpenMP is the runtime PyTorch itself loaded (same soname, libgomp.so.1), so the kernels
 * share its thread pool and its torch.set_num_threads setting. All arithmetic is float32; only
 * the order of sums differs from PyTorch's. */
#ifndef TOKENMILL_VECTOR_H
#define TOKENMILL_VECTOR_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* e^x, one lane (vexp below: 16 lanes): x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6
 * polynomial (Cephes' coefficients, ~1 ulp), 2^n put into the exponent bits. x is clamped to
 * [-87, 88], where float32 neither overflows nor turns denormal. */
static inline float exp_clamped(float x) {
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* Vectors of VEC floats: AVX-512 or AVX2 intrinsics where the host has them. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define VEC 16
typedef __m512 vec;
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vfma _mm512_fmadd_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vdiv _mm512_div_ps
#define vmin _mm512_min_ps
#define vmax _mm512_max_ps
#define vfloor(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
/* 2^n for integral n (as floats) in the exponent bits */
static inline vec vpow2(vec n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
static inline float vhmax(vec v) { return _mm512_reduce_max_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC 8
typedef __m256 vec;
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfma _mm256_fmadd_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vdiv _mm256_div_ps
#define vmin _mm256_min_ps
#define vmax _mm256_max_ps
#define vfloor(x) _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
static inline vec vpow2(vec n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline float vsum(vec v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
static inline float vhmax(vec v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

/* Rows [begin, end) of the thread's share of `rows` (in blocks of 4). */
static inline void share(int64_t rows, int64_t *begin, int64_t *end) {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t blocks = (rows + 3) / 4, per = (blocks + n - 1) / n;
    *begin = t * per * 4 < rows ? t * per * 4 : rows;
    *end = (t + 1) * per * 4 < rows ? (t + 1) * per * 4 : rows;
}

/* dot(a, b) over n floats (n a multiple of VEC where vectors are used) */
static inline float dot(const float *a, const float *b, int64_t n) {
#ifdef VEC
    if (n % VEC == 0) {
        vec acc0 = vzero(), acc1 = vzero();
        int64_t d = 0;
        for (; d + 2 * VEC <= n; d += 2 * VEC) {
            acc0 = vfma(vload(a + d), vload(b + d), acc0);
            acc1 = vfma(vload(a + d + VEC), vload(b + d + VEC), acc1);
        }
        if (d < n) acc0 = vfma(vload(a + d), vload(b + d), acc0);
        return vsum(acc0) + vsum(acc1);
    }
#endif
    float total = 0.f;
    for (int64_t d = 0; d < n; ++d) total += a[d] * b[d];
    return total;
}

/* acc[0:n] += p · x[0:n] */
static inline void axpy(float *acc, float p, const float *x, int64_t n) {
#ifdef VEC
    if (n % VEC == 0) {
        vec pv = vset1(p);
        for (int64_t d = 0; d < n; d += VEC) vstore(acc + d, vfma(pv, vload(x + d), vload(acc + d)));
        return;
    }
#endif
    for (int64_t d = 0; d < n; ++d) acc[d] += p * x[d];
}

#ifdef VEC
/* exp_clamped on VEC lanes: the same steps, in AVX-512 or AVX2. */
static inline vec vexp(vec x) {
    x = vmin(vmax(x, vset1(-87.f)), vset1(88.f));
    vec n = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(vmul(p, r), r, vadd(r, vset1(1.f)));
    return vmul(p, vpow2(n));
}
#endif

/* x[t] = e^(x[t] - top) for t < n; returns their sum */
static inline float exp_shifted_sum(float *x, int64_t n, float top) {
    int64_t t = 0;
    float total = 0.f;
#ifdef VEC
    vec top_v = vset1(top), totals = vzero();
    for (; t + VEC <= n; t += VEC) {
        vec e = vexp(vsub(vload(x + t), top_v));
        vstore(x + t, e);
        totals = vadd(totals, e);
    }
    total = vsum(totals);
#endif
    for (; t < n; ++t) {
        x[t] = exp_clamped(x[t] - top);
        total += x[t];
    }
    return total;
}

/* out[i] = silu(g[i]) · u[i] for i < n (out may be g): SwiGLU's activation, silu(g) =
 * g / (1 + e^-g) */
static inline void silu_mul_row(const float *g, const float *u, int64_t n, float *out) {
    int64_t i = 0;
#ifdef VEC
    for (; i + VEC <= n; i += VEC) {
        vec gv = vload(g + i);
        vec e = vexp(vsub(vzero(), gv));
        vstore(out + i, vmul(vdiv(gv, vadd(vset1(1.f), e)), vload(u + i)));
    }
#endif
    for (; i < n; ++i) out[i] = g[i] / (1.f + exp_clamped(-g[i])) * u[i];
}

/* out[i] = gelu(g[i]) · u[i] for i < n (out may be g): GeGLU's activation with GELU's tanh
 * form, 0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³))), the tanh as 1 - 2 / (e^2z + 1); u NULL:
 * gelu(g[i]) alone (GPT-2's MLP, not gated) */
static inline void gelu_tanh_mul_row(const float *g, const float *u, int64_t n, float *out) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    int64_t i = 0;
#ifdef VEC
    for (; i + VEC <= n; i += VEC) {
        vec gv = vload(g + i);
        vec z = vmul(vset1(k), vfma(vmul(vset1(c), gv), vmul(gv, gv), gv));
        vec e = vexp(vadd(z, z));
        vec t = vsub(vset1(1.f), vdiv(vset1(2.f), vadd(e, vset1(1.f))));
        vec half = vmul(vset1(0.5f), gv);
        vec act = vfma(half, t, half);
        vstore(out + i, u ? vmul(act, vload(u + i)) : act);
    }
#endif
    for (; i < n; ++i) {
        float x = g[i], z = k * (x + c * x * x * x);
        float t = 1.f - 2.f / (exp_clamped(2.f * z) + 1.f);
        out[i] = 0.5f * x * (1.f + t) * (u ? u[i] : 1.f);
    }
}

#if VEC == 16
/* Prefetch one KV head's 64 floats (4 lines) at position j of a block (`block_head`: that
 * head's row at the block's first position; NULL: nothing). Asked one position at a time as
 * the current block's positions go by, not in one burst per block: a burst queues ahead of
 * the loads the kernel waits for (measured 2026-12-03, 64 sequences × 300 positions × 30
 * layers of SmolLM2's pool: 38–41 ms with a burst per block, 29.5–34 ms spread). */
static inline void prefetch_position64(const char *block_head, int64_t j, int64_t token_stride) {
    if (block_head)
        for (int c = 0; c < 4; ++c) __builtin_prefetch(block_head + j * token_stride * 4 + c * 64);
}
#endif

/* Prefetch `n` contiguous floats (a whole block of the pool). */
static inline void prefetch_floats(const float *start, int64_t n) {
    const char *bytes = (const char *)start;
    for (int64_t b = 0; b < n * 4; b += 64) __builtin_prefetch(bytes + b);
}

static inline void rms_norm_row(const float *x, const float *weight, float eps, int64_t n,
                                float *out) {
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
    float inv = 1.f / sqrtf(squares / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

/* out = (x - mean) / sqrt(var + eps) · weight + bias over n (LayerNorm, GPT-2's; the variance
 * biased, as torch's). out may be x. */
static inline void layer_norm_row(const float *x, const float *weight, const float *bias,
                                  float eps, int64_t n, float *out) {
    float sum = 0.f, squares = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    float mean = sum / (float)n;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += (x[i] - mean) * (x[i] - mean);
    float inv = 1.f / sqrtf(squares / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

/* Rotary embedding in place, rotate-half layout, on the first `rotary` dims of each of the
 * `heads` heads of x (the rest of a head passes through: Phi-4-mini's partial rotary); c, s
 * are the position's rows of the tables, `rotary` wide. */
static inline void rope_row(float *x, int64_t heads, int64_t head_dim, int64_t rotary,
                            const float *c, const float *s) {
    int64_t half = rotary / 2;
    for (int64_t h = 0; h < heads; ++h) {
        float *a = x + h * head_dim, *b = a + half;
        for (int64_t i = 0; i < half; ++i) {
            float lo = a[i], hi = b[i];
            a[i] = lo * c[i] + (-hi) * s[i];
            b[i] = hi * c[half + i] + lo * s[half + i];
        }
    }
}

#endif
