"""`tokenmill plan` end to end on checkpoint folders holding only a config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.models.plan_cli import plan

LLAMA = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}

GPT2 = {
    "model_type": "gpt2",
    "vocab_size": 50257,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "layer_norm_epsilon": 1e-5,
}


def _checkpoint(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    return _checkpoint(tmp_path, "llama", LLAMA)


@pytest.fixture
def gpt2(tmp_path: Path) -> Path:
    return _checkpoint(tmp_path, "gpt2", GPT2)


def _run(*args: str) -> Any:
    # A wide terminal so rich does not wrap the table's cells.
    return CliRunner().invoke(plan, list(args), env={"COLUMNS": "200"})


def test_table_spells_out_the_kv_formula(llama: Path) -> None:
    result = _run(
        "--model", str(llama), "--dtype", "fp32", "--batch", "8", "--seq-len", "2048",
        "--device-memory", "80GiB",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "2 × 30 × 3 × 64 × 4 B" in out
    assert "46,080 B" in out
    assert "2 × 30 × 3 × 64 × 2048 × 8 × 4 B" in out
    assert f"{8 * 2048 * 46_080:,} B" in out
    assert "134,515,008 × 4 B" in out
    assert "--device-memory" in out
    assert "yes" in out
    assert "fits with batch ≤ " in out


def test_table_says_when_it_does_not_fit(gpt2: Path) -> None:
    result = _run(
        "--model", str(gpt2), "--dtype", "float32", "--batch", "64", "--seq-len", "1024",
        "--device-memory", "1GiB",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no" in result.output
    assert "does not fit" in result.output


def test_table_notes_block_rounding(gpt2: Path) -> None:
    result = _run(
        "--model", str(gpt2), "--dtype", "bf16", "--batch", "2", "--seq-len", "1000",
        "--device-memory", "8GiB", "--block-size", "32",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 × 12 × 12 × 64 × 1024 × 2 × 2 B" in result.output
    assert "rounded up to blocks of 32" in result.output


def test_json_is_one_object_with_integer_bytes(llama: Path) -> None:
    result = _run(
        "--model", str(llama), "--dtype", "bf16", "--batch", "4", "--seq-len", "1000",
        "--device-memory", "2GiB", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["budget_bytes"] == 2 * 2**30
    assert record["budget_source"] == "--device-memory"
    assert record["kv_bytes_per_token"] == 23_040
    assert record["kv_tokens_per_sequence"] == 1008
    assert record["kv_bytes"] == 4 * 1008 * 23_040
    assert record["weights_bytes"] == 134_515_008 * 2
    assert record["total_bytes"] == (
        record["weights_bytes"] + record["kv_bytes"] + record["activation_bytes"]
    )
    assert record["fits"] is True
    assert record["max_batch"] >= 4
    assert record["dtype"] == "bfloat16"
    assert record["arch"] == "llama"
    assert isinstance(record["advice"], str)
    for key, value in record.items():
        if key.endswith("_bytes"):
            assert isinstance(value, int), key


def test_json_for_gpt2_and_a_config_json_path(gpt2: Path) -> None:
    result = _run(
        "--model", str(gpt2 / "config.json"), "--dtype", "fp16", "--batch", "1",
        "--seq-len", "1024", "--device-memory", "1.5GB", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["num_parameters"] == 124_439_808
    assert record["budget_bytes"] == 1_500_000_000
    assert record["kv_bytes_per_token"] == 2 * 12 * 12 * 64 * 2


def test_default_budget_names_its_source(llama: Path) -> None:
    result = _run(
        "--model", str(llama), "--dtype", "bf16", "--batch", "1", "--seq-len", "128", "--json"
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["budget_source"].startswith(("cuda:0 total memory", "physical RAM"))
    assert record["budget_bytes"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "int8"], "'int8' is not one of"),
        (["--batch", "0"], "0 is not in the range"),
        (["--seq-len", "-5"], "--seq-len"),
        (["--device-memory", "lots"], "cannot read 'lots' as a size"),
        (["--device-memory", "80G"], "ambiguous unit"),
        (["--device-memory", "0"], "not a positive size"),
        (["--block-size", "0"], "--block-size"),
    ],
)
def test_bad_options_are_usage_errors(llama: Path, args: list[str], message: str) -> None:
    base = {"--dtype": "bf16", "--batch": "1", "--seq-len": "128", "--device-memory": "8GiB"}
    base.update(zip(args[::2], args[1::2], strict=True))
    flat = [x for pair in base.items() for x in pair]
    result = _run("--model", str(llama), *flat)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_folder_without_config_json(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _run(
        "--model", str(empty), "--dtype", "bf16", "--batch", "1", "--seq-len", "8",
        "--device-memory", "1GiB",
    )  # fmt: skip
    assert result.exit_code != 0
    assert "config.json not found" in result.output
    assert isinstance(result.exception, SystemExit)


def test_unsupported_architecture(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, "bert", {"model_type": "bert"})
    result = _run(
        "--model", str(folder), "--dtype", "bf16", "--batch", "1", "--seq-len", "8",
        "--device-memory", "1GiB",
    )  # fmt: skip
    assert result.exit_code != 0
    assert "'bert' is not supported" in result.output
    assert isinstance(result.exception, SystemExit)


def test_unknown_model_name(tmp_path: Path) -> None:
    result = _run(
        "--model", str(tmp_path / "nowhere"), "--dtype", "bf16", "--batch", "1",
        "--seq-len", "8", "--device-memory", "1GiB",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "neither a known alias nor a path" in result.output
    assert isinstance(result.exception, SystemExit)


def test_file_that_is_not_a_model(tmp_path: Path) -> None:
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"\0")
    result = _run(
        "--model", str(stray), "--dtype", "bf16", "--batch", "1", "--seq-len", "8",
        "--device-memory", "1GiB",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "neither a folder holding config.json nor a .gguf file" in result.output


# Config-only folders of the newer Llama-family architectures, their config.json fields as the
# real checkpoints publish them; the counts are the real checkpoints' (every expert counted).
NEWER = {
    "qwen3": (
        {
            "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 3072, "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": True,
            "sliding_window": None, "use_sliding_window": False, "hidden_act": "silu",
        },
        596_049_920,  # Qwen3-0.6B
    ),
    "phi3": (
        {
            "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "intermediate_size": 8192, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
            },
            "sliding_window": 262144, "tie_word_embeddings": False, "hidden_act": "silu",
        },
        3_821_079_552,  # Phi-3-mini-128k-instruct
    ),
    "mixtral": (
        {
            "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
            "sliding_window": None, "tie_word_embeddings": False, "hidden_act": "silu",
        },
        46_702_792_704,  # Mixtral-8x7B-v0.1
    ),
    "qwen3_moe": (
        {
            "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": False,
            "sliding_window": None, "use_sliding_window": False, "hidden_act": "silu",
        },
        30_532_122_624,  # Qwen3-30B-A3B
    ),
}  # fmt: skip


@pytest.mark.parametrize("arch", NEWER)
def test_newer_architectures_plan_from_config_alone(tmp_path: Path, arch: str) -> None:
    config, parameters = NEWER[arch]
    folder = _checkpoint(tmp_path, arch, config)
    result = _run(
        "--model", str(folder), "--dtype", "bf16", "--batch", "2", "--seq-len", "4096",
        "--device-memory", "80GiB", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["arch"] == arch
    assert record["num_parameters"] == parameters
    assert record["weights_bytes"] == parameters * 2


def test_qwen3_moe_dense_layers_count_their_dense_mlp(tmp_path: Path) -> None:
    """decoder_sparse_step 2 makes the even layers dense; mlp_only_layers adds layer 1."""
    config = dict(NEWER["qwen3_moe"][0], decoder_sparse_step=2, mlp_only_layers=[0, 1])
    folder = _checkpoint(tmp_path, "dense_moe", config)
    result = _run(
        "--model", str(folder), "--dtype", "bf16", "--batch", "1", "--seq-len", "8",
        "--device-memory", "80GiB", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    h, layers, sparse, dense = 2048, 48, 23, 25
    per_layer = h * (4096 + 2 * 512) + 4096 * h + 2 * 128 + 2 * h  # attention, q/k and layer norms
    experts = 128 * (h + 3 * h * 768)
    embeddings = 2 * 151936 * h + h  # untied head, final norm
    expected = embeddings + layers * per_layer + sparse * experts + dense * 3 * h * 6144
    assert json.loads(result.output)["num_parameters"] == expected


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, "deepseek", {"model_type": "deepseek_v3"})
    result = _run(
        "--model", str(folder), "--dtype", "bf16", "--batch", "1", "--seq-len", "8",
        "--device-memory", "1GiB",
    )  # fmt: skip
    assert result.exit_code != 0
    assert "'deepseek_v3' is not supported" in result.output
    for arch in ("llama", "qwen3", "phi3", "mixtral", "qwen3_moe"):
        assert arch in result.output
