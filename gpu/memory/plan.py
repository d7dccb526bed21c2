"""The memory planner: weights + KV cache + activation reserve against a device budget.

Pure arithmetic on a `ModelConfig` (no torch, no I/O), so `tokenmill plan` can size a
deployment before anything is loaded, and the engine sizes its KV pool with the same code:

    kv_budget = kv_budget_bytes(config, dtype=..., device_budget_bytes=..., ...)
    num_blocks = num_kv_blocks(config, dtype=..., kv_budget_bytes=kv_budget, block_size=16)

Every quantity is in bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from gpu.errors import MemoryPlanError
from gpu.memory.byte_sizes import format_bytes
from gpu.model_config import ModelConfig

DTYPE_BYTES: MappingProxyType[str, int] = MappingProxyType(
    {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
)
_CANONICAL_DTYPE = MappingProxyType({"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"})

# Sampling (gpu/sampling.py) works on fp32 rows of `vocab` values; at its peak about 8 are
# alive: the upcast logits, the sampled rows' copy, the temperature-scaled logits, the sorted
# values, the int64 sort indices (8 bytes = 2 fp32 copies), the softmax and its cumulative sum.
SAMPLING_FP32_COPIES = 8
# Attention scores and their softmax, per head, materialised in fp32 (the naive / math path).
ATTENTION_SCORE_BYTES = 2 * 4
# Default tokens per step: whole prompts up to seq_len (at least this many) ...
DEFAULT_MAX_BATCHED_TOKENS = 2048
# ... but never more than this: longer prompts are prefilled in chunks.
MAX_DEFAULT_BATCHED_TOKENS = 8192


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name (`float32`/`fp32`, `bfloat16`/`bf16`, `float16`/`fp16`)."""
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r}; choose one of: {', '.join(DTYPE_BYTES)}"
        ) from None


def canonical_dtype(name: str) -> str:
    """`bf16` → `bfloat16` and so on; raises ValueError like `dtype_bytes`."""
    dtype_bytes(name)
    key = name.lower()
    return _CANONICAL_DTYPE.get(key, key)


def kv_bytes_per_token(config: ModelConfig, dtype: str) -> int:
    """K and V for one token in every layer: 2 × layers × kv_heads × head_dim × dtype bytes."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)


def weights_bytes(config: ModelConfig, dtype: str, quantization: str = "none") -> int:
    """All parameters held in `dtype`: `config.num_parameters()` × dtype bytes; with
    `quantization` int8 or int4[-gN] the linear layers held quantized instead
    (`gpu.memory.quantized_sizes`). `none` and `auto` count floats: what `auto` keeps depends
    on the file (`quantized_sizes.gguf_kept_weights_bytes`)."""
    method, _, group = quantization.partition("-g")
    if method in ("int8", "int4"):
        from gpu.memory.quantized_sizes import quantized_weights_bytes

        return quantized_weights_bytes(
            config, dtype_bytes(dtype), method, int(group) if group else None
        )
    return config.num_parameters() * dtype_bytes(dtype)


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
    """The memory CUDA graphs of decode steps hold for good (`gpu.decode_graphs`): one pool
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


def default_max_batched_tokens(batch: int, seq_len: int) -> int:
    """Tokens per step when none is given.

        max(batch, min(batch × seq_len, max(seq_len, 2048), 8192))

    A step prefills a whole prompt when it can (at least 2048 tokens a step), chunks prompts
    past 8192 tokens, never holds more tokens than batch × seq_len exist, and always has room
    for one decode token per sequence.
    """
    capped = min(
        batch * seq_len,
        max(seq_len, DEFAULT_MAX_BATCHED_TOKENS),
        MAX_DEFAULT_BATCHED_TOKENS,
    )
    return max(batch, capped)


@dataclass(frozen=True)
class MemoryPlan:
    """One model at one dtype, batch and sequence length, against one device budget.

    `headroom_bytes` is budget − total: negative when the plan does not fit.
    """

    arch: str
    num_parameters: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # canonical: float32, bfloat16 or float16
    dtype_bytes: int
    batch: int
    seq_len: int
    block_size: int
    kv_tokens_per_sequence: int  # seq_len rounded up to whole blocks
    max_batched_tokens: int
    weights_bytes: int
    kv_bytes_per_token: int
    kv_bytes: int
    activation_bytes: int
    total_bytes: int
    budget_bytes: int
    fits: bool
    max_batch: int  # largest batch that fits at this seq_len; 0 if none
    headroom_bytes: int
    advice: str


