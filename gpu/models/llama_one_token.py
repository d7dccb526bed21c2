"""A single-sequence decode step of a Llama-family model as one native call.

At batch 1 a step's work is streaming every weight once. Through PyTorch it is ~300 ops, each
forking and joining the thread pool, with Python in between; `tm_llama_decode_one`
(`gpu/kernels/cpu_kernels.c`) runs the whole step, every layer and the LM head, in one
parallel region over the plain weights (measured 2026-12-01, SmolLM2-135M's 121 products:
7.2 ms in one region against 9.5 ms as separate oneDNN calls). The engine takes this path on
float32 CPU models with the native kernels when a step is exactly one decode token; every
other step runs the layers as usual. Same arithmetic, so the same tokens.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from gpu.kernels.native import CpuKernels
from gpu.kv_pool import KVPool
from gpu.models.attention import AttentionMetadata

if TYPE_CHECKING:
    from gpu.models.llama import LlamaForCausalLM

WEIGHTS_PER_LAYER = 8  # the C side's layout of `layer_weights`


def one_token_step(meta: AttentionMetadata, tokens: int) -> bool:
    """Whether a step is one decode token and nothing else."""
    return (
        tokens == 1
        and not meta.prefills
        and len(meta.decodes) == 1
        and meta.decodes[0].end - meta.decodes[0].begin == 1
    )


class OneTokenDecode:
    """The model's weights as the native call takes them, gathered once per model."""

    def __init__(self, model: LlamaForCausalLM, kernels: CpuKernels) -> None:
        self.model = model
        self.kernels = kernels
        c = model.config
        held: list[torch.Tensor | None] = []
        for layer in model.typed_layers():
            attn, mlp = layer.self_attn, layer.mlp
            held += [
                layer.input_layernorm.weight,
                attn.qkv_proj.weight,
                attn.qkv_proj.bias,
                attn.o_proj.weight,
                attn.o_proj.bias,
                layer.post_attention_layernorm.weight,
                mlp.gate_up_proj.weight,
                mlp.down_proj.weight,
            ]
        for t in [*held, model.norm.weight, model.lm_head.weight]:
            if t is not None and not (t.dtype == torch.float32 and t.is_contiguous()):
                raise ValueError("the one-token path needs contiguous float32 weights")
        pointers = [None if t is None else t.data_ptr() for t in held]
        self.layer_weights = (ctypes.c_void_p * len(pointers))(*pointers)
        self.layers = c.num_layers
        self.scale = c.head_dim**-0.5  # as LlamaAttention's
        self._pools: dict[tuple[int, ...], tuple[ctypes.Array[ctypes.c_void_p], ...]] = {}

    def _pool_pointers(self, kv: KVPool) -> tuple[ctypes.Array[ctypes.c_void_p], ...]:
        # Keyed by address and shape: a later pool may take a freed one's address, and with
        # another shape its layers lie elsewhere.
        key = (kv.cache.data_ptr(), *kv.cache.shape)
        if key not in self._pools:
            k = [kv.cache[i, 0].data_ptr() for i in range(self.layers)]
            v = [kv.cache[i, 1].data_ptr() for i in range(self.layers)]
            self._pools[key] = (
                (ctypes.c_void_p * self.layers)(*k),
                (ctypes.c_void_p * self.layers)(*v),
            )
        return self._pools[key]

    def __call__(
        self,
        x: torch.Tensor,  # [1, hidden] the token's embedding (becomes its residual stream)
        positions: torch.Tensor,  # [1] int64
        kv: KVPool,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [1, vocab] float32 logits
        m, c = self.model, self.model.config
        group = meta.decodes[0]
        ctx = int(group.lengths[0])
        slot = int(meta.slot_mapping[0])
        position = int(positions[0])
        table = group.blocks.contiguous()
        if table.dtype != torch.int64 or table.numel() * kv.block_size < ctx:
            raise ValueError("the one-token path needs an int64 block table covering the context")
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        work = torch.empty(
            2 * c.hidden_size
            + 2 * q_size
            + 2 * kv_size
            + 2 * c.intermediate_size
            + c.num_heads * ctx
        )
        residual = x.contiguous()
        logits = torch.empty(1, c.vocab_size)
        row = position * c.head_dim * 4  # bytes into the float32 rotary tables
        k_layers, v_layers = self._pool_pointers(kv)
        self.kernels.llama_decode_one(
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
            self.layer_weights,
            m.norm.weight.data_ptr(),
            m.lm_head.weight.data_ptr(),
            c.norm_eps,
            self.scale,
            m.rope_cos.data_ptr() + row,
            m.rope_sin.data_ptr() + row,
            k_layers,
            v_layers,
            table.data_ptr(),
            kv.block_size,
            ctx,
            slot,
            residual.data_ptr(),
            work.data_ptr(),
            logits.data_ptr(),
        )
        return logits
