"""The sparse MLP of Mixtral and Qwen3-MoE: a top-k router over SwiGLU experts.

Each token goes to `num_experts_per_tok` experts. The (token, expert) pairs are sorted by
expert, so each expert multiplies all its tokens' rows at once: one pair of matmuls per expert
that has tokens (a loop over experts, none over tokens). Gate and up are fused per expert at
load, as in the dense MLP.

Each product of every expert is one module (`Experts`): float32, stacked (`StackedExperts`:
gate_up [experts, 2i, hidden], down [experts, hidden, i]), or held quantized, which
`--quantization` puts in its place (`gpu.quant.experts.QuantizedExperts`). The router always
stays float: routing is a discrete choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from gpu.backends.layer_ops import LayerOps
from gpu.model_config import ModelConfig
from gpu.models.layers import WeightSource, copy_into
from gpu.quantized_weight import QuantizedWeight


class Experts(Protocol):
    """One product of every expert: expert e's [out, in] matrix."""

    def product(self, expert: int, rows: torch.Tensor) -> torch.Tensor: ...  # [n, in] -> [n, out]

    def matrix(self, expert: int) -> torch.Tensor | QuantizedWeight: ...  # as held


class StackedExperts(nn.Module):
    """One product of every expert in float: `weight` [experts, out, in]."""

    def __init__(self, experts: int, out: int, inputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out, inputs))
        self.in_features = inputs

    def product(self, expert: int, rows: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        return F.linear(rows, self.weight[expert])

    def matrix(self, expert: int) -> torch.Tensor:  # [out, in]
        return self.weight[expert].detach()


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, h = config.num_experts, config.hidden_size
        i = config.moe_intermediate_size or config.intermediate_size
        self.top_k = config.num_experts_per_tok
        self.renormalise = config.norm_topk_prob
        # The router stays a plain weight (never oneDNN-packed): routing is a discrete choice,
        # so its logits are computed as transformers computes them, by F.linear.
        self.router = nn.Parameter(torch.empty(e, h))  # [experts, hidden]
        self.num_experts, self.inter = e, i
        self.gate_up: Experts = StackedExperts(e, 2 * i, h)  # [experts, 2 * i, hidden]
        self.down: Experts = StackedExperts(e, h, i)  # [experts, hidden, i]

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        ops: LayerOps | None = None,  # unused: the experts' products are grouped matmuls here
    ) -> torch.Tensor:  # [tokens, hidden]
        tokens = x.shape[0]
        probs = F.softmax(F.linear(x, self.router).float(), dim=-1)  # [tokens, experts]
        weights, experts = probs.topk(self.top_k, dim=-1)  # [tokens, top_k]
        if self.renormalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = experts.flatten()  # [tokens * top_k]
        order = flat.argsort(stable=True)  # the pairs grouped by expert
        token_of = order // self.top_k  # [pairs] which token each sorted pair is
        # One host sync a layer: how many rows each expert's matmuls take.
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = x[token_of]  # [pairs, hidden], expert by expert
        out = torch.empty_like(rows)
        begin = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            end = begin + count
            gate, up = self.gate_up.product(expert, rows[begin:end]).chunk(2, dim=-1)
            out[begin:end] = self.down.product(expert, F.silu(gate) * up)
            begin = end
        out = out * weights.flatten()[order].unsqueeze(1).to(out.dtype)
        return x.new_zeros(tokens, x.shape[1]).index_add_(0, token_of, out)

    def load(self, src: WeightSource, prefix: str, names: ExpertNames) -> None:
        """Copy in the router and each expert's weights (gate and up into one matrix), into
        float experts (before any quantization).

        `prefix`: the layer's, `model.layers.N.`."""
        gate_up, down = self.gate_up, self.down
        assert isinstance(gate_up, StackedExperts) and isinstance(down, StackedExperts)
        e, h, i = down.weight.shape
        block = prefix + names.block
        if block + "gate.weight" not in src.tensors:
            block = prefix + "mlp."  # transformers 5's name for Mixtral's block in memory
        copy_into(self.router, src.take(block + "gate.weight", (e, h)))
        if block + "experts.gate_up_proj" in src.tensors:  # experts saved as 3-D tensors
            copy_into(gate_up.weight, src.take(block + "experts.gate_up_proj", (e, 2 * i, h)))
            copy_into(down.weight, src.take(block + "experts.down_proj", (e, h, i)))
            return
        for n in range(e):
            p = f"{block}experts.{n}."
            copy_into(gate_up.weight[n, :i], src.take(p + names.gate, (i, h)))
            copy_into(gate_up.weight[n, i:], src.take(p + names.up, (i, h)))
            copy_into(down.weight[n], src.take(p + names.down, (h, i)))


@dataclass(frozen=True)
class ExpertNames:
    """How a checkpoint names an MoE block's tensors: `model.layers.N.<block>experts.E.<gate>`."""

    block: str
    gate: str
    up: str
    down: str


EXPERT_NAMES = {
    "mixtral": ExpertNames("block_sparse_moe.", "w1.weight", "w3.weight", "w2.weight"),
    "qwen3_moe": ExpertNames("mlp.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"),
}
