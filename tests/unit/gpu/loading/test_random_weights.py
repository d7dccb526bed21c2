"""Random-weight models from a config.json: shapes, dtype, determinism, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import CheckpointError, UnsupportedArchitecture
from gpu.loading.random_weights import has_random_weights, load_random_model, read_random_config
from gpu.memory.held_bytes import weight_bytes
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests import tiny_models

CONFIGS = Path(__file__).resolve().parents[3] / "gpu" / "configs"


def tiny_config(folder: Path, **changes: Any) -> Path:
    """Llama-3-8B's config (llama3 rope scaling included) at a tiny size."""
    return tiny_models.tiny_config(CONFIGS / "llama3-8b.json", folder / "config.json", **changes)


def test_the_shipped_configs_have_the_real_models_shapes() -> None:
    llama, _ = read_random_config(CONFIGS / "llama3-8b.json")
    assert llama.num_parameters() == 8_030_261_248  # Meta-Llama-3-8B
    assert (llama.num_kv_heads, llama.intermediate_size, llama.vocab_size) == (8, 14336, 128256)
    assert llama.rope_scaling is not None and llama.rope_scaling["rope_type"] == "llama3"
    smol, std = read_random_config(CONFIGS / "smollm2-135m.json")
    assert smol.num_parameters() == 134_515_008 and smol.tie_word_embeddings  # SmolLM2-135M
    assert std == pytest.approx(1 / 24)


def test_weights_are_drawn_in_the_dtype_and_seeded(tmp_path: Path) -> None:
    path = tiny_config(tmp_path)
    model = load_random_model(path, device="cpu", dtype=torch.bfloat16, seed=3)
    params = dict(model.module.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert weight_bytes(model.module) == model.config.num_parameters() * 2
    embed = params["embed_tokens.weight"].float()
    assert 0.015 < embed.std().item() < 0.025  # initializer_range 0.02
    assert torch.equal(params["norm.weight"].float(), torch.ones(64))
    again = load_random_model(path, device="cpu", dtype=torch.bfloat16, seed=3)
    assert torch.equal(again.module.embed_tokens.weight, model.module.embed_tokens.weight)
    other = load_random_model(path, device="cpu", dtype=torch.bfloat16, seed=4)
    assert not torch.equal(other.module.embed_tokens.weight, model.module.embed_tokens.weight)
    assert has_random_weights(model) and model.digest != other.digest
    assert model.name == "config (random weights)"


def test_the_engine_generates_with_the_stand_in_tokenizer(tmp_path: Path) -> None:
    model = load_random_model(tiny_config(tmp_path), device="cpu")
    engine = Engine(model, EngineConfig(max_num_seqs=2, num_kv_blocks=8, max_model_len=64))
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    (done,) = run_all(engine, [EngineRequest("r", [5, 6, 7], params)]).completions
    assert len(done.token_ids) == 5
    assert done.text.split() == [f"<{t}>" for t in done.token_ids]
    assert model.tokenizer.encode("<5> <6>", add_special_tokens=False) == [5, 6]


def test_an_unsupported_architecture_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitecture, match="model_type 'mamba'"):
        load_random_model(tiny_config(tmp_path, model_type="mamba"), device="cpu")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="one JSON object"):
        load_random_model(bad, device="cpu")
