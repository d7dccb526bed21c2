/* tokenmill's CPU kernels: what PyTorch's CPU ops cannot do without copies.
 *
 * Built at first use by gpu/kernels/native.py with the host's C compiler
 * (-O3 -march=native -fopenmp) and called through ctypes on tensors' memory. OpenMP here is
 * the runtime PyTorch itself loaded (same soname, libgomp.so.1), so these loops share its
 * thread pool and its torch.set_num_threads setting. Vector work uses AVX-512 or AVX2
 * intrinsics where -march=native finds them, plain C loops elsewhere.
 * All arithmetic is float32; only the order of sums differs from PyTorch's.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* e^x in a form the compiler vectorises: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6
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
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC 8
typedef __m256 vec;
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfma _mm256_fmadd_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
static inline float vsum(vec v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

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

#if VEC == 16
/* exp_clamped on 16 lanes: the same steps, in AVX-512. */
static inline vec vexp(vec x) {
    x = _mm512_min_ps(_mm512_max_ps(x, vset1(-87.f)), vset1(88.f));
    vec n = _mm512_roundscale_ps(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)),
                                 _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, vset1(1.f)));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* One KV head of one sequence for head_dim 64 and G ≤ 4 query heads: the G query rows and
 * the G output rows stay in registers (4 vectors each) while the context streams by, the
 * next block's lines of this head prefetched. Same sums as the generic loops below. */
