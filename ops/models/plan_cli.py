"""`tokenmill plan`: will this model, dtype, batch and sequence length fit the device?"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gpu.errors import EngineError
from gpu.loading.model_config import load_hf_config
from gpu.memory.byte_sizes import format_bytes, parse_size
from gpu.memory.model_sizes import DTYPE_BYTES, dtype_bytes, weights_bytes
from gpu.memory.plan import MemoryPlan, plan_memory
from gpu.model_config import ModelConfig
from ops.errors import OpsError
from ops.models.engine_options import QUANTIZATION_CHOICES


def _size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Parse a byte size such as 80GiB, 512MiB, 1.5GB or 1073741824."""
    if value is None:
        return None
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    if size <= 0:
        raise click.BadParameter(f"{value!r} is not a positive size", ctx, param)
    return size


@click.command()
@click.option(
    "--model",
    "model",
    required=True,
    help="A checkpoint folder holding config.json, a .gguf file, or an alias (smollm2-135m).",
)
@click.option(
    "--dtype",
    required=True,
    type=click.Choice(list(DTYPE_BYTES), case_sensitive=False),
    help="The dtype weights, KV cache and activations are held in.",
)
@click.option("--batch", required=True, type=click.IntRange(min=1), help="Concurrent sequences.")
@click.option(
    "--seq-len",
    required=True,
    type=click.IntRange(min=1),
    help="Tokens per sequence, prompt and output together.",
)
@click.option(
    "--device-memory",
    metavar="SIZE",
    callback=_size_option,
    help="Memory budget, e.g. 80GiB. Default: the CUDA device's total, else physical RAM.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Tokens per KV block; KV is counted in whole blocks.",
)
@click.option(
    "--max-batched-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per engine step. "
    "Default: max(batch, min(batch×seq_len, max(seq_len, 2048), 8192)).",
)
@click.option(
    "--quantization",
    type=click.Choice(QUANTIZATION_CHOICES),
    default="none",
    show_default=True,
    help="Linear weights held as int8 / int4 (quantized at load), or as a GGUF holds them "
    "(auto); the table shows the saving against the dtype.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object and nothing else.")
def plan(
    model: str,
    dtype: str,
    batch: int,
    seq_len: int,
    device_memory: int | None,
    block_size: int,
    max_batched_tokens: int | None,
    quantization: str,
    as_json: bool,
) -> None:
    """Plan memory before deploying: weights + KV cache + activation reserve vs the budget.

    Reads only the model's shapes (config.json or GGUF metadata), never its weights. Prints
    what each part needs, whether the total fits, the largest batch that fits at this
    sequence length, and what to change when it does not fit (cut batch, cut sequence
    length, or use bf16). Exits 0 whether or not the plan fits; bad input exits non-zero.
    """
    path, config = _load_config(model)
    weights_of = None
    if quantization == "auto" and path.suffix == ".gguf":
        from gpu.loading.checkpoint_header import gguf_kept_weights_bytes

        def weights_of(d: str) -> int:
            return gguf_kept_weights_bytes(path, dtype_bytes(d))

    if device_memory is None:
        budget, budget_source = _default_budget()
    else:
        budget, budget_source = device_memory, "--device-memory"
    result = plan_memory(
        config,
        dtype=dtype,
        batch=batch,
        seq_len=seq_len,
        budget_bytes=budget,
        block_size=block_size,
        max_batched_tokens=max_batched_tokens,
        quantization=quantization,
        weights_of=weights_of,
    )
    unquantized = weights_bytes(config, result.dtype)
    if as_json:
        record = {
            "model": model,
            **dataclasses.asdict(result),
            "budget_source": budget_source,
            "quantization": quantization,
            "unquantized_weights_bytes": unquantized,
        }
        click.echo(json.dumps(record))
    else:
        Console().print(_table(model, config, result, budget_source, quantization, unquantized))


