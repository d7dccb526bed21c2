"""The quantization benchmark: one model loaded each way its weights can be held, side by side.

For each model and each scheme (`fp32`, `bf16`, `int8`, `int4`, `gguf`: the file's own blocks
kept quantized, `mixed`: a `tokenmill quantize` checkpoint), in one process, one after another:
the weight bytes the model holds, batch-1 decode tokens/s (`bench engine`'s `batch1`), the
tokens/s of a short workload of `--batch` requests decoding together (`bench engine`'s
`bench_engine`), and, over a held-out text, perplexity and greedy top-1 agreement with fp32
(`ops.quant.evaluate`). Each figure also as a ratio to the same run's fp32 row; targets are
reported (met or not), never asserted.

`run_quant_bench(options)` returns one JSON-ready dict (ratios and targets:
`ops/bench/quant_report.py`); `ops/bench/quant_table.py` prints it.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpu.device import default_device
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.memory.held_bytes import module_bytes, weight_bytes
from ops.bench.engine import bench_engine
from ops.bench.flops import FlopModel
from ops.bench.narrate import Narrate
from ops.bench.quant_report import add_ratios, busy_host, targets
from ops.bench.step_time import BATCH1_NEW_TOKENS, batch1
from ops.bench.workload import BenchOptions, host_load, make_workload

if TYPE_CHECKING:
    from ops.quant.evaluate import Scores

SCHEMES = ("fp32", "bf16", "int8", "int4", "gguf", "mixed")
# scheme -> (compute dtype, `load_model`'s quantization); mixed loads its checkpoint with auto
LOADS: dict[str, tuple[torch.dtype, str]] = {
    "fp32": (torch.float32, "none"),
    "bf16": (torch.bfloat16, "none"),
    "int8": (torch.float32, "int8"),
    "int4": (torch.float32, "int4"),
    "gguf": (torch.float32, "auto"),
    "mixed": (torch.float32, "auto"),
}
DEFAULT_MODELS = ("smollm2-135m", "gemma3-270m")
DEFAULT_HELDOUT = Path(__file__).resolve().parents[1] / "samples" / "heldout.txt"
MIXED_TO = "int4"  # what `quantize_checkpoint` quantizes to for the mixed row

WEIGHT_BYTES = {
    "weight_bytes": "what the model module holds: parameters and buffers (quantized integers, "
    "scales and offsets; RoPE tables), tied weights once, oneDNN-packed copies included "
    "(packed_bytes: how much of it they are); not the KV pool",
    "loaded_bytes": "the weights as loaded (gpu.memory.footprint.weight_bytes): parameters and "
    "persistent buffers, tied once; no packed copies, no RoPE tables",
}


@dataclass(frozen=True)
class QuantBenchOptions:
    models: tuple[str, ...] = DEFAULT_MODELS
    schemes: tuple[str, ...] = SCHEMES
    decode_tokens: int = BATCH1_NEW_TOKENS  # batch 1: a prompt of as many, as many new tokens
    bf16_decode_tokens: int = 32  # bf16 matmuls are slow on most CPUs: a shorter batch-1 run
    batch: int = 64
    batch_prompt_tokens: int = 32
    batch_new_tokens: int = 32
    heldout: Path = DEFAULT_HELDOUT
    mixed_from: dict[str, Path] = field(default_factory=dict)  # model -> quantized checkpoint
    device: torch.device | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [s for s in self.schemes if s not in SCHEMES]
        if unknown or not self.schemes:
            raise ValueError(
                f"unknown scheme(s) {', '.join(unknown) or '(none given)'}: "
                f"expected some of {','.join(SCHEMES)}"
            )
        if not 1 <= self.decode_tokens <= BATCH1_NEW_TOKENS:
            raise ValueError(f"decode tokens must be 1 to {BATCH1_NEW_TOKENS}")


def parse_schemes(text: str) -> tuple[str, ...]:
    """`fp32,int8` -> ('fp32', 'int8'), in run order: fp32 first (the others' reference)."""
    given = {s.strip().lower() for s in text.split(",") if s.strip()}
    return tuple([s for s in SCHEMES if s in given] + sorted(given - set(SCHEMES)))


def quantized_kernel(device: torch.device) -> str:
    """Which kernel quantized linears run on here (`gpu.quant.linear.quantized_matmul`)."""
    if device.type == "cuda":
        from gpu.quant import triton_linear

        return "triton" if triton_linear.available() else "dequantize-per-call"
    from gpu.kernels.native import cpu_kernels

    kernels = cpu_kernels()
    native = kernels is not None and hasattr(kernels, "qlinear")
    return "native" if native else "dequantize-per-call"


# -- one row -------------------------------------------------------------------------------


def _engine(model: LoadedModel, quantization: str, max_model_len: int, seqs: int) -> Engine:
    config = EngineConfig(max_model_len=max_model_len, max_num_seqs=seqs, quantization=quantization)
    return Engine(model, config)


def decode_rate(model: LoadedModel, quantization: str, tokens: int, seed: int) -> dict[str, Any]:
    """`bench engine`'s batch 1 with a `tokens`-token prompt and `tokens` new tokens: an engine
    of max_model_len 2 × tokens makes `batch1` pick that fit (both at most 128)."""
    engine = _engine(model, quantization, 2 * tokens, 1)
    return batch1(engine, BenchOptions(seed=seed))


def batch_rate(model: LoadedModel, quantization: str, o: QuantBenchOptions) -> dict[str, Any]:
    """`bench engine`'s engine contender on `o.batch` prompts of `o.batch_prompt_tokens`
    random tokens, `o.batch_new_tokens` new each (greedy, EOS ignored), all added at once."""
    length = o.batch_prompt_tokens + o.batch_new_tokens
    # at least bench_engine's warm-up: up to 8 prompt tokens, 4 new
    engine = _engine(model, quantization, max(length, 12), o.batch)
    shape = BenchOptions(
        requests=o.batch,
        seed=o.seed,
        min_prompt=o.batch_prompt_tokens,
        max_prompt=o.batch_prompt_tokens,
        min_output=o.batch_new_tokens,
        max_output=o.batch_new_tokens,
    )
    stats, steady, _ = bench_engine(
        engine, make_workload(engine, shape), FlopModel.of(model.config)
    )
    decode_rows = (steady["mean_batch"] or 0) * steady["steps"]
    return {
        "requests": stats["requests"],
        "prompt_tokens": stats["prompt_tokens"],
        "output_tokens": stats["output_tokens"],
        "wall_s": stats["wall_s"],
        "output_tokens_per_s": stats["output_tokens_per_s"],
        "steps": stats["steps"],
        "preemptions": stats["preemptions"],
        "decode_only_steps": steady["steps"],
        "decode_only_tokens_per_s": (
            round(decode_rows / steady["seconds"], 2) if steady["seconds"] else None
        ),
        "attention_kernel": engine.attention_kernel,
        "host_load_1m": stats["host_load_1m"],
    }


def measure(model: LoadedModel, scheme: str, o: QuantBenchOptions, say: Narrate) -> dict[str, Any]:
    """One row's figures for a loaded model (quality figures are added by the caller)."""
    quantization = LOADS[scheme][1]
    tokens = min(o.decode_tokens, o.bf16_decode_tokens) if scheme == "bf16" else o.decode_tokens
    say(f"  batch 1: a {tokens}-token prompt, {tokens} new tokens (twice: bare and clocked)")
    single = decode_rate(model, quantization, tokens, o.seed)
    say(
        f"  batch {o.batch}: prompts of {o.batch_prompt_tokens} tokens, "
        f"{o.batch_new_tokens} new each"
    )
    many = batch_rate(model, quantization, o)
    held = module_bytes(model.module)
    loaded = weight_bytes(model.module)
    return {
        "scheme": scheme,
        "dtype": str(model.dtype).removeprefix("torch."),
        "quantization": quantization,
        "weights": model.quantization,  # the linear weights' formats, by share of elements
        "linear_kernel": model.linear_kernel,
        "weight_bytes": held,
        "packed_bytes": model.packed_bytes,
        "loaded_bytes": loaded,
        "weight_mb": round(held / 2**20, 1),
        "loaded_mb": round(loaded / 2**20, 1),
        "decode_tokens_per_s": single["decode_tokens_per_s"],
        "batch_tokens_per_s": many["output_tokens_per_s"],
        "batch1": single,
        "batch": many,
    }


# -- quality: perplexity and top-1 agreement over the held-out text ------------------------


def heldout_text(path: Path) -> str | None:
    return path.read_text("utf-8") if path.is_file() else None


def quality(
    model: LoadedModel, text: str, reference: Scores | None
) -> tuple[dict[str, Any], Scores]:
    """Perplexity of the held-out text, and top-1 agreement with `reference` (fp32's scores
    of the same tokens; None: not measured): the share of positions whose greedy next token,
    the text's true tokens fed in (teacher forcing), is fp32's."""
    from ops.quant.evaluate import perplexity, score, top1_agreement

    scores = score(model, model.tokenizer.encode(text), keep=False)
    agreement = None if reference is None else top1_agreement(reference, scores)
    return {
        "heldout_tokens": scores.tokens,
        "perplexity": round(perplexity(scores), 4),
        "top1_agreement": None if agreement is None else round(agreement, 4),
    }, scores


# -- the mixed row's checkpoint ------------------------------------------------------------


@contextmanager
def mixed_checkpoint(
    source: Path, given: Path | None, device: torch.device | None, say: Narrate
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """`given` as it is, or `source` quantized to int4 by `quantize_checkpoint` (its default
    threshold for keeping sensitive layers in float) into a temporary folder for the run;
    with what the run says of it."""
    if given is not None:
        yield given, {"checkpoint": str(given), "made_here": False}
        return
    from ops.quant.sensitivity import quantize_checkpoint

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-mixed-") as tmp:
        say(f"  quantize_checkpoint({source.name}, to={MIXED_TO}) into {tmp}")
        made = quantize_checkpoint(
            source, MIXED_TO, Path(tmp), device=device, progress=_every_tenth(say)
        )
        yield (
            Path(tmp),
            {
                "checkpoint": None,  # a temporary folder, gone after the row
                "made_here": True,
                "to": made.scheme,
                "keep_threshold": made.keep_threshold,
                "kept": made.kept,
                "unfit": made.unfit,
                "calibration_tokens": made.calibration_tokens,
                "quantize_s": round(made.timings.get("total_s", 0.0), 1),
            },
        )


def _every_tenth(say: Narrate) -> Callable[[int, int, str], None]:
    """quantize_checkpoint's per-layer progress, told at every tenth of the layers."""

    def progress(done: int, total: int, layer: str) -> None:
        if done == total or done % max(1, total // 10) == 0:
            say(f"    sensitivity: {done} of {total} layers ({layer})")

    return progress


# -- the whole benchmark -------------------------------------------------------------------


def _skip(scheme: str, reason: str) -> dict[str, Any]:
    return {"scheme": scheme, "skipped": reason}


def _load(path: Path, name: str, scheme: str, device: torch.device | None) -> LoadedModel:
    dtype, quantization = LOADS[scheme]
    return load_model(path, name=name, dtype=dtype, device=device, quantization=quantization)


def bench_model(name: str, o: QuantBenchOptions, say: Narrate) -> dict[str, Any]:
    """Every scheme's row for one model, with its ratios to the fp32 row."""
    from ops.models.registry import resolve_model

    path = resolve_model(name)
    text = heldout_text(o.heldout)
    rows: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"name": name, "path": str(path)}
    reference: Scores | None = None  # fp32's, for top-1 agreement
    for scheme in o.schemes:
        if scheme == "gguf" and path.suffix != ".gguf":
            rows.append(_skip(scheme, "not a GGUF file: it has no quantized blocks of its own"))
            continue
        say(f"{name} {scheme}: loading")
        with ExitStack() as stack:
            source, extra = path, {}
            if scheme == "mixed":
                given = o.mixed_from.get(name)
                try:
                    making = mixed_checkpoint(path, given, o.device, say)
                    source, made = stack.enter_context(making)
                except (ImportError, FileNotFoundError) as exc:  # quantize's code or texts
                    rows.append(_skip(scheme, f"no mixed checkpoint: {exc}"))
                    continue
                extra = {"mixed": made}
            start = time.perf_counter()
            model = _load(source, name, scheme, o.device)
            load_s = round(time.perf_counter() - start, 2)
        facts.setdefault("arch", model.config.arch)
        facts.setdefault("parameters", model.config.num_parameters())
        facts.setdefault("digest", model.digest)
        with torch.inference_mode():
            row = {**measure(model, scheme, o, say), "load_s": load_s, **extra}
            if text is not None:
                say(f"  perplexity and top-1 agreement over {o.heldout.name}")
                figures, scores = quality(model, text, reference)
                row |= figures
                if scheme == "fp32":
                    reference, row["top1_agreement"] = scores, 1.0  # the reference itself
        rows.append(row)
        del model
        gc.collect()
    return {**facts, "rows": add_ratios(rows), "targets": targets(rows)}


def default_models() -> tuple[str, ...]:
    """SmolLM2, and Gemma 3 where it has been fetched (`tokenmill models fetch gemma3-270m`)."""
    from ops.models.registry import is_cached

    return tuple(m for m in DEFAULT_MODELS if m == DEFAULT_MODELS[0] or is_cached(m))


def run_quant_bench(o: QuantBenchOptions, progress: Narrate | None = None) -> dict[str, Any]:
    """Every model's rows; a JSON-ready report (see `ops/bench/cli.py`)."""
    say = progress or (lambda _: None)
    device = o.device or default_device()
    report: dict[str, Any] = {
        "benchmark": "quant",
        "environment": {
            "torch": torch.__version__,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "quantized_linear_kernel": quantized_kernel(device),
            "native_kernels": os.environ.get("TOKENMILL_NATIVE_KERNELS", "1") != "0",
            "host_load_1m_at_start": host_load(),
        },
        "settings": {
            "schemes": list(o.schemes),
            "decode": {
                "prompt_tokens": o.decode_tokens,
                "new_tokens": o.decode_tokens,
                "bf16_tokens": min(o.decode_tokens, o.bf16_decode_tokens),
                "what": "bench engine's batch 1: tokens after the first over their time",
            },
            "batch": {
                "requests": o.batch,
                "prompt_tokens": o.batch_prompt_tokens,
                "new_tokens": o.batch_new_tokens,
                "what": "bench engine's engine contender: output tokens over the run's wall time "
                "(prefill included), all requests added at once, greedy, EOS ignored",
            },
            "weight_bytes": WEIGHT_BYTES,
            "heldout": str(o.heldout),
            "seed": o.seed,
        },
        "quality": None if o.heldout.is_file() else f"no held-out text at {o.heldout}",
        "models": [bench_model(name, o, say) for name in o.models],
    }
    report["environment"]["host_load_1m_at_end"] = host_load()
    report["warnings"] = busy_host(report)
    return report
