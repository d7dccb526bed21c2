"""tokenmill's native CPU kernels: decode attention from the paged pool against SDPA, and the
build's fallback (one warning, PyTorch's ops) where no compiler is found or the build fails."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpu.kernels import native
from gpu.kernels.native import CpuKernels, build, cpu_kernels, find_compiler


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    built = cpu_kernels()
    if built is None:
        pytest.skip("no C compiler on this host: the fallback is tested below")
    return built


def reference(
    q: torch.Tensor,  # [seqs, heads, head_dim]
    k: torch.Tensor,  # [blocks, block_size, kv_heads, head_dim]
    v: torch.Tensor,
    tables: torch.Tensor,  # [seqs, width]
    lengths: torch.Tensor,  # [seqs]
    scale: float,
) -> torch.Tensor:
    rows = []
    for s in range(q.shape[0]):
        n = int(lengths[s])
        ks = k[tables[s]].flatten(0, 1)[:n].transpose(0, 1)  # [kv_heads, n, head_dim]
        vs = v[tables[s]].flatten(0, 1)[:n].transpose(0, 1)
        qs = q[s].unsqueeze(1)  # [heads, 1, head_dim]
        out = F.scaled_dot_product_attention(qs, ks, vs, scale=scale, enable_gqa=True)
        rows.append(out.squeeze(1))
    return torch.stack(rows)


@pytest.mark.parametrize(
    ("seqs", "kv_heads", "group", "head_dim", "block_size"),
    [
        (5, 3, 3, 64, 16),  # SmolLM2's shape: grouped queries, vector path
        (1, 3, 3, 64, 16),  # batch 1: one task per KV head
        (7, 2, 1, 32, 4),  # plain multi-head attention, small blocks
        (3, 2, 4, 24, 8),  # a head_dim no vector width divides: the scalar loops
    ],
)
def test_decode_attention_equals_sdpa_over_gathered_blocks(
    kernels: CpuKernels, seqs: int, kv_heads: int, group: int, head_dim: int, block_size: int
) -> None:
    g = torch.Generator().manual_seed(seqs * 100 + head_dim)
    num_blocks, width = 64, 9
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    tables = (torch.randperm(num_blocks - 1, generator=g)[: seqs * width] + 1).view(seqs, width)
    # ragged: 1 position, a whole block, one past it, the whole table, random
    longest = width * block_size
    edges = [1, block_size, block_size + 1, longest]
    randoms = torch.randint(1, longest, (seqs,), generator=g).tolist()
    lengths = torch.tensor((edges + randoms[len(edges) :])[:seqs], dtype=torch.long)
    q = torch.randn(seqs, kv_heads * group, head_dim, generator=g) * 3  # sharp softmaxes too
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode_attention(q, k, v, tables.contiguous(), lengths, 0.125, out)
    expected = reference(q, k, v, tables, lengths, 0.125)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_decode_attention_refuses_tensors_it_cannot_read(kernels: CpuKernels) -> None:
    k = torch.zeros(4, 4, 1, 16)
    tables = torch.ones(1, 1, dtype=torch.long)
    lengths = torch.ones(1, dtype=torch.long)
    q = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.paged_decode_attention(q.double(), k, k, tables, lengths, 1.0, q)
    with pytest.raises(TypeError, match="int64"):
        kernels.paged_decode_attention(q, k, k, tables.int(), lengths, 1.0, q)


def test_no_compiler_means_one_warning_and_no_kernels(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tokenmill.kernels"):
        assert build(None, tmp_path) is None
    (record,) = caplog.records
    assert "no C compiler" in record.getMessage()
    assert list(tmp_path.iterdir()) == []


def test_a_failing_build_means_one_warning_and_no_kernels(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tokenmill.kernels"):
        assert build("/bin/false", tmp_path) is None
    (record,) = caplog.records
    assert "failed" in record.getMessage()
    assert not any(p.suffix == ".so" for p in tmp_path.iterdir())  # nothing half-built left


def test_a_named_compiler_that_is_absent_is_no_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    assert find_compiler() is None


def test_the_build_is_cached_per_source_and_host(tmp_path: Path) -> None:
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C compiler on this host")
    first = build(compiler, tmp_path)
    assert first is not None
    built = first.path.stat().st_mtime_ns
    second = build(compiler, tmp_path)
    assert second is not None and second.path == first.path
    assert second.path.stat().st_mtime_ns == built  # found, not rebuilt


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENABLE_VARIABLE, "0")
    cpu_kernels.cache_clear()
    try:
        assert cpu_kernels() is None
    finally:
        cpu_kernels.cache_clear()
