"""A decode step of a Llama-, Gemma-family or GPT-2 model as one native call.

A decode step of a few sequences is mostly streaming every weight once. Through PyTorch it
is ~300 ops, each forking and joining the thread pool, with Python in between;
`tm_decode_step` (`gpu/kernels/decode_step.c`) runs the whole step, every layer and the LM
head, in one parallel region, each block of weight rows used for every token while it is in L1
(measured 2026-12-01 on SmolLM2-135M's 121 products at one token: 7.2 ms in one region against
9.5 ms as separate oneDNN calls). The engine takes this path on float32 CPU models with the
native kernels when a step is decodes only, at most `max_rows` of them: `DECODE_STEP_ROWS` over
the plain (or quantized) weights, whose products lose to the layers' from 3 rows; up to
`PANEL_ROWS` where every linear holds its weight in panels (`PackedLinear`, float32 with the
native kernels): the same panel products as the layers', without the layers' ~300 calls
(measured 2026-12-03 on the 64-request workload: 406, 386 → 434, 450 tok/s). Every other
step runs the layers as usual. Same arithmetic, so the same tokens.

A linear layer is float (`.weight` float32 [out, in]: `nn.Linear`, `PackedLinear`) or held
quantized (`.qweight`, a `QuantizedWeight`: int8/int4, which the kernels dequantize in
registers); the call takes each as a `tm_weight` descriptor, so a quantized model's small
decode steps are one call too.

Gemma 2 and 3 take the same call with what sets them apart (`TmDecodeArch`): GeGLU, the norms
after attention and after the MLP, each layer's sliding window and rotary tables, attention's
soft cap; their norms' (1 + w) is added once here, their embedding scale and logit soft cap
applied around the call (`embed`, `__call__`). GPT-2 takes it with LayerNorms (their biases),
no rotary, and its MLP not gated (GELU of the up projection, with biases); its learned
positions are added to the embeddings (`embed`). Mixtral and Qwen3-MoE take it with their
sparse layers' router and experts (`decode_step_layers.experts`; float32, or int8/int4 under
`--quantization`): each token's top-k experts chosen in the call, at most `DECODE_STEP_ROWS`
tokens (the experts are not in panels). What each family's layer gives the call is in
`gpu/backends/decode_step_layers.py`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from gpu.backends.decode_step_layers import (
    Linear,
    decoder_layer,
    experts,
    gemma_norm,
    gpt2_layer,
    held_weight,
    panels_of,
    plain_norm,
)
from gpu.backends.metadata import AttentionMetadata
from gpu.kernels.native import CpuKernels, TmWeight, tm_weight
from gpu.kv_pool import KVPool
from gpu.model_config import GEMMA_FAMILY, LLAMA_FAMILY, ModelConfig
from gpu.models.gemma import embedding_scale
from gpu.models.moe import SparseMoE
from gpu.models.packed_linear import PANEL_ROWS


class DecoderWeights(Protocol):
    """What the step reads of a Llama- or Gemma-family model (`gpu/models/llama.py`,
    `gpu/models/gemma.py`; Gemma's sliding layers also read `local_rope_cos`/`_sin`). GPT-2's
    (`gpu/models/gpt2.py`) are read by their own names (`decode_step_layers.gpt2_layer`)."""

    config: ModelConfig
    embed_tokens: Any  # .weight [vocab, hidden]
    norm: Any  # .weight [hidden]
    lm_head: Any  # .weight [vocab, hidden]
    rope_cos: torch.Tensor  # [positions, rotary_dim] float32
    rope_sin: torch.Tensor

    def typed_layers(self) -> Sequence[Any]: ...


DECODE_STEP_ROWS = 2  # the most decode tokens for the native path (measured: from 3 the layers win)
VECTORS_PER_LAYER = 12  # the C side's layout of `layer_vectors`: norms and biases
LINEARS_PER_LAYER = 5  # and of `layer_linears`: qkv, o, gate, up, down


class TmDecodeArch(ctypes.Structure):
    """decode_step.c's `tm_decode_arch`: what sets the model apart from a plain Llama. Raw
    addresses: the `DecodeStep` holding one keeps what they point into alive."""

    _fields_ = (
        ("gelu", ctypes.c_int64),
        ("rotary_dim", ctypes.c_int64),
        ("attn_softcap", ctypes.c_float),
        ("windows", ctypes.c_void_p),
        ("cos_layers", ctypes.c_void_p),
        ("sin_layers", ctypes.c_void_p),
        ("gated", ctypes.c_int64),
        ("layer_norm", ctypes.c_int64),
        ("final_norm_bias", ctypes.c_void_p),
        ("experts", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
        ("renormalise", ctypes.c_int64),
        ("expert_inter", ctypes.c_int64),
        ("moe_layers", ctypes.c_void_p),
    )


def implements(config: ModelConfig) -> bool:
    """Whether `tm_decode_step` computes this model: Llama layers (Qwen3's q/k norms included,
    Mixtral's and Qwen3-MoE's experts), Gemma 2/3's and GPT-2's, RoPE over whole heads or their
    first dims (Phi-4-mini's partial rotary). LongRoPE (Phi-3) is only other rope tables and
    rows, which the step takes as given."""
    # an encoder has no LM head: gpu/encoder runs it
    return config.arch in (*LLAMA_FAMILY, *GEMMA_FAMILY, GPT2) and not config.bidirectional


GPT2 = "gpt2"


class DecodeStep:
    """The model's weights as the native call takes them, gathered once per model."""

    def __init__(self, model: DecoderWeights, kernels: CpuKernels) -> None:
        self.model = model
        self.kernels = kernels
        c = model.config
        gemma, gpt2 = c.arch in GEMMA_FAMILY, c.arch == GPT2
        vectors: list[torch.Tensor | None] = []
        # (weight, first row, its panels or None)
        matrices: list[Linear] = []
        width = kernels.panel_width
        for layer in model.typed_layers():
            parts = gpt2_layer(layer, width) if gpt2 else decoder_layer(layer, c, width)
            vectors += parts[0]
            matrices += parts[1]
        own: Any = model  # GPT-2's own names (ln_f, wte, wpe)
        if gpt2:
            self.final_norm, final_bias = own.ln_f.weight, own.ln_f.bias
        else:
            self.final_norm = (gemma_norm if gemma else plain_norm)(model.norm)
            final_bias = None
        rotary_dim = 0 if gpt2 else c.rotary_dim
        rope = self._layer_rope(model, gemma, gpt2)
        for t in [*vectors, self.final_norm, final_bias, *rope[0], *rope[1]]:
            if t is not None and not (t.dtype == torch.float32 and t.is_contiguous()):
                raise ValueError("the native decode step needs contiguous float32 norms and biases")
        if any(table.shape[1] != rotary_dim for table in rope[0] + rope[1]):
            raise ValueError(f"rotary tables are not {rotary_dim} wide")
        assert len(vectors) == VECTORS_PER_LAYER * c.num_layers
        assert len(matrices) == LINEARS_PER_LAYER * c.num_layers
        pointers = [None if t is None else t.data_ptr() for t in vectors]
        self.layer_vectors = (ctypes.c_void_p * len(pointers))(*pointers)
        linears = [
            TmWeight() if weight is None else tm_weight(weight, first, panels)
            for weight, first, panels in matrices
        ]
        self.layer_linears = (TmWeight * len(linears))(*linears)
        head_panels = panels_of(model.lm_head, width)
        self.lm_head = tm_weight(held_weight(model.lm_head), 0, head_panels)
        # The descriptors are raw addresses: hold what they point into.
        held = [*vectors, final_bias, held_weight(model.lm_head), head_panels]
        for weight, _, panels in matrices:
            held += [weight, panels]
        self._held: list[Any] = [t for t in held if t is not None]
        every_panel = head_panels is not None and all(p is not None for *_, p in matrices)
        # the most decode rows this step takes: many where every product tiles them
        self.max_rows = PANEL_ROWS if every_panel else DECODE_STEP_ROWS
        self.layers = c.num_layers
        shapes = [layer.shape if gpt2 else layer.self_attn.shape for layer in model.typed_layers()]
        first = shapes[0]
        self.scale = first.scale  # as the attention layers' (Gemma: query_pre_attn_scalar)
        self.embedding_scale = embedding_scale(c.hidden_size, torch.float32) if gemma else None
        self.positions = own.wpe if gpt2 else None  # GPT-2's learned positions
        self.logit_softcap = c.final_logit_softcapping
        windows = [shape.window or 0 for shape in shapes]
        self._windows = torch.tensor(windows, dtype=torch.int64)
        cos, sin = rope
        tables = ctypes.c_void_p * c.num_layers
        self._cos_layers = tables(*(cos[i].data_ptr() for i in range(c.num_layers)))
        self._sin_layers = tables(*(sin[i].data_ptr() for i in range(c.num_layers)))
        self._held += [self.final_norm, *cos, *sin]
        # each sparse layer's router and experts (GPT-2's layers have no `mlp`)
        mlps = [getattr(layer, "mlp", None) for layer in model.typed_layers()]
        expert_tables = [experts(mlp) if isinstance(mlp, SparseMoE) else None for mlp in mlps]
        self._held += [table for table in expert_tables if table is not None]
        self._moe_layers = (ctypes.c_void_p * c.num_layers)(
            *(None if table is None else ctypes.addressof(table) for table in expert_tables)
        )
        expert_inter = (c.moe_intermediate_size or c.intermediate_size) if c.num_experts else 0
        k = c.num_experts_per_tok
        # the work floats a token's sparse MLP needs beyond the dense one's (moe_part's scratch)
        self.moe_room = (
            c.num_experts + 2 * k + 2 * k * expert_inter + c.hidden_size if c.num_experts else 0
        )
        self.arch = TmDecodeArch(
            gelu=int(gemma or gpt2),
            rotary_dim=rotary_dim,
            attn_softcap=first.softcap or 0.0,
            windows=self._windows.data_ptr(),
            cos_layers=ctypes.addressof(self._cos_layers),
            sin_layers=ctypes.addressof(self._sin_layers),
            gated=int(not gpt2),
            layer_norm=int(gpt2),
            final_norm_bias=None if final_bias is None else final_bias.data_ptr(),
            experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            renormalise=int(c.norm_topk_prob),
            expert_inter=expert_inter,
            moe_layers=ctypes.addressof(self._moe_layers) if c.num_experts else None,
        )
        self._pools: dict[tuple[int, ...], tuple[ctypes.Array[ctypes.c_void_p], ...]] = {}

    @staticmethod
    def _layer_rope(
        model: DecoderWeights, gemma: bool, gpt2: bool
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each layer's rotary tables (cos, sin): Gemma's sliding layers have their own; GPT-2
        has none (empty tables, never read)."""
        if gpt2:
            empty = [torch.empty(1, 0) for _ in model.typed_layers()]
            return empty, empty
        cos, sin = [], []
        for layer in model.typed_layers():
            local = gemma and layer.self_attn.shape.window is not None
            cos.append(getattr(model, "local_rope_cos" if local else "rope_cos"))
            sin.append(getattr(model, "local_rope_sin" if local else "rope_sin"))
        return cos, sin

    def embed(
        self,
        input_ids: torch.Tensor,  # [tokens]
        positions: torch.Tensor,  # [tokens] int64
    ) -> torch.Tensor:  # [tokens, hidden]
        """The step's input: the tokens' embeddings, scaled as the model scales them (GPT-2:
        plus its learned positions')."""
        if self.positions is not None:
            own: Any = self.model
            added: torch.Tensor = own.wte(input_ids) + self.positions(positions)
            return added
        x: torch.Tensor = self.model.embed_tokens(input_ids)
        if self.embedding_scale is not None:
            x = x * self.embedding_scale
        return x

    def _pool_pointers(self, kv: KVPool) -> tuple[ctypes.Array[ctypes.c_void_p], ...]:
        # Keyed by address and shape: a later pool may take a freed one's address, and with
        # another shape its layers lie elsewhere.
        key = (kv.cache.data_ptr(), *kv.cache.shape)
        if key not in self._pools:
            k = [kv.cache[i, 0].data_ptr() for i in range(self.layers)]
            v = [kv.cache[i, 1].data_ptr() for i in range(self.layers)]
            pointer_array = ctypes.c_void_p * self.layers
            self._pools[key] = (pointer_array(*k), pointer_array(*v))
        return self._pools[key]

    def __call__(
        self,
        x: torch.Tensor,  # [tokens, hidden] the embeddings (become the residual streams)
        positions: torch.Tensor,  # [tokens] int64
        kv: KVPool,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [tokens, vocab] float32 logits
        c = self.model.config
        group = meta.decodes[0]
        tokens = x.shape[0]
        tables = group.blocks.view(tokens, -1)
        lengths, slots = group.lengths, meta.slot_mapping
        for t in (tables, lengths, slots, positions):
            if t.dtype != torch.int64 or not t.is_contiguous():
                raise ValueError("the native decode step takes contiguous int64 index tensors")
        longest = int(lengths.max())
        if longest > tables.shape[1] * kv.block_size:
            raise ValueError("a block table does not cover its sequence's context")
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        mlp = 2 * c.intermediate_size + self.moe_room  # the dense MLP's or the experts' (moe_part)
        per_token = 2 * c.hidden_size + qkv + c.num_heads * c.head_dim + mlp
        work = torch.empty(tokens * per_token)
        residual = x.contiguous()
        logits = torch.empty(tokens, c.vocab_size)
        k_layers, v_layers = self._pool_pointers(kv)
        self.kernels.decode_step(
            tokens,
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
            self.layer_vectors,
            self.layer_linears,
            self.final_norm.data_ptr(),
            ctypes.byref(self.lm_head),
            c.norm_eps,
            self.scale,
            ctypes.addressof(self.arch),
            positions.data_ptr(),
            k_layers,
            v_layers,
            tables.data_ptr(),
            tables.shape[1],
            lengths.data_ptr(),
            slots.data_ptr(),
            kv.block_size,
            residual.data_ptr(),
            work.data_ptr(),
            logits.data_ptr(),
        )
        if self.logit_softcap is not None:  # Gemma 2: cap · tanh(logits / cap)
            logits.div_(self.logit_softcap).tanh_().mul_(self.logit_softcap)
        return logits