def _load_config(model: str) -> tuple[Path, ModelConfig]:
    path = Path(model).expanduser()
    if not path.exists():
        from ops.models.registry import resolve_model  # fetches an alias's file on first use

        try:
            path = resolve_model(model)
        except OpsError as exc:
            raise click.BadParameter(str(exc), param_hint="'--model'") from None
    try:
        if path.is_dir():
            return path, load_hf_config(path)
        if path.suffix == ".gguf":
            from gpu.loading.gguf import read_gguf_config

            gguf_config: ModelConfig = read_gguf_config(path)
            return path, gguf_config
        if path.name == "config.json":
            return path.parent, load_hf_config(path.parent)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:  # a corrupt GGUF header
        raise click.ClickException(f"{path}: cannot read model metadata: {exc}") from None
    raise click.BadParameter(
        f"{str(path)!r} is neither a folder holding config.json nor a .gguf file",
        param_hint="'--model'",
    )


def _default_budget() -> tuple[int, str]:
    """The CUDA device's total memory, else the machine's physical RAM."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return int(props.total_memory), f"cuda:0 total memory ({props.name})"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        raise click.UsageError(
            "no CUDA device and cannot read the physical RAM size; pass --device-memory"
        ) from None
    return ram, "physical RAM (no CUDA device)"


def _amount(n: int) -> str:
    return f"{format_bytes(n)} ({n:,} B)"


def _table(
    model: str,
    config: ModelConfig,
    p: MemoryPlan,
    budget_source: str,
    quantization: str = "none",
    unquantized: int = 0,
) -> Table:
    kv_seq = f"{p.kv_tokens_per_sequence}"
    rounded = ""
    if p.kv_tokens_per_sequence != p.seq_len:
        rounded = f"; seq_len {p.seq_len} rounded up to blocks of {p.block_size}"
    per_token = f"2 × {p.num_layers} × {p.num_kv_heads} × {p.head_dim} × {p.dtype_bytes} B"
    kv_total = (
        f"2 × {p.num_layers} × {p.num_kv_heads} × {p.head_dim} × {kv_seq} × {p.batch} "
        f"× {p.dtype_bytes} B"
    )
    fits = "[bold green]yes[/]" if p.fits else "[bold red]no[/]"
    table = Table(title=f"memory plan: {model}", show_header=True, header_style="bold")
    table.add_column("item")
    table.add_column("bytes", justify="right")
    table.add_column("how")
    table.add_row(
        "model",
        f"{p.num_parameters / 1e6:,.1f}M params",
        f"{p.arch}: {config.num_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_heads} heads / {config.num_kv_heads} kv heads, vocab {config.vocab_size}",
    )
    if p.weights_bytes == unquantized or not unquantized:
        table.add_row(
            "weights", _amount(p.weights_bytes), f"{p.num_parameters:,} × {p.dtype_bytes} B"
        )
    else:
        saved = 1 - p.weights_bytes / unquantized
        table.add_row(
            f"weights ({quantization})",
            _amount(p.weights_bytes),
            f"{saved:.0%} less than {format_bytes(unquantized)} in {p.dtype} "
            f"({unquantized / p.weights_bytes:.1f}× smaller)",
        )
    table.add_row("KV per token", _amount(p.kv_bytes_per_token), per_token)
    table.add_row("KV total", _amount(p.kv_bytes), kv_total + rounded)
    table.add_row(
        "activation reserve",
        _amount(p.activation_bytes),
        f"one step of {p.max_batched_tokens} tokens, {p.batch} sampled rows",
    )
    table.add_row("total", _amount(p.total_bytes), "weights + KV total + activation reserve")
    table.add_row("budget", _amount(p.budget_bytes), budget_source)
    table.add_row("headroom", _amount(p.headroom_bytes), "budget − total")
    table.add_row("fits", fits, f"{p.dtype}, batch {p.batch}, seq_len {p.seq_len}")
    table.add_row("max batch", str(p.max_batch), f"largest batch that fits at seq_len {p.seq_len}")
    table.add_row("advice", "", p.advice)
    return table
