"""`bench engine`: the engine against Hugging Face transformers (one request at a time, and
static padded batches) on one seeded workload, with batch 1, latency, KV and FLOP figures
(`ops/bench/flops.py`); what each figure means: `tokenmill bench engine --help`."""

from __future__ import annotations

import gc
import importlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from gpu.engine import Engine
from gpu.loading.random_weights import has_random_weights
from ops.bench.flops import (
    FLOP_FORMULA,
    DecodeTracker,
    FlopModel,
    gemm_peak_gflops,
    prefill_rate,
    steady_decode,
)
from ops.bench.report import Narrate, Report, quiet, ratio, significant
from ops.bench.runs import BATCH1_NEW_TOKENS, batch1, engine_facts, measure, profile_engine, warm
from ops.bench.workload import BenchRequest, Workload, engine_requests

NO_TRANSFORMERS = "transformers is not installed (a dev dependency: `uv sync --group dev`)"
NO_CHECKPOINT = "random weights (--random-weights): no checkpoint for transformers to load"


@dataclass(frozen=True)
class EngineBenchOptions:
    workload: Workload = field(default_factory=Workload)
    sequential_requests: int = 8  # transformers batch-1 runs on this many of the requests
    static_batch: int = 16
    static_batches: int = 2  # transformers static batching runs on this many whole batches
    gemm_size: int = 2048
    profile_dir: Path | None = None
    profile_decode_steps: int = 8


def run_bench(engine: Engine, o: EngineBenchOptions, say: Narrate = quiet) -> Report:
    """Every contender on one workload; the report (see `ops/bench/cli.py`)."""
    m = engine.model
    workload = o.workload.build(engine)
    flop_model = FlopModel.of(m.config)
    report = Report("engine")
    report["model"] = engine_facts(engine)
    report["environment"] = {"transformers": _transformers_version()}
    w = o.workload
    report["workload"] = w.describe(workload) | {
        "prompts": "uniform random token ids, special/EOS/BOS ids excluded",
        "sampling": "greedy, EOS ignored: exactly the asked output length",
    }
    gemm = "torch.mm" if m.linear_kernel == "torch" else f"{m.linear_kernel} linear"
    say(f"GEMM peak: {gemm} {o.gemm_size}² {m.dtype} on {m.device}")
    peak = gemm_peak_gflops(m.device, m.dtype, o.gemm_size, kernel=m.linear_kernel)

    say(f"engine: {len(workload)} requests in one continuous batch")
    warm(engine, workload[0].prompt_token_ids)
    requests = engine_requests(workload, "bench-")
    run = measure(engine, requests, clock=m.device.type == "cpu")
    stats = run.stats() | {"expected_output_tokens": sum(r.max_new_tokens for r in workload)}
    tracker = DecodeTracker({r.request_id: len(r.prompt_token_ids) for r in requests})
    steady = steady_decode(run.run, run.sampled, tracker, flop_model)
    say(f"engine: the {len(workload)} prompts alone, one new token each (prefill)")
    report["prefill"] = measure_prefill(engine, workload, flop_model, peak)
    say(f"engine: batch 1, up to {BATCH1_NEW_TOKENS} prompt and {BATCH1_NEW_TOKENS} new tokens")
    report["batch1"] = batch1(engine, w.seed)
    contenders = {"engine": stats, **_transformers_runs(engine, workload, o, run.tokens, say)}
    report["contenders"] = contenders

    rate = stats["output_tokens_per_s"]
    vs_seq = ratio(rate, contenders["transformers_sequential"].get("output_tokens_per_s"), 2)
    vs_static = ratio(rate, contenders["transformers_static"].get("output_tokens_per_s"), 2)
    engine_gflops = flop_model.workload_flops(workload) / run.wall_s / 1e9
    fraction = ratio(steady["gflops"], peak, 4)
    report["ratios"] = {"engine_vs_sequential": vs_seq, "engine_vs_static": vs_static}
    report["flops"] = {
        "formula": FLOP_FORMULA,
        "gemm": f"{gemm} {o.gemm_size}×{o.gemm_size} {m.dtype}, best of 5 × 3 products",
        "gemm_peak_gflops": round(peak, 2), "engine_gflops": significant(engine_gflops),
        "engine_fraction_of_peak": round(engine_gflops / peak, 4),
        "steady_decode_fraction": fraction, "steady_decode": steady,
    }  # fmt: skip
    report.target("engine_vs_sequential", vs_seq, 15.0)
    report.target("engine_vs_static", vs_static, 2.5)  # issue 15: static batches of transformers
    report.target("steady_decode_fraction_of_gemm_peak", fraction, 0.5)
    for name, c in contenders.items():
        report.headline(name, c, "skipped", "output_tokens_per_s", "requests", "wall_s")
    report.headline("batch 1", report["batch1"], "decode_tokens_per_s", "decode_step_ms")
    report.headline("GFLOP/s", report["flops"], "engine_gflops", "gemm_peak_gflops")
    report.headline("prefill", report["prefill"], "prompt_tokens_per_s", "fraction_of_gemm_peak")
    report["profile"] = None
    if o.profile_dir is not None:
        say(f"profiling engine steps into {o.profile_dir}")
        profiled = engine_requests(workload, "profile-")
        report["profile"] = profile_engine(engine, profiled, o.profile_dir, o.profile_decode_steps)
    return report


