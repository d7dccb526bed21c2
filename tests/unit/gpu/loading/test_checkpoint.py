"""Bad HF checkpoints fail with one message naming the file and the problem; shards load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu.errors import CheckpointError, UnsupportedArchitecture
from gpu.loading.loader import load_checkpoint, load_model
from gpu.sequence import SamplingParams
from tests.unit.gpu.test_engine import engine_tokens, random_prompts


@pytest.fixture
def llama(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the tiny llama checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_checkpoints["llama"], tmp_path / "llama"))


def rewrite_weights(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def expect_error(
    path: Path, *fragments: str, kind: type[CheckpointError] = CheckpointError
) -> None:
    with pytest.raises(kind) as info:
        load_model(path)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message


def test_missing_config(llama: Path) -> None:
    (llama / "config.json").unlink()
    expect_error(llama, "config.json", "not found")


def test_missing_tokenizer(llama: Path) -> None:
    (llama / "tokenizer.json").unlink()
    expect_error(llama, "tokenizer.json", "not found")


def test_no_weights(llama: Path) -> None:
    (llama / "model.safetensors").unlink()
    expect_error(llama, str(llama), "no *.safetensors")


def test_pickle_weights_are_never_loaded(llama: Path) -> None:
    (llama / "model.safetensors").unlink()
    (llama / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    expect_error(llama, "pickle", "safetensors or GGUF")


def test_truncated_safetensors(llama: Path) -> None:
    path = llama / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    expect_error(llama, "model.safetensors", "corrupt or truncated")


def test_wrong_shape_names_the_tensor(llama: Path) -> None:
    def shrink(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.1.mlp.up_proj.weight"] = t["model.layers.1.mlp.up_proj.weight"][:-1]

    rewrite_weights(llama, shrink)
    expect_error(
        llama, "model.layers.1.mlp.up_proj.weight", "shape (127, 64)", "expected (128, 64)"
    )


def test_missing_tensor_names_the_tensor(llama: Path) -> None:
    rewrite_weights(llama, lambda t: t.pop("model.layers.2.self_attn.k_proj.weight"))
    expect_error(llama, "model.layers.2.self_attn.k_proj.weight", "missing")


def test_unsupported_architecture(llama: Path) -> None:
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps(config | {"model_type": "bert"}))
    expect_error(llama, "config.json", "'bert' is not supported", kind=UnsupportedArchitecture)


def test_unsupported_rope_scaling(llama: Path) -> None:
    config = json.loads((llama / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    (llama / "config.json").write_text(json.dumps(config))
    expect_error(llama, "'dynamic' is not supported", kind=UnsupportedArchitecture)


def test_sharded_checkpoint_loads_and_matches(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    source = tiny_checkpoints["qwen2"]
    sharded = tmp_path / "sharded"
    hf = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    hf.save_pretrained(sharded, max_shard_size="40KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(load_checkpoint(sharded).files) > 1

    prompts = random_prompts(hf.config.vocab_size, 3, seed=9)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    assert engine_tokens(load_model(sharded), prompts, params) == engine_tokens(
        load_model(source), prompts, params
    )

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    missing = sorted(set(index["weight_map"].values()))[-1]
    (sharded / missing).unlink()
    expect_error(sharded, missing, "missing")


def test_digest_names_the_weights(tiny_checkpoints: dict[str, Path]) -> None:
    a = load_model(tiny_checkpoints["llama"])
    b = load_model(tiny_checkpoints["qwen2"])
    assert a.digest.startswith("sha256:") and len(a.digest) == 71
    assert a.digest != b.digest
    assert load_model(tiny_checkpoints["llama"]).digest == a.digest
