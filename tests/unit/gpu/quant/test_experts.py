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
from gpu.models.moe import SparseMoE, StackedExperts
from gpu.quant.apply import quantize_linears
from gpu.quant.experts import QuantizedExperts
from gpu.quant.scheme import Quantization, describe
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


def test_keep_leaves_named_experts_float(tiny_checkpoints: dict[str, Path]) -> None:
    path = tiny_checkpoints["mixtral"]
    keep = {"layers.0.mlp.gate_up", "layers.0.mlp.down"}
    model = load_model(path, device="cpu", quantization="int8", keep=keep)
    sparse = _sparse(model)
    assert isinstance(sparse["layers.0.mlp"].gate_up, StackedExperts)
    assert isinstance(sparse["layers.0.mlp"].down, StackedExperts)
    rest = [m for name, m in sparse.items() if name != "layers.0.mlp"]
    assert rest and all(isinstance(m.down, QuantizedExperts) for m in rest)
    assert "float32" in model.quantization  # the float experts are counted


def test_experts_whose_inputs_the_scheme_cannot_group_stay_float(
    tiny_checkpoints: dict[str, Path],
) -> None:
    config = load_hf_config(tiny_checkpoints["qwen3_moe"])
    moe = SparseMoE(dataclasses.replace(config, moe_intermediate_size=40))  # 40: not 16 · n
    assert quantize_linears(moe, Quantization.parse("int8")) == ["gate_up"]
    assert isinstance(moe.gate_up, QuantizedExperts) and isinstance(moe.down, StackedExperts)
    assert describe(moe, torch.float32) == "int8+float32"  # gate_up's 2 · 40 rows, down's 64


@pytest.mark.parametrize(("arch", "scheme"), [("mixtral", "int8"), ("qwen3_moe", "int4")])
def test_quantized_experts_generate_as_their_dequantized_weights_do(
    tiny_checkpoints: dict[str, Path], arch: str, scheme: str
) -> None:
    """Through the quantized kernels (the layers' path and the one-call decode step) against
    the same integers as float experts."""
    path = tiny_checkpoints[arch]
    quantized = load_model(path, device="cpu", quantization=scheme)
    reference = load_model(path, device="cpu", quantization=scheme)
    for name, moe in _sparse(reference).items():  # the same integers, as float experts
        for attr in ("gate_up", "down"):
            experts = getattr(moe, attr)
            assert isinstance(experts, QuantizedExperts)
            float_experts = StackedExperts(
                moe.num_experts, experts.out_features, experts.in_features
            )
            with torch.no_grad():
                for e in range(moe.num_experts):
                    float_experts.weight[e] = experts.matrix(e).dequantize()
            setattr(moe, attr, float_experts)
        assert isinstance(_sparse(quantized)[name].down, QuantizedExperts)
    prompt = [5, 17, 2, 41, 9, 33, 8]
    assert _greedy(quantized, prompt) == _greedy(reference, prompt)
