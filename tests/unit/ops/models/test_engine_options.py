"""`ops.models.engine_options`: the engine's settings, declared on `EngineChoice` and
`gpu.engine_config.EngineConfig`, as options of every command that builds an engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
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


def test_build_engine_loads_the_draft_model(tiny_checkpoints: dict[str, Path]) -> None:
    from gpu.speculative.draft_model import DraftModelProposer
    from ops.models.engine_options import build_engine

    llama, qwen2 = str(tiny_checkpoints["llama"]), str(tiny_checkpoints["qwen2"])
    config = EngineConfig(max_model_len=128, num_kv_blocks=64, speculative_model=llama)
    engine = build_engine(EngineChoice(model=llama, engine=config))
    assert engine.draft_model is not None, "the target's own checkpoint drafts, int4"
    assert engine.draft_model.quantization.startswith("int4")
    assert engine.draft_model.digest == engine.model.digest
    assert engine.model.quantization == "none"
    other = build_engine(EngineChoice(model=llama, engine=replace(config, speculative_model=qwen2)))
    assert other.draft_model is not None and other.draft_model.name == qwen2
    assert other.draft_model.quantization == "none"
    assert (other.draft_model.dtype, other.draft_model.device) == (
        other.model.dtype,
        other.model.device,
    )
    DraftModelProposer(other.draft_model, other.model, other.config, other.max_model_len)
    plain = build_engine(EngineChoice(model=llama, engine=replace(config, speculative_model=None)))
    assert plain.draft_model is None


def test_a_draft_with_another_tokenizer_is_a_click_error(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from ops.models.engine_options import build_engine

    stranger = tmp_path / "stranger"
    shutil.copytree(tiny_checkpoints["qwen2"], stranger)
    tokenizer = json.loads((stranger / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]  # two tokens trade ids: same size, other meaning
    first, second = sorted(vocab)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (stranger / "tokenizer.json").write_text(json.dumps(tokenizer))
    llama = str(tiny_checkpoints["llama"])
    config = EngineConfig(max_model_len=128, num_kv_blocks=64, speculative_model=str(stranger))
    with pytest.raises(click.ClickException, match="does not share the tokenizer"):
        build_engine(EngineChoice(model=llama, engine=config))


def test_smollm2_drafts_for_itself_int4(smollm2_path: Path) -> None:
    import torch

    from gpu.loading.loader import load_model
    from ops.models.engine_options import load_engine_draft

    target = load_model(smollm2_path, name="smollm2-135m", dtype=torch.float32, device="cpu")
    choice = EngineChoice(
        model="smollm2-135m", engine=EngineConfig(speculative_model="smollm2-135m")
    )
    draft = load_engine_draft(choice, target)
    assert draft is not None and draft.quantization.startswith("int4")
    assert draft.tokenizer.vocab_digest == target.tokenizer.vocab_digest
