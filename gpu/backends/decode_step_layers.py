"""What each family's layer gives the one-call decode step (`native_decode_step.DecodeStep`):
its vectors (norms, biases) and its products' weights in the order `tm_decode_step` takes them,
and a sparse layer's router and experts.

    vectors, linears = decoder_layer(layer, config, panel_width)   # Llama and Gemma families
    vectors, linears = gpt2_layer(layer, panel_width)              # GPT-2
    table = experts(layer.mlp)                                     # Mixtral, Qwen3-MoE
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from gpu.kernels.native import TmWeight, tm_weight
from gpu.model_config import GEMMA_FAMILY, ModelConfig
from gpu.models.moe import SparseMoE
from gpu.quantized_weight import QuantizedWeight

# One layer as the C side takes it: its VECTORS_PER_LAYER vectors (or None), and its
# LINEARS_PER_LAYER weights (None: not read), each with the first row the product starts at and
# its panels.
Linear = tuple[torch.Tensor | QuantizedWeight | None, int, torch.Tensor | None]
LayerParts = tuple[list[torch.Tensor | None], list[Linear]]
NO_LINEAR = (None, 0, None)  # a slot the layer does not use (a sparse layer's dense MLP)


def decoder_layer(layer: Any, c: ModelConfig, width: int) -> LayerParts:
    """A Llama- or Gemma-family layer's parts."""
    gemma = c.arch in GEMMA_FAMILY
    factor = gemma_norm if gemma else plain_norm
    attn, mlp = layer.self_attn, layer.mlp
    # Gemma: a norm of attention's output (its `post_attention_layernorm`), another before the
    # MLP and one of the MLP's output; a Llama's `post_attention_layernorm` is the one before
    # the MLP
    before_mlp = layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm
    attention: list[Linear] = [
        (held_weight(attn.qkv_proj), 0, panels_of(attn.qkv_proj, width)),
        (held_weight(attn.o_proj), 0, panels_of(attn.o_proj, width)),
    ]
    vectors: list[torch.Tensor | None] = [
        factor(layer.input_layernorm),
        attn.qkv_proj.bias,
        attn.o_proj.bias,
        factor(before_mlp),
        factor(attn.q_norm) if c.qk_norm else None,
        factor(attn.k_norm) if c.qk_norm else None,
        factor(layer.post_attention_layernorm) if gemma else None,
        factor(layer.post_feedforward_layernorm) if gemma else None,
        None,  # RMSNorms: no biases
        None,
        None,  # no MLP biases
        None,
    ]
    if isinstance(mlp, SparseMoE):  # the experts: `_experts`
        return vectors, [*attention, NO_LINEAR, NO_LINEAR, NO_LINEAR]
    gate_up = held_weight(mlp.gate_up_proj)
    # gate's panels then up's: both or neither (a thread applies silu(gate) · up to the
    # features it computed of both)
    gate_up_panels = panels_of(mlp.gate_up_proj, width)
    if c.intermediate_size % width:
        gate_up_panels = None
    matrices: list[Linear] = [
        *attention,
        (gate_up, 0, gate_up_panels),
        (gate_up, c.intermediate_size, gate_up_panels),
        (held_weight(mlp.down_proj), 0, panels_of(mlp.down_proj, width)),
    ]
    return vectors, matrices


def experts(moe: SparseMoE) -> ctypes.Array[TmWeight]:
    """A sparse layer's weights as `tm_decode_arch.moe_layers[l]` takes them: the router, then
    each expert's gate, up and down, as held (views of the stacked float32 experts, or each
    expert's int8/int4 matrices)."""
    weights = [tm_weight(moe.router.detach())]
    for expert in range(moe.num_experts):
        gate_up = moe.gate_up.matrix(expert)  # [2 inter, hidden]
        down = moe.down.matrix(expert)  # [hidden, inter]
        weights += [tm_weight(gate_up), tm_weight(gate_up, moe.inter), tm_weight(down)]
    return (TmWeight * len(weights))(*weights)


def gpt2_layer(layer: Any, width: int) -> LayerParts:
    """A GPT-2 layer's parts: LayerNorms with biases, biases on every product, no gate (its
    slot holds up again, which the C side does not read)."""
    vectors: list[torch.Tensor | None] = [
        layer.ln_1.weight,
        layer.c_attn.bias,
        layer.attn_proj.bias,
        layer.ln_2.weight,
        None,  # no q/k norms
        None,
        None,  # no norms after attention or the MLP
        None,
        layer.ln_1.bias,
        layer.ln_2.bias,
        layer.c_fc.bias,
        layer.mlp_proj.bias,
    ]
    up: Linear = (held_weight(layer.c_fc), 0, panels_of(layer.c_fc, width))
    matrices: list[Linear] = [
        (held_weight(layer.c_attn), 0, panels_of(layer.c_attn, width)),
        (held_weight(layer.attn_proj), 0, panels_of(layer.attn_proj, width)),
        up,
        up,
        (held_weight(layer.mlp_proj), 0, panels_of(layer.mlp_proj, width)),
    ]
    return vectors, matrices


def plain_norm(norm: Any) -> torch.Tensor:
    """An RMSNorm's factors as applied: its weight."""
    weight: torch.Tensor = norm.weight
    return weight


def gemma_norm(norm: Any) -> torch.Tensor:
    """A Gemma RMSNorm's factors as applied: 1 + its weight (stored as the offset from 1)."""
    factors: torch.Tensor = (1.0 + norm.weight.detach().float()).contiguous()
    return factors


def panels_of(linear: Any, width: int) -> torch.Tensor | None:
    """A linear module's float weight in panels of `width` (`PackedLinear.panels`), if held."""
    panels = getattr(linear, "panels", None)
    if isinstance(panels, torch.Tensor) and panels.shape[2] == width:
        return panels
    return None


def held_weight(linear: Any) -> torch.Tensor | QuantizedWeight:
    """A linear module's weight as held: its `QuantizedWeight` (`.qweight`, e.g.
    `gpu.quant.linear.QuantizedLinear`) or its float32 `.weight` [out, in]."""
    quantized = getattr(linear, "qweight", None)
    if isinstance(quantized, QuantizedWeight):
        return quantized
    weight: torch.Tensor = linear.weight
    return weight
