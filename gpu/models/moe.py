"""The sparse MLP of Mixtral and Qwen3-MoE: a top-k router over SwiGLU experts.

Each token goes to `num_experts_per_tok` experts. The (token, expert) pairs are sorted by
expert, so each expert multiplies all its tokens' rows at once: one pair of matmuls per expert
that has tokens (a loop over experts, none over tokens). Gate and up are fused per expert at
load, as in the dense MLP.

The experts are float (`gate_up` [experts, 2i, hidden], `down` [experts, hidden, i]) until
`quantize` makes each product a `QuantizedExperts` (int8/int4, `--quantization`); the router
always stays float: routing is a discrete choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpu.backends.layer_ops import LayerOps
from gpu.model_config import ModelConfig
from gpu.models.layers import WeightSource, copy_into
from gpu.quant.experts import QuantizedExperts
from gpu.quant.scheme import Quantization
from gpu.quantized_weight import QuantizedWeight

Experts = nn.Parameter | QuantizedExperts  # one product of every expert: stacked floats, or not


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
        self.gate_up: Experts = nn.Parameter(torch.empty(e, 2 * i, h))  # [experts, 2 * i, hidden]
        self.down: Experts = nn.Parameter(torch.empty(e, h, i))  # [experts, hidden, i]

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
            gate, up = _product(self.gate_up, expert, rows[begin:end]).chunk(2, dim=-1)
            out[begin:end] = _product(self.down, expert, F.silu(gate) * up)
            begin = end
        out = out * weights.flatten()[order].unsqueeze(1).to(out.dtype)
        return x.new_zeros(tokens, x.shape[1]).index_add_(0, token_of, out)

    def quantize(self, scheme: Quantization) -> bool:
        """Hold every expert's products quantized by `scheme`; False (left float) when a
        product's input features do not fit it."""
        if not isinstance(self.gate_up, nn.Parameter) or not isinstance(self.down, nn.Parameter):
            return False  # quantized already
        hidden = self.gate_up.shape[2]
        if not (scheme.fits(hidden) and scheme.fits(self.inter)):
            return False
        gate_up, down = self.gate_up, self.down
        del self.gate_up, self.down  # parameters: nn.Module takes no module in their place
        self.gate_up = QuantizedExperts.of(gate_up, scheme)
        self.down = QuantizedExperts.of(down, scheme)
        return True

    def expert_weights(
        self, expert: int
    ) -> tuple[torch.Tensor | QuantizedWeight, torch.Tensor | QuantizedWeight]:
        """Expert `expert`'s gate_up [2i, hidden] and down [hidden, i], as held."""
        return _weight(self.gate_up, expert), _weight(self.down, expert)

    def load(self, src: WeightSource, prefix: str, names: ExpertNames) -> None:
        """Copy in the router and each expert's weights (gate and up into one matrix), before
        any `quantize`.

        `prefix`: the layer's, `model.layers.N.`."""
        assert isinstance(self.gate_up, nn.Parameter) and isinstance(self.down, nn.Parameter)
        e, h, i = self.down.shape
        block = prefix + names.block
        if block + "gate.weight" not in src.tensors:
            block = prefix + "mlp."  # transformers 5's name for Mixtral's block in memory
        copy_into(self.router, src.take(block + "gate.weight", (e, h)))
        if block + "experts.gate_up_proj" in src.tensors:  # experts saved as 3-D tensors
            copy_into(self.gate_up, src.take(block + "experts.gate_up_proj", (e, 2 * i, h)))
            copy_into(self.down, src.take(block + "experts.down_proj", (e, h, i)))
            return
        for n in range(e):
            p = f"{block}experts.{n}."
            copy_into(self.gate_up[n, :i], src.take(p + names.gate, (i, h)))
            copy_into(self.gate_up[n, i:], src.take(p + names.up, (i, h)))
            copy_into(self.down[n], src.take(p + names.down, (h, i)))


def _product(experts: Experts, expert: int, rows: torch.Tensor) -> torch.Tensor:
    """rows [n, in] through expert `expert`'s matrix of `experts`: [n, out]."""
    if isinstance(experts, QuantizedExperts):
        return experts.product(expert, rows)
    return F.linear(rows, experts[expert])


def _weight(experts: Experts, expert: int) -> torch.Tensor | QuantizedWeight:
    if isinstance(experts, QuantizedExperts):
        return experts.weight(expert)
    return experts[expert].detach()


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