static inline __attribute__((always_inline)) void attend_head64(
    const float *qh, const float *k, const float *v, const int64_t *table, int64_t ctx,
    int64_t block_size, int64_t block_floats, int64_t token_stride, float scale, float *scores,
    float *oh, const int G) {
    vec qr[4][4], acc[4][4];
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < 4; ++c) {
            qr[g][c] = vload(qh + g * 64 + c * 16);
            acc[g][c] = vzero();
        }
    for (int64_t t0 = 0; t0 < ctx; t0 += block_size) {
        const float *kb = k + table[t0 / block_size] * block_floats;
        int64_t n = ctx - t0 < block_size ? ctx - t0 : block_size;
        if (t0 + block_size < ctx) {
            const char *next = (const char *)(k + table[t0 / block_size + 1] * block_floats);
            for (int64_t j = 0; j < block_size; ++j)
                for (int c = 0; c < 4; ++c) __builtin_prefetch(next + j * token_stride * 4 + c * 64);
        }
        for (int64_t j = 0; j < n; ++j) {
            const float *kt = kb + j * token_stride;
            vec k0 = vload(kt), k1 = vload(kt + 16), k2 = vload(kt + 32), k3 = vload(kt + 48);
            for (int g = 0; g < G; ++g) {
                vec a = _mm512_mul_ps(qr[g][0], k0);
                vec b = _mm512_mul_ps(qr[g][1], k1);
                a = vfma(qr[g][2], k2, a);
                b = vfma(qr[g][3], k3, b);
                scores[g * ctx + t0 + j] = vsum(_mm512_add_ps(a, b)) * scale;
            }
        }
    }
    float inv[4];
    for (int g = 0; g < G; ++g) {
        float *sg = scores + g * ctx;
        int64_t whole = ctx / 16 * 16, t = 0;
        vec tops = vset1(-INFINITY);
        for (; t < whole; t += 16) tops = _mm512_max_ps(tops, vload(sg + t));
        float top = _mm512_reduce_max_ps(tops);
        for (; t < ctx; ++t) top = sg[t] > top ? sg[t] : top;
        vec top_v = vset1(top), totals = vzero();
        for (t = 0; t < whole; t += 16) {
            vec e = vexp(_mm512_sub_ps(vload(sg + t), top_v));
            vstore(sg + t, e);
            totals = _mm512_add_ps(totals, e);
        }
        float total = _mm512_reduce_add_ps(totals);
        for (; t < ctx; ++t) {
            sg[t] = exp_clamped(sg[t] - top);
            total += sg[t];
        }
        inv[g] = 1.f / total;
    }
    for (int64_t t0 = 0; t0 < ctx; t0 += block_size) {
        const float *vb = v + table[t0 / block_size] * block_floats;
        int64_t n = ctx - t0 < block_size ? ctx - t0 : block_size;
        if (t0 + block_size < ctx) {
            const char *next = (const char *)(v + table[t0 / block_size + 1] * block_floats);
            for (int64_t j = 0; j < block_size; ++j)
                for (int c = 0; c < 4; ++c) __builtin_prefetch(next + j * token_stride * 4 + c * 64);
        }
        for (int64_t j = 0; j < n; ++j) {
            const float *vt = vb + j * token_stride;
            vec v0 = vload(vt), v1 = vload(vt + 16), v2 = vload(vt + 32), v3 = vload(vt + 48);
            for (int g = 0; g < G; ++g) {
                vec p = vset1(scores[g * ctx + t0 + j]);
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

/* Decode attention straight from the paged KV pool: no copy of any context.
 *
 * q, out:  [seqs, kv_heads * group, head_dim]; query head h * group + g reads KV head h.
 * k, v:    [num_blocks, block_size, kv_heads, head_dim], one layer of the pool.
 * tables:  [seqs, width] block tables; lengths: [seqs] how many positions each attends to.
 * A task is one sequence and a range of its KV heads: all of them when there are sequences
 * enough to keep every thread busy, so each block (block_size × kv_heads × head_dim floats,
 * contiguous) is read front to back while the next one is prefetched; one KV head each when
 * there are fewer sequences than threads. Scores are kept whole (exact softmax with the
 * maximum subtracted), then the values summed.
 */
void tm_paged_decode_attention(const float *q, const float *k, const float *v,
                               const int64_t *tables, int64_t width, const int64_t *lengths,
                               int64_t seqs, int64_t block_size, int64_t kv_heads,
                               int64_t group, int64_t head_dim, float scale, float *out) {
    int64_t heads = kv_heads * group;
    int64_t token_stride = kv_heads * head_dim; /* from one position to the next in a block */
    int64_t block_floats = block_size * token_stride;
    int64_t split = seqs < omp_get_max_threads() ? kv_heads : 1; /* tasks per sequence */
    int64_t per_task = kv_heads / split;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < seqs * split; ++task) {
        int64_t s = task / split, h0 = task % split * per_task, h1 = h0 + per_task;
        int64_t ctx = lengths[s];
        int64_t rows = (h1 - h0) * group; /* query heads of this task */
        const int64_t *table = tables + s * width;
        const float *qs = q + (s * heads + h0 * group) * head_dim;
        float *os = out + (s * heads + h0 * group) * head_dim;
        float *scores = malloc(sizeof(float) * (size_t)(rows * ctx > 0 ? rows * ctx : 1));
#if VEC == 16
        if (head_dim == 64 && group <= 4 && ctx > 0) {
            for (int64_t h = h0; h < h1; ++h) {
                const float *qh = qs + (h - h0) * group * 64;
                float *oh = os + (h - h0) * group * 64;
                const float *kh = k + h * 64, *vh = v + h * 64;
#define ATTEND(G)                                                                             \
    attend_head64(qh, kh, vh, table, ctx, block_size, block_floats, token_stride, scale, scores, \
                  oh, G)
                switch (group) {
                case 1: ATTEND(1); break;
                case 2: ATTEND(2); break;
                case 3: ATTEND(3); break;
                default: ATTEND(4); break;
                }
#undef ATTEND
            }
            free(scores);
            continue;
        }
#endif
        /* scores[r, t] = scale · q_r · k_t, r = (h - h0) * group + g */
        for (int64_t t0 = 0; t0 < ctx; t0 += block_size) {
            const float *kb = k + table[t0 / block_size] * block_floats;
            if (t0 + block_size < ctx) {
                const char *next = (const char *)(k + table[t0 / block_size + 1] * block_floats);
                for (int64_t b = 0; b < block_floats * 4; b += 64) __builtin_prefetch(next + b);
            }
            int64_t n = ctx - t0 < block_size ? ctx - t0 : block_size;
            for (int64_t j = 0; j < n; ++j)
                for (int64_t h = h0; h < h1; ++h) {
                    const float *kt = kb + j * token_stride + h * head_dim;
                    for (int64_t g = 0; g < group; ++g) {
                        int64_t r = (h - h0) * group + g;
                        scores[r * ctx + t0 + j] = dot(qs + r * head_dim, kt, head_dim) * scale;
                    }
                }
        }
        /* softmax over t, per query head */
        for (int64_t r = 0; r < rows; ++r) {
            float *sr = scores + r * ctx;
            float top = sr[0];
            for (int64_t t = 1; t < ctx; ++t) top = sr[t] > top ? sr[t] : top;
            float total = 0.f;
#pragma omp simd reduction(+ : total)
            for (int64_t t = 0; t < ctx; ++t) {
                sr[t] = exp_clamped(sr[t] - top);
                total += sr[t];
            }
            float inv = 1.f / total;
#pragma omp simd
            for (int64_t t = 0; t < ctx; ++t) sr[t] *= inv;
            for (int64_t d = 0; d < head_dim; ++d) os[r * head_dim + d] = 0.f;
        }
        /* out_r = sum_t p[r, t] v_t */
        for (int64_t t0 = 0; t0 < ctx; t0 += block_size) {
            const float *vb = v + table[t0 / block_size] * block_floats;
            if (t0 + block_size < ctx) {
                const char *next = (const char *)(v + table[t0 / block_size + 1] * block_floats);
                for (int64_t b = 0; b < block_floats * 4; b += 64) __builtin_prefetch(next + b);
            }
            int64_t n = ctx - t0 < block_size ? ctx - t0 : block_size;
            for (int64_t j = 0; j < n; ++j)
                for (int64_t h = h0; h < h1; ++h) {
                    const float *vt = vb + j * token_stride + h * head_dim;
                    for (int64_t g = 0; g < group; ++g) {
                        int64_t r = (h - h0) * group + g;
                        axpy(os + r * head_dim, scores[r * ctx + t0 + j], vt, head_dim);
                    }
                }
        }
        free(scores);
    }
}


/* out[r] = weight ⊙ (x[r] / sqrt(mean(x[r]²) + eps)), the order of operations of the reference
 * RMSNorm. With `residual`, first residual[r] += x[r] (in place) and normalise that sum: the
 * residual add and the next layer's norm in one pass. rows × hidden, all contiguous. */
void tm_rms_norm(const float *x, float *residual, const float *weight, float eps, int64_t rows,
                 int64_t hidden, float *out) {
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * hidden;
        float *src = (float *)xr;
        if (residual) {
            src = residual + r * hidden;
#pragma omp simd
            for (int64_t i = 0; i < hidden; ++i) src[i] += xr[i];
        }
        float squares = 0.f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < hidden; ++i) squares += src[i] * src[i];
        float inv = 1.f / sqrtf(squares / (float)hidden + eps);
        float *o = out + r * hidden;
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i) o[i] = weight[i] * (src[i] * inv);
    }
}

