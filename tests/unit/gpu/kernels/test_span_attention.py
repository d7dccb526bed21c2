"""`CpuKernels.span_attention` (gpu/kernels/span_attention.c): sequences laid out one after
another, each attending to its own rows of a fused qkv, against a softmax over every key in
float64, on every vector path: causal, causal through a window, both ways within a reach and
without one, Gemma 2's soft cap; grouped-query heads; head sizes that fill the kernel's
register blocks and ones that leave tails (96, 16, 40). Chunks that continue a cached context
read their keys in a KV pool through scattered block tables, beside chunks that do not.
"""

from __future__ import annotations

import pytest
import torch

from gpu.kernels.native import CpuKernels
from gpu.kernels.step_kernels import ChunkTables
from tests.unit.gpu.kernels import test_native

kernels = test_native.kernels  # the fixture: these kernels on every build
LENGTHS = (1, 5, 33, 70, 129)  # a lone token, a tile's tail, several tiles and key tiles
SIGHTS = {  # name -> (before, after)
    "causal": (None, 0),
    "causal-window": (11, 0),
    "both-ways": (None, None),
    "both-ways-reach": (40, 40),
}


def reference(
    q: torch.Tensor,  # [tokens, heads, d]
    k: torch.Tensor,  # [tokens, kv_heads, d]
    v: torch.Tensor,
    lengths: tuple[int, ...],
    before: int | None,
    after: int | None,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:  # [tokens, heads, d]
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    begin = 0
    for n in lengths:
        rows = slice(begin, begin + n)
        qs = q[rows].double()
        ks, vs = (t[rows].double().repeat_interleave(group, 1) for t in (k, v))
        scores = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        i, j = torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)
        sight = torch.ones(n, n, dtype=torch.bool)
        if before is not None:
            sight &= i - j <= before
        if after is not None:
            sight &= j - i <= after
        scores = scores.masked_fill(~sight, float("-inf"))
        out[rows] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs)
        begin += n
    return out.float()


