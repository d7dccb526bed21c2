"""Post-training quantization with a sensitivity report: `tokenmill quantize`'s engine.

For each linear layer the scheme can take, only that layer is quantized (in place), the model
scores the calibration text, and the float layer is put back: how much its quantization alone
raises perplexity, and the KL divergence of its next-token distributions from the float
model's. Layers whose relative perplexity increase (ppl_layer / ppl_float - 1) is above the
keep threshold stay in full precision; every other one is quantized, the checkpoint is
written (`ops.quant.checkpoint`), loaded back as it will be served, and compared with the
float model on the calibration tokens (and on a held-out text, when given).

With a tied LM head (SmolLM2, Gemma), quantizing `lm_head` quantizes the embedding table too
(they are one matrix), so its row measures both.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from gpu.loading.loader import LoadedModel, load_model
from gpu.model_config import ModelConfig
from gpu.models.packed_linear import PackedLinear
from gpu.quant.linear import QuantizedEmbedding, QuantizedLinear
from gpu.quant.scheme import Quantization
from ops.quant.checkpoint import WEIGHTS, supported, write_checkpoint
from ops.quant.evaluate import Comparison, Scores, compare, kl_divergence, perplexity, score
from ops.quant.evaluate import top1_agreement as agreement

# Keep a layer in float when quantizing it alone raises calibration perplexity by more than 2%.
# It keeps the outliers, not the bulk (SmolLM2-135M, 512 tokens, measured 2026-12-01): in int8
# no layer costs more than +0.23% (nothing kept; the model +0.7%); in int4-g32 the tied
# head/table costs +10% and is kept, the rest ~0 (the GGUF's weights are Q4_1 already). Where
# many layers each cost ~1% (int4-g128) no threshold saves the scheme: 0.0025 keeps 47 of 121
# layers and held-out perplexity is still +8%, while calibration perplexity falls below the
# float model's (layers picked on those same tokens): judge a threshold on a held-out text.
DEFAULT_KEEP_THRESHOLD = 0.02
DEFAULT_TOKENS = 512  # calibration tokens each layer is scored on
MIN_TOKENS = 16
TARGETS = ("int8", "int4", "int4-g32", "int4-g128")  # what --to accepts

# progress(done, total, layer name) after each measured layer
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class LayerSensitivity:
    """One layer quantized alone, against the float model on the calibration tokens."""

    name: str
    ppl: float
    delta_ppl: float  # relative: ppl / float ppl - 1 (0.01 = +1%)
    kl: float  # mean KL(p_float || p_layer quantized), nats
    top1_agreement: float
    seconds: float  # to quantize, score and restore it


@dataclass
class QuantizeReport:
    """What `quantize_checkpoint` measured and wrote."""

    source: str
    output: str
    scheme: str  # int8 | int4-g32 | int4-g128
    keep_threshold: float
    calibration: str
    calibration_tokens: int
    float_ppl: float  # the float model on the calibration tokens
    layers: list[LayerSensitivity]  # most sensitive first
    kept: list[str]  # measured and above the threshold: float in the checkpoint
    quantized: list[str]  # every other layer the scheme can take
    unfit: list[str]  # layers the scheme cannot take (input features): float too
    calibration_eval: Comparison  # the written checkpoint against the float model
    heldout: str | None = None
    heldout_eval: Comparison | None = None
    quantization: str = "none"  # the checkpoint's formats (`gpu.quant.scheme.describe`)
    checkpoint_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def linear_layers(module: nn.Module, scheme: Quantization) -> tuple[list[str], list[str]]:
    """The float linear layers (module names) the scheme can take, and those it cannot."""
    fit: list[str] = []
    unfit: list[str] = []
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear | PackedLinear):
            (fit if scheme.fits(m.in_features) else unfit).append(name)
    return fit, unfit


@contextmanager
def quantized_layers(
    module: nn.Module, config: ModelConfig, names: Sequence[str], scheme: Quantization
) -> Iterator[None]:
    """`names` (float linears of `module`) replaced by QuantizedLinears for the duration; the
    float modules are put back on exit. A tied `lm_head` brings the embedding table along."""
    undo: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for name in names:
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            layer = getattr(parent, attr)
            weight = scheme.quantize(layer.weight.detach())  # [out, in]
            bias = None if layer.bias is None else layer.bias.detach()
            undo.append((parent, attr, layer))
            setattr(parent, attr, QuantizedLinear(weight, bias))
            if name == "lm_head" and config.tie_word_embeddings:
                table = "wte" if hasattr(module, "wte") else "embed_tokens"
                embed = getattr(module, table)
                undo.append((module, table, embed))
                setattr(module, table, QuantizedEmbedding(weight, embed.weight.dtype))
        yield
    finally:
        for parent, attr, layer in reversed(undo):
            setattr(parent, attr, layer)


def layer_sensitivity(
    model: LoadedModel,
    scheme: Quantization,
    token_ids: Sequence[int],
    reference: Scores,
    names: Sequence[str],
    progress: Progress | None = None,
) -> list[LayerSensitivity]:
    """Each of `names` quantized alone and scored against `reference` (the float model's
    scores of `token_ids`, distributions kept), most sensitive first."""
    float_ppl = perplexity(reference)
    rows: list[LayerSensitivity] = []
    for i, name in enumerate(names):
        began = time.perf_counter()
        with quantized_layers(model.module, model.config, [name], scheme):
            scores = score(model, token_ids, chunk=len(token_ids))
        ppl = perplexity(scores)
        rows.append(
            LayerSensitivity(
                name=name,
                ppl=ppl,
                delta_ppl=ppl / float_ppl - 1.0,
                kl=kl_divergence(reference, scores),
                top1_agreement=agreement(reference, scores),
                seconds=time.perf_counter() - began,
            )
        )
        if progress is not None:
            progress(i + 1, len(names), name)
    return sorted(rows, key=lambda r: (-r.delta_ppl, -r.kl))


def kept_layers(rows: Sequence[LayerSensitivity], threshold: float) -> list[str]:
    """The layers whose relative perplexity increase is above `threshold`, most sensitive first."""
    return [r.name for r in rows if r.delta_ppl > threshold]


def calibration_tokens(model: LoadedModel, text: str, tokens: int, what: str) -> list[int]:
    """The first `tokens` tokens of `text`; ValueError when it has fewer."""
    ids = model.tokenizer.encode(text)
    if len(ids) < tokens:
        raise ValueError(
            f"{what} has {len(ids)} tokens, fewer than the {tokens} asked for: "
            "give a longer text or fewer tokens"
        )
    return ids[:tokens]


def quantize_checkpoint(
    source: Path,
    to: str,
    out: Path,
    calibration: Path | None = None,
    keep_threshold: float | None = None,
    *,
    tokens: int = DEFAULT_TOKENS,
    heldout: Path | None = None,
    layers: Collection[str] | None = None,
    device: torch.device | str | None = None,
    progress: Progress | None = None,
) -> QuantizeReport:
    """Quantize the checkpoint at `source` (an HF folder or a .gguf) to `to` (int8, int4 =
    int4-g32, int4-g128), keeping in float the layers whose quantization alone raises the
    perplexity of the first `tokens` tokens of `calibration` (default: the shipped
    `ops/samples/calibration.txt`) by more than `keep_threshold` (relative; default
    DEFAULT_KEEP_THRESHOLD), and write the checkpoint to the folder `out`.

    `heldout`: a text the written checkpoint is also compared on (all of it). `layers`: measure
    only these (quick looks, tests); the others are quantized unmeasured. The model is loaded
    in float32 (on `device`, default CUDA when present). Raises ValueError for a bad scheme,
    threshold or text, `gpu.errors.CheckpointError` for a bad source.
    """
    began = time.perf_counter()
    timings: dict[str, float] = {}
    scheme = Quantization.parse(to)
    if not scheme.quantizes_floats:
        raise ValueError(f"--to must be one of {', '.join(TARGETS)}, not {to!r}")
    threshold = DEFAULT_KEEP_THRESHOLD if keep_threshold is None else float(keep_threshold)
    if not math.isfinite(threshold) or threshold < 0:
        raise ValueError(f"the keep threshold must be a finite number >= 0, not {threshold}")
    if tokens < MIN_TOKENS:
        raise ValueError(f"calibration needs at least {MIN_TOKENS} tokens, not {tokens}")
    calibration = calibration or default_calibration()
    texts = {"calibration": calibration.read_text("utf-8")}  # unreadable: before any work
    if heldout is not None:
        texts["heldout"] = heldout.read_text("utf-8")

    lap = time.perf_counter()
    model = load_model(Path(source), dtype=torch.float32, device=device, quantization="none")
    supported(model.config, Path(source))
    ids = calibration_tokens(model, texts["calibration"], tokens, str(calibration))
    heldout_ids = None
    if heldout is not None:
        heldout_ids = model.tokenizer.encode(texts["heldout"])
        if len(heldout_ids) < MIN_TOKENS:
            raise ValueError(f"{heldout} has {len(heldout_ids)} tokens: too short to compare on")
    names, unfit = linear_layers(model.module, scheme)
    if layers is not None and (unknown := set(layers) - set(names)):
        raise ValueError(f"not linear layers {scheme.name} can take: {sorted(unknown)}")
    timings["load_s"] = time.perf_counter() - lap

    lap = time.perf_counter()
    reference = score(model, ids, chunk=len(ids))
    float_ppl = perplexity(reference)
    timings["reference_s"] = time.perf_counter() - lap
    lap = time.perf_counter()
    measured = [n for n in names if layers is None or n in layers]
    rows = layer_sensitivity(model, scheme, ids, reference, measured, progress)
    timings["sensitivity_s"] = time.perf_counter() - lap
    if rows:
        timings["per_layer_s"] = timings["sensitivity_s"] / len(rows)
    del reference  # its distributions: tokens × vocab floats

    kept = kept_layers(rows, threshold)
    quantize = [n for n in names if n not in kept]
    recorded = {
        "scheme": scheme.name,
        "bits": 8 if scheme.method == "int8" else 4,
        "group": scheme.group,  # None: per output channel; see Quantization.group_for
        "kept": kept,
        "unfit": unfit,
        "keep_threshold": threshold,
        "calibration": calibration.name,
        "calibration_tokens": len(ids),
    }
    lap = time.perf_counter()
    with quantized_layers(model.module, model.config, quantize, scheme):
        write_checkpoint(model, Path(source), out, recorded)
    timings["write_s"] = time.perf_counter() - lap

    # Compared as it will be served: the written folder, loaded back.
    lap = time.perf_counter()
    written = load_model(out, dtype=torch.float32, device=model.device, quantization="auto")
    calibration_eval = compare(model, written, ids)
    heldout_eval = None if heldout_ids is None else compare(model, written, heldout_ids)
    timings["evaluate_s"] = time.perf_counter() - lap
    timings["total_s"] = time.perf_counter() - began
    return QuantizeReport(
        source=str(source),
        output=str(out),
        scheme=scheme.name,
        keep_threshold=threshold,
        calibration=str(calibration),
        calibration_tokens=len(ids),
        float_ppl=float_ppl,
        layers=rows,
        kept=kept,
        quantized=quantize,
        unfit=unfit,
        calibration_eval=calibration_eval,
        heldout=None if heldout is None else str(heldout),
        heldout_eval=heldout_eval,
        quantization=written.quantization,
        checkpoint_bytes=(out / WEIGHTS).stat().st_size,
        timings=timings,
    )


def default_calibration() -> Path:
    """The calibration text shipped with tokenmill (original prose, code and numbers)."""
    return Path(__file__).resolve().parents[2] / "ops" / "samples" / "calibration.txt"
