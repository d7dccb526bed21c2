"""Quantizing a loaded model's linear layers in place, and keeping a tied head tied."""

from __future__ import annotations

from collections.abc import Collection

from torch import nn

from gpu.model_config import ModelConfig
from gpu.models.moe import SparseMoE
from gpu.quant.linear import QuantizedEmbedding, QuantizedLinear
from gpu.quant.scheme import Quantization


def quantize_linears(
    module: nn.Module, scheme: Quantization, keep: Collection[str] = ()
) -> list[str]:
    """Replace every float `nn.Linear` of `module` (but those named in `keep`, and those whose
    input features the scheme cannot group) by a QuantizedLinear, and hold every sparse MLP's
    experts quantized (`SparseMoE.quantize`; its router stays float); return the names done.

    Names are the module's own (`layers.3.self_attn.qkv_proj`, `lm_head`; a sparse MLP's
    experts by its name, `layers.3.mlp`)."""
    done: list[str] = []
    for name, child in list(module.named_modules()):
        if isinstance(child, SparseMoE) and name not in keep and child.quantize(scheme):
            done.append(name)
            continue
        if not isinstance(child, nn.Linear) or name in keep or not scheme.fits(child.in_features):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
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
