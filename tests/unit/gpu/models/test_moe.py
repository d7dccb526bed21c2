"""The sparse MLP alone: grouped by expert it computes what a loop over tokens does, and it
reads the experts from either layout a checkpoint may hold them in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from gpu.loading.model_config import load_hf_config
from gpu.models.layers import WeightSource
from gpu.models.moe import EXPERT_NAMES, SparseMoE


def one_token_at_a_time(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:  # [tokens, hidden]
    rows = []
    for token in x:
        probs = F.softmax(moe.router @ token, dim=-1)
        weights, experts = probs.topk(moe.top_k)
        if moe.renormalise:
            weights = weights / weights.sum()
        out = torch.zeros_like(token)
        for weight, e in zip(weights, experts.tolist(), strict=True):
            gate, up = (moe.gate_up.matrix(e) @ token).chunk(2)
            out += weight * (moe.down.matrix(e) @ (F.silu(gate) * up))
        rows.append(out)
    return torch.stack(rows)


@pytest.mark.parametrize("renormalise", [True, False])
def test_grouped_by_expert_equals_token_by_token(
    tiny_checkpoints: dict[str, Path], renormalise: bool
) -> None:
    config = load_hf_config(tiny_checkpoints["qwen3_moe"])
    config = dataclasses.replace(config, num_experts=6, num_experts_per_tok=3)
    moe = SparseMoE(dataclasses.replace(config, norm_topk_prob=renormalise))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in moe.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.3)
        x = torch.randn(37, config.hidden_size, generator=g)
        torch.testing.assert_close(moe(x), one_token_at_a_time(moe, x), atol=1e-5, rtol=1e-5)
        assert moe(x[:0]).shape == (0, config.hidden_size)  # a step with no tokens


def test_experts_load_from_per_expert_or_stacked_tensors(tiny_checkpoints: dict[str, Path]) -> None:
    """Mixtral as published (block_sparse_moe.experts.E.w1/w2/w3) and as transformers 5
    holds it in memory (mlp.experts.gate_up_proj [E, 2i, h], down_proj [E, h, i])."""
    path = tiny_checkpoints["mixtral"]
    config = load_hf_config(path)
    tensors = load_file(path / "model.safetensors")
    p = "model.layers.0."
    e = config.num_experts
    block = p + "block_sparse_moe."
    stacked = {
        p + "mlp.gate.weight": tensors[block + "gate.weight"],
        p + "mlp.experts.gate_up_proj": torch.stack(
            [
                torch.cat(
                    (
                        tensors[f"{block}experts.{n}.w1.weight"],
                        tensors[f"{block}experts.{n}.w3.weight"],
                    )
                )
                for n in range(e)
            ]
        ),
        p + "mlp.experts.down_proj": torch.stack(
            [tensors[f"{block}experts.{n}.w2.weight"] for n in range(e)]
        ),
    }
    published, in_memory = SparseMoE(config), SparseMoE(config)
    published.load(WeightSource(tensors, path), p, EXPERT_NAMES["mixtral"])
    in_memory.load(WeightSource(stacked, path), p, EXPERT_NAMES["mixtral"])
    for a, b in zip(published.parameters(), in_memory.parameters(), strict=True):
        assert torch.equal(a, b)
