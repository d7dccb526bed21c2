"""The engine benchmark: tokenmill's engine against Hugging Face transformers, same workload.

One seeded workload of random-token prompts and fixed output lengths (greedy, EOS ignored, so
every contender generates exactly the same tokens per request) runs through three contenders,
one after another in this process: the engine (every request added at once), transformers
`generate` one request at a time, and transformers in static left-padded batches. The slow
transformers contenders run on subsets; rates (output tokens/s) are compared, not totals.

`run_bench(engine, options)` returns one JSON-ready dict; it reports targets, never asserts.
FLOP accounting lives in `ops/bench/flops.py`, profiling in `ops/bench/profile.py`.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from gpu.engine import Engine, EngineRequest, StepOutput
from gpu.loading.random_weights import has_random_weights
from gpu.sequence import SamplingParams
from ops.bench.flops import (
    FLOP_FORMULA,
    DecodeTracker,
    FlopModel,
    gemm_peak_gflops,
    significant,
    steady_decode,
)
from ops.bench.narrate import Narrate
from ops.bench.profile import profile_engine
from ops.bench.step_time import BATCH1_NEW_TOKENS, BATCH1_PROMPT_TOKENS, batch1, timed
from ops.bench.workload import BenchOptions, BenchRequest, host_load, make_workload
from ops.models.offline import run_all

TARGET_VS_SEQUENTIAL = 15.0
TARGET_VS_STATIC = 2.5  # issue 15: static batches of transformers
TARGET_STEADY_DECODE_FRACTION = 0.5
NO_TRANSFORMERS = "transformers is not installed (a dev dependency: `uv sync --group dev`)"
NO_CHECKPOINT = "random weights (--random-weights): no checkpoint for transformers to load"


def _engine_requests(workload: Sequence[BenchRequest], prefix: str) -> list[EngineRequest]:
    return [
        EngineRequest(
            f"{prefix}{i}",
            r.prompt_token_ids,
            SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True),
        )
        for i, r in enumerate(workload)
    ]


# -- contender 1: the engine ---------------------------------------------------------------


class StepRecorder:
    """Stands in for the engine inside `run_all`, noting which requests sampled at each step."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sampled: list[list[str]] = []  # per step, the request ids that got a token

    def add(self, request: EngineRequest) -> None:
        self.engine.add(request)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> StepOutput:
        out = self.engine.step()
        self.sampled.append([rid for rid, _ in out.new_tokens])
        return out


def percentiles(values: Sequence[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(present, [50, 90, 99])
    return {"p50": round(float(p50), 2), "p90": round(float(p90), 2), "p99": round(float(p99), 2)}


def bench_engine(
    engine: Engine, workload: Sequence[BenchRequest], flop_model: FlopModel
) -> tuple[dict[str, Any], dict[str, Any], list[list[int]]]:
    """Warm up, then run the whole workload in one continuous batch.

    Returns the run's stats, its steady-decode figures and each request's output tokens.
    """
    warm = [BenchRequest(workload[0].prompt_token_ids[:8], 4)] * 2
    run_all(engine, _engine_requests(warm, "warmup-"))
    engine.peak_blocks_used = 0  # the warm-up's blocks are not the benchmark's

    requests = _engine_requests(workload, "bench-")
    recorder = StepRecorder(engine)
    load_before = host_load()
    start = time.perf_counter()
    with torch.inference_mode():
        if engine.model.device.type == "cpu":  # there the clock costs nothing measurable
            run, breakdown = timed(engine, lambda: run_all(cast(Engine, recorder), requests))
        else:  # on CUDA it synchronizes at every phase: the rate would not be the engine's
            run, breakdown = run_all(cast(Engine, recorder), requests), None
    wall = time.perf_counter() - start

    tracker = DecodeTracker({r.request_id: len(r.prompt_token_ids) for r in requests})
    steady = steady_decode(run, recorder.sampled, tracker, flop_model)
    out_tokens = run.output_tokens
    stats = {
        "requests": len(requests),
        "prompt_tokens": run.prompt_tokens,
        "output_tokens": out_tokens,
        "expected_output_tokens": sum(r.max_new_tokens for r in workload),
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 2),
        "steps": len(run.steps),
        "decode_only_steps": steady["steps"],
        "preemptions": sum(s.num_preempted for s in run.steps),
        "ttft_ms": percentiles([c.ttft_ms for c in run.completions]),
        "tpot_ms": percentiles([c.tpot_ms for c in run.completions]),
        "host_load_1m": [load_before, host_load()],
        "step_time": breakdown,
    }
    return stats, steady, [c.token_ids for c in run.completions]


# -- contenders 2 and 3: transformers ------------------------------------------------------


def load_transformers_model(engine: Engine) -> Any:
    """The same checkpoint through transformers, in the engine's dtype and device.

    Raises ImportError when transformers is not installed.
    """
    auto = _transformers().AutoModelForCausalLM
    m = engine.model
    if m.path.is_file():  # a .gguf file; transformers dequantizes it as the engine does
        hf = auto.from_pretrained(m.path.parent, gguf_file=m.path.name, dtype=m.dtype)
    else:
        hf = auto.from_pretrained(m.path, dtype=m.dtype)
    return hf.to(m.device).eval()


def _hf_generate(
    hf: Any, prompts: Sequence[Sequence[int]], new_tokens: int, pad_id: int, eos: list[int]
) -> torch.Tensor:
    """Greedy, exactly `new_tokens` per row (EOS suppressed); left-padded. -> [rows, new_tokens]"""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    config = _transformers().GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=eos,
    )
    out = hf.generate(
        input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device), generation_config=config
    )
    return cast(torch.Tensor, out[:, width:].cpu())


