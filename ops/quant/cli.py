"""`tokenmill quantize`: post-training quantization with a per-layer sensitivity report."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ops.quant.chart import report_text

if TYPE_CHECKING:
    from ops.quant.sensitivity import QuantizeReport

# `ops.quant.sensitivity`'s TARGETS, DEFAULT_KEEP_THRESHOLD, DEFAULT_TOKENS and MIN_TOKENS,
# spelled here so `--help` does not import torch (tests hold them equal).
TARGETS = ("int8", "int4", "int4-g32", "int4-g128")
DEFAULT_KEEP_THRESHOLD = 0.02
DEFAULT_TOKENS = 512
MIN_TOKENS = 16


def _threshold(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"must be a finite number >= 0 (0.02 = +2%), not {value}")
    return value


@click.command()
@click.argument("model")
@click.option(
    "--to",
    "to",
    type=click.Choice(TARGETS),
    required=True,
    help="int8: one scale per output channel; int4 (= int4-g32), int4-g128: asymmetric 4-bit "
    "in groups of 32 or 128 input features.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Folder to write the checkpoint into (refused when it holds files, unless --force).",
)
@click.option(
    "--calibration",
    type=click.Path(path_type=Path, exists=True, dir_okay=False, readable=True),
    default=None,
    help="UTF-8 text the layers are measured on [default: ops/samples/calibration.txt].",
)
@click.option(
    "--keep-threshold",
    type=float,
    default=DEFAULT_KEEP_THRESHOLD,
    show_default=True,
    callback=_threshold,
    help="Keep a layer in float when quantizing it alone raises calibration perplexity by more "
    "than this fraction (0.02 = +2%).",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=MIN_TOKENS),
    default=DEFAULT_TOKENS,
    show_default=True,
    help="Calibration tokens each layer is scored on (time grows with them).",
)
@click.option(
    "--heldout",
    type=click.Path(path_type=Path, exists=True, dir_okay=False, readable=True),
    default=None,
    help="Also compare the written checkpoint with the float model on this text (all of it).",
)
@click.option("--device", default=None, help="cpu | cuda (default: cuda when present).")
@click.option("--force", is_flag=True, help="Write into an existing folder that holds files.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--only-layer", "only_layers", multiple=True, hidden=True)  # tests: measure these
def quantize(**kwargs: Any) -> None:
    """Quantize MODEL (an alias, an HF folder or a .gguf) to int8 or int4 and write a
    safetensors checkpoint tokenmill serves with `--quantization auto`.

    Each linear layer is quantized alone and the model scores the first --tokens tokens of the
    calibration text: the rise in perplexity and the KL divergence of its next-token
    distributions from the float model's, as a table sorted by sensitivity with a bar chart.
    Layers above --keep-threshold stay in float32. The written checkpoint is loaded back and
    compared with the float model: perplexity, KL and top-1 agreement before and after. Its
    config.json records the scheme, the layers kept and the weights' sha256, checked on load.
    """
    output: Path = kwargs["output"]
    if output.exists() and any(output.iterdir()) and not kwargs["force"]:
        raise click.UsageError(f"{output} is not empty: choose another folder, or pass --force")
    report = _run(kwargs)
    if kwargs["as_json"]:
        click.echo(report.to_json())
        return
    click.echo(report_text(report))
    click.echo(f"\ncheckpoint: {report.output}")
    click.echo(f"serve it:   tokenmill worker --model {report.output} --quantization auto")


def _run(kwargs: dict[str, Any]) -> QuantizeReport:
    from gpu.device import parse_device
    from gpu.errors import EngineError
    from ops.errors import ModelFetchError
    from ops.models.registry import resolve_model
    from ops.quant.sensitivity import quantize_checkpoint

    try:
        device = parse_device(kwargs["device"]) if kwargs["device"] else None
        source = resolve_model(kwargs["model"])
        if source.is_dir() and source.resolve() == kwargs["output"].resolve():
            raise click.UsageError("--output must not be the folder the model is read from")
        return quantize_checkpoint(
            source,
            kwargs["to"],
            kwargs["output"],
            kwargs["calibration"],
            kwargs["keep_threshold"],
            tokens=kwargs["tokens"],
            heldout=kwargs["heldout"],
            layers=kwargs["only_layers"] or None,
            device=device,
            progress=_progress,
        )
    except (EngineError, ModelFetchError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _progress(done: int, total: int, name: str) -> None:
    """One line per layer on a terminal (overwritten), every 10th elsewhere."""
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        click.echo(f"\rmeasured {done}/{total} layers ({name})\x1b[K", nl=False, err=True)
        click.echo(end, nl=False, err=True)
    elif done % 10 == 0 or done == total:
        click.echo(f"measured {done}/{total} layers", err=True)
