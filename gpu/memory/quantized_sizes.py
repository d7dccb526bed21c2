"""Bytes a model's weights take when its linear layers are held quantized: pure arithmetic
over its shapes (the planner's), and over a GGUF header's tensor types (`auto`).

A quantized [out, in] matrix (`gpu/quantized_weight.py`) holds its integers (in bytes at 8 bits,
in / 2 at 4) and a float32 scale per group, plus a float32 offset per group at 4 bits (the
zero point). With tied embeddings the quantized head and the table are one matrix.
"""

from __future__ import annotations

from gpu.model_config import GEMMA_FAMILY, ModelConfig

# bytes per weight of the kernel format each GGUF block type loads into, with `auto`
# (`gpu.loading.gguf_quants.to_quantized`): integers + float32 scales (+ offsets)
GGUF_KEPT_BYTES_PER_WEIGHT = {
    "Q4_0": 0.5 + 8 / 32,  # 4 bits with an offset of -8 d
    "Q4_1": 0.5 + 8 / 32,
    "Q4_K": 0.5 + 8 / 32,
    "Q5_0": 1 + 4 / 32,
    "Q5_1": 1 + 8 / 32,
    "Q5_K": 1 + 8 / 32,
    "Q6_K": 1 + 4 / 16,
    "Q8_0": 1 + 4 / 32,
}


def matrix_bytes(out: int, inputs: int, method: str, group: int | None) -> int:
    """A quantized [out, in] matrix: `int8` per output channel, `int4` in groups of `group`."""
    if method == "int8":
        return out * inputs + 4 * out
    if method == "int4":
        g = group or 32
        while g > 32 and inputs % g:  # as `Quantization.group_for`
            g //= 2
        return out * inputs // 2 + 8 * out * (inputs // g)
    raise ValueError(f"{method!r} is not a quantization of weights")


def linear_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """The [out, in] of every linear layer `--quantization int8|int4` quantizes: each layer's
    fused qkv, o, fused gate/up and down (dense MLPs; a sparse layer's of each expert, its
    router left float), and the LM head."""
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    expert_i = config.moe_intermediate_size or i
    shapes: list[tuple[int, int]] = []
    if config.arch == "gpt2":
        per_layer = [(3 * h, h), (h, h), (i, h), (h, i)]
        shapes = per_layer * config.num_layers
    else:
        for index in range(config.num_layers):
            shapes += [(q + 2 * kv, h), (h, q)]
            if config.arch in GEMMA_FAMILY or not config.sparse_layer(index):
                shapes += [(2 * i, h), (h, i)]
            else:
                shapes += [(2 * expert_i, h), (h, expert_i)] * config.num_experts
    shapes.append((config.vocab_size, h))
    return shapes


def quantized_weights_bytes(
    config: ModelConfig, dtype_bytes: int, method: str, group: int | None
) -> int:
    """All weights with the linear layers quantized and the rest in the compute dtype."""
    linears = linear_shapes(config)
    # tied: the table is the head, one of the linears; untied: the table stays float
    floats = config.num_parameters() - sum(o * i for o, i in linears)
    quantized = sum(matrix_bytes(o, i, method, group) for o, i in linears)
    return floats * dtype_bytes + quantized
