"""Decode against the memory roofline: batch-1 step time, its share of the bandwidth bound, and
decode tokens/s with every sequence of a batch decoding.

A batch-1 decode step reads every weight as held (an untied embedding table only for its row)
and the K/V its token attends. At the copy bandwidth measured in the same run (read + write
bytes of a large `copy_` over its best time) that takes `roofline_step_ms`; `roofline_fraction`
= roofline ÷ measured step (1.0: at the bound). On CUDA intervals are timed with CUDA events,
synchronized after a timed loop; elsewhere `time.perf_counter` and a host memcpy stand in.

Imports nothing from `ops/`: `tests/gpu/check.py` loads this file by path on GPU machines that
have torch but not the CLI's dependencies.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from gpu.block_allocator import blocks_for
from gpu.engine import Engine, EngineRequest
from gpu.memory.held_bytes import weight_bytes
from gpu.sequence import SamplingParams

CUDA_COPY_BYTES = 1 << 30  # 1 GiB each way: far past any cache
HOST_COPY_BYTES = 1 << 26  # 64 MiB: past the last-level cache, quick on a small CPU


@dataclass(frozen=True)
class DecodeOptions:
    prompt_tokens: int = 128  # every sequence's prompt
    new_tokens: int = 64  # every sequence's output (greedy, EOS ignored)
    batches: tuple[int, ...] = (16, 64)  # batch sizes run besides batch 1
    copy_bytes: int | None = None  # the bandwidth copy's size (None: by device)
    copy_repeats: int = 10
    seed: int = 0


class Marks:
    """Timestamps: CUDA events on a CUDA device (read after one synchronize), else perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in pairwise(self._marks)]
        return [b - a for a, b in pairwise(self._marks)]


def copy_bandwidth(
    device: torch.device, nbytes: int | None = None, repeats: int = 10
) -> dict[str, Any]:
    """Bytes per second a `dst.copy_(src)` moves (read + write), best of `repeats`."""
    cuda = device.type == "cuda"
    nbytes = nbytes or (CUDA_COPY_BYTES if cuda else HOST_COPY_BYTES)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    dst.copy_(src)  # first touch and warm-up, untimed
    marks = Marks(device)
    for _ in range(repeats):
        marks.mark()
        dst.copy_(src)
        marks.mark()
    times = marks.intervals_s()[::2]  # each copy's start to its end
    return {
        "method": "device copy_, CUDA events" if cuda else "host copy_, perf_counter",
        "bytes_copied": nbytes, "bytes_per_s_counts": "read + write", "repeats": repeats,
        "best_s": min(times), "median_s": statistics.median(times),
        "bytes_per_s": 2 * nbytes / min(times),
    }  # fmt: skip


def read_weight_bytes(module: nn.Module) -> dict[str, int]:
    """Weights as held, and what a decode step reads of them: all but the embedding tables
    that are not also a linear's weight (a step reads one row of those)."""
    held = weight_bytes(module)
    linear = {m.weight.data_ptr() for m in module.modules() if isinstance(m, nn.Linear)}
    tables = sum(
        m.weight.numel() * m.weight.element_size()
        for m in module.modules()
        if isinstance(m, nn.Embedding) and m.weight.data_ptr() not in linear
    )
    return {"held": held, "embedding_tables_not_read": tables, "read_per_step": held - tables}


def kv_bytes_attended(engine: Engine, context: int) -> int:
    """K and V bytes a token at context length `context` reads, each layer within its window."""
    c = engine.model.config
    positions = sum(min(context, c.layer_window(i) or context) for i in range(c.num_layers))
    return positions * 2 * c.num_kv_heads * c.head_dim * engine.model.dtype.itemsize


def _requests(engine: Engine, count: int, o: DecodeOptions, seed: int, new: int, tag: str) -> Any:
    """`count` seeded random-token prompts (no EOS or BOS id), greedy, EOS ignored."""
    m = engine.model
    special = {*m.eos_token_ids, m.config.bos_token_id}
    allowed = [
        t for t in range(min(m.config.vocab_size, m.tokenizer.vocab_size)) if t not in special
    ]
    rng, params = random.Random(seed), SamplingParams(max_new_tokens=new, ignore_eos=True)
    return [
        EngineRequest(f"{tag}-{i}", rng.choices(allowed, k=o.prompt_tokens), params)
        for i in range(count)
    ]


