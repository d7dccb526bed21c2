/* The Llama family's elementwise ops, fused: residual add + RMSNorm, rotary in place on
 * fused qkv rows, SwiGLU's activation. */
#include "vector.h"

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

/* out[r, i] = gelu(gate_up[r, i]) · gate_up[r, size + i], GELU's tanh form: GeGLU's
 * activation (Gemma). */
void tm_gelu_tanh_mul(const float *gate_up, int64_t rows, int64_t size, float *out) {
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r)
        gelu_tanh_mul_row(gate_up + r * 2 * size, gate_up + r * 2 * size + size, size,
                          out + r * size);
}

/* out[r, i] = silu(gate_up[r, i]) · gate_up[r, size + i]: SwiGLU's activation. */
void tm_silu_mul(const float *gate_up, int64_t rows, int64_t size, float *out) {
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; ++r)
        silu_mul_row(gate_up + r * 2 * size, gate_up + r * 2 * size + size, size, out + r * size);
}