def plan_memory(
    config: ModelConfig,
    *,
    dtype: str,
    batch: int,
    seq_len: int,
    budget_bytes: int,
    block_size: int = 16,
    max_batched_tokens: int | None = None,
    quantization: str = "none",
    weights_of: WeightsFn | None = None,
) -> MemoryPlan:
    """Plan `batch` sequences of `seq_len` tokens (prompt + output) against `budget_bytes`.

    KV is counted in whole blocks: ceil(seq_len / block_size) × block_size tokens per
    sequence. `max_batched_tokens` defaults to `default_max_batched_tokens(batch, seq_len)`;
    the activation reserve assumes a prefill chunk may attend to a context of `seq_len`.
    `quantization` (int8, int4[-gN]) counts the linear layers quantized; `weights_of(dtype)`,
    when given, is what the weights hold in a dtype (a GGUF kept quantized: `auto`).
    """
    for name, value in (("batch", batch), ("seq_len", seq_len), ("block_size", block_size)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must not be negative, got {budget_bytes}")
    if max_batched_tokens is not None and max_batched_tokens <= 0:
        raise ValueError(f"max_batched_tokens must be positive, got {max_batched_tokens}")
    dtype = canonical_dtype(dtype)
    weights_of = weights_of or (lambda d: weights_bytes(config, d, quantization))
    total_at = _total_fn(config, dtype, block_size, max_batched_tokens, weights_of)
    weights, per_token, tokens_per_seq, step_tokens, activations = _parts(
        config, dtype, batch, seq_len, block_size, max_batched_tokens, weights_of
    )
    kv = batch * tokens_per_seq * per_token
    total = weights + kv + activations
    fits = total <= budget_bytes
    max_batch = _max_batch(total_at, seq_len, budget_bytes)
    return MemoryPlan(
        arch=config.arch,
        num_parameters=config.num_parameters(),
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=dtype,
        dtype_bytes=dtype_bytes(dtype),
        batch=batch,
        seq_len=seq_len,
        block_size=block_size,
        kv_tokens_per_sequence=tokens_per_seq,
        max_batched_tokens=step_tokens,
        weights_bytes=weights,
        kv_bytes_per_token=per_token,
        kv_bytes=kv,
        activation_bytes=activations,
        total_bytes=total,
        budget_bytes=budget_bytes,
        fits=fits,
        max_batch=max_batch,
        headroom_bytes=budget_bytes - total,
        advice=_advice(
            config,
            dtype=dtype,
            batch=batch,
            seq_len=seq_len,
            budget_bytes=budget_bytes,
            block_size=block_size,
            max_batched_tokens=max_batched_tokens,
            fits=fits,
            max_batch=max_batch,
            weights_of=weights_of,
        ),
    )


def num_kv_blocks(config: ModelConfig, *, dtype: str, kv_budget_bytes: int, block_size: int) -> int:
    """How many KV blocks of `block_size` tokens fit in `kv_budget_bytes` (floor)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if kv_budget_bytes <= 0:
        return 0
    return kv_budget_bytes // (block_size * kv_bytes_per_token(config, dtype))


def kv_budget_bytes(
    config: ModelConfig,
    *,
    dtype: str,
    device_budget_bytes: int,
    max_batched_tokens: int,
    max_batch: int,
    max_context_len: int | None = None,
    weights: int | None = None,
) -> int:
    """Bytes left for the KV pool after the weights and the activation reserve.

    `max_context_len` is the engine's longest sequence (default: the model's
    max_position_embeddings); see `activation_reserve_bytes`. `weights`: what the loaded
    weights really hold (a quantized model), instead of the parameters in `dtype`. Raises
    `MemoryPlanError` (with the numbers) when nothing is left.
    """
    weights = weights_bytes(config, dtype) if weights is None else weights
    reserve = activation_reserve_bytes(
        config, dtype, max_batched_tokens, max_batch, max_context_len=max_context_len
    )
    left = device_budget_bytes - weights - reserve
    if left <= 0:
        raise MemoryPlanError(
            f"no memory left for the KV cache: device budget {format_bytes(device_budget_bytes)}"
            f" ({device_budget_bytes} B) − weights {format_bytes(weights)} ({weights} B, "
            f"{dtype}) − activation reserve {format_bytes(reserve)} ({reserve} B, "
            f"max_batched_tokens={max_batched_tokens}, max_batch={max_batch}) = {left} B"
        )
    return left


# --- internals -----------------------------------------------------------------------------

# total_at(batch, seq_len) -> total bytes; non-decreasing in both arguments.
_TotalFn = Callable[[int, int], int]
# weights_of(dtype) -> bytes the weights hold with the compute dtype `dtype`
WeightsFn = Callable[[str], int]


def _parts(
    config: ModelConfig,
    dtype: str,
    batch: int,
    seq_len: int,
    block_size: int,
    max_batched_tokens: int | None,
    weights_of: WeightsFn,
) -> tuple[int, int, int, int, int]:
    """(weights, kv per token, kv tokens per sequence, step tokens, activation reserve)."""
    tokens_per_seq = math.ceil(seq_len / block_size) * block_size
    step_tokens = (
        default_max_batched_tokens(batch, seq_len)
        if max_batched_tokens is None
        else max_batched_tokens
    )
    activations = activation_reserve_bytes(
        config, dtype, step_tokens, batch, max_context_len=seq_len
    )
    return (
        weights_of(dtype),
        kv_bytes_per_token(config, dtype),
        tokens_per_seq,
        max(step_tokens, batch),
        activations,
    )


def _total_fn(
    config: ModelConfig,
    dtype: str,
    block_size: int,
    max_batched_tokens: int | None,
    weights_of: WeightsFn,
) -> _TotalFn:
    def total_at(batch: int, seq_len: int) -> int:
        weights, per_token, tokens_per_seq, _, activations = _parts(
            config, dtype, batch, seq_len, block_size, max_batched_tokens, weights_of
        )
        return weights + batch * tokens_per_seq * per_token + activations

    return total_at


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest n in [1, hi] with fits(n), for a monotone (true-then-false) predicate; else 0."""
    lo = 0  # invariant: lo == 0 or fits(lo)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _max_batch(total_at: _TotalFn, seq_len: int, budget_bytes: int) -> int:
    if total_at(1, seq_len) > budget_bytes:
        return 0
    # Double until a batch does not fit: the KV total grows with every sequence, so this ends.
    hi = 2
    while total_at(hi, seq_len) <= budget_bytes:
        hi *= 2
    return _largest(lambda b: total_at(b, seq_len) <= budget_bytes, hi - 1)


