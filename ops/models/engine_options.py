"""The engine's settings, as options of every command that builds one, and the builder.

`EngineChoice` holds the model and device settings and nests `gpu.engine_config.EngineConfig`,
whose fields declare the engine's own (`ops/settings.py` derives the options from both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import click

from gpu.engine_config import DECODE_GRAPH_MODES as DECODE_GRAPH_MODES  # for plan_cli's
from gpu.engine_config import QUANTIZATION_CHOICES as QUANTIZATION_CHOICES
from gpu.engine_config import EngineConfig
from ops.settings import build, options

if TYPE_CHECKING:
    from gpu.encoder.engine import EncoderEngine
    from gpu.engine import Engine
    from gpu.loading.loader import LoadedModel

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class EngineChoice:
    model: str = field(
        metadata={"help": "Alias (smollm2-135m), HF folder or .gguf.", "short": "-m"}
    )
    dtype: str | None = field(
        default=None,
        metadata={"help": "float32 | bfloat16 | float16 (default: bf16 on CUDA, fp32 on CPU)."},
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu | cuda (default: cuda when present)."}
    )
    engine: EngineConfig = field(default_factory=EngineConfig, metadata={"prefix": ""})
    # A config.json whose shapes are built with random weights (`--random-weights`); `model`
    # is then only a label.
    random_weights: Path | None = None


def engine_options(command: F) -> F:
    """The engine's options (model, limits, quantization, prefix caching) for `command`, and
    `--random-weights`, which makes `--model` optional."""
    return options(EngineChoice, envvars=False, required=False)(_random_weights_option(command))


_random_weights_option = click.option(
    "--random-weights",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Hugging Face config.json: build its model with seeded random weights drawn on the "
    "device in --dtype (no checkpoint, no tokenizer; for benchmarks). --model is then a label.",
)


def worker_engine_options(command: F) -> F:
    """The same options, each also read from its TOKENMILL_* env var (`--max-num-seqs`:
    TOKENMILL_MAX_NUM_SEQS), as every worker setting is; `--model` is required."""
    return options(EngineChoice)(command)


def engine_choice(values: dict[str, Any]) -> EngineChoice:
    """Pop the engine's settings out of a command's option values."""
    random_weights = values.pop("random_weights", None)
    if values["model"] is None:
        if random_weights is None:
            raise click.UsageError("give --model (or --random-weights CONFIG.json)")
        values["model"] = f"{random_weights.stem} (random weights)"
    return build(EngineChoice, values, random_weights=random_weights)


@overload
def build_engine(choice: EngineChoice, *, embeddings: Literal[False] = False) -> Engine: ...
@overload
def build_engine(choice: EngineChoice, *, embeddings: bool) -> Engine | EncoderEngine: ...


def build_engine(choice: EngineChoice, *, embeddings: bool = False) -> Engine | EncoderEngine:
    """Resolve the model, load it and build the engine; errors become click errors.

    An embedding model (a sentence-transformers folder: `gpu.encoder.is_embedding_model`)
    gets the encoder engine, which answers embedding requests only, when the caller takes one
    (`embeddings`: the worker); a command that generates is told it cannot run one."""
    import torch

    from gpu.device import parse_device, parse_dtype
    from gpu.encoder import is_embedding_model, load_encoder_engine
    from gpu.engine import Engine
    from gpu.errors import EngineError
    from gpu.loading.loader import load_model
    from gpu.loading.random_weights import load_random_model
    from ops.errors import ModelFetchError
    from ops.models.registry import resolve_model

    try:
        device = parse_device(choice.device) if choice.device else None
        dtype = parse_dtype(choice.dtype) if choice.dtype else None
        path = resolve_model(choice.model) if choice.random_weights is None else None
        if path is not None and is_embedding_model(path):
            if not embeddings:
                raise click.ClickException(
                    f"{choice.model} is an embedding model: it makes vectors, not text "
                    "(serve it with `tokenmill worker`)"
                )
            return load_encoder_engine(
                path, name=choice.model, dtype=dtype, device=device, config=choice.engine
            )
        if choice.random_weights is not None:
            model = load_random_model(
                choice.random_weights,
                name=choice.model,
                dtype=dtype,
                device=device,
                quantization=choice.engine.quantization,
            )
        else:
            assert path is not None
            model = load_model(
                path,
                name=choice.model,
                dtype=dtype,
                device=device,
                quantization=choice.engine.quantization,
            )
        return Engine(model, choice.engine, draft=load_engine_draft(choice, model))
    except (EngineError, ModelFetchError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        # Allocating the KV pool or the weights failed: say how much was asked for.
        raise click.ClickException(f"cannot allocate the engine's memory: {exc}") from exc


def load_engine_draft(choice: EngineChoice, target: LoadedModel) -> LoadedModel | None:
    """The draft model `--speculative-model` names for `target` (None without one), resolved
    as `--model` is; naming the target's own model loads it int4
    (`gpu.speculative.draft_model.load_draft`). Raises what loading raises."""
    from gpu.loading.random_weights import load_random_model
    from gpu.speculative.draft_model import SELF_DRAFT_QUANTIZATION, check_draft, load_draft
    from ops.models.registry import resolve_model

    spec = choice.engine.speculation()
    if spec is None or spec.model is None:
        return None
    if spec.model == choice.model and choice.random_weights is not None:
        draft = load_random_model(
            choice.random_weights,
            name=f"{choice.model} {SELF_DRAFT_QUANTIZATION}",
            dtype=target.dtype,
            device=target.device,
            quantization=SELF_DRAFT_QUANTIZATION,
        )
        check_draft(draft, target)
        return draft
    path = target.path if spec.model == choice.model else resolve_model(spec.model)
    return load_draft(path, target, choice.engine.quantization, name=spec.model)
