"""The memory planner behind `tokenmill plan`: weights + KV cache + activation reserve of a
batch against a device budget, the largest batch that fits, and what to change when it does not.

Pure arithmetic on a `ModelConfig` (no torch, no I/O), so a deployment is sized before
anything is loaded; the engine sizes its KV pool from the same parts (`kv_budget.py`). Every
quantity is in bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpu.memory.activation_reserve import activation_reserve_bytes
from gpu.memory.byte_sizes import format_bytes
from gpu.memory.model_sizes import canonical_dtype, dtype_bytes, kv_bytes_per_token, weights_bytes
from gpu.model_config import ModelConfig

# Default tokens per step: whole prompts up to seq_len (at least this many) ...
DEFAULT_MAX_BATCHED_TOKENS = 2048
# ... but never more than this: longer prompts are prefilled in chunks.
MAX_DEFAULT_BATCHED_TOKENS = 8192


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
