"""Click options shared by every command that builds an engine, and the builder itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gpu.engine import Engine
    from gpu.engine_config import EngineConfig


# `gpu.quant.scheme.CHOICES`, spelled here so `--help` does not import torch
QUANTIZATION_CHOICES = ("none", "auto", "int8", "int4", "int4-g32", "int4-g128")
DECODE_GRAPH_MODES = ("auto", "eager", "off")  # gpu.engine_config's; kept here, torch-free


@dataclass(frozen=True)
class EngineChoice:
    model: str
    dtype: str | None
    device: str | None
    engine: EngineConfig
    # A config.json whose shapes are built with random weights (`--random-weights`); `model`
    # is then only a label.
    random_weights: Path | None = None


def engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The engine's options (model, limits, quantization, prefix caching) for `command`, and
    `--random-weights`, which makes `--model` optional."""
    return _with_options(command, [*_engine_options(envvars=False), _random_weights_option])


_random_weights_option = click.option(
    "--random-weights",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Hugging Face config.json: build its model with seeded random weights drawn on the "
    "device in --dtype (no checkpoint, no tokenizer; for benchmarks). --model is then a label.",
)


def worker_engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The same options, each also read from its TOKENMILL_* env var (`--max-num-seqs`:
    TOKENMILL_MAX_NUM_SEQS), as every worker setting is."""
    return _with_options(command, _engine_options(envvars=True))


def _with_options(
    command: Callable[..., Any], options: list[Callable[[Callable[..., Any]], Callable[..., Any]]]
) -> Callable[..., Any]:
    for option in reversed(options):
        command = option(command)
    return command


def _engine_options(envvars: bool) -> list[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    def option(*decls: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if envvars:
            name = decls[0].split("/")[0].lstrip("-").replace("-", "_").upper()
            kwargs.update(envvar="TOKENMILL_" + name, show_envvar=True)
        return click.option(*decls, **kwargs)

    return [
        option(
            "--model",
            "-m",
            required=envvars,  # the worker's; elsewhere --random-weights may stand in
            default=None,
            help="Alias (smollm2-135m), HF folder or .gguf.",
        ),
        option(
            "--dtype",
            default=None,
            help="float32 | bfloat16 | float16 (default: bf16 on CUDA, fp32 on CPU).",
        ),
        option("--device", default=None, help="cpu | cuda (default: cuda when present)."),
        option(
            "--max-model-len",
            type=int,
            default=None,
            help="Context limit (default: model's, capped at 2048).",
        ),
        option(
            "--max-new-tokens-limit",
            type=int,
            default=4096,
            show_default=True,
            help="The most new tokens a request may ask for (bounds a result's size).",
        ),
        option(
            "--max-num-seqs", type=int, default=64, show_default=True, help="Sequences per step."
        ),
        option(
            "--max-batched-tokens",
            type=int,
            default=1024,
            show_default=True,
            help="Token budget per step.",
        ),
        option(
            "--quantization",
            type=click.Choice(QUANTIZATION_CHOICES),
            default="none",
            show_default=True,
            help="Weights held quantized: int8 (per output channel), int4 (groups of 32; "
            "int4-g128), quantized at load; auto keeps a GGUF's (or a `tokenmill quantize` "
            "checkpoint's) quantized tensors as they are; none dequantizes everything.",
        ),
        option(
            "--num-kv-blocks",
            type=int,
            default=None,
            help="KV pool size in blocks (default: memory plan).",
        ),
        option(
            "--prefix-caching/--no-prefix-caching",
            default=True,
            show_default=True,
            help="Reuse the K/V of full blocks a prompt shares with earlier ones (a system "
            "prompt, a few-shot header); outputs are the same either way.",
        ),
        option(
            "--decode-graphs",
            type=click.Choice(DECODE_GRAPH_MODES),
            default="auto",
            show_default=True,
            help="Decode-only steps through static buffers at padded batch sizes: auto = as "
            "CUDA graphs captured at start, on CUDA only; eager = without capture, on any "
            "device with kernels; off. Outputs are the same either way.",
        ),
    ]


def engine_choice(kwargs: dict[str, Any]) -> EngineChoice:
    """Pop the engine options out of a command's kwargs."""
    from gpu.engine_config import EngineConfig

    try:
        config = EngineConfig(
            max_model_len=kwargs.pop("max_model_len"),
            max_new_tokens=kwargs.pop("max_new_tokens_limit"),
            max_num_seqs=kwargs.pop("max_num_seqs"),
            max_num_batched_tokens=kwargs.pop("max_batched_tokens"),
            num_kv_blocks=kwargs.pop("num_kv_blocks"),
            quantization=kwargs.pop("quantization"),
            prefix_caching=kwargs.pop("prefix_caching"),
            decode_graphs=kwargs.pop("decode_graphs"),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    random_weights = kwargs.pop("random_weights", None)
    model = kwargs.pop("model")
    if model is None and random_weights is None:
        raise click.UsageError("give --model (or --random-weights CONFIG.json)")
    return EngineChoice(
        model=model or f"{random_weights.stem} (random weights)",
        dtype=kwargs.pop("dtype"),
        device=kwargs.pop("device"),
        engine=config,
        random_weights=random_weights,
    )


def build_engine(choice: EngineChoice) -> Engine:
    """Resolve the model, load it and build the engine; errors become click errors."""
    import torch

    from gpu.device import parse_device, parse_dtype
    from gpu.engine import Engine
    from gpu.errors import EngineError
    from gpu.loading.loader import load_model
    from gpu.loading.random_weights import load_random_model
    from ops.errors import ModelFetchError
    from ops.models.registry import resolve_model

    try:
        device = parse_device(choice.device) if choice.device else None
        dtype = parse_dtype(choice.dtype) if choice.dtype else None
        if choice.random_weights is not None:
            model = load_random_model(
                choice.random_weights,
                name=choice.model,
                dtype=dtype,
                device=device,
                quantization=choice.engine.quantization,
            )
        else:
            model = load_model(
                resolve_model(choice.model),
                name=choice.model,
                dtype=dtype,
                device=device,
                quantization=choice.engine.quantization,
            )
        return Engine(model, choice.engine)
    except (EngineError, ModelFetchError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        # Allocating the KV pool or the weights failed: say how much was asked for.
        raise click.ClickException(f"cannot allocate the engine's memory: {exc}") from exc