/* Rotary embedding, rotate-half layout, in place on the first `heads` heads of each row of x
 * (row r at x + r * row_stride, heads of head_dim floats back to back: q then k of a fused
 * qkv row). cos, sin: [positions, head_dim] tables, row positions[r] used for row r. */
void tm_rope(float *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
             const int64_t *positions, const float *cos, const float *sin) {
    int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos + positions[r] * head_dim, *s = sin + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
            float *a = x + r * row_stride + h * head_dim, *b = a + half;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                float lo = a[i], hi = b[i];
                a[i] = lo * c[i] + (-hi) * s[i];
                b[i] = hi * c[half + i] + lo * s[half + i];
            }
        }
    }
}

/* out[r, i] = silu(gate_up[r, i]) · gate_up[r, size + i]: SwiGLU's gate, silu(g) = g / (1 + e^-g). */
void tm_silu_mul(const float *gate_up, int64_t rows, int64_t size, float *out) {
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gate_up + r * 2 * size, *u = g + size;
        float *o = out + r * size;
        int64_t i = 0;
#if VEC == 16
        for (; i + 16 <= size; i += 16) {
            vec gv = vload(g + i);
            vec e = vexp(_mm512_sub_ps(vzero(), gv));
            vstore(o + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(vset1(1.f), e)), vload(u + i)));
        }
#endif
        for (; i < size; ++i) o[i] = g[i] / (1.f + exp_clamped(-g[i])) * u[i];
    }
}

/* ---- One token through a whole Llama-family model, in one parallel region -------------------
 *
 * A batch-1 decode step is nothing but streaming every weight once; PyTorch spends it in a
 * few hundred separate ops, each its own fork and join of the thread pool, with Python in
 * between. Here every thread stays in one region for the whole step and takes its share of
 * each product's rows; a barrier separates the phases that depend on each other. Weights are
 * the plain [out, in] matrices. The arithmetic is the layers' own (RMSNorm, rotary in the
 * rotate-half layout, grouped-query attention over the paged pool, SwiGLU), in float32.
 */

