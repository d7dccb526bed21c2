"""`bench quant`: one model loaded each way its weights can be held (`SCHEMES`), side by side in
one run (`tokenmill bench quant --help`). Weight bytes: what the model module holds (packed
copies included); loaded bytes: the weights as loaded; neither counts the KV pool. Batch
tokens/s: output tokens over the run's wall time (prefill included), greedy, EOS ignored.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Iterator
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
from ops.bench.report import Narrate, Report, quiet, ratio
from ops.bench.runs import BATCH1_NEW_TOKENS, batch1, measure, warm
from ops.bench.workload import Workload, engine_requests

if TYPE_CHECKING:
    from ops.quant.evaluate import Scores

SCHEMES = ("fp32", "bf16", "int8", "int4", "gguf", "mixed")
F32, BF16 = torch.float32, torch.bfloat16
LOADS = {  # scheme -> (compute dtype, load quantization); mixed loads its checkpoint with auto
    "fp32": (F32, "none"), "bf16": (BF16, "none"), "int8": (F32, "int8"),
    "int4": (F32, "int4"), "gguf": (F32, "auto"), "mixed": (F32, "auto"),
}  # fmt: skip
DEFAULT_MODELS = ("smollm2-135m", "gemma3-270m")
DEFAULT_HELDOUT = Path(__file__).resolve().parents[1] / "samples" / "heldout.txt"
RATIOS = {"decode": "decode_tokens_per_s", "batch": "batch_tokens_per_s"}  # ratio name -> figure
RATIOS |= {k: k for k in ("weight_bytes", "loaded_bytes", "perplexity")}
# name -> (scheme, ratio, target, at_most); issue "Quantized weights that stay quantized"
TARGETS = {
    "int8_decode_vs_fp32": ("int8", "decode", 1.6, False),
    "int4_decode_vs_fp32": ("int4", "decode", 2.5, False),
    "int8_perplexity_vs_fp32": ("int8", "perplexity", 1.02, True),
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
    """`int8,fp32` -> ('fp32', 'int8'), in run order: fp32 first (the others' reference)."""
    given = {s.strip().lower() for s in text.split(",") if s.strip()}
    return tuple([s for s in SCHEMES if s in given] + sorted(given - set(SCHEMES)))


def default_models() -> tuple[str, ...]:
    """SmolLM2, and Gemma 3 where it has been fetched (`tokenmill models fetch gemma3-270m`)."""
    from ops.models.registry import is_cached

    return tuple(m for m in DEFAULT_MODELS if m == DEFAULT_MODELS[0] or is_cached(m))


def quantized_kernel(device: torch.device) -> str:
    """Which kernel quantized linears run on here (`gpu.quant.linear.quantized_matmul`)."""
    from gpu.kernels.native import cpu_kernels
    from gpu.quant import triton_linear

    if device.type == "cuda":
        return "triton" if triton_linear.available() else "dequantize-per-call"
    return "native" if hasattr(cpu_kernels(), "qlinear") else "dequantize-per-call"


def measure_row(
    model: LoadedModel, scheme: str, o: QuantBenchOptions, say: Narrate
) -> dict[str, Any]:
    """One row's speed and size figures for a loaded model."""
    quantization = LOADS[scheme][1]
    tokens = min(o.decode_tokens, o.bf16_decode_tokens) if scheme == "bf16" else o.decode_tokens

    def engine(max_model_len: int, max_num_seqs: int) -> Engine:
        config = EngineConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                              quantization=quantization)  # fmt: skip
        return Engine(model, config)

    say(f"  batch 1: a {tokens}-token prompt, {tokens} new tokens (twice: bare and clocked)")
    single = batch1(engine(2 * tokens, 1), o.seed, tokens)
    say(f"  batch {o.batch}: prompts of {o.batch_prompt_tokens} tokens, {o.batch_new_tokens} new")
    many = engine(max(o.batch_prompt_tokens + o.batch_new_tokens, 12), o.batch)  # warm: 8 + 4
    shape = (o.batch, o.batch_prompt_tokens, o.batch_new_tokens)
    work = Workload(seed=o.seed).fixed(*shape).build(many)
    warm(many, work[0].prompt_token_ids)
    batch = measure(many, engine_requests(work, "batch-")).stats()
    held, loaded = module_bytes(model.module), weight_bytes(model.module)
    return {
        "scheme": scheme, "dtype": str(model.dtype).removeprefix("torch."),
        "quantization": quantization, "weights": model.quantization,
        "linear_kernel": model.linear_kernel, "weight_bytes": held,
        "packed_bytes": model.packed_bytes, "loaded_bytes": loaded,
        "weight_mb": round(held / 2**20, 1), "loaded_mb": round(loaded / 2**20, 1),
        "decode_tokens_per_s": single["decode_tokens_per_s"],
        "batch_tokens_per_s": batch["output_tokens_per_s"],
        "batch1": single, "batch": batch | {"attention_kernel": many.attention_kernel},
    }  # fmt: skip


def quality(
    model: LoadedModel, text: str, reference: Scores | None
) -> tuple[dict[str, Any], Scores]:
    """Perplexity of the held-out text, and top-1 agreement with `reference` (fp32's scores of
    the same tokens, the text fed in; None: not measured)."""
    from ops.quant.evaluate import perplexity, score, top1_agreement

    scores = score(model, model.tokenizer.encode(text), keep=False)
    agreement = None if reference is None else top1_agreement(reference, scores)
    return {
        "heldout_tokens": scores.tokens,
        "perplexity": round(perplexity(scores), 4),
        "top1_agreement": None if agreement is None else round(agreement, 4),
    }, scores


