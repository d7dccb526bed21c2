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
