"""tokenmill's native CPU kernels: decode attention from the paged pool against SDPA, and the
build's fallback (one warning, PyTorch's ops) where no compiler is found or the build fails."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpu.kernels import native
from gpu.kernels.native import KERNEL_ISAS, CpuKernels, cpu_kernels, isa_flags
from gpu.kernels.native_build import build, find_compiler

# Builds of the same source for the vector paths a host may have: what -march=native finds
# here, AVX2 only, and no vector intrinsics at all (the plain C loops).
ISA_FLAGS = KERNEL_ISAS


@pytest.fixture(scope="module", params=list(ISA_FLAGS))
def kernels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CpuKernels:
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C compiler on this host: the fallback is tested below")
    if request.param != "native" and platform.machine() != "x86_64":
        pytest.skip("the x86 vector paths")
    cache = tmp_path_factory.mktemp(f"kernels-{request.param}")
    built = build(compiler, cache, ISA_FLAGS[request.param])
    assert built is not None
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


@pytest.mark.parametrize(
    ("seqs", "kv_heads", "group", "head_dim", "block_size", "window"),
    [
        (5, 3, 3, 64, 16, 20),  # vector path; windows that start mid-block
        (1, 2, 2, 64, 4, 8),  # batch 1, window a whole number of blocks
        (6, 2, 1, 32, 4, 5),
        (3, 1, 4, 24, 8, 1),  # scalar loops; a window of one position: itself
    ],
)
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_decode_attention_in_a_sliding_window_reads_only_the_window(
    kernels: CpuKernels,
    seqs: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    window: int,
    softcap: float | None,
) -> None:
    """Positions before each sequence's start are NaN in the pool: reading any would show."""
    g = torch.Generator().manual_seed(seqs * 10 + window)
    num_blocks, width = 64, 9
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    tables = (torch.randperm(num_blocks - 1, generator=g)[: seqs * width] + 1).view(seqs, width)
    longest = width * block_size
    edges = [1, window, window + 1, longest]
    randoms = torch.randint(1, longest, (seqs,), generator=g).tolist()
    lengths = torch.tensor((edges + randoms[len(edges) :])[:seqs], dtype=torch.long)
    starts = (lengths - window).clamp(min=0)
    q = torch.randn(seqs, kv_heads * group, head_dim, generator=g) * 3
    expected = []
    for s in range(seqs):
        first, n = int(starts[s]), int(lengths[s])
        ks = k[tables[s]].flatten(0, 1)[first:n].transpose(0, 1)  # [kv_heads, span, head_dim]
        vs = v[tables[s]].flatten(0, 1)[first:n].transpose(0, 1)
        ks = ks.repeat_interleave(group, 0)
        vs = vs.repeat_interleave(group, 0)
        scores = (q[s].unsqueeze(1) @ ks.transpose(1, 2)) * 0.125  # [heads, 1, span]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        expected.append((scores.softmax(-1) @ vs).squeeze(1))
        for position in range(first):  # never to be read
            block = tables[s, position // block_size]
            k[block, position % block_size] = float("nan")
            v[block, position % block_size] = float("nan")
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode_attention(
        q, k, v, tables.contiguous(), lengths, 0.125, out, starts=starts, softcap=softcap
    )
    torch.testing.assert_close(out, torch.stack(expected), atol=2e-6, rtol=1e-5)


def test_decode_attention_refuses_tensors_it_cannot_read(kernels: CpuKernels) -> None:
    k = torch.zeros(4, 4, 1, 16)
    tables = torch.ones(1, 1, dtype=torch.long)
    lengths = torch.ones(1, dtype=torch.long)
    q = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.paged_decode_attention(q.double(), k, k, tables, lengths, 1.0, q)
    with pytest.raises(TypeError, match="int64"):
        kernels.paged_decode_attention(q, k, k, tables.int(), lengths, 1.0, q)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 64])
def test_panel_linear_equals_the_product(kernels: CpuKernels, rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    width = kernels.panel_width
    out = 3 * width + 5  # the last panel only partly filled
    w = torch.randn(out, 96)
    b = torch.randn(out) if bias else None
    wide = torch.randn(rows, 128)
    x = wide[:, :96]  # rows 128 apart, as a slice of a fused product is
    panels = kernels.pack_panels(w)
    assert panels.shape == (4, 96, width)
    y = kernels.panel_linear(x, panels, out, b)
    torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-4, rtol=1e-5)


def test_panel_linear_refuses_what_does_not_fit(kernels: CpuKernels) -> None:
    panels = kernels.pack_panels(torch.randn(40, 32))
    x = torch.randn(2, 32)
    with pytest.raises(ValueError, match="rows are contiguous"):
        kernels.panel_linear(x.t().contiguous().t(), panels, 40)
    with pytest.raises(ValueError, match="does not fit"):
        kernels.panel_linear(torch.randn(2, 16), panels, 40)
    with pytest.raises(ValueError, match="do not fill"):
        kernels.panel_linear(x, panels, 40 + kernels.panel_width * 2)
    with pytest.raises(ValueError, match="bias"):
        kernels.panel_linear(x, panels, 40, torch.zeros(41))


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


