"""Bidirectional attention over a packed batch of whole sequences: the encoder's `LayerOps`.

An encoder step lays its inputs out flat, one after another (`packed_inputs`); each attends
to itself only, every token to every other, no K/V kept. A sliding layer sees the window on
both sides, as transformers builds EmbeddingGemma's mask: with `use_bidirectional_attention`
its config turns `sliding_window` (512) into `512 // 2 + 1` and lets a query at q see a key
at k where |q - k| < that, i.e. `reach = window // 2` (256) positions either side. Full
layers see the whole sequence.

`EncoderOps` wraps the backend's ops (`gpu/backends/layer_ops.py`): norms, activations and
the rotary tables are theirs; attention is SDPA per sequence, in query chunks on a long one so
that a sliding layer multiplies only the keys in reach.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gpu.backends.layer_ops import AttentionShape, LayerOps, Rope, split_heads
from gpu.backends.metadata import AttentionMetadata, ModelInputs, PrefillSpan
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import LayerKV
from gpu.models.layers import apply_rope

CHUNK = 256  # queries per SDPA call on a sequence longer than a sliding layer's reach


def reach(window: int | None) -> int | None:
    """Positions a sliding layer's query sees on each side (transformers: |q - k| <
    window // 2 + 1); None: the whole sequence."""
    return None if window is None else window // 2


def packed_inputs(
    sequences: Sequence[Sequence[int]], device: torch.device
) -> ModelInputs:
    """The inputs of one encoder step: `sequences` laid out flat, each at positions 0 .. n-1,
    one `PrefillSpan` each (rows `begin:end`); no K/V slots, no logits rows."""
    spans, ids, positions, begin = [], [], [], 0
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
            q, k = self._rotate(qkv, q, k, shape, rope)
        out = q.new_empty(q.shape)
        side = reach(shape.window)
        for span in meta.prefills:
            rows = slice(span.begin, span.end)
            attend(q[rows], k[rows], v[rows], side, shape.scale, shape.softcap, out[rows])
        return out

    def _rotate(
        self,
        qkv: torch.Tensor,  # [tokens, q_size + 2 * kv_size]
        q: torch.Tensor,  # [tokens, heads, head_dim] views of qkv
        k: torch.Tensor,  # [tokens, kv_heads, head_dim]
        shape: AttentionShape,
        rope: Rope,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if rope.cos is not None and rope.sin is not None:
            return apply_rope(q, rope.cos, rope.sin), apply_rope(k, rope.cos, rope.sin)
        if self.kernels is not None and shape.rotary_dim == shape.head_dim:  # in place
            heads = shape.heads + shape.kv_heads
            self.kernels.rope_(qkv, heads, shape.head_dim, rope.rows, rope.table_cos, rope.table_sin)
            return q, k
        cos = rope.table_cos[rope.rows].unsqueeze(1).to(q.dtype)  # [tokens, 1, rotary_dim]
        sin = rope.table_sin[rope.rows].unsqueeze(1).to(q.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def attend(
    q: torch.Tensor,  # [n, heads, head_dim] one sequence
    k: torch.Tensor,  # [n, kv_heads, head_dim]
    v: torch.Tensor,
    side: int | None,  # a query sees keys within `side` positions; None: all
    scale: float,
    softcap: float | None,
    out: torch.Tensor,  # [n, heads, head_dim], written
) -> None:
    """One sequence's bidirectional attention, into `out`."""
    n = q.shape[0]
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, n, head_dim]
    if side is None or n <= side + 1:  # every key in reach of every query
        out.copy_(_sdpa(qh, kh, vh, None, scale, softcap)[0].transpose(0, 1))
        return
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        lo, hi = max(0, a - side), min(n, b - 1 + side + 1)  # keys in reach of a .. b-1
        mask = _band(b - a, hi - lo, a - lo, side, q.device)
        o = _sdpa(qh[:, :, a:b], kh[:, :, lo:hi], vh[:, :, lo:hi], mask, scale, softcap)
        out[a:b].copy_(o[0].transpose(0, 1))


def _sdpa(
    q: torch.Tensor,  # [1, heads, m, head_dim]
    k: torch.Tensor,  # [1, kv_heads, keys, head_dim]
    v: torch.Tensor,
    mask: torch.Tensor | None,  # [m, keys] bool, True = may attend
    scale: float,
    softcap: float | None,
) -> torch.Tensor:  # [1, heads, m, head_dim]
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
    groups = q.shape[1] // k.shape[1]  # soft-capped scores: SDPA has no such option
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = softcap * torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


@functools.lru_cache(maxsize=64)
def _band(
    queries: int, keys: int, offset: int, side: int, device: torch.device
) -> torch.Tensor:  # [queries, keys] bool: query i (key offset + i) sees key j where |i + offset - j| <= side
    q = torch.arange(queries, device=device).unsqueeze(1) + offset
    k = torch.arange(keys, device=device).unsqueeze(0)
    return (q - k).abs() <= side
