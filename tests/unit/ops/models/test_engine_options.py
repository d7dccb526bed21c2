"""`ops.models.engine_options`: the engine's settings, declared on `EngineChoice` and
`gpu.engine_config.EngineConfig`, as options of every command that builds an engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from gpu.engine_config import EngineConfig
from ops.models.engine_options import (
    EngineChoice,
    engine_choice,
    engine_options,
    worker_engine_options,
)


@click.command()
@engine_options
def offline(**kwargs: Any) -> EngineChoice:
    choice = engine_choice(kwargs)
    assert not kwargs, f"options engine_choice left behind: {sorted(kwargs)}"
    return choice


@click.command()
@worker_engine_options
def served(**kwargs: Any) -> EngineChoice:
    return engine_choice(kwargs)


def run(command: click.Command, *args: str, env: dict[str, str] | None = None) -> Result:
    clean = {f"TOKENMILL_{n}": None for n in ("MODEL", "MAX_NUM_SEQS", "MAX_BATCHED_TOKENS")}
    return CliRunner().invoke(
        command, list(args), env={**clean, **(env or {})}, standalone_mode=False
    )


def choice_of(command: click.Command, *args: str, env: dict[str, str] | None = None) -> Any:
    result = run(command, *args, env=env)
    assert result.exception is None, result.output
    return result.return_value


def test_defaults_are_the_engine_configs() -> None:
    assert choice_of(offline, "-m", "smollm2-135m") == EngineChoice(
        model="smollm2-135m", dtype=None, device=None, engine=EngineConfig()
    )


def test_each_setting_reaches_its_field() -> None:
    choice = choice_of(
        offline,
        *("--model", "m", "--dtype", "bfloat16", "--device", "cpu", "--max-model-len", "512"),
        *("--max-new-tokens-limit", "100", "--max-num-seqs", "8"),
        *("--max-num-batched-tokens", "256", "--num-kv-blocks", "40", "--quantization", "int8"),
        *("--no-prefix-caching", "--decode-graphs", "eager"),
    )
    assert (choice.dtype, choice.device) == ("bfloat16", "cpu")
    assert choice.engine == EngineConfig(
        max_model_len=512,
        max_new_tokens=100,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        num_kv_blocks=40,
        quantization="int8",
        prefix_caching=False,
        decode_graphs="eager",
    )


def test_the_former_flag_and_env_var_still_work() -> None:
    old = choice_of(offline, "-m", "m", "--max-batched-tokens", "64")
    assert old.engine.max_num_batched_tokens == 64
    env = {"TOKENMILL_MODEL": "m", "TOKENMILL_MAX_BATCHED_TOKENS": "96"}
    assert choice_of(served, env=env).engine.max_num_batched_tokens == 96


def test_the_worker_reads_env_vars_and_needs_a_model() -> None:
    env = {"TOKENMILL_MODEL": "m", "TOKENMILL_MAX_NUM_SEQS": "4"}
    assert choice_of(served, env=env).engine.max_num_seqs == 4
    assert choice_of(offline, "-m", "m", env=env).engine.max_num_seqs == 64, "worker only"
    missing = run(served)
    assert isinstance(missing.exception, click.MissingParameter)


def test_bad_values_are_usage_errors() -> None:
    bad = run(offline, "-m", "m", "--max-num-seqs", "0")
    assert isinstance(bad.exception, click.UsageError)
    assert "max_num_seqs must be positive, got 0" in str(bad.exception)
    nothing = run(offline)
    assert isinstance(nothing.exception, click.UsageError)
    assert "give --model (or --random-weights CONFIG.json)" in str(nothing.exception)


def test_random_weights_name_the_model(tmp_path: Path) -> None:
    config = tmp_path / "llama3-8b.json"
    config.write_text("{}")
    choice = choice_of(offline, "--random-weights", str(config))
    assert (choice.model, choice.random_weights) == ("llama3-8b (random weights)", config)


@pytest.mark.parametrize("module", ["ops.models.engine_options", "ops.worker.cli"])
def test_the_options_need_no_torch(module: str) -> None:
    """`--help` stays fast: the declarations live in a module that imports no torch."""
    code = f"import sys, {module}; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