def decode_run(engine: Engine, requests: Sequence[EngineRequest]) -> dict[str, Any]:
    """All `requests` at once; every step timed, the steady ones (every sequence decoding, no
    prefill in the step) summed."""
    batch = len(requests)
    for request in requests:
        engine.add(request)
    marks = Marks(engine.model.device)
    steady: list[bool] = []
    with torch.inference_mode():
        marks.mark()
        while engine.has_work():
            stats = engine.step().stats
            marks.mark()
            steady.append(stats.num_prefill_tokens == 0 and stats.num_decode_tokens == batch)
    times = marks.intervals_s()
    steady_s = [t for t, ok in zip(times, steady, strict=True) if ok]
    if not steady_s:
        raise ValueError(f"no step ran all {batch} sequences decoding: give more new tokens")
    total = sum(steady_s)
    return {
        "batch": batch, "prompt_tokens": len(requests[0].prompt_token_ids),
        "new_tokens": requests[0].params.max_new_tokens, "steps": len(times),
        "steady_steps": len(steady_s), "steady_s": total,
        "step_ms": total / len(steady_s) * 1e3,
        "step_ms_median": statistics.median(steady_s) * 1e3,
        "tokens_per_s": batch * len(steady_s) / total,
    }  # fmt: skip


def _unfit(engine: Engine, batch: int, tokens: int) -> str | None:
    """Why `batch` sequences of `tokens` cannot all run at once, or None."""
    if batch > engine.config.max_num_seqs:
        return f"batch {batch} > max_num_seqs {engine.config.max_num_seqs}"
    if tokens > engine.max_model_len:
        return f"{tokens} tokens > max_model_len {engine.max_model_len}"
    need = batch * blocks_for(tokens, engine.config.block_size)
    if need > engine.num_blocks:
        return f"batch {batch} needs {need} KV blocks; the pool has {engine.num_blocks}"
    return None


def _warm_up(engine: Engine, batch: int, o: DecodeOptions) -> None:
    """Untimed steps of this batch's shapes: one-time costs (kernel selection, autotuning,
    allocator growth) stay out of the timing."""
    for request in _requests(engine, batch, o, o.seed - 1 - batch, 4, f"warm{batch}"):
        engine.add(request)
    with torch.inference_mode():
        while engine.has_work():
            engine.step()


def _timed(engine: Engine, batch: int, o: DecodeOptions) -> dict[str, Any]:
    _warm_up(engine, batch, o)
    return decode_run(
        engine, _requests(engine, batch, o, o.seed + batch, o.new_tokens, f"decode{batch}")
    )


def run_decode_roofline(engine: Engine, options: DecodeOptions | None = None) -> dict[str, Any]:
    """The report's `decode_roofline` section (see the module docstring); JSON-ready."""
    o = options or DecodeOptions()
    device, total = engine.model.device, o.prompt_tokens + o.new_tokens
    if (problem := _unfit(engine, 1, total)) is not None:
        raise ValueError(f"decode roofline: {problem}")
    _warm_up(engine, 1, o)
    bandwidth = copy_bandwidth(device, o.copy_bytes, o.copy_repeats)
    one = decode_run(engine, _requests(engine, 1, o, o.seed, o.new_tokens, "decode1"))
    weights = read_weight_bytes(engine.model.module)
    # steady steps are decode steps 1 .. new_tokens - 1: contexts prompt + 1 .. prompt + n - 1
    contexts = range(o.prompt_tokens + 1, o.prompt_tokens + o.new_tokens)
    kv = statistics.fmean(kv_bytes_attended(engine, n) for n in contexts)
    step_bytes = weights["read_per_step"] + kv
    roofline_s, measured_s = step_bytes / bandwidth["bytes_per_s"], one["step_ms"] / 1e3
    batches = {
        str(n): {"skipped": why} if (why := _unfit(engine, n, total)) else _timed(engine, n, o)
        for n in o.batches
    }
    return {
        "device": str(device),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "bandwidth": bandwidth,
        "batch1": one | {
            "weight_bytes": weights, "kv_bytes_attended_mean": kv, "bytes_per_step": step_bytes,
            "roofline_step_ms": roofline_s * 1e3, "roofline_fraction": roofline_s / measured_s,
            "step_over_roofline": measured_s / roofline_s,
        },
        "batches": batches,
    }  # fmt: skip
