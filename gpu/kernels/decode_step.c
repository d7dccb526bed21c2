#include "attention.h"
#include "weight.h"

/* ---- One token through a whole Llama-, Gemma-family or GPT-2 model, in one parallel region --
 *
 * A batch-1 decode step is nothing but streaming every weight once; PyTorch spends it in a
 * few hundred separate ops, each its own fork and join of the thread pool, with Python in
 * between. Here every thread stays in one region for the whole step and takes its share of
 * each product's rows; a barrier separates the phases that depend on each other. The
 * arithmetic is the layers' own (RMSNorm or LayerNorm, rotary in the rotate-half layout or none,
 * grouped-query attention over the paged pool, SwiGLU, GeGLU, GPT-2's GELU MLP or a top-k
 * mixture of SwiGLU experts), in float32. The products take any weight
 * format of weight.h: float32 (in panels where the weight has them: panel_linear.c, the
 * products of many rows), or int8/int4 dequantized in registers (tm_linear_share).
 */

/* What sets a model apart from a plain Llama in the step. A Llama: gelu 0, attn_softcap 0,
 * every window 0, every layer the same rotary tables, rotary_dim = head_dim, gated 1,
 * layer_norm 0. GPT-2: gelu 1, rotary_dim 0, gated 0, layer_norm 1. */
typedef struct {
    int64_t gelu;                   /* 1: tanh GELU (Gemma's GeGLU, GPT-2's MLP); 0: SiLU */
    int64_t rotary_dim;             /* the rotated dims of each head (the first ones); 0: none */
    float attn_softcap;             /* > 0: scores soft-capped before the softmax (Gemma 2) */
    const int64_t *windows;         /* [layers] a query at p sees (p - window, p]; 0: all */
    const float *const *cos_layers; /* [layers] each layer's rotary tables [positions, */
    const float *const *sin_layers; /* rotary_dim] (Gemma 3's sliding layers have their own) */
    int64_t gated;                  /* 1: act(gate) · up, then down; 0: act(up + bias), down */
    int64_t layer_norm;             /* 1: LayerNorms with biases (GPT-2); 0: RMSNorms */
    const float *final_norm_bias;   /* the final LayerNorm's bias (layer_norm 1) */
    /* Mixtral, Qwen3-MoE: a sparse layer's MLP is a softmax router over `experts` SwiGLU
     * experts, each token to the `top_k` most likely (their weights renormalised to sum 1
     * where `renormalise`). moe_layers[l]: NULL for a dense layer, else 1 + 3 · experts
     * weights: the router [experts, hidden], then each expert's gate [expert_inter, hidden],
     * up [expert_inter, hidden] and down [hidden, expert_inter]. moe_layers NULL: none. */
    int64_t experts, top_k, renormalise, expert_inter;
    const tm_weight *const *moe_layers;
} tm_decode_arch;

/* out = the norm of x over n: LayerNorm with `bias` where the model has them, else RMSNorm */
static inline void norm_row(const tm_decode_arch *arch, const float *x, const float *weight,
                            const float *bias, float eps, int64_t n, float *out) {
    if (arch->layer_norm)
        layer_norm_row(x, weight, bias, eps, n, out);
    else
        rms_norm_row(x, weight, eps, n, out);
}

/* h[r] = RMSNorm(h[r]) where `post` is given (Gemma's norm after attention and after the
 * MLP), residual[r] += h[r], then normed[r] = the norm (`weight`, `bias`) of residual[r], for
 * the m rows, shared among the threads (ends with a barrier) */
static inline void add_and_norm(const tm_decode_arch *arch, float *residual, float *h, int64_t m,
                                int64_t hidden, const float *post, const float *weight,
                                const float *bias, float eps, float *normed) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m; ++r) {
        float *res = residual + r * hidden, *hr = h + r * hidden;
        if (post) rms_norm_row(hr, post, eps, hidden, hr);
        for (int64_t i = 0; i < hidden; ++i) res[i] += hr[i];
        norm_row(arch, res, weight, bias, eps, hidden, normed + r * hidden);
    }
}

static void linear_part(const tm_weight *w, const float *bias, const float *x, int64_t x_stride,
                        int64_t m, int64_t in, int64_t out, int64_t y_stride, float *y,
                        float *mine, int64_t *begin, int64_t *end);