def _differs(got: list[int], engine: list[int], eos: list[int]) -> bool:
    """Greedy tokens differ before the engine's first EOS. Past it the two legitimately part:
    transformers' `min_new_tokens` masks EOS out of the logits; `ignore_eos` keeps it."""
    n = next((k for k, t in enumerate(engine) if t in eos), len(engine))
    return got[:n] != engine[:n]


def bench_transformers(
    hf: Any,
    workload: Sequence[BenchRequest],
    groups: list[list[int]],
    engine_out: list[list[int]],
    eos: list[int],
) -> dict[str, Any]:
    """Each group of request indices is one left-padded `generate` call that runs until its
    longest output; only the tokens each request asked for count toward throughput."""
    pad = eos[0] if eos else 0
    warm = workload[0].prompt_token_ids
    with torch.inference_mode():
        _hf_generate(hf, [warm[:8], warm[:5]][: len(groups[0])], 4, pad, eos)
        useful = generated = 0
        mismatched: list[int] = []
        load_before = host_load()
        start = time.perf_counter()
        for group in groups:
            lengths = [workload[i].max_new_tokens for i in group]
            prompts = [workload[i].prompt_token_ids for i in group]
            rows = _hf_generate(hf, prompts, max(lengths), pad, eos)  # [group, max(lengths)]
            useful += sum(min(n, rows.shape[1]) for n in lengths)
            generated += rows.numel()
            mismatched += [
                i
                for row, (i, n) in enumerate(zip(group, lengths, strict=True))
                if _differs(rows[row, :n].tolist(), engine_out[i][:n], eos)
            ]
        wall = time.perf_counter() - start
    return {
        "requests": sum(len(g) for g in groups),
        "request_indices": [i for g in groups for i in g],
        "batch_size": max(len(g) for g in groups),
        "batches": len(groups),
        "output_tokens": useful,
        "expected_output_tokens": sum(workload[i].max_new_tokens for g in groups for i in g),
        "generated_tokens_incl_padding": generated,
        "padding_waste_fraction": round(1 - useful / generated, 3),
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(useful / wall, 2),
        "outputs_matching_engine": sum(len(g) for g in groups) - len(mismatched),
        # Request indices whose greedy tokens differ before the first EOS; there should be none.
        "outputs_differing_from_engine": mismatched,
        "host_load_1m": [load_before, host_load()],
    }


# -- the whole benchmark -------------------------------------------------------------------


def _target(value: float | None, target: float) -> dict[str, Any]:
    return {"target": target, "value": value, "met": None if value is None else value >= target}


def _ratio(a: float, b: dict[str, Any]) -> float | None:
    rate = b.get("output_tokens_per_s")
    return round(a / rate, 2) if rate else None


def _run_transformers(
    engine: Engine,
    workload: Sequence[BenchRequest],
    o: BenchOptions,
    engine_out: list[list[int]],
    say: Narrate,
) -> dict[str, Any]:
    """Contenders 2 and 3, or why they were skipped."""
    if has_random_weights(engine.model):
        skipped = {"skipped": NO_CHECKPOINT}
        return {"transformers_sequential": skipped, "transformers_static": skipped}
    try:
        say("transformers: loading the same checkpoint")
        hf = load_transformers_model(engine)
    except ImportError:
        skipped = {"skipped": NO_TRANSFORMERS}
        return {"transformers_sequential": skipped, "transformers_static": skipped}
    eos = list(engine.model.eos_token_ids)
    n = len(workload)
    picks = sorted(random.Random(o.seed + 1).sample(range(n), min(o.sequential_requests, n)))
    say(f"transformers sequential: {len(picks)} requests, batch 1")
    sequential = bench_transformers(hf, workload, [[i] for i in picks], engine_out, eos)
    # Static batches in arrival order, as a batcher without continuous batching forms them.
    chosen = range(min(n, o.static_batch * o.static_batches))
    size = o.static_batch
    batches = [list(chosen[i : i + size]) for i in range(0, len(chosen), size)]
    say(f"transformers static: {len(batches)} batches of up to {size}")
    static = bench_transformers(hf, workload, batches, engine_out, eos)
    del hf
    gc.collect()
    return {"transformers_sequential": sequential, "transformers_static": static}


