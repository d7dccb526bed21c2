"""The engine benchmark: tokenmill's engine against Hugging Face transformers, same workload.

One seeded workload of random-token prompts and fixed output lengths (greedy, EOS ignored, so
every contender generates exactly the same tokens per request) runs through three contenders,
one after another in this process: the engine (every request added at once), transformers
`generate` one request at a time, and transformers in static left-padded batches. The slow
transformers contenders run on subsets; rates (output tokens/s) are compared, not totals.

`run_bench(engine, options)` returns one JSON-ready dict; it reports targets, never asserts.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from gpu.config import ModelConfig
from gpu.engine import Engine, EngineRequest, StepOutput, StepStats
from gpu.offline import OfflineRun, run_all
from gpu.sequence import SamplingParams

TARGET_VS_SEQUENTIAL = 15.0
TARGET_VS_STATIC = 2.0
TARGET_STEADY_DECODE_FRACTION = 0.5
NO_TRANSFORMERS = "transformers is not installed (a dev dependency: `uv sync --group dev`)"

FLOP_FORMULA = (
    "2 × linear_params × tokens_processed + 2 × lm_head_params × sampled_rows + "
    "4 × layers × heads × head_dim × attended_keys; linear_params = every per-layer matmul "
    "weight (q,k,v,o and MLP), no embeddings, norms or biases; the LM head counts only for rows "
    "that sample (one per output token); tokens_processed = prompt + output - 1 per request; "
    "attended_keys = causal keys per processed token (position + 1); recomputation after "
    "preemption and decode padding are not counted"
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    requests: int = 64
    seed: int = 0
    min_prompt: int = 16
    max_prompt: int = 256
    min_output: int = 16
    max_output: int = 256
    sequential_requests: int = 8  # transformers batch-1 runs on this many of the requests
    static_batch: int = 16
    static_batches: int = 2  # transformers static batching runs on this many whole batches
    gemm_size: int = 2048
    profile_dir: Path | None = None
    profile_decode_steps: int = 8


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_new_tokens: int


# -- workload ------------------------------------------------------------------------------


def make_workload(engine: Engine, options: BenchOptions) -> list[BenchRequest]:
    """Seeded prompts of random non-special token ids and uniform output lengths."""
    o = options
    if not 1 <= o.min_prompt <= o.max_prompt or not 1 <= o.min_output <= o.max_output:
        raise ValueError("need 1 ≤ min ≤ max for both prompt and output lengths")
    if o.max_prompt + o.max_output > engine.max_model_len:
        raise ValueError(
            f"max prompt ({o.max_prompt}) + max output ({o.max_output}) exceeds the engine's "
            f"max_model_len {engine.max_model_len}"
        )
    if o.requests < 1:
        raise ValueError("--requests must be at least 1")
    model = engine.model
    inner = model.tokenizer.inner
    special = {*inner.get_added_tokens_decoder(), *model.eos_token_ids}
    if model.config.bos_token_id is not None:
        special.add(model.config.bos_token_id)
    vocab = min(model.config.vocab_size, model.tokenizer.vocab_size)
    allowed = [t for t in range(vocab) if t not in special]
    rng = random.Random(o.seed)
    return [
        BenchRequest(
            prompt_token_ids=rng.choices(allowed, k=rng.randint(o.min_prompt, o.max_prompt)),
            max_new_tokens=rng.randint(o.min_output, o.max_output),
        )
        for _ in range(o.requests)
    ]


def _engine_requests(workload: Sequence[BenchRequest], prefix: str) -> list[EngineRequest]:
    return [
        EngineRequest(
            f"{prefix}{i}",
            r.prompt_token_ids,
            SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True),
        )
        for i, r in enumerate(workload)
    ]


# -- FLOP accounting -----------------------------------------------------------------------


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


def host_load() -> float | None:
    """The 1-minute load average: above the CPU count, other work competed for the CPUs."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak_gflops(
    device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 3, trials: int = 5
) -> float:
    """Best observed `torch.mm` rate on an n×n by n×n product, in GFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.mm(a, b)
    best = float("inf")
    for _ in range(trials):
        _sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b, out=c)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 * repeats / best / 1e9


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


def _percentiles(values: Sequence[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(present, [50, 90, 99])
    return {"p50": round(float(p50), 2), "p90": round(float(p90), 2), "p99": round(float(p99), 2)}


class DecodeTracker:
    """Tells pure-decode steps apart and counts each request's outputs so far.

    A step is pure decode when every sequence in it fed exactly one token and sampled, and
    each already had an output (so the token fed is its last output, not a prompt token).
    Tracking each request's outputs also gives the keys every decode attended to, which the
    FLOP count needs and `StepStats` does not carry.
    """

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


def _steady_decode(
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
        "steps": steps,
        "mean_batch": round(rows / steps, 1) if steps else None,
        "seconds": round(ns / 1e9, 3),
        "gflop": round(flops / 1e9, 1),
        "gflops": round(flops / ns, 2) if ns else None,
    }


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
        run = run_all(cast(Engine, recorder), requests)
    wall = time.perf_counter() - start

    tracker = DecodeTracker({r.request_id: len(r.prompt_token_ids) for r in requests})
    steady = _steady_decode(run, recorder.sampled, tracker, flop_model)
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
        "ttft_ms": _percentiles([c.ttft_ms for c in run.completions]),
        "tpot_ms": _percentiles([c.tpot_ms for c in run.completions]),
        "host_load_1m": [load_before, host_load()],
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


# -- profile -------------------------------------------------------------------------------


@contextmanager
def _profiler(device: torch.device) -> Iterator[torch.profiler.profile]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        yield prof


STEP_LABEL = "engine.step"
OUTSIDE_TORCH = "engine.step: Python outside torch ops (scheduler, prepare, collect)"


def _top_ops(prof: torch.profiler.profile, limit: int = 15) -> list[dict[str, Any]]:
    """Ops by self CPU time; the per-step labels' self time is the step's Python, summed."""
    calls: dict[str, int] = {}
    self_us: dict[str, float] = {}
    for e in prof.key_averages():
        name = OUTSIDE_TORCH if e.key.startswith(STEP_LABEL) else e.key
        calls[name] = calls.get(name, 0) + e.count
        self_us[name] = self_us.get(name, 0.0) + e.self_cpu_time_total
    total = sum(self_us.values()) or 1.0
    ranked = sorted(self_us, key=self_us.__getitem__, reverse=True)[:limit]
    return [
        {
            "name": name,
            "calls": calls[name],
            "self_cpu_ms": round(self_us[name] / 1e3, 2),
            "self_cpu_pct": round(100 * self_us[name] / total, 1),
        }
        for name in ranked
    ]


def profile_engine(
    engine: Engine, workload: Sequence[BenchRequest], out_dir: Path, decode_steps: int
) -> dict[str, Any]:
    """Re-run the workload's start under the profiler, in two Chrome traces: "prefill", the
    steps up to and including the first pure-decode one, and "decode", the next
    `decode_steps` steps. The remaining requests are then aborted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    requests = _engine_requests(workload, "profile-")
    for r in requests:
        engine.add(r)
    tracker = DecodeTracker({r.request_id: len(r.prompt_token_ids) for r in requests})
    report: dict[str, Any] = {}
    for phase, limit in (("prefill", 256), ("decode", decode_steps)):
        steps = 0
        with _profiler(engine.model.device) as prof:
            while engine.has_work() and steps < limit:
                with torch.profiler.record_function(f"{STEP_LABEL} {phase} #{steps}"):
                    out = engine.step()
                steps += 1
                is_decode = tracker.observe(out.stats, [i for i, _ in out.new_tokens]) is not None
                if phase == "prefill" and is_decode:
                    break
        trace = out_dir / f"engine-{phase}-trace.json"
        prof.export_chrome_trace(str(trace))
        report[phase] = {"trace": str(trace), "steps": steps, "top_ops": _top_ops(prof)}
    for r in requests:
        engine.abort(r.request_id)
    return report


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
    say: Progress,
) -> dict[str, Any]:
    """Contenders 2 and 3, or why they were skipped."""
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
    engine: Engine, options: BenchOptions, progress: Progress | None = None
) -> dict[str, Any]:
    """Run every contender on one workload; a JSON-ready report (see `ops/cmd_bench.py`)."""
    say = progress or (lambda _: None)
    o = options
    m = engine.model
    workload = make_workload(engine, o)
    flop_model = FlopModel.of(m.config)

    say(f"GEMM peak: torch.mm {o.gemm_size}² {m.dtype} on {m.device}")
    peak = gemm_peak_gflops(m.device, m.dtype, o.gemm_size)

    say(f"engine: {len(workload)} requests in one continuous batch")
    engine_stats, steady, engine_out = bench_engine(engine, workload, flop_model)

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
            "gemm": f"torch.mm {o.gemm_size}×{o.gemm_size} {dtype}, best of 5 × 3 products",
            "gemm_peak_gflops": round(peak, 2),
            "engine_gflop": round(engine_flops / 1e9, 1),
            "engine_gflops": round(engine_gflops, 2),
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
        report["profile"] = profile_engine(engine, workload, o.profile_dir, o.profile_decode_steps)
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