/* A token's experts from its router logits: the top_k most likely (the largest logits, the
 * lowest index first among equals, as torch.topk of the softmax), weighted by their softmax
 * probabilities (libm's exp: a few experts), renormalised to sum 1 where the model does */
static void route_row(const tm_decode_arch *arch, const float *logits, int32_t *chosen,
                      float *weights) {
    int64_t n = arch->experts, k = arch->top_k;
    float top = logits[0], total = 0.f, picked = 0.f;
    for (int64_t x = 1; x < n; ++x) top = logits[x] > top ? logits[x] : top;
    for (int64_t x = 0; x < n; ++x) total += expf(logits[x] - top);
    for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t x = 0; x < n; ++x) {
            int taken = 0;
            for (int64_t i = 0; i < j; ++i) taken |= chosen[i] == x;
            if (!taken && (best < 0 || logits[x] > logits[best])) best = x;
        }
        chosen[j] = (int32_t)best;
        weights[j] = expf(logits[best] - top) / total;
        picked += weights[j];
    }
    if (arch->renormalise)
        for (int64_t j = 0; j < k; ++j) weights[j] /= picked;
}

/* h [m, hidden] = the sparse MLP of `normed`'s m rows. The router's products shared among
 * the threads; each token routed by one thread; then every (token, expert) pair's gate and up
 * with each expert's rows shared among the threads, each thread applying SiLU(gate) · up to
 * the features it computed; then every pair's down, each thread adding the features it
 * computed to h, scaled by the pair's weight (the same features for every down: one share of
 * `hidden`). Three barriers a layer, whatever the number of experts. `scratch` has room for
 * m · (experts + 2 top_k + 2 top_k expert_inter) + hidden floats. Ends with a barrier. */
static void moe_part(const tm_decode_arch *arch, const tm_weight *moe, const float *normed,
                     int64_t m, int64_t hidden, float *h, float *scratch, float *mine) {
    int64_t n = arch->experts, k = arch->top_k, inter = arch->expert_inter, b, e;
    float *route = scratch, *weights = route + m * n, *act = weights + m * k;
    float *out = act + m * k * 2 * inter;                /* [hidden]: a down's features */
    int32_t *chosen = (int32_t *)(out + hidden);         /* m · k ints in m · k floats' room */
    linear_part(&moe[0], NULL, normed, hidden, m, hidden, n, n, route, mine, &b, &e);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m; ++r) {
        route_row(arch, route + r * n, chosen + r * k, weights + r * k);
        for (int64_t i = 0; i < hidden; ++i) h[r * hidden + i] = 0.f;
    } /* implicit barrier */
    for (int64_t pair = 0; pair < m * k; ++pair) {
        const tm_weight *expert = moe + 1 + 3 * chosen[pair];
        const float *x = normed + pair / k * hidden;
        float *gu = act + pair * 2 * inter;
        linear_part(&expert[0], NULL, x, hidden, 1, hidden, inter, 2 * inter, gu, mine, &b, &e);
        linear_part(&expert[1], NULL, x, hidden, 1, hidden, inter, 2 * inter, gu + inter, mine,
                    &b, &e);
        silu_mul_row(gu + b, gu + inter + b, e - b, gu + b);
    }
#pragma omp barrier
    for (int64_t pair = 0; pair < m * k; ++pair) {
        const tm_weight *expert = moe + 1 + 3 * chosen[pair];
        linear_part(&expert[2], NULL, act + pair * 2 * inter, 2 * inter, 1, inter, hidden, hidden,
                    out, mine, &b, &e);
        float w = weights[pair], *hr = h + pair / k * hidden;
        for (int64_t i = b; i < e; ++i) hr[i] += w * out[i];
    }
#pragma omp barrier
}

/* The calling thread's share of y [m, out] (rows `y_stride` apart) = x · Wᵀ + bias: runs of
 * W's panels where it has them, else its rows in blocks of 4 (`mine`: tm_linear_share's
 * scratch). [*begin, *end) are the output features it wrote: the same for two weights of the
 * same kind and `out`. */
