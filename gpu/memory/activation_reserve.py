"""The memory a forward step needs beyond the weights and the KV pool: the activation
reserve of one step, and what CUDA graphs of decode steps hold for good.

Pure arithmetic on a `ModelConfig` (no torch, no I/O); every quantity is in bytes.
"""

from __future__ import annotations

from gpu.memory.model_sizes import dtype_bytes
from gpu.model_config import ModelConfig

# Sampling (gpu/sampling.py) works on fp32 rows of `vocab` values; at its peak about 8 are
# alive: the upcast logits, the sampled rows' copy, the temperature-scaled logits, the sorted
# values, the int64 sort indices (8 bytes = 2 fp32 copies), the softmax and its cumulative sum.
SAMPLING_FP32_COPIES = 8
# Attention scores and their softmax, per head, materialised in fp32 (the naive / math path).
ATTENTION_SCORE_BYTES = 2 * 4


def activation_reserve_bytes(
    config: ModelConfig,
    dtype: str,
    max_batched_tokens: int,
    max_batch: int,
    *,
    max_context_len: int | None = None,
) -> int:
    """A conservative bound on the transient memory of one forward step (one layer at a time).

    With T = max(max_batched_tokens, max_batch) tokens in the step (a decode step has one
    token per sequence), B = max_batch sequences (and sampled rows), C = max_context_len (the
    longest context a token attends to; default `config.max_position_embeddings`, pass the
    engine's max_model_len to tighten it), h = hidden, q = heads × head_dim,
    kv = kv_heads × head_dim, i = intermediate, V = vocab, b = dtype bytes:

        per_token = T × (4h + 3q + 3kv + 3i) × b
            hidden states: residual, norm output, o_proj output, MLP down output (4h);
            attention: q, rotated q, attention output (3q); k, v, rotated k (3kv);
            MLP: gate, up, act(gate) × up (3i); a sparse MLP (Mixtral, Qwen3-MoE) runs each
            token through k = num_experts_per_tok experts: i = k × the expert's intermediate
            size, plus 2 × k × h for the token's k copies going in and coming out
        logits    = B × V × (b + 4 × SAMPLING_FP32_COPIES)
            the lm_head output in dtype, then fp32 rows for sampling (upcast, scaled,
            top-p sorted values + int64 indices, softmax, cumulative sum); logits are
            computed only for the rows that are sampled (the last token of each sequence)
        scores    = heads × T × C × 8
            fp32 attention scores and their softmax for the step's tokens against their
            context (the math path of attention materialises these)
        gathered  = 2 × B × C × (kv + q) × b
            K and V of every context gathered out of the paged pool (kv), then expanded to
            all query heads for GQA (q) by the math path of attention

        reserve = per_token + logits + scores + gathered

    The terms are summed, not maxed: a layer's intermediates, its attention buffers and the
    sampler's rows can be alive together. Not counted: the CUDA context and allocator
    fragmentation (keep the device budget below the card's total for them).
    """
    if max_batched_tokens <= 0 or max_batch <= 0:
        raise ValueError("max_batched_tokens and max_batch must be positive")
    b = dtype_bytes(dtype)
    tokens = max(max_batched_tokens, max_batch)
    context = config.max_position_embeddings if max_context_len is None else max_context_len
    if context <= 0:
        raise ValueError("max_context_len must be positive")
    h, q, kv, i = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    routed = 0  # a sparse MLP's copies of each token's hidden state, into and out of experts
    if config.num_experts:
        k = config.num_experts_per_tok
        # (a dense layer's MLP, if any, may be the wider)
        i, routed = max(i, k * (config.moe_intermediate_size or i)), 2 * k * h
    per_token = tokens * (4 * h + routed + 3 * q + 3 * kv + 3 * i) * b
    logits = max_batch * config.vocab_size * (b + 4 * SAMPLING_FP32_COPIES)
    scores = config.num_heads * tokens * context * ATTENTION_SCORE_BYTES
    gathered = 2 * max_batch * context * (kv + q) * b
    return per_token + logits + scores + gathered


def decode_graph_reserve_bytes(config: ModelConfig, dtype: str, max_batch: int) -> int:
    """The memory CUDA graphs of decode steps hold for good (`gpu.backends.decode_graphs`): one pool
    shared by all captured sizes, as large as the largest size's forward needs, B = max_batch
    tokens: its per-token intermediates and its logits (the terms of
    `activation_reserve_bytes` for a step of B decodes, without attention's, which reads the
    pool in place), plus their input buffers (a block table row per sequence)."""
    b = dtype_bytes(dtype)
    h, q, kv, i = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    if config.num_experts:
        i = max(i, config.num_experts_per_tok * (config.moe_intermediate_size or i))
    per_token = max_batch * (4 * h + 3 * q + 3 * kv + 3 * i) * b
    logits = max_batch * config.vocab_size * (b + 4)
    inputs = max_batch * (8 + config.max_position_embeddings // 16) * 8
    return per_token + logits + inputs
