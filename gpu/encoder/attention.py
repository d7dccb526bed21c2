"""Bidirectional attention over a packed batch of whole sequences: the encoder's `LayerOps`.

An encoder step lays its inputs out flat, one after another (`packed_inputs`); each attends
to itself only, every token to every other, no K/V kept. A sliding layer sees the window on
both sides, as transformers builds EmbeddingGemma's mask: with `use_bidirectional_attention`
its config turns `sliding_window` (512) into `512 // 2 + 1` and lets a query at q see a key
at k where |q - k| < that, i.e. `reach = window // 2` (256) positions either side. Full
layers see the whole sequence.

`EncoderOps` wraps the backend's ops (`gpu/backends/layer_ops.py`): norms, activations and
the rotary tables are theirs. Attention: with the native CPU kernels, one call for every
sequence of the step, each read in place in the qkv rows (`span_attention`); otherwise SDPA
over short sequences padded into batches and long ones alone, in query chunks that multiply
only the keys in reach (`gpu.encoder.attend`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu.backends.layer_ops import AttentionShape, LayerOps, Rope, split_heads
from gpu.backends.metadata import AttentionMetadata, ModelInputs, PrefillSpan
from gpu.encoder.attend import Plan, attend_alone, attend_batch, plan
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import LayerKV
from gpu.models.layers import apply_rope


def reach(window: int | None) -> int | None:
    """Positions a sliding layer's query sees on each side (transformers: |q - k| <
    window // 2 + 1); None: the whole sequence."""
    return None if window is None else window // 2


def packed_inputs(sequences: Sequence[Sequence[int]], device: torch.device) -> ModelInputs:
    """The inputs of one encoder step: `sequences` laid out flat, each at positions 0 .. n-1,
    one `PrefillSpan` each (rows `begin:end`); no K/V slots, no logits rows."""
    spans: list[PrefillSpan] = []
    ids: list[int] = []
    positions: list[int] = []
    begin = 0
    for tokens in sequences:
        n = len(tokens)
        spans.append(PrefillSpan(begin, begin + n, n, None, None))
        ids.extend(tokens)
        positions.extend(range(n))
        begin += n
    # one copy to the device: [2, tokens] ids and positions
    host = torch.tensor([ids, positions], dtype=torch.int64).to(device)
    empty = host.new_empty(0)
    meta = AttentionMetadata(slot_mapping=empty, decodes=(), prefills=tuple(spans))
    return ModelInputs(host[0], host[1], host[1], meta, empty)


class EncoderOps:
    """`LayerOps` for an encoder step (`packed_inputs`): the backend's `inner` ops for all but
    attention, which is bidirectional per sequence. `kernels`: the backend's kernel library,
    whose in-place rotation is used where `inner` leaves rotating to attention."""

    def __init__(self, inner: LayerOps, kernels: StepKernels | None = None) -> None:
        self.inner = inner
        self.kernels = kernels
        self._meta: AttentionMetadata | None = None  # the step the plans are for
        self._plans: dict[int | None, Plan] = {}  # by reach
        self._span_bounds: tuple[AttentionMetadata, torch.Tensor] | None = None

    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden]
    ) -> torch.Tensor:  # [rows, hidden]
        return self.inner.rms_norm(x, weight, eps, residual)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        return self.inner.silu_mul(gate_up)

    def gelu_tanh_mul(
        self, gate_up: torch.Tensor
    ) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        return self.inner.gelu_tanh_mul(gate_up)

    def rope(
        self, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
    ) -> Rope:
        rope = self.inner.rope(cos, sin, rows, dtype)
        if rope.cos is None and self.kernels is None:  # gathered once, for every layer
            gathered = cos[rows].unsqueeze(1).to(dtype), sin[rows].unsqueeze(1).to(dtype)
            rope = Rope(cos, sin, rows, *gathered)
        return rope

    def attention(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size] rows contiguous
        shape: AttentionShape,
        rope: Rope | None,
        kv: LayerKV,  # unused: an encoder keeps no K/V
        meta: AttentionMetadata,  # one PrefillSpan per sequence (`packed_inputs`)
    ) -> torch.Tensor:  # [tokens, heads, head_dim]
        q, k, v = split_heads(qkv, shape)
        if rope is not None:
            self._rotate_(qkv, q, k, shape, rope)
        out = q.new_empty(q.shape)
        side = reach(shape.window)
        span_attention = getattr(self.kernels, "span_attention", None)
        if span_attention is not None:  # every sequence in one native call, read in place
            bounds = self._bounds(meta)
            span_attention(
                q, k, v, bounds, shape.scale, out, before=side, after=side, softcap=shape.softcap
            )
            return out
        steps = self._plan(meta, side, qkv.device)
        for batch in steps.batches:
            attend_batch(qkv, shape, batch, out)
        for span in steps.alone:
            rows = slice(span.begin, span.end)
            attend_alone(q[rows], k[rows], v[rows], side, shape.scale, shape.softcap, out[rows])
        return out

    def _bounds(self, meta: AttentionMetadata) -> torch.Tensor:  # [2, sequences] int64
        """Each sequence's first row and end, for the native kernel: made by the first layer."""
        if self._span_bounds is None or self._span_bounds[0] is not meta:
            spans = meta.prefills
            rows = torch.tensor([[s.begin for s in spans], [s.end for s in spans]])
            self._span_bounds = (meta, rows)
        return self._span_bounds[1]

    def _plan(self, meta: AttentionMetadata, side: int | None, device: torch.device) -> Plan:
        """The step's plan for layers of this reach: made by the first such layer."""
        if meta is not self._meta:
            self._meta, self._plans = meta, {}
        found = self._plans.get(side)
        if found is None:
            found = self._plans[side] = plan(meta.prefills, side, device)
        return found

    def _rotate_(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size]
        q: torch.Tensor,  # [tokens, heads, head_dim] views of qkv
        k: torch.Tensor,  # [tokens, kv_heads, head_dim]
        shape: AttentionShape,
        rope: Rope,
    ) -> None:
        """RoPE on q and k, in place in `qkv` (the batches gather from its rows)."""
        if self.kernels is not None and rope.cos is None and shape.rotary_dim == shape.head_dim:
            heads = shape.heads + shape.kv_heads
            self.kernels.rope_(
                qkv, heads, shape.head_dim, rope.rows, rope.table_cos, rope.table_sin
            )
            return
        cos, sin = rope.cos, rope.sin
        if cos is None or sin is None:
            cos = rope.table_cos[rope.rows].unsqueeze(1).to(q.dtype)  # [tokens, 1, rotary_dim]
            sin = rope.table_sin[rope.rows].unsqueeze(1).to(q.dtype)
        q.copy_(apply_rope(q, cos, sin))
        k.copy_(apply_rope(k, cos, sin))