static void linear_part(const tm_weight *w, const float *bias, const float *x, int64_t x_stride,
                        int64_t m, int64_t in, int64_t out, int64_t y_stride, float *y,
                        float *mine, int64_t *begin, int64_t *end) {
    if (w->panels) {
        int64_t pb, pe, width = tm_panel_width();
        tm_panel_share(out, &pb, &pe);
        tm_panel_range(m, in, out, x, x_stride, w->panels, bias, y, y_stride, pb, pe);
        *begin = pb * width < out ? pb * width : out;
        *end = pe * width < out ? pe * width : out;
        return;
    }
    share(out, begin, end);
    tm_linear_share(w, bias, x, x_stride, m, in, y_stride, *begin, *end, y, mine);
}

/* h [m, hidden] = the dense MLP of `normed`'s m rows (`lw`, `lv`: the layer's weights and
 * vectors; `gate_up` room for m · 2 inter floats). Ends with a barrier. */
static void dense_mlp_part(const tm_decode_arch *arch, const tm_weight *lw,
                           const float *const *lv, const float *normed, int64_t m, int64_t hidden,
                           int64_t inter, float *gate_up, float *h, float *mine) {
    int64_t b, e;
    if (arch->gated) {
        /* gate and up rows of the same features in one share: each thread then has both
         * halves of its features and applies the activation · up itself */
        linear_part(&lw[2], NULL, normed, hidden, m, hidden, inter, 2 * inter, gate_up, mine, &b,
                    &e);
        linear_part(&lw[3], NULL, normed, hidden, m, hidden, inter, 2 * inter, gate_up + inter,
                    mine, &b, &e);
    } else /* up alone, into the first half of each row's 2 · inter */
        linear_part(&lw[3], lv[10], normed, hidden, m, hidden, inter, 2 * inter, gate_up, mine,
                    &b, &e);
    for (int64_t r = 0; r < m; ++r) {
        float *g = gate_up + r * 2 * inter + b, *u = gate_up + r * 2 * inter + inter + b;
        if (arch->gelu)
            gelu_tanh_mul_row(g, arch->gated ? u : NULL, e - b, g);
        else
            silu_mul_row(g, u, e - b, g);
    }
#pragma omp barrier
    /* down reads each row's activations: the first `inter` of its 2 · inter */
    linear_part(&lw[4], lv[11], gate_up, 2 * inter, m, inter, hidden, hidden, h, mine, &b, &e);
#pragma omp barrier
}

/* m decode tokens, one per sequence, through every layer and the LM head.
 *
 * Per layer, `layer_vectors` holds 12 pointers: input norm, qkv bias (or NULL), o bias (or
 * NULL), the norm before the MLP, q norm and k norm (RMSNorm over each head, before the
 * rotation: Qwen3, Gemma 3; or NULL), the norm of attention's output and of the MLP's before
 * each joins the residual stream (Gemma's; or NULL), then the input norm's and the MLP norm's
 * biases (LayerNorms; or NULL), up's bias and down's (or NULL). `layer_linears` holds 5
 * weights: qkv [q + 2 kv, hidden], o [hidden, q], gate [inter, hidden] (not read when the MLP
 * is not gated), up [inter, hidden], down [hidden, inter] (none read by a sparse layer);
 * `lm_head` [vocab, hidden]; `k_layers`/`v_layers` each layer's pool [blocks, block_size,
 * kv_heads, head_dim]. Token r is at `positions[r]` (its rows of layer l's rotary tables
 * arch->cos_layers[l], sin_layers[l]), writes its K and V to `slots[r]` and attends to
 * `lengths[r]` positions (the last windows[l] of them) through block table r of `tables` [m,
 * width]. `residual` [m, hidden] holds the embeddings (scaled as the model scales them) and
 * ends as the last layer's residual stream; `work` has room for m · (2 hidden + 2 (heads +
 * kv_heads) · head_dim) floats and then the MLP's: m · 2 inter, or where a layer is sparse at
 * least moe_part's scratch; `logits` is [m, vocab]. A float32 gate and up with
 * panels lie in one weight's panels (gate's first), `inter` a multiple of the panel width.
 * Norm weights are the factors applied (Gemma's 1 + w already added). */