/* x[t] = e^(x[t] - top) for t < n; returns their sum */
static inline float exp_shifted_sum(float *x, int64_t n, float top) {
    int64_t t = 0;
    float total = 0.f;
#if VEC == 16
    vec top_v = vset1(top), totals = vzero();
    for (; t + 16 <= n; t += 16) {
        vec e = vexp(_mm512_sub_ps(vload(x + t), top_v));
        vstore(x + t, e);
        totals = _mm512_add_ps(totals, e);
    }
    total = _mm512_reduce_add_ps(totals);
#endif
    for (; t < n; ++t) {
        x[t] = exp_clamped(x[t] - top);
        total += x[t];
    }
    return total;
}

/* g[i] = silu(g[i]) · u[i] for i < n */
static inline void silu_mul_inplace(float *g, const float *u, int64_t n) {
    int64_t i = 0;
#if VEC == 16
    for (; i + 16 <= n; i += 16) {
        vec gv = vload(g + i);
        vec e = vexp(_mm512_sub_ps(vzero(), gv));
        vstore(g + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(vset1(1.f), e)), vload(u + i)));
    }
#endif
    for (; i < n; ++i) g[i] = g[i] / (1.f + exp_clamped(-g[i])) * u[i];
}

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

static inline void rms_norm_row(const float *x, const float *weight, float eps, int64_t n,
                                float *out) {
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += x[i] * x[i];
    float inv = 1.f / sqrtf(squares / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

static inline void rope_row(float *x, int64_t heads, int64_t head_dim, const float *c,
                            const float *s) {
    int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; ++h) {
        float *a = x + h * head_dim, *b = a + half;
        for (int64_t i = 0; i < half; ++i) {
            float lo = a[i], hi = b[i];
            a[i] = lo * c[i] + (-hi) * s[i];
            b[i] = hi * c[half + i] + lo * s[half + i];
        }
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
                    int64_t at = (table[t / block_size] * block_size + t % block_size) * token_stride;
                    sc[t] = dot(qv, kl + at, head_dim) * scale;
                    top = sc[t] > top ? sc[t] : top;
                }
                float inv = 1.f / exp_shifted_sum(sc, ctx, top);
                float *o = attn + r * q_size + qh * head_dim;
                for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.f;
                for (int64_t t = 0; t < ctx; ++t) {
                    int64_t at = (table[t / block_size] * block_size + t % block_size) * token_stride;
                    axpy(o, sc[t] * inv, vl + at, head_dim);
                }
            } /* implicit barrier */
            share(hidden, &b, &e);
            gemv_share(lw[3], lw[4], attn, q_size, m, q_size, hidden, b, e, h);
#pragma omp barrier
#pragma omp single
            for (int64_t r = 0; r < m; ++r) {
                float *res = residual + r * hidden;
                for (int64_t i = 0; i < hidden; ++i) res[i] += h[r * hidden + i];
                rms_norm_row(res, lw[5], eps, hidden, normed + r * hidden);
            }
            /* gate and up rows of the same features in one share: each thread then has both
             * halves of its features and applies silu(gate) · up itself */
            share(inter, &b, &e);
            gemv_share(lw[6], NULL, normed, hidden, m, hidden, 2 * inter, b, e, gate_up);
            gemv_share(lw[6] + inter * hidden, NULL, normed, hidden, m, hidden, 2 * inter, b, e,
                       gate_up + inter);
            for (int64_t r = 0; r < m; ++r)
                silu_mul_inplace(gate_up + r * 2 * inter + b, gate_up + r * 2 * inter + inter + b,
                                 e - b);
#pragma omp barrier
            /* down reads each row's activations: the first `inter` of its 2 · inter */
            share(hidden, &b, &e);
            gemv_share(lw[7], NULL, gate_up, 2 * inter, m, inter, hidden, b, e, h);
#pragma omp barrier
#pragma omp single
            {
                const float *next = l + 1 < layers ? layer_weights[8 * (l + 1)] : final_norm;
                for (int64_t r = 0; r < m; ++r) {
                    float *res = residual + r * hidden;
                    for (int64_t i = 0; i < hidden; ++i) res[i] += h[r * hidden + i];
                    rms_norm_row(res, next, eps, hidden, normed + r * hidden);
                }
            }
        }
        share(vocab, &b, &e);
        gemv_share(lm_head, NULL, normed, hidden, m, hidden, vocab, b, e, logits);
    }
}
