"""Decode against the memory roofline: batch-1 step time, its share of the bandwidth bound,
and decode tokens/s with every sequence of a batch decoding.

A batch-1 decode step must read every weight as held (an untied embedding table only for
its one row) and the K/V its token attends. At the device's copy bandwidth, measured in the
same run by a large device-to-device `copy_` (read + write bytes over the best time), that
takes `roofline_step_ms`; `roofline_fraction` = roofline ÷ measured step is how close the
engine comes to memory-bound (1.0: at the bound).

On CUDA every interval is timed with CUDA events and `torch.cuda.synchronize()` runs only
after a timed loop; elsewhere (`run_decode_roofline` on a CPU engine, for tests and
`bench engine --decode-roofline`) `time.perf_counter` and a host memcpy stand in. The
engine's `step()` brings its sampled ids to the host, so each step ends synchronised anyway.
Each batch size first runs a few untimed steps of its own shapes.

Imports nothing from `ops/`: `tests/gpu/check.py` loads this file by path on GPU machines
that have torch but not the CLI's dependencies.
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
    """Timestamps between steps: CUDA events on a CUDA device (read after one synchronize),
    `time.perf_counter` elsewhere."""

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
        """Seconds between consecutive marks (synchronizes the device first)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in pairwise(self._marks)]
        return [b - a for a, b in pairwise(self._marks)]


def copy_bandwidth(
    device: torch.device, nbytes: int | None = None, repeats: int = 10
) -> dict[str, Any]:
    """Bytes per second a `dst.copy_(src)` of `nbytes` moves (read + write), best of
    `repeats` after one untimed copy."""
    if nbytes is None:
        nbytes = CUDA_COPY_BYTES if device.type == "cuda" else HOST_COPY_BYTES
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    dst.copy_(src)  # first touch and warm-up, untimed
    marks = Marks(device)
    for _ in range(repeats):
        marks.mark()
        dst.copy_(src)
        marks.mark()
    times = marks.intervals_s()[::2]  # each copy's start to its end
    del src, dst
    best = min(times)
    cuda = device.type == "cuda"
    return {
        "method": "device copy_, CUDA events" if cuda else "host copy_, perf_counter",
        "bytes_copied": nbytes,
        "bytes_per_s_counts": "read + write",
        "repeats": repeats,
        "best_s": best,
        "median_s": statistics.median(times),
        "bytes_per_s": 2 * nbytes / best,
    }


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
    """K and V bytes one token at context length `context` (itself included) reads, each
    layer within its window."""
    c = engine.model.config
    per_position = 2 * c.num_kv_heads * c.head_dim * engine.model.dtype.itemsize
    return sum(
        min(context, c.layer_window(i) or context) * per_position for i in range(c.num_layers)
    )


def _prompts(engine: Engine, count: int, length: int, seed: int) -> list[list[int]]:
    model = engine.model
    special = {*model.eos_token_ids}
    if model.config.bos_token_id is not None:
        special.add(model.config.bos_token_id)
    vocab = min(model.config.vocab_size, model.tokenizer.vocab_size)
    allowed = [t for t in range(vocab) if t not in special]
    rng = random.Random(seed)
    return [rng.choices(allowed, k=length) for _ in range(count)]


def _requests(prompts: Sequence[list[int]], new_tokens: int, tag: str) -> list[EngineRequest]:
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    return [EngineRequest(f"{tag}-{i}", p, params) for i, p in enumerate(prompts)]


def decode_run(engine: Engine, prompts: Sequence[list[int]], new_tokens: int) -> dict[str, Any]:
    """All `prompts` at once, `new_tokens` each; every step timed, and the steady ones (each
    sequence decoding, no prefill in the step) summed."""
    batch = len(prompts)
    for request in _requests(prompts, new_tokens, f"decode{batch}"):
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
        "batch": batch,
        "prompt_tokens": len(prompts[0]),
        "new_tokens": new_tokens,
        "steps": len(times),
        "steady_steps": len(steady_s),
        "steady_s": total,
        "step_ms": total / len(steady_s) * 1e3,
        "step_ms_median": statistics.median(steady_s) * 1e3,
        "tokens_per_s": batch * len(steady_s) / total,
    }


def _check_fits(engine: Engine, batch: int, tokens: int) -> str | None:
    """Why `batch` sequences of `tokens` cannot all run at once, or None."""
    if batch > engine.config.max_num_seqs:
        return f"batch {batch} > max_num_seqs {engine.config.max_num_seqs}"
    if tokens > engine.max_model_len:
        return f"{tokens} tokens > max_model_len {engine.max_model_len}"
    need = batch * blocks_for(tokens, engine.config.block_size)
    if need > engine.num_blocks:
        return f"batch {batch} needs {need} KV blocks; the pool has {engine.num_blocks}"
    return None


def _warm_up(engine: Engine, batch: int, prompt_tokens: int, seed: int) -> None:
    """A few untimed steps of this batch's shapes (prefill, then every sequence decoding):
    one-time costs (kernel selection, autotuning, allocator growth) stay out of the timing."""
    prompts = _prompts(engine, batch, prompt_tokens, seed - 1 - batch)
    with torch.inference_mode():
        for request in _requests(prompts, 4, f"warm{batch}"):
            engine.add(request)
        while engine.has_work():
            engine.step()


def run_decode_roofline(engine: Engine, options: DecodeOptions | None = None) -> dict[str, Any]:
    """The report's `decode_roofline` section (see the module docstring); JSON-ready."""
    o = options or DecodeOptions()
    device = engine.model.device
    total = o.prompt_tokens + o.new_tokens
    problem = _check_fits(engine, 1, total)
    if problem is not None:
        raise ValueError(f"decode roofline: {problem}")
    _warm_up(engine, 1, o.prompt_tokens, o.seed)
    bandwidth = copy_bandwidth(device, o.copy_bytes, o.copy_repeats)
    one = decode_run(engine, _prompts(engine, 1, o.prompt_tokens, o.seed), o.new_tokens)
    weights = read_weight_bytes(engine.model.module)
    # steady steps are decode steps 1 .. new_tokens - 1: contexts prompt + 1 .. prompt + n - 1
    contexts = range(o.prompt_tokens + 1, o.prompt_tokens + o.new_tokens)
    kv = statistics.fmean(kv_bytes_attended(engine, n) for n in contexts)
    step_bytes = weights["read_per_step"] + kv
    roofline_s = step_bytes / bandwidth["bytes_per_s"]
    measured_s = one["step_ms"] / 1e3
    batches: dict[str, Any] = {}
    for size in o.batches:
        problem = _check_fits(engine, size, total)
        if problem is not None:
            batches[str(size)] = {"skipped": problem}
            continue
        _warm_up(engine, size, o.prompt_tokens, o.seed)
        prompts = _prompts(engine, size, o.prompt_tokens, o.seed + size)
        batches[str(size)] = decode_run(engine, prompts, o.new_tokens)
    return {
        "device": str(device),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "bandwidth": bandwidth,
        "batch1": {
            **one,
            "weight_bytes": weights,
            "kv_bytes_attended_mean": kv,
            "bytes_per_step": step_bytes,
            "roofline_step_ms": roofline_s * 1e3,
            "roofline_fraction": roofline_s / measured_s,
            "step_over_roofline": measured_s / roofline_s,
        },
        "batches": batches,
    }