def run_bench(
    engine: Engine, options: BenchOptions, progress: Narrate | None = None
) -> dict[str, Any]:
    """Run every contender on one workload; a JSON-ready report (see `ops/bench/cli.py`)."""
    say = progress or (lambda _: None)
    o = options
    m = engine.model
    workload = make_workload(engine, o)
    flop_model = FlopModel.of(m.config)

    gemm = "torch.mm" if m.linear_kernel == "torch" else f"{m.linear_kernel} linear"
    say(f"GEMM peak: {gemm} {o.gemm_size}² {m.dtype} on {m.device}")
    peak = gemm_peak_gflops(m.device, m.dtype, o.gemm_size, kernel=m.linear_kernel)

    say(f"engine: {len(workload)} requests in one continuous batch")
    engine_stats, steady, engine_out = bench_engine(engine, workload, flop_model)

    say(f"engine: batch 1, a {BATCH1_PROMPT_TOKENS}-token prompt, {BATCH1_NEW_TOKENS} new tokens")
    single = batch1(engine, o)

    contenders = {"engine": engine_stats, **_run_transformers(engine, workload, o, engine_out, say)}

    rate = engine_stats["output_tokens_per_s"]
    vs_seq = _ratio(rate, contenders["transformers_sequential"])
    vs_static = _ratio(rate, contenders["transformers_static"])
    engine_flops = flop_model.workload_flops(workload)
    engine_gflops = engine_flops / engine_stats["wall_s"] / 1e9
    steady_gflops = steady["gflops"]
    steady_fraction = round(steady_gflops / peak, 4) if steady_gflops is not None else None

    dtype = str(m.dtype).removeprefix("torch.")
    report: dict[str, Any] = {
        "benchmark": "engine",
        "model": {
            "name": m.name,
            "digest": m.digest,
            "arch": m.config.arch,
            "parameters": m.config.num_parameters(),
        },
        "environment": {
            "torch": torch.__version__,
            "transformers": _transformers_version(),
            "device": str(m.device),
            "dtype": dtype,
            "linear_kernel": m.linear_kernel,
            "attention_kernel": engine.attention_kernel,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "host_load_1m_at_end": host_load(),
        },
        "workload": {
            "seed": o.seed,
            "requests": len(workload),
            "prompt_len_range": [o.min_prompt, o.max_prompt],
            "output_len_range": [o.min_output, o.max_output],
            "prompt_tokens": sum(len(r.prompt_token_ids) for r in workload),
            "output_tokens": sum(r.max_new_tokens for r in workload),
            "prompts": "uniform random token ids, special/EOS/BOS ids excluded",
            "sampling": "greedy, EOS ignored: exactly the asked output length",
        },
        "contenders": contenders,
        "batch1": single,
        "ratios": {"engine_vs_sequential": vs_seq, "engine_vs_static": vs_static},
        "latency_ms": {"ttft": engine_stats["ttft_ms"], "tpot": engine_stats["tpot_ms"]},
        "kv": {
            "peak_blocks_used": engine.peak_blocks_used,
            "blocks_allocated": engine.num_blocks,
            "block_size": engine.config.block_size,
            "peak_fraction": round(engine.peak_blocks_used / engine.num_blocks, 3),
        },
        "flops": {
            "formula": FLOP_FORMULA,
            "linear_params": flop_model.linear_params,
            "lm_head_params": flop_model.lm_head_params,
            "gemm": f"{gemm} {o.gemm_size}×{o.gemm_size} {dtype}, best of 5 × 3 products",
            "gemm_peak_gflops": round(peak, 2),
            "engine_gflop": significant(engine_flops / 1e9),
            "engine_gflops": significant(engine_gflops),
            "engine_fraction_of_peak": round(engine_gflops / peak, 4),
            "steady_decode_gflops": steady_gflops,
            "steady_decode_fraction": steady_fraction,
            "steady_decode": steady,
        },
        "targets": {
            "engine_vs_sequential": _target(vs_seq, TARGET_VS_SEQUENTIAL),
            "engine_vs_static": _target(vs_static, TARGET_VS_STATIC),
            "steady_decode_fraction_of_gemm_peak": _target(
                steady_fraction, TARGET_STEADY_DECODE_FRACTION
            ),
        },
        "profile": None,
    }
    if o.profile_dir is not None:
        say(f"profiling engine steps into {o.profile_dir}")
        requests = _engine_requests(workload, "profile-")
        report["profile"] = profile_engine(engine, requests, o.profile_dir, o.profile_decode_steps)
    return report


def _transformers() -> Any:
    """transformers, imported on first use: it is a dev dependency. Raises ImportError."""
    return importlib.import_module("transformers")


def _transformers_version() -> str | None:
    try:
        return str(_transformers().__version__)
    except ImportError:
        return None


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False)
