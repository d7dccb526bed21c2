"""gpu.encoder.attention: bidirectional attention over packed sequences against a naive
reference (every score, a mask per sequence, float64), and the window's reach against
transformers' own mask function for EmbeddingGemma's config."""

from __future__ import annotations

import pytest
import torch

from gpu.backends.kernel_ops import KernelOps
from gpu.backends.layer_ops import AttentionShape
from gpu.backends.torch_ops import TorchOps
from gpu.encoder.attend import BATCH_TOKENS, CHUNK, plan
from gpu.encoder.attention import EncoderOps, packed_inputs, reach
from gpu.kernels.native import cpu_kernels
from gpu.kv_pool import LayerKV
from gpu.models.layers import apply_rope

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
NO_KV = LayerKV(*(torch.empty(0) for _ in range(4)))


def test_reach_is_transformers_window_for_a_bidirectional_gemma3() -> None:
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import _bidirectional_window_overlay

    config = Gemma3TextConfig(sliding_window=512, use_bidirectional_attention=True)
    assert config.sliding_window == 257  # transformers' exclusive bound
    sees = _bidirectional_window_overlay(config.sliding_window)
    side = reach(512)
    assert side == 256
    positions = torch.arange(700)
    q, k = positions[:, None], positions[None, :]
    assert torch.equal(sees(0, 0, q, k), (q - k).abs() <= side)  # (batch, head, q, k)
    assert reach(None) is None


def naive(
    qkv: torch.Tensor,  # [tokens, (heads + 2 kv_heads) head_dim]
    lengths: list[int],
    side: int | None,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:  # [tokens, heads, head_dim] float64
    x = qkv.double()
    q = x[:, : HEADS * HEAD_DIM].view(-1, HEADS, HEAD_DIM)
    k = x[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(-1, KV_HEADS, HEAD_DIM)
    v = x[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(-1, KV_HEADS, HEAD_DIM)
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    total = sum(lengths)
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])
    allowed = seq[:, None] == seq[None, :]  # each token sees its own sequence only
    if side is not None:
        allowed &= (pos[:, None] - pos[None, :]).abs() <= side
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [heads, tokens, tokens]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    assert out.shape == (total, HEADS, HEAD_DIM)
    return out


def shape(window: int | None, softcap: float | None = None) -> AttentionShape:
    return AttentionShape(HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, 0.3, softcap, window)


# short ones padded into batches (9, 8, 8, 7; 5, 4; 3, 3), within reach, chunked ones
LENGTHS = [8, 1, 5, 9, 3, 40, CHUNK + 45, 4, 2 * CHUNK + 7, 8, 3, 7]


@pytest.mark.parametrize("window", [None, 16, 80, 2 * CHUNK])
def test_matches_the_naive_reference(window: int | None) -> None:
    torch.manual_seed(0)
    qkv = torch.randn(sum(LENGTHS), (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    meta = packed_inputs([[0] * n for n in LENGTHS], torch.device("cpu")).attention
    out = EncoderOps(TorchOps()).attention(qkv, shape(window), None, NO_KV, meta)
    expected = naive(qkv, LENGTHS, reach(window), 0.3)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


def test_soft_capped_scores_match_the_naive_reference() -> None:
    torch.manual_seed(1)
    lengths = [3, CHUNK + 20]
    qkv = torch.randn(sum(lengths), (HEADS + 2 * KV_HEADS) * HEAD_DIM) * 3
    meta = packed_inputs([[0] * n for n in lengths], torch.device("cpu")).attention
    out = EncoderOps(TorchOps()).attention(qkv, shape(16, softcap=2.0), None, NO_KV, meta)
    expected = naive(qkv, lengths, reach(16), 0.3, softcap=2.0)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


def test_rotary_embedding_as_each_backend_applies_it() -> None:
    """TorchOps' gathered tables and the native kernels' in-place rotation give one answer,
    the reference's: positions restart at 0 in every sequence."""
    torch.manual_seed(2)
    lengths = [7, 30, 12]
    inputs = packed_inputs([[0] * n for n in lengths], torch.device("cpu"))
    assert inputs.positions.tolist() == [p for n in lengths for p in range(n)]
    angles = torch.outer(torch.arange(64).float(), torch.rand(HEAD_DIM // 2))
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    qkv = torch.randn(sum(lengths), (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    rotated = qkv.clone()
    gathered = cos[inputs.positions].unsqueeze(1), sin[inputs.positions].unsqueeze(1)
    q = rotated[:, : HEADS * HEAD_DIM].view(-1, HEADS, HEAD_DIM)
    k = rotated[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(-1, KV_HEADS, HEAD_DIM)
    q.copy_(apply_rope(q, *gathered))
    k.copy_(apply_rope(k, *gathered))
    expected = naive(rotated, lengths, reach(16), 0.3)
    kernels = cpu_kernels()
    backends = [EncoderOps(TorchOps())]
    if kernels is not None:
        backends.append(EncoderOps(KernelOps(kernels), kernels))
    for ops in backends:
        rope = ops.rope(cos, sin, inputs.rope_rows, torch.float32)
        out = ops.attention(qkv.clone(), shape(16), rope, NO_KV, inputs.attention)
        torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


def test_packed_inputs_lay_sequences_out_flat() -> None:
    inputs = packed_inputs([[5, 6, 7], [8], [9, 10]], torch.device("cpu"))
    assert inputs.input_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert inputs.positions.tolist() == [0, 1, 2, 0, 0, 1]
    spans = [(s.begin, s.end) for s in inputs.attention.prefills]
    assert spans == [(0, 3), (3, 4), (4, 6)]
    assert inputs.logits_rows.numel() == 0 and inputs.attention.slot_mapping.numel() == 0


def test_plan_pads_similar_lengths_together() -> None:
    cpu = torch.device("cpu")
    spans = packed_inputs([[0] * n for n in LENGTHS], cpu).attention.prefills
    full = plan(spans, None, cpu)  # full layers: up to 512 tokens batched
    assert [s.end - s.begin for s in full.alone] == [2 * CHUNK + 7]
    # longest first; a batch's shortest is at least 3/4 of its longest
    widths = [(b.sequences, b.width) for b in full.batches]
    assert widths == [(1, CHUNK + 45), (1, 40), (4, 9), (2, 5), (2, 3), (1, 1)]
    for batch in full.batches:
        assert batch.slots.shape == (batch.sequences * batch.width,)
        assert batch.rows.shape == batch.kept.shape
        assert (batch.padding is None) == (batch.rows.numel() == batch.slots.numel())
    sliding = plan(spans, 8, cpu)  # reach 8: up to 9 tokens batched
    assert sorted(s.end - s.begin for s in sliding.alone) == [40, CHUNK + 45, 2 * CHUNK + 7]
    many = plan(packed_inputs([[0] * 100] * 200, cpu).attention.prefills, None, cpu)
    assert all(b.sequences * b.width <= BATCH_TOKENS for b in many.batches)
    assert sum(b.sequences for b in many.batches) == 200
