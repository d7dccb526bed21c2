"""The fused Triton kernels (`gpu.kernels.triton`: RMSNorm with the residual add, rotary
embedding with and without the K/V pool write, SiLU·mul) against the PyTorch ops they stand
for, run on the CPU through Triton's interpreter.

TRITON_INTERPRET=1 must be set before `triton` is first imported, and torch can import it
first in a pytest process, so every kernel runs in one child process with the variable set:
this module writes the inputs, the child writes the kernels' outputs, the comparisons happen
here. The kernels round as PyTorch's separate ops do, so float32 and bfloat16 are compared
bit for bit where the arithmetic is the same (the rotary, the residual add), and within a
float32 rounding's reach elsewhere (a reduction's order, exp).
"""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gpu.kernels.step_kernels import StepKernels
from gpu.kernels.triton.kernels import TritonKernels, triton_kernels
from gpu.models.layers import RMSNorm, apply_rope
from tests.unit.gpu.triton_child import run_interpreted

pytest.importorskip("triton", reason="triton is not importable", exc_type=ImportError)

ROOT = Path(__file__).resolve().parents[5]

CHILD = """
import sys
import torch
before = "triton" in sys.modules
from gpu.kernels.triton.kernels import triton_kernels
assert ("triton" in sys.modules) == before, "importing the kernels imported triton"
kernels = triton_kernels()
assert kernels is not None, "TRITON_INTERPRET=1 but the interpreter is not in force"
cases = torch.load(sys.argv[1])
outputs = {}
for name, c in cases.items():
    kind = c["kind"]
    if kind == "norm":
        residual = None if c["residual"] is None else c["residual"].clone()
        out = kernels.rms_norm(c["x"], c["weight"], c["eps"], residual)
        outputs[name] = {"out": out, "residual": residual}
    elif kind == "rope":
        x = c["x"].clone()
        view = x[:, : c["width"]]  # rows strided past the width used
        kernels.rope_(view, c["heads"], c["head_dim"], c["positions"], c["cos"], c["sin"])
        outputs[name] = {"x": x}
    elif kind == "cache":
        qkv, k_pool, v_pool = c["x"].clone(), c["k_pool"].clone(), c["v_pool"].clone()
        kernels.rope_and_cache_(
            qkv[:, : c["width"]], c["heads"], c["kv_heads"], c["head_dim"], c["positions"],
            c["cos"], c["sin"], k_pool, v_pool, c["slots"],
        )
        outputs[name] = {"x": qkv, "k_pool": k_pool, "v_pool": v_pool}
    else:
        outputs[name] = {"out": kernels.silu_mul(c["gate_up"][:, : c["width"]])}
torch.save(outputs, sys.argv[2])
"""

DTYPES = (torch.float32, torch.bfloat16)
ROWS = (1, 3, 7)
HEADS, KV_HEADS = 4, 2  # tests/tiny_models.py's Llama-like models
MAX_POSITIONS = 512