def measure_prefill(
    engine: Engine, workload: Sequence[BenchRequest], flop_model: FlopModel, peak: float
) -> dict[str, Any]:
    """`workload`'s prompts alone, one new token each, none found in the prefix cache (a run
    of the same prompts leaves them there): prefill's rate (`flops.prefill_rate`)."""
    prompts_only = [BenchRequest(r.prompt_token_ids, 1) for r in workload]
    engine.reset_prefix_cache()
    alone = measure(engine, engine_requests(prompts_only, "prefill-"))
    return prefill_rate(prompts_only, alone.run, alone.wall_s, flop_model, peak)


# -- contenders 2 and 3: transformers ------------------------------------------------------


def _transformers_runs(
    engine: Engine, workload: Sequence[BenchRequest], o: EngineBenchOptions,
    engine_out: list[list[int]], say: Narrate,
) -> dict[str, Any]:  # fmt: skip
    """Sequential and static-batch runs, or why they were skipped."""
    names = ("transformers_sequential", "transformers_static")
    if has_random_weights(engine.model):
        return {n: {"skipped": NO_CHECKPOINT} for n in names}
    try:
        say("transformers: loading the same checkpoint")
        hf = _load_transformers(engine)
    except ImportError:
        return {n: {"skipped": NO_TRANSFORMERS} for n in names}
    eos = list(engine.model.eos_token_ids)
    n, rng = len(workload), random.Random(o.workload.seed + 1)
    picks = sorted(rng.sample(range(n), min(o.sequential_requests, n)))
    say(f"transformers sequential: {len(picks)} requests, batch 1")
    sequential = _hf_run(hf, workload, [[i] for i in picks], engine_out, eos)
    # Static batches in arrival order, as a batcher without continuous batching forms them.
    chosen, size = range(min(n, o.static_batch * o.static_batches)), o.static_batch
    batches = [list(chosen[i : i + size]) for i in range(0, len(chosen), size)]
    say(f"transformers static: {len(batches)} batches of up to {size}")
    static = _hf_run(hf, workload, batches, engine_out, eos)
    del hf
    gc.collect()
    return dict(zip(names, (sequential, static), strict=True))


def _load_transformers(engine: Engine) -> Any:
    """The same checkpoint through transformers, in the engine's dtype and device."""
    auto = _transformers().AutoModelForCausalLM
    m = engine.model
    if m.path.is_file():  # a .gguf file; transformers dequantizes it as the engine does
        hf = auto.from_pretrained(m.path.parent, gguf_file=m.path.name, dtype=m.dtype)
    else:
        hf = auto.from_pretrained(m.path, dtype=m.dtype)
    return hf.to(m.device).eval()


def _generate(
    hf: Any, prompts: Sequence[Sequence[int]], new: int, pad: int, eos: list[int]
) -> torch.Tensor:
    """Greedy, exactly `new` tokens per row (EOS suppressed), left-padded. -> [rows, new]"""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    config = _transformers().GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=pad, eos_token_id=eos
    )
    out = hf.generate(
        input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device), generation_config=config
    )
    return cast(torch.Tensor, out[:, width:].cpu())


def _hf_run(
    hf: Any, workload: Sequence[BenchRequest], groups: list[list[int]],
    engine_out: list[list[int]], eos: list[int],
) -> dict[str, Any]:  # fmt: skip
    """Each group of request indices is one left-padded `generate` call running until its
    longest output; only the tokens each request asked for count toward throughput."""
    pad = eos[0] if eos else 0
    with torch.inference_mode():
        _generate(hf, [workload[0].prompt_token_ids[:8]] * len(groups[0]), 4, pad, eos)  # warm
        useful = generated = 0
        differing: list[int] = []
        start = time.perf_counter()
        for group in groups:
            lengths = [workload[i].max_new_tokens for i in group]
            prompts = [workload[i].prompt_token_ids for i in group]
            rows = _generate(hf, prompts, max(lengths), pad, eos)
            useful += sum(min(n, rows.shape[1]) for n in lengths)
            generated += rows.numel()
            differing += [
                i
                for row, (i, n) in enumerate(zip(group, lengths, strict=True))
                if _differs(rows[row, :n].tolist(), engine_out[i][:n], eos)
            ]
        wall = time.perf_counter() - start
    requests = sum(len(g) for g in groups)
    return {
        "requests": requests, "batch_size": max(len(g) for g in groups), "batches": len(groups),
        "output_tokens": useful,
        "expected_output_tokens": sum(workload[i].max_new_tokens for g in groups for i in g),
        "generated_tokens_incl_padding": generated,
        "padding_waste_fraction": round(1 - useful / generated, 3),
        "wall_s": round(wall, 3), "output_tokens_per_s": round(useful / wall, 2),
        "outputs_matching_engine": requests - len(differing),
        "outputs_differing_from_engine": differing,  # request indices; there should be none
    }  # fmt: skip


def _differs(got: list[int], engine: list[int], eos: list[int]) -> bool:
    """Greedy tokens differ before the engine's first EOS (past it the two legitimately part:
    `min_new_tokens` masks EOS out of transformers' logits; `ignore_eos` keeps it)."""
    n = next((k for k, t in enumerate(engine) if t in eos), len(engine))
    return got[:n] != engine[:n]


def _transformers() -> Any:
    """transformers, imported on first use: it is a dev dependency. Raises ImportError."""
    return importlib.import_module("transformers")


def _transformers_version() -> str | None:
    try:
        return str(_transformers().__version__)
    except ImportError:
        return None