def fused_qkv(
    heads: int, kv_heads: int, d: int, tokens: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """q, k, v as views of one [tokens, (heads + 2 kv_heads) · d] row block, as a layer has them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g)
    q = qkv[:, : heads * d].view(tokens, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(tokens, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(tokens, kv_heads, d)
    return q, k, v


def bounds_of(lengths: tuple[int, ...]) -> torch.Tensor:  # [2, sequences]
    ends = torch.tensor(lengths).cumsum(0)
    return torch.stack([ends - torch.tensor(lengths), ends]).contiguous()


@pytest.mark.parametrize("sight", SIGHTS)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "d"),
    [(9, 3, 64), (3, 1, 256), (4, 2, 96), (2, 2, 16), (6, 3, 40)],
)
def test_span_attention_matches_a_softmax_over_every_key(
    kernels: CpuKernels, sight: str, heads: int, kv_heads: int, d: int
) -> None:
    before, after = SIGHTS[sight]
    q, k, v = fused_qkv(heads, kv_heads, d, sum(LENGTHS), seed=d)
    out = torch.full(q.shape, float("nan"))
    kernels.span_attention(q, k, v, bounds_of(LENGTHS), d**-0.5, out, before=before, after=after)
    expected = reference(q, k, v, LENGTHS, before, after, d**-0.5, None)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_span_attention_soft_caps_the_scores(kernels: CpuKernels) -> None:
    q, k, v = fused_qkv(4, 2, 64, sum(LENGTHS), seed=1)
    q.mul_(4.0)  # scores large enough for a cap of 5 to bite
    out = torch.empty(q.shape)
    kernels.span_attention(q, k, v, bounds_of(LENGTHS), 0.125, out, after=0, softcap=5.0)
    expected = reference(q, k, v, LENGTHS, None, 0, 0.125, 5.0)
    uncapped = reference(q, k, v, LENGTHS, None, 0, 0.125, None)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert (expected - uncapped).abs().max() > 0.1


def test_span_attention_writes_only_its_sequences_rows(kernels: CpuKernels) -> None:
    """Rows outside the given sequences (another chunk's, attended elsewhere) stay as they were."""
    q, k, v = fused_qkv(2, 1, 32, 40, seed=2)
    out = torch.full(q.shape, 7.0)
    kernels.span_attention(q, k, v, torch.tensor([[3, 20], [10, 35]]), 0.2, out, after=0)
    assert (out[:3] == 7.0).all() and (out[10:20] == 7.0).all() and (out[35:] == 7.0).all()
    expected = reference(q[3:10], k[3:10], v[3:10], (7,), None, 0, 0.2, None)
    torch.testing.assert_close(out[3:10], expected, atol=1e-5, rtol=1e-5)


def test_span_attention_refuses_what_it_cannot_read(kernels: CpuKernels) -> None:
    q, k, v = fused_qkv(2, 1, 32, 8, seed=3)
    out = torch.empty(q.shape)
    with pytest.raises(ValueError, match="outside"):
        kernels.span_attention(q, k, v, torch.tensor([[0], [9]]), 0.2, out)
    with pytest.raises(ValueError, match="int64"):
        kernels.span_attention(q, k, v, torch.tensor([[0], [8]], dtype=torch.int32), 0.2, out)
    with pytest.raises(ValueError, match="contiguously"):
        kernels.span_attention(q.transpose(1, 2), k, v, torch.tensor([[0], [8]]), 0.2, out)


def cached_reference(
    q: torch.Tensor,  # [n, heads, d] a chunk's queries, the last n of `keys` positions
    k: torch.Tensor,  # [keys, kv_heads, d] all its keys, in position order
    v: torch.Tensor,
    before: int | None,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:  # [n, heads, d]
    n, keys, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    ks, vs = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = torch.einsum("ihd,jhd->hij", q.double(), ks) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(keys - n, keys).unsqueeze(1)
    j = torch.arange(keys).unsqueeze(0)
    sight = j <= i
    if before is not None:
        sight &= i - j <= before
    scores = scores.masked_fill(~sight, float("-inf"))
    return torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs).float()


@pytest.mark.parametrize("before", [None, 20])
@pytest.mark.parametrize(("heads", "kv_heads", "d", "cap"), [(9, 3, 64, None), (4, 2, 40, 3.0)])
def test_chunks_over_cached_context_read_their_keys_in_the_pool(
    kernels: CpuKernels, before: int | None, heads: int, kv_heads: int, d: int, cap: float | None
) -> None:
    """Three chunks in one call: one with no context (its own rows), two continuing contexts
    of 37 and 90 positions whose blocks lie scattered in the pool; the chunks' own K/V are in
    the pool too, as the layer writes them before attending."""
    block_size, num_blocks = 8, 40
    chunks = ((0, 21), (37, 12), (90, 45))  # (cached positions, new rows)
    q, k, v = fused_qkv(heads, kv_heads, d, sum(n for _, n in chunks), seed=d)
    q.mul_(3.0)  # scores large enough for the cap to bite
    g = torch.Generator().manual_seed(7)
    k_pool = torch.randn(num_blocks, block_size, kv_heads, d, generator=g)
    v_pool = torch.randn(num_blocks, block_size, kv_heads, d, generator=g)
    free = torch.randperm(num_blocks - 1, generator=g) + 1  # block 0 stays unused
    tables, offsets, keys, expected, row = [], [], [], [], 0
    for cached, n in chunks:
        total = cached + n
        if cached:
            table = free[: -(-total // block_size)]
            free = free[table.numel() :]
            slots = table.repeat_interleave(block_size) * block_size
            slots = (slots + torch.arange(block_size).repeat(table.numel()))[:total]
            flat_k, flat_v = k_pool.view(-1, kv_heads, d), v_pool.view(-1, kv_heads, d)
            flat_k[slots[cached:]] = k[row : row + n]  # the chunk's own K/V, written
            flat_v[slots[cached:]] = v[row : row + n]
            ks, vs = flat_k[slots], flat_v[slots]
            offsets.append(sum(t.numel() for t in tables))
            tables.append(table)
        else:
            ks, vs = k[row : row + n], v[row : row + n]
            offsets.append(-1)
        keys.append(total)
        expected.append(cached_reference(q[row : row + n], ks, vs, before, 0.125, cap))
        row += n
    out = torch.full(q.shape, float("nan"))
    bounds = bounds_of(tuple(n for _, n in chunks))
    chunk_tables = ChunkTables(torch.tensor(keys), torch.tensor(offsets), torch.cat(tables))
    kernels.span_attention(
        q, k, v, bounds, 0.125, out, before=before, after=0, softcap=cap,
        pool=(k_pool, v_pool), tables=chunk_tables,
    )  # fmt: skip
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-5)


def test_chunk_tables_that_overrun_are_refused(kernels: CpuKernels) -> None:
    q, k, v = fused_qkv(2, 1, 32, 8, seed=4)
    pool = (torch.zeros(4, 4, 1, 32), torch.zeros(4, 4, 1, 32))
    out = torch.empty(q.shape)
    bounds = torch.tensor([[0], [8]])
    outside = ChunkTables(torch.tensor([12]), torch.tensor([0]), torch.tensor([1, 2, 4]))
    with pytest.raises(ValueError, match="outside the pool"):
        kernels.span_attention(q, k, v, bounds, 0.2, out, pool=pool, tables=outside)
    short = ChunkTables(torch.tensor([12]), torch.tensor([0]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="overrun"):
        kernels.span_attention(q, k, v, bounds, 0.2, out, pool=pool, tables=short)
    with pytest.raises(ValueError, match="need the pool"):
        kernels.span_attention(q, k, v, bounds, 0.2, out, tables=short)
