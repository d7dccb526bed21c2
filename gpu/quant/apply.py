"""Quantizing a loaded model's linear layers in place, and keeping a tied head tied."""

from __future__ import annotations

from collections.abc import Collection

from torch import nn

from gpu.model_config import ModelConfig
from gpu.models.moe import StackedExperts
from gpu.quant.experts import QuantizedExperts
from gpu.quant.linear import QuantizedEmbedding, QuantizedLinear
from gpu.quant.scheme import Quantization


def quantize_linears(
    module: nn.Module, scheme: Quantization, keep: Collection[str] = ()
) -> list[str]:
    """Replace every float `nn.Linear` of `module` by a QuantizedLinear, and every sparse MLP's
    float experts (`StackedExperts`, a product of every expert) by QuantizedExperts (its router
    stays float); but those named in `keep`, and those whose input features the scheme cannot
    group. Return the names replaced.

    Names are the module's own (`layers.3.self_attn.qkv_proj`, `lm_head`, a sparse MLP's
    `layers.3.mlp.gate_up` and `layers.3.mlp.down`)."""
    done: list[str] = []
    for name, child in list(module.named_modules()):
        if not isinstance(child, (nn.Linear, StackedExperts)):
            continue
        if name in keep or not scheme.fits(child.in_features):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if isinstance(child, StackedExperts):
            setattr(parent, attr, QuantizedExperts.of(child.weight, scheme))
        else:
            bias = None if child.bias is None else child.bias.detach()
            setattr(parent, attr, QuantizedLinear(scheme.quantize(child.weight.detach()), bias))
        done.append(name)
    return done


def tie_quantized(module: nn.Module, config: ModelConfig) -> None:
    """With tied embeddings, one side quantized makes both share its integers: a GGUF's
    quantized table becomes the head too, a quantized head becomes the table."""
    if not config.tie_word_embeddings:
        return
    attr = "wte" if hasattr(module, "wte") else "embed_tokens"
    embed, head = getattr(module, attr), getattr(module, "lm_head", None)
    if isinstance(embed, QuantizedEmbedding) and not isinstance(head, QuantizedLinear):
        module.lm_head = QuantizedLinear(embed.qweight)
    elif isinstance(head, QuantizedLinear) and not isinstance(embed, QuantizedEmbedding):
        setattr(module, attr, QuantizedEmbedding(head.qweight, embed.weight.dtype))