def test_the_environment_picks_the_vector_path() -> None:
    """`TOKENMILL_KERNEL_ISA` (read by `cpu_kernels`): the host's path by default, AVX2 or
    plain C on request, a typed error for anything else."""
    assert isa_flags(None) == isa_flags("") == isa_flags("native") == ()
    if platform.machine() == "x86_64":
        assert isa_flags("avx2") == ("-mno-avx512f",)
        assert "-mno-avx2" in isa_flags("plain")
    with pytest.raises(ValueError, match="expected one of native, avx2, plain"):
        isa_flags("avx9000")


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_rms_norm_with_and_without_the_residual_add(kernels: CpuKernels, rows: int) -> None:
    from gpu.models.layers import RMSNorm

    torch.manual_seed(rows)
    norm = RMSNorm(72, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x, residual = torch.randn(rows, 72), torch.randn(rows, 72)
    with torch.inference_mode():
        torch.testing.assert_close(kernels.rms_norm(x, norm.weight, 1e-5), norm(x))
        expected_sum = residual + x
        fused = kernels.rms_norm(x, norm.weight, 1e-5, residual=residual)
    torch.testing.assert_close(residual, expected_sum)  # the add happened in place
    torch.testing.assert_close(fused, norm(expected_sum))


@pytest.mark.parametrize("rows", [1, 3, 33])
def test_rope_in_place_on_fused_rows_equals_apply_rope(kernels: CpuKernels, rows: int) -> None:
    from gpu.models.layers import apply_rope

    heads, kv_heads, head_dim, positions_max = 4, 2, 16, 50
    torch.manual_seed(rows)
    cos, sin = torch.randn(positions_max, head_dim), torch.randn(positions_max, head_dim)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim)
    positions = torch.randint(0, positions_max, (rows,))
    q = qkv[:, : heads * head_dim].reshape(rows, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(rows, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].clone()
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    expected_q, expected_k = apply_rope(q, c, s), apply_rope(k, c, s)
    kernels.rope_(qkv, heads + kv_heads, head_dim, positions, cos, sin)
    torch.testing.assert_close(qkv[:, : heads * head_dim].view(rows, heads, head_dim), expected_q)
    rotated_k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim]
    torch.testing.assert_close(rotated_k.reshape(rows, kv_heads, head_dim), expected_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v)  # v untouched


def test_silu_mul_equals_swiglu(kernels: CpuKernels) -> None:
    torch.manual_seed(0)
    gate_up = torch.randn(17, 2 * 40) * 6  # far into both tails of silu
    gate_up[0, 0], gate_up[0, 1] = -200.0, 200.0
    gate, up = gate_up.split(40, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up)


def test_gelu_tanh_mul_equals_geglu(kernels: CpuKernels) -> None:
    torch.manual_seed(0)
    gate_up = torch.randn(17, 2 * 40) * 6  # far into both tails of the tanh
    gate_up[0, 0], gate_up[0, 1] = -200.0, 200.0
    gate, up = gate_up.split(40, dim=-1)
    expected = F.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(kernels.gelu_tanh_mul(gate_up), expected)


def test_varied_batches_and_lengths_build_one_binary(
    tiny_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is compiled per shape: a run of many batch sizes and lengths uses one build."""
    from gpu.engine import Engine, EngineRequest
    from gpu.engine_config import EngineConfig
    from gpu.loading.loader import load_model
    from gpu.sequence import SamplingParams
    from ops.models.offline import run_all

    if find_compiler() is None:
        pytest.skip("no C compiler on this host")
    monkeypatch.setenv("TOKENMILL_KERNEL_CACHE", str(tmp_path))
    cpu_kernels.cache_clear()
    try:
        engine = Engine(load_model(tiny_checkpoints["llama"], device="cpu"), EngineConfig())
        assert engine.attention_kernel == "native-paged"
        g = torch.Generator().manual_seed(0)
        for wave, count in enumerate((1, 3, 8, 17)):
            lengths = torch.randint(1, 120, (count,), generator=g).tolist()
            requests = [
                EngineRequest(
                    f"{wave}-{i}", list(range(1, n + 1)), SamplingParams(max_new_tokens=5)
                )
                for i, n in enumerate(lengths)
            ]
            run = run_all(engine, requests)
            assert len(run.completions) == count
        assert [p.suffix for p in tmp_path.iterdir()] == [".so"]
    finally:
        cpu_kernels.cache_clear()


def test_engine_tokens_on_every_vector_path_match_transformers(
    kernels: CpuKernels, tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole engine on this build of the kernels: batched steps and one-sequence steps."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    import gpu.backends.choose
    import gpu.loading.loader
    from gpu.loading.loader import load_model
    from gpu.sequence import SamplingParams
    from tests.unit.gpu.test_engine import CHUNKY, engine_tokens, hf_greedy, random_prompts

    monkeypatch.setattr(gpu.backends.choose, "cpu_kernels", lambda: kernels)
    monkeypatch.setattr(gpu.loading.loader, "cpu_kernels", lambda: kernels)  # the panels
    path = tiny_checkpoints["llama"]
    model = load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = random_prompts(model.config.vocab_size, 4, seed=4)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    for config in (CHUNKY, replace(CHUNKY, max_num_seqs=1)):
        for prompt, tokens in zip(
            prompts, engine_tokens(model, prompts, params, config), strict=True
        ):
            assert tokens == hf_greedy(hf, prompt, 12)


@pytest.mark.parametrize(("rows", "vocab"), [(1, 7), (5, 1000), (3, 4099)])
def test_sampling_noise_is_the_reference_bit_for_bit(
    kernels: CpuKernels, rows: int, vocab: int
) -> None:
    """The native noise must equal `reference_noise` exactly: a seeded request then draws the
    same tokens with and without the kernels, on every vector path, as on CUDA."""
    from gpu.sampling_noise import reference_noise

    g = torch.Generator().manual_seed(rows * vocab)
    seeds = torch.randint(0, 2**63 - 1, (rows,), generator=g)
    positions = torch.randint(0, 2**40, (rows,), generator=g)
    seeds[0], positions[0] = 0, 0  # the smallest key words, and the largest below:
    if rows > 1:
        seeds[1], positions[1] = 2**63 - 1, 2**63 - 1
    got = kernels.exponential_noise(seeds, positions, vocab)
    assert torch.equal(got, reference_noise(seeds, positions, vocab))