def _tables(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:  # each [positions, head_dim]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(MAX_POSITIONS).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _norm_case(rows: int, hidden: int, dtype: torch.dtype, residual: bool) -> dict[str, Any]:
    return {
        "kind": "norm",
        "x": torch.randn(rows, hidden).to(dtype),
        "weight": (1 + 0.1 * torch.randn(hidden)).to(dtype),
        "eps": 1e-5,
        "residual": torch.randn(rows, hidden).to(dtype) if residual else None,
    }


def _qkv(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, width + 8).to(dtype)  # 8 columns past the width: untouched


def _rope_case(
    rows: int, head_dim: int, dtype: torch.dtype, heads: int = HEADS, kv_heads: int = KV_HEADS
) -> dict[str, Any]:
    cos, sin = _tables(head_dim)
    width = (heads + 2 * kv_heads) * head_dim
    return {
        "kind": "rope",
        "x": _qkv(rows, width, dtype),
        "width": width,
        "heads": heads + kv_heads,  # q and k, as LlamaAttention.rotate_ asks
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "positions": torch.randint(0, MAX_POSITIONS, (rows,)),
        "cos": cos,
        "sin": sin,
    }


def _cache_case(
    rows: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    padded: bool,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
) -> dict[str, Any]:
    blocks = 4
    slots = torch.randperm(blocks * block_size)[:rows]
    if padded:
        slots[rows // 2] = -1
    pool_shape = (blocks, block_size, kv_heads, head_dim)
    case = _rope_case(rows, head_dim, dtype, heads, kv_heads)
    case.update(
        kind="cache",
        heads=heads,
        k_pool=torch.randn(pool_shape).to(dtype),
        v_pool=torch.randn(pool_shape).to(dtype),
        slots=slots,
    )
    return case


def _silu_case(rows: int, size: int, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "kind": "silu",
        "gate_up": (3 * torch.randn(rows, 2 * size + 8)).to(dtype),
        "width": 2 * size,
    }


def _cases() -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    cases: dict[str, dict[str, Any]] = {}
    for dtype, rows, hidden, residual in itertools.product(DTYPES, ROWS, (64, 96), (False, True)):
        cases[f"norm-{dtype}-{rows}x{hidden}-{'res' if residual else 'plain'}"] = _norm_case(
            rows, hidden, dtype, residual
        )
    cases["norm-float16-3x8192-res"] = _norm_case(3, 8192, torch.float16, True)
    for dtype, rows, head_dim in itertools.product(DTYPES, ROWS, (16, 32, 64)):
        cases[f"rope-{dtype}-{rows}-d{head_dim}"] = _rope_case(rows, head_dim, dtype)
    cases["rope-float16-3-d64"] = _rope_case(3, 64, torch.float16)
    # 24 + 8 heads of 128: a row's heads span programs (16 heads of 128 to a program).
    cases["rope-bfloat16-3-d128-h24"] = _rope_case(3, 128, torch.bfloat16, 24, 8)
    cases["cache-bfloat16-3-d128-h24-b16-padded"] = _cache_case(
        3, 128, 16, torch.bfloat16, True, 24, 8
    )
    combos = itertools.product(DTYPES, (16, 32, 64), (16, 32))
    for i, (dtype, head_dim, block_size) in enumerate(combos):
        rows = ROWS[i % len(ROWS)]  # every row count, spread over the shapes
        padded = rows > 1 and i % 4 < 2
        name = f"cache-{dtype}-{rows}-d{head_dim}-b{block_size}{'-padded' if padded else ''}"
        cases[name] = _cache_case(rows, head_dim, block_size, dtype, padded)
    for dtype, rows, size in itertools.product((*DTYPES, torch.float16), ROWS, (64, 96)):
        cases[f"silu-{dtype}-{rows}x{size}"] = _silu_case(rows, size, dtype)
    return cases


CASES = _cases()


def _named(kind: str) -> list[str]:
    return [name for name, c in CASES.items() if c["kind"] == kind]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    result: dict[str, dict[str, torch.Tensor]] = run_interpreted(
        CHILD, CASES, tmp_path_factory.mktemp("fused")
    )
    return result


def _ulps_apart(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest gap between got and want in units of want's last place (in got's dtype)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    ulp = torch.finfo(want.dtype).eps * want.float().abs().clamp_min(torch.finfo(want.dtype).tiny)
    return float(((got.float() - want.float()).abs() / ulp).max())


@pytest.mark.parametrize("name", _named("norm"))
def test_rms_norm_matches_rmsnorm_after_the_residual_add(
    name: str, outputs: dict[str, dict[str, torch.Tensor]]
) -> None:
    c, got = CASES[name], outputs[name]
    x, weight = c["x"], c["weight"]
    norm = RMSNorm(x.shape[1], c["eps"]).to(x.dtype)
    norm.weight.data.copy_(weight)
    if c["residual"] is not None:
        summed = c["residual"].clone()
        summed += x  # as _layers_fused's unfused twin: in x's dtype
        assert torch.equal(got["residual"], summed), "the residual, updated in place"
        x = summed
    with torch.no_grad():
        want = norm(x)
    # The row's sum of squares adds in another order and rsqrt is computed apart: a float32
    # ulp or two in the scale, which a 16-bit rounding of the normalised value hides nearly
    # always (and shows as one ulp where it does not).
    if x.dtype == torch.float32:
        torch.testing.assert_close(got["out"], want, rtol=1e-6, atol=1e-6)
    else:
        assert _ulps_apart(got["out"], want) <= 1.0
        assert (got["out"] == want).float().mean() >= 0.99


def _rope_reference(c: dict[str, Any], heads: int) -> torch.Tensor:
    """apply_rope over the first `heads` heads of the rows, as LlamaModel.forward turns q, k."""
    x: torch.Tensor = c["x"].clone()  # [rows, width + 8]
    dtype, head_dim = x.dtype, c["head_dim"]
    cos = c["cos"][c["positions"]].unsqueeze(1).to(dtype)  # [rows, 1, head_dim]
    sin = c["sin"][c["positions"]].unsqueeze(1).to(dtype)
    turned = x[:, : heads * head_dim].view(x.shape[0], heads, head_dim)
    turned.copy_(apply_rope(turned, cos, sin))
    return x


@pytest.mark.parametrize("name", _named("rope"))
def test_rope_turns_q_and_k_in_place_as_apply_rope(
    name: str, outputs: dict[str, dict[str, torch.Tensor]]
) -> None:
    c = CASES[name]
    # The same products and sums, rounded at the same places: the same bits in every dtype
    # (v and the columns past the width as they were).
    assert torch.equal(outputs[name]["x"], _rope_reference(c, c["heads"]))


@pytest.mark.parametrize("name", _named("cache"))
def test_rope_and_cache_turns_and_writes_k_and_v_at_their_slots(
    name: str, outputs: dict[str, dict[str, torch.Tensor]]
) -> None:
    c, got = CASES[name], outputs[name]
    want = _rope_reference(c, c["heads"] + c["kv_heads"])
    assert torch.equal(got["x"], want)
    head_dim, kv_heads = c["head_dim"], c["kv_heads"]
    q_size, kv_size = c["heads"] * head_dim, kv_heads * head_dim
    k = want[:, q_size : q_size + kv_size].reshape(-1, kv_heads, head_dim)
    v = want[:, q_size + kv_size : q_size + 2 * kv_size].reshape(-1, kv_heads, head_dim)
    slots = c["slots"]
    written = slots >= 0  # a padded row (slot -1) writes nothing
    for pool, values, key in ((c["k_pool"], k, "k_pool"), (c["v_pool"], v, "v_pool")):
        expected = pool.clone()
        expected.view(-1, kv_heads, head_dim)[slots[written]] = values[written]
        assert torch.equal(got[key], expected), key


@pytest.mark.parametrize("name", _named("silu"))
def test_silu_mul_matches_silu_times_up(
    name: str, outputs: dict[str, dict[str, torch.Tensor]]
) -> None:
    c = CASES[name]
    gate, up = c["gate_up"][:, : c["width"]].chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = outputs[name]["out"]
    if want.dtype == torch.float32:  # exp computed apart (numpy's, PyTorch's)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        assert _ulps_apart(got, want) <= 1.0
        assert (got == want).float().mean() >= 0.99


def test_the_library_is_the_step_kernels_protocol() -> None:
    kernels: StepKernels = TritonKernels()  # mypy checks the methods against the Protocol
    assert callable(kernels.rms_norm)


def test_without_cuda_or_the_interpreter_there_are_no_triton_kernels(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    triton_kernels.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenmill.kernels"):
            assert triton_kernels() is None
            assert triton_kernels() is None  # cached: asked again, no second warning
        assert len(caplog.records) == 1
        assert "interpreter" in caplog.records[0].getMessage()
    finally:
        triton_kernels.cache_clear()


def test_without_triton_there_are_no_triton_kernels(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    triton_kernels.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenmill.kernels"):
            assert triton_kernels() is None
        assert len(caplog.records) == 1
        assert "not importable" in caplog.records[0].getMessage()
    finally:
        triton_kernels.cache_clear()


def test_the_kernels_build_for_cuda() -> None:
    """The CUDA path, which the interpreter never takes: each kernel (bfloat16, its fullest
    variant) lowers to an sm_90 binary, no FMA in it. A build, not a run: no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from gpu.kernels.triton import activation, norm, rotary

    pointers = "*bf16"
    builds = {
        "norm": (
            norm._kernel(False),
            {n: pointers for n in ("x_ptr", "r_ptr", "w_ptr", "o_ptr")}
            | {"hidden": "i32", "stride_x": "i32", "stride_r": "i32", "eps": "fp32"},
            {"HAS_RESIDUAL": True, "BLOCK": 8192},
        ),
        "rotary": (
            rotary._kernel(False),
            {n: pointers for n in ("x_ptr", "k_ptr", "v_ptr")}
            | {n: "*i64" for n in ("pos_ptr", "slot_ptr")}
            | {n: "*fp32" for n in ("cos_ptr", "sin_ptr")}
            | {n: "i32" for n in ("stride_x", "stride_block", "stride_slot", "stride_head")}
            | {"block_size": "i32"},
            {"TOTAL": 48, "ROTATED": 40, "Q_HEADS": 32, "HEAD_DIM": 128, "CACHE": True}
            | {"BLOCK_HEADS": 16, "BLOCK_HALF": 64},
        ),
        "activation": (
            activation._kernel(False),
            {"gu_ptr": pointers, "o_ptr": pointers, "size": "i32", "stride_gu": "i32"},
            {"BLOCK": 1024},
        ),
    }
    for name, (kernel, signature, constants) in builds.items():
        source = ASTSource(
            kernel, signature | dict.fromkeys(constants, "constexpr"), constexprs=constants
        )
        options = {"num_warps": 4, "enable_fp_fusion": False}
        built = compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        assert built.asm["cubin"], name
        assert "fma.rn" not in built.asm["ptx"], f"{name}: a product fused past its rounding"


def test_mismatched_inputs_are_refused_before_any_launch() -> None:
    kernels = TritonKernels()  # the checks run before a kernel is built: no triton needed
    x, cos = torch.randn(3, 64), torch.randn(16, 16)
    with pytest.raises(ValueError, match="one dtype"):
        kernels.rms_norm(x, torch.ones(64), 1e-5, residual=torch.zeros(3, 64).bfloat16())
    with pytest.raises(ValueError, match="weight"):
        kernels.rms_norm(x, torch.ones(32), 1e-5)
    positions = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.rope_(x, 5, 16, positions, cos, cos)
    with pytest.raises(ValueError, match="float32"):
        kernels.rope_(x, 4, 16, positions, cos.double(), cos)
    with pytest.raises(ValueError, match="positions"):
        kernels.rope_(x, 4, 16, positions.int(), cos, cos)
    qkv, pool = torch.randn(3, 4 * 16), torch.zeros(2, 16, 1, 16)
    slots = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="pool"):
        kernels.rope_and_cache_(qkv, 2, 1, 16, positions, cos, cos, pool[..., :8], pool, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.rope_and_cache_(qkv, 2, 1, 16, positions, cos, cos, pool, pool, slots.int())
    with pytest.raises(ValueError, match="2 \\* size"):
        kernels.silu_mul(torch.randn(3, 7))
