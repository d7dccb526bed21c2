"""FLOP accounting for `bench engine`: a model's useful FLOPs (`FlopModel`, formula in
`FLOP_FORMULA`), the matmul rate they are compared against (`gemm_peak_gflops`), and the
pure-decode steps of a run with their FLOP rate (`DecodeTracker`, `steady_decode`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gpu.engine import StepStats
from gpu.model_config import ModelConfig
from ops.bench.report import significant
from ops.models.offline import OfflineRun

if TYPE_CHECKING:
    from ops.bench.workload import BenchRequest

FLOP_FORMULA = (
    "2 × linear_params × tokens_processed + 2 × lm_head_params × sampled_rows + "
    "4 × layers × heads × head_dim × attended_keys; linear_params = every per-layer matmul "
    "weight (q,k,v,o and MLP), no embeddings, norms or biases; the LM head counts only for rows "
    "that sample (one per output token); tokens_processed = prompt + output - 1 per request; "
    "attended_keys = causal keys per processed token (position + 1); recomputation after "
    "preemption and decode padding are not counted"
)


@dataclass(frozen=True)
class FlopModel:
    linear_params: int  # per-token matmul weights of all layers (no embeddings, no LM head)
    lm_head_params: int
    attention_flops_per_key: int  # per processed token, per key attended, all layers

    @classmethod
    def of(cls, c: ModelConfig) -> FlopModel:
        h, i = c.hidden_size, c.intermediate_size
        if c.arch == "gpt2":
            per_layer = 3 * h * h + h * h + 2 * h * i
        else:
            per_layer = h * (c.q_size + 2 * c.kv_size) + c.q_size * h + 3 * h * i
        return cls(
            linear_params=c.num_layers * per_layer,
            lm_head_params=c.vocab_size * h,
            attention_flops_per_key=4 * c.num_layers * c.num_heads * c.head_dim,
        )

    def flops(self, tokens: int, sampled_rows: int, attended_keys: int) -> int:
        return (
            2 * self.linear_params * tokens
            + 2 * self.lm_head_params * sampled_rows
            + self.attention_flops_per_key * attended_keys
        )

    def workload_flops(self, workload: Sequence[BenchRequest]) -> int:
        """Useful FLOPs of the whole workload: each position fed once, causal attention."""
        tokens = keys = sampled = 0
        for r in workload:
            fed = len(r.prompt_token_ids) + r.max_new_tokens - 1
            tokens += fed
            keys += fed * (fed + 1) // 2
            sampled += r.max_new_tokens
        return self.flops(tokens, sampled, keys)


def gemm_peak_gflops(
    device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 3, trials: int = 5,
    kernel: str = "torch",
) -> float:  # fmt: skip
    """Best observed rate of an n×n by n×n product, in GFLOP/s, by the engine's kernel:
    `torch.mm`, or ("native-panels", "onednn-packed") a `PackedLinear` holding its weight
    in panels or as oneDNN reordered it."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.mm(a, b)
    product: Callable[[], object] = lambda: torch.mm(a, b, out=c)  # noqa: E731
    if kernel in ("native-panels", "onednn-packed"):
        from gpu.kernels.native import cpu_kernels
        from gpu.models.packed_linear import PackedLinear

        linear = torch.nn.Linear(n, n, bias=False, device=device, dtype=dtype)
        packed = PackedLinear(linear, cpu_kernels() if kernel == "native-panels" else None)
        product = lambda: packed(a)  # noqa: E731
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    best = float("inf")
    with torch.inference_mode():
        for _ in range(trials):
            sync(device)
            start = time.perf_counter()
            for _ in range(repeats):
                product()
            sync(device)
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 * repeats / best / 1e9


def prefill_rate(
    workload: Sequence[BenchRequest],
    run: OfflineRun,
    wall_s: float,
    flop_model: FlopModel,
    peak_gflops: float,
) -> dict[str, Any]:
    """What a run of `workload`'s prompts alone (one new token each: nothing but prefill and
    one sample a request) took: prompt tokens/s, GFLOP/s and their share of the GEMM peak."""
    tokens = sum(len(r.prompt_token_ids) for r in workload)
    keys = sum(len(r.prompt_token_ids) * (len(r.prompt_token_ids) + 1) // 2 for r in workload)
    gflops = flop_model.flops(tokens, len(workload), keys) / wall_s / 1e9
    return {
        "requests": len(workload), "prompt_tokens": tokens, "wall_s": round(wall_s, 3),
        "prompt_tokens_per_s": significant(tokens / wall_s), "gflops": significant(gflops),
        "fraction_of_gemm_peak": round(gflops / peak_gflops, 4),
        "cached_prompt_tokens": sum(step.cached_prompt_tokens for step in run.steps),
    }  # fmt: skip


class DecodeTracker:
    """Tells pure-decode steps apart (every sequence fed one token, its last output, and
    sampled) and counts each request's outputs: the keys each decode attended to, which the
    FLOP count needs and `StepStats` does not carry."""

    def __init__(self, prompt_lens: dict[str, int]) -> None:
        self.prompt_lens = prompt_lens
        self.outputs = dict.fromkeys(prompt_lens, 0)

    def observe(self, stats: StepStats, sampled: list[str]) -> int | None:
        """Attended keys if the step was pure decode, else None; then count its outputs."""
        tokens = stats.num_prefill_tokens + stats.num_decode_tokens
        keys = None
        if tokens == stats.num_seqs == len(sampled) > 0 and all(self.outputs[i] for i in sampled):
            # A decode feeds the last token at position P + n - 1: it attends to P + n keys.
            keys = sum(self.prompt_lens[i] + self.outputs[i] for i in sampled)
        for i in sampled:
            self.outputs[i] += 1
        return keys


def steady_decode(
    run: OfflineRun, sampled: list[list[str]], tracker: DecodeTracker, flop_model: FlopModel
) -> dict[str, Any]:
    """FLOPs and time of the pure-decode steps."""
    flops = ns = steps = rows = 0
    for stats, ids in zip(run.steps, sampled, strict=True):
        keys = tracker.observe(stats, ids)
        if keys is not None:
            flops += flop_model.flops(len(ids), len(ids), keys)
            ns += stats.end_ns - stats.start_ns
            steps += 1
            rows += len(ids)
    return {
        "steps": steps, "mean_batch": round(rows / steps, 1) if steps else None,
        "seconds": round(ns / 1e9, 3), "gflop": significant(flops / 1e9),
        "gflops": significant(flops / ns) if ns else None,
    }  # fmt: skip