@contextmanager
def mixed_checkpoint(
    source: Path, given: Path | None, device: torch.device | None, say: Narrate
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """`given`, or `source` quantized to int4 by `quantize_checkpoint` (its default threshold
    for keeping sensitive layers in float) into a temporary folder; with what it says of it."""
    if given is not None:
        yield given, {"checkpoint": str(given), "made_here": False}
        return
    from ops.quant.sensitivity import quantize_checkpoint

    def progress(done: int, total: int, layer: str) -> None:
        if done == total or done % max(1, total // 10) == 0:
            say(f"    sensitivity: {done} of {total} layers ({layer})")

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-mixed-") as tmp:
        say(f"  quantize_checkpoint({source.name}, to=int4) into {tmp}")
        made = quantize_checkpoint(source, "int4", Path(tmp), device=device, progress=progress)
        yield Path(tmp), {
            "checkpoint": None, "made_here": True, "to": made.scheme,
            "keep_threshold": made.keep_threshold, "kept": made.kept, "unfit": made.unfit,
            "calibration_tokens": made.calibration_tokens,
            "quantize_s": round(made.timings.get("total_s", 0.0), 1),
        }  # fmt: skip


def bench_model(name: str, o: QuantBenchOptions, say: Narrate) -> dict[str, Any]:
    """Every scheme's row for one model, with its ratios to the fp32 row."""
    from ops.models.registry import resolve_model

    path = resolve_model(name)
    text = o.heldout.read_text("utf-8") if o.heldout.is_file() else None
    rows: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"name": name, "path": str(path)}
    reference: Scores | None = None  # fp32's, for top-1 agreement
    for scheme in o.schemes:
        if scheme == "gguf" and path.suffix != ".gguf":
            why = "not a GGUF file: it has no quantized blocks of its own"
            rows.append({"scheme": scheme, "skipped": why})
            continue
        say(f"{name} {scheme}: loading")
        with ExitStack() as stack:
            source, extra = path, {}
            if scheme == "mixed":
                try:
                    making = mixed_checkpoint(path, o.mixed_from.get(name), o.device, say)
                    source, made = stack.enter_context(making)
                except (ImportError, FileNotFoundError) as exc:  # quantize's code or texts
                    rows.append({"scheme": scheme, "skipped": f"no mixed checkpoint: {exc}"})
                    continue
                extra = {"mixed": made}
            start, (dtype, quantization) = time.perf_counter(), LOADS[scheme]
            model = load_model(source, name=name, dtype=dtype, device=o.device,
                               quantization=quantization)  # fmt: skip
            load_s = round(time.perf_counter() - start, 2)
        c = model.config
        facts |= {"arch": c.arch, "parameters": c.num_parameters(), "digest": model.digest}
        with torch.inference_mode():
            row = {**measure_row(model, scheme, o, say), "load_s": load_s, **extra}
            if text is not None:
                say(f"  perplexity and top-1 agreement over {o.heldout.name}")
                figures, scores = quality(model, text, reference)
                row |= figures
                if scheme == "fp32":
                    reference, row["top1_agreement"] = scores, 1.0  # the reference itself
        rows.append(row)
        del model
        gc.collect()
    return {**facts, "rows": add_ratios(rows)}


def add_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured row with `vs_fp32`: its figures over the fp32 row's (None without one)."""
    base = next((r for r in rows if r["scheme"] == "fp32" and "skipped" not in r), {})
    for row in rows:
        if "skipped" not in row:
            row["vs_fp32"] = {
                k: ratio(row.get(f), base.get(f), 4 if k == "perplexity" else 3)
                for k, f in RATIOS.items()
            }
    return rows


def add_targets(report: Report) -> None:
    """Each model's targets (`TARGETS`), from its rows' ratios to fp32."""
    for model in report["models"]:
        vs = {r["scheme"]: r.get("vs_fp32", {}) for r in model["rows"]}
        for name, (scheme, figure, target, at_most) in TARGETS.items():
            value = vs.get(scheme, {}).get(figure)
            report.target(f"{model['name']} {name}", value, target, at_most=at_most)


def run_quant_bench(o: QuantBenchOptions, say: Narrate = quiet) -> Report:
    """Every model's rows; the report (see `ops/bench/cli.py`)."""
    device = o.device or default_device()
    report = Report("quant")
    report["environment"] = {
        "device": str(device),
        "quantized_linear_kernel": quantized_kernel(device),
        "native_kernels": os.environ.get("TOKENMILL_NATIVE_KERNELS", "1") != "0",
    }
    d, b = o.decode_tokens, min(o.decode_tokens, o.bf16_decode_tokens)
    report["settings"] = {
        "schemes": list(o.schemes), "heldout": str(o.heldout), "seed": o.seed,
        "decode": {"prompt_tokens": d, "new_tokens": d, "bf16_tokens": b},
        "batch": {"requests": o.batch, "prompt_tokens": o.batch_prompt_tokens,
                  "new_tokens": o.batch_new_tokens},
    }  # fmt: skip
    report["quality"] = None if o.heldout.is_file() else f"no held-out text at {o.heldout}"
    report["models"] = [bench_model(name, o, say) for name in o.models]
    add_targets(report)
    for model in report["models"]:
        for r in model["rows"]:
            keys = ("skipped", "weight_mb", "decode_tokens_per_s", "batch_tokens_per_s")
            report.headline(f"{model['name']} {r['scheme']}", r, *keys, "perplexity", "vs_fp32")
    return report.finish()
