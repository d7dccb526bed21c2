"""Quantized experts: `--quantization int8|int4` holds a sparse MLP's experts quantized (its
router float), what they hold is what the planner counts, and a quantized Mixtral or Qwen3-MoE
generates what the same integers do as float weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.loading.loader import LoadedModel, load_model
from gpu.loading.model_config import load_hf_config
from gpu.memory.held_bytes import weight_bytes
from gpu.memory.model_sizes import weights_bytes
from gpu.models.moe import SparseMoE
from gpu.quant.experts import QuantizedExperts
from gpu.quant.scheme import Quantization
from gpu.sequence import SamplingParams
from ops.models.offline import run_all


def _sparse(model: LoadedModel) -> dict[str, SparseMoE]:
    return {n: m for n, m in model.module.named_modules() if isinstance(m, SparseMoE)}


def _greedy(model: LoadedModel, prompt: list[int], n: int = 10) -> list[int]:
    engine = Engine(model, EngineConfig(max_model_len=128, num_kv_blocks=32))
    params = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    return run_all(engine, [EngineRequest("r", prompt, params)]).completions[0].token_ids


@pytest.mark.parametrize(("arch", "scheme"), [("mixtral", "int4"), ("qwen3_moe", "int8")])
def test_experts_are_held_quantized_as_the_planner_counts(
    tiny_checkpoints: dict[str, Path], arch: str, scheme: str
) -> None:
    model = load_model(tiny_checkpoints[arch], device="cpu", quantization=scheme)
    sparse = _sparse(model)
    assert sparse
    for moe in sparse.values():
        assert isinstance(moe.gate_up, QuantizedExperts) and isinstance(moe.down, QuantizedExperts)
        assert moe.gate_up.num_experts == moe.num_experts
        assert moe.router.dtype == torch.float32  # routing stays float
    assert weight_bytes(model.module) == weights_bytes(model.config, "float32", scheme)
    assert model.quantization.startswith(scheme)


def test_keep_leaves_a_sparse_layers_experts_float(tiny_checkpoints: dict[str, Path]) -> None:
    path = tiny_checkpoints["mixtral"]
    model = load_model(path, device="cpu", quantization="int8", keep={"layers.0.mlp"})
    sparse = _sparse(model)
    assert isinstance(sparse["layers.0.mlp"].gate_up, torch.nn.Parameter)
    rest = [m for name, m in sparse.items() if name != "layers.0.mlp"]
    assert rest and all(isinstance(m.down, QuantizedExperts) for m in rest)


def test_experts_whose_inputs_the_scheme_cannot_group_stay_float(
    tiny_checkpoints: dict[str, Path],
) -> None:
    config = load_hf_config(tiny_checkpoints["qwen3_moe"])
    moe = SparseMoE(dataclasses.replace(config, moe_intermediate_size=40))  # 40: not 16 · n
    assert not moe.quantize(Quantization.parse("int8"))
    assert isinstance(moe.down, torch.nn.Parameter)


@pytest.mark.parametrize(("arch", "scheme"), [("mixtral", "int8"), ("qwen3_moe", "int4")])
def test_quantized_experts_generate_as_their_dequantized_weights_do(
    tiny_checkpoints: dict[str, Path], arch: str, scheme: str
) -> None:
    """Through the quantized kernels (the layers' path and the one-call decode step) against
    the same integers as float experts."""
    path = tiny_checkpoints[arch]
    quantized = load_model(path, device="cpu", quantization=scheme)
    reference = load_model(path, device="cpu", quantization=scheme)
    with torch.no_grad():
        for name, moe in _sparse(reference).items():
            gate_up, down = moe.gate_up, moe.down
            assert isinstance(gate_up, QuantizedExperts) and isinstance(down, QuantizedExperts)
            del moe.gate_up, moe.down
            moe.gate_up = torch.nn.Parameter(
                torch.stack([gate_up.weight(e).dequantize() for e in range(moe.num_experts)])
            )
            moe.down = torch.nn.Parameter(
                torch.stack([down.weight(e).dequantize() for e in range(moe.num_experts)])
            )
            assert isinstance(_sparse(quantized)[name].down, QuantizedExperts)
    prompt = [5, 17, 2, 41, 9, 33, 8]
    assert _greedy(quantized, prompt) == _greedy(reference, prompt)