void tm_decode_step(int64_t m, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
                    int64_t head_dim, int64_t inter, int64_t vocab,
                    const float *const *layer_vectors, const tm_weight *layer_linears,
                    const float *final_norm, const tm_weight *lm_head, float eps, float scale,
                    const tm_decode_arch *arch, const int64_t *positions,
                    float *const *k_layers, float *const *v_layers, const int64_t *tables,
                    int64_t width, const int64_t *lengths, const int64_t *slots,
                    int64_t block_size, float *residual, float *work, float *logits) {
    int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, group = heads / kv_heads;
    int64_t qkv_size = q_size + 2 * kv_size, token_stride = kv_heads * head_dim;
    float *normed = work, *qkv = normed + m * hidden, *attn = qkv + m * qkv_size;
    float *h = attn + m * q_size, *gate_up = h + m * hidden;
    int64_t widest = hidden > q_size ? hidden : q_size;
    widest = inter > widest ? inter : widest;
    widest = arch->expert_inter > widest ? arch->expert_inter : widest;
#pragma omp parallel
    {
        int64_t b, e;
        float *mine = malloc((size_t)(m * widest) * sizeof(float)); /* tm_linear_share's */
        if (!mine) abort();
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r)
            norm_row(arch, residual + r * hidden, layer_vectors[0], layer_vectors[8], eps, hidden,
                     normed + r * hidden);
        for (int64_t l = 0; l < layers; ++l) {
            const float *const *lv = layer_vectors + 12 * l;
            const tm_weight *lw = layer_linears + 5 * l;
            const float *cos = arch->cos_layers[l], *sin = arch->sin_layers[l];
            int64_t window = arch->windows[l], rotary = arch->rotary_dim;
            linear_part(&lw[0], lv[1], normed, hidden, m, hidden, qkv_size, qkv_size, qkv, mine,
                        &b, &e);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t r = 0; r < m; ++r) {
                float *row = qkv + r * qkv_size;
                if (lv[4]) /* q/k norms: each head of q, then of k, in place */
                    for (int64_t hd = 0; hd < heads + kv_heads; ++hd) {
                        float *head = row + hd * head_dim;
                        rms_norm_row(head, hd < heads ? lv[4] : lv[5], eps, head_dim, head);
                    }
                rope_row(row, heads + kv_heads, head_dim, rotary, cos + positions[r] * rotary,
                         sin + positions[r] * rotary);
                float *kslot = k_layers[l] + slots[r] * token_stride;
                float *vslot = v_layers[l] + slots[r] * token_stride;
                for (int64_t i = 0; i < kv_size; ++i) {
                    kslot[i] = row[q_size + i];
                    vslot[i] = row[q_size + kv_size + i];
                }
            }
            /* attention: (token, KV head) pairs shared among the threads */
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < m * kv_heads; ++task) {
                int64_t r = task / kv_heads, kvh = task % kv_heads;
                int64_t at = r * qkv_size + kvh * group * head_dim;
                int64_t first = window && lengths[r] > window ? lengths[r] - window : 0;
                tm_attend(qkv + at, attn + r * q_size + kvh * group * head_dim, k_layers[l],
                          v_layers[l], tables + r * width, first, lengths[r], kvh, kvh + 1,
                          block_size, kv_heads, group, head_dim, scale, arch->attn_softcap);
            } /* implicit barrier */
            linear_part(&lw[1], lv[2], attn, q_size, m, q_size, hidden, hidden, h, mine, &b, &e);
#pragma omp barrier
            add_and_norm(arch, residual, h, m, hidden, lv[6], lv[3], lv[9], eps, normed);
            const tm_weight *moe = arch->moe_layers ? arch->moe_layers[l] : NULL;
            if (moe)
                moe_part(arch, moe, normed, m, hidden, h, gate_up, mine);
            else
                dense_mlp_part(arch, lw, lv, normed, m, hidden, inter, gate_up, h, mine);
            const float *const *next = layer_vectors + 12 * (l + 1);
            add_and_norm(arch, residual, h, m, hidden, lv[7], l + 1 < layers ? next[0] : final_norm,
                         l + 1 < layers ? next[8] : arch->final_norm_bias, eps, normed);
        }
        linear_part(lm_head, NULL, normed, hidden, m, hidden, vocab, vocab, logits, mine, &b, &e);
        free(mine);
    }
}