def _max_seq_len(total_at: _TotalFn, seq_len: int, budget_bytes: int, block_size: int) -> int:
    """Largest sequence length below `seq_len` that fits at batch 1 (whole blocks when ≥ 1)."""
    best = _largest(lambda s: total_at(1, s) <= budget_bytes, seq_len - 1)
    return best - best % block_size if best >= block_size else best


def _advice(
    config: ModelConfig,
    *,
    dtype: str,
    batch: int,
    seq_len: int,
    budget_bytes: int,
    block_size: int,
    max_batched_tokens: int | None,
    fits: bool,
    max_batch: int,
    weights_of: WeightsFn,
) -> str:
    if fits:
        return f"fits with batch ≤ {max_batch} at seq_len {seq_len}"
    total_at = _total_fn(config, dtype, block_size, max_batched_tokens, weights_of)
    options: list[str] = []
    shortest = 0
    if max_batch >= 1:
        options.append(f"cut batch to ≤ {max_batch}")
    else:
        shortest = _max_seq_len(total_at, seq_len, budget_bytes, block_size)
        if shortest:
            options.append(f"cut seq_len to ≤ {shortest}")
    if dtype_bytes(dtype) > 2:
        half_at = _total_fn(config, "bfloat16", block_size, max_batched_tokens, weights_of)
        half_batch = _max_batch(half_at, seq_len, budget_bytes)
        if half_batch >= batch:
            options.append("use bf16")
        elif half_batch >= 1:
            options.append(f"use bf16 with batch ≤ {half_batch}")
        else:
            half_seq = _max_seq_len(half_at, seq_len, budget_bytes, block_size)
            if half_seq > shortest:
                options.append(f"use bf16 with seq_len ≤ {half_seq}")
    head = "does not fit" if max_batch >= 1 else "does not fit even at batch 1"
    if options:
        return f"{head}: {' or '.join(options)}"
    weights, _, _, _, activations = _parts(
        config, dtype, 1, 1, block_size, max_batched_tokens, weights_of
    )
    fixed = weights + activations
    return (
        f"{head}: weights + activation reserve alone need about {format_bytes(fixed)} of "
        f"{format_bytes(budget_bytes)}; use a device with more memory or a smaller model"
    )
