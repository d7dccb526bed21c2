"""The Triton paged-attention kernels (`gpu.kernels.triton.paged_decode`, `paged_prefill`)
against plain-torch references that gather each sequence's blocks and attend in float32, run on
the CPU through Triton's interpreter.

TRITON_INTERPRET=1 must be set before `triton` is first imported, and torch can import triton
first in a pytest process, so the kernels run in one child process with the variable set: this
module writes the cases, the child writes the kernels' outputs, the comparison happens here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpu.kernels.triton.paged_attention import available, keys_per_tile
from gpu.kernels.triton.paged_decode import _decode_splits, paged_decode_attention
from gpu.kernels.triton.paged_prefill import paged_prefill_attention
from tests.unit.gpu.triton_child import run_interpreted

triton = pytest.importorskip("triton", reason="triton is not importable", exc_type=ImportError)

ROOT = Path(__file__).resolve().parents[5]

CHILD = """
import sys
import torch
before = "triton" in sys.modules
from gpu.kernels.triton import paged_attention as pa, paged_decode, paged_prefill
assert ("triton" in sys.modules) == before, "importing the modules imported triton"
assert pa.available(), "TRITON_INTERPRET=1 but the interpreter is not in force"
cases = torch.load(sys.argv[1])
outputs = {}
for name, c in cases.items():
    out = torch.full_like(c["q"], float("nan"))  # every element must be written
    if c["kind"] == "decode":
        paged_decode.paged_decode_attention(
            c["q"], c["k"], c["v"], c["tables"], c["lengths"], c["scale"], out,
            starts=c["starts"], softcap=c["softcap"],
        )
    else:
        paged_prefill.paged_prefill_attention(
            c["q"], c["k"], c["v"], c["table"], c["context"], c["scale"], out,
            window=c["window"], softcap=c["softcap"],
        )
    outputs[name] = out
torch.save(outputs, sys.argv[2])
"""


def _attend(
    q: torch.Tensor,  # [n, heads, head_dim]
    k: torch.Tensor,  # [keys, kv_heads, head_dim]
    v: torch.Tensor,
    allowed: torch.Tensor,  # [n, keys] bool
    scale: float,
    softcap: float | None,
) -> torch.Tensor:  # [n, heads, head_dim] float32
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [keys, heads, head_dim]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,khd->hnk", q.float(), k) * scale  # [heads, n, keys]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("hnk,khd->nhd", scores, v)


def _gather(pool: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    # pool: [num_blocks, block_size, kv_heads, head_dim] -> [length, kv_heads, head_dim]
    return pool[table.long()].flatten(0, 1)[:length]


def reference_decode_attention(
    q: torch.Tensor,  # [seqs, heads, head_dim]
    k_pool: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_pool: torch.Tensor,
    tables: torch.Tensor,  # [seqs, width]
    lengths: torch.Tensor,  # [seqs]
    scale: float,
    starts: torch.Tensor | None = None,  # [seqs]
    softcap: float | None = None,
) -> torch.Tensor:  # [seqs, heads, head_dim] float32; zeros for a length-0 row
    """What `paged_decode_attention` computes, one sequence at a time in float32."""
    out = torch.zeros(q.shape)
    for s, length in enumerate(lengths.tolist()):
        if length == 0:
            continue
        start = 0 if starts is None else int(starts[s])
        k, v = _gather(k_pool, tables[s], length), _gather(v_pool, tables[s], length)
        allowed = (torch.arange(length) >= start)[None, :]  # [1, length]
        out[s] = _attend(q[s : s + 1], k, v, allowed, scale, softcap)[0]
    return out


def reference_prefill_attention(
    q: torch.Tensor,  # [n, heads, head_dim]
    k_pool: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_pool: torch.Tensor,
    table: torch.Tensor,  # [>= ceil(context / block_size)]
    context: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [n, heads, head_dim] float32
    """What `paged_prefill_attention` computes: a lower-right causal mask in float32."""
    n = q.shape[0]
    k, v = _gather(k_pool, table, context), _gather(v_pool, table, context)
    q_pos = torch.arange(context - n, context)[:, None]  # [n, 1]
    k_pos = torch.arange(context)[None, :]  # [1, context]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return _attend(q, k, v, allowed, scale, softcap)


def _pool(
    blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (blocks, block_size, kv_heads, head_dim)
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


def _decode(
    group: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    index: torch.dtype,
    width: int,
    lengths: list[int],
    starts: list[int] | None = None,
    softcap: float | None = None,
) -> dict[str, Any]:
    seqs = len(lengths)
    blocks = seqs * width + 1  # block 0 pads the tables
    k, v = _pool(blocks, block_size, kv_heads, head_dim, dtype)
    # Each row's blocks scattered over the pool; a row's unused entries are the pad block 0.
    tables = (torch.randperm(blocks - 1)[: seqs * width] + 1).view(seqs, width)
    for s, length in enumerate(lengths):
        tables[s, -(-length // block_size) :] = 0
    q = torch.randn(seqs, kv_heads * group, head_dim) * (3.0 if softcap else 1.0)
    return {
        "kind": "decode",
        "q": q.to(dtype),
        "k": k,
        "v": v,
        "tables": tables.to(index),
        "lengths": torch.tensor(lengths, dtype=index),
        "starts": None if starts is None else torch.tensor(starts, dtype=index),
        "scale": head_dim**-0.5,
        "softcap": softcap,
    }


def _prefill(
    group: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    index: torch.dtype,
    context: int,
    n: int,
    window: int | None = None,
    softcap: float | None = None,
) -> dict[str, Any]:
    used = -(-context // block_size)
    k, v = _pool(used + 3, block_size, kv_heads, head_dim, dtype)
    table = torch.randperm(used + 2)[: used + 1] + 1  # one spare entry past the context
    q = torch.randn(n, kv_heads * group, head_dim) * (3.0 if softcap else 1.0)
    return {
        "kind": "prefill",
        "q": q.to(dtype),
        "k": k,
        "v": v,
        "table": table.to(index),
        "context": context,
        "scale": head_dim**-0.5,
        "window": window,
        "softcap": softcap,
    }


F32, BF16, I32, I64 = torch.float32, torch.bfloat16, torch.int32, torch.int64


def _cases() -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    cases = {
        # (group, kv_heads, head_dim, block_size, dtype, index, width, lengths, ...)
        "decode-g1-d16-b16-one-split": _decode(1, 2, 16, 16, F32, I64, 3, [1, 17, 48, 0, 16]),
        "decode-g3-d80-b16-splits": _decode(3, 1, 80, 16, F32, I32, 48, [768, 300, 1, 0, 257]),
        "decode-g4-d32-b32-bf16-splits": _decode(4, 2, 32, 32, BF16, I64, 24, [768, 500, 33, 0]),
        "decode-g2-d32-b16-starts": _decode(
            2, 2, 32, 16, F32, I64, 40, [640, 100, 12, 0], starts=[300, 90, 2, 0]
        ),
        "decode-g2-d32-b16-bf16-softcap": _decode(
            2, 2, 32, 16, BF16, I32, 4, [64, 5, 40], starts=[54, 0, 30], softcap=5.0
        ),
        "decode-g4-d128-b16": _decode(4, 1, 128, 16, F32, I64, 2, [32, 7]),
        "decode-g1-d96-b8": _decode(1, 2, 96, 8, F32, I32, 5, [40, 9, 1]),
        # (group, kv_heads, head_dim, block_size, dtype, index, context, n, ...)
        "prefill-g1-d16-b16-scratch": _prefill(1, 2, 16, 16, F32, I64, 21, 21),
        "prefill-g3-d80-b16-cached": _prefill(3, 1, 80, 16, F32, I32, 70, 9),
        "prefill-g4-d32-b32-bf16-cached": _prefill(4, 2, 32, 32, BF16, I64, 100, 37),
        "prefill-g2-d32-b16-window": _prefill(2, 2, 32, 16, F32, I64, 60, 25, window=10),
        "prefill-g2-d32-b16-bf16-window-softcap": _prefill(
            2, 2, 32, 16, BF16, I32, 45, 45, window=12, softcap=5.0
        ),
        "prefill-g1-d128-b8-scratch-softcap": _prefill(1, 1, 128, 8, F32, I64, 40, 40, softcap=5.0),
        "prefill-g1-d16-b16-one-query": _prefill(1, 2, 16, 16, F32, I64, 1, 1),
    }
    # The same rows without the padded ones: padded rows must not change the others.
    padded = cases["decode-g4-d32-b32-bf16-splits"]
    cases["decode-g4-d32-b32-bf16-splits-unpadded"] = {
        **padded,
        "q": padded["q"][:3],
        "tables": padded["tables"][:3],
        "lengths": padded["lengths"][:3],
    }
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    result: dict[str, torch.Tensor] = run_interpreted(
        CHILD, CASES, tmp_path_factory.mktemp("paged_attention")
    )
    return result


def _reference(c: dict[str, Any]) -> torch.Tensor:
    if c["kind"] == "decode":
        return reference_decode_attention(
            c["q"], c["k"], c["v"], c["tables"], c["lengths"], c["scale"], c["starts"], c["softcap"]
        )
    return reference_prefill_attention(
        c["q"], c["k"], c["v"], c["table"], c["context"], c["scale"], c["window"], c["softcap"]
    )


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_gathering_reference(name: str, outputs: dict[str, torch.Tensor]) -> None:
    c = CASES[name]
    want, got = _reference(c), outputs[name]
    assert got.dtype == c["q"].dtype and got.shape == want.shape
    tol = 1e-5 if got.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=10 * tol)


def test_padded_rows_are_zeros_and_change_no_other_row(outputs: dict[str, torch.Tensor]) -> None:
    padded = outputs["decode-g4-d32-b32-bf16-splits"]
    assert torch.equal(padded[3], torch.zeros_like(padded[3]))
    assert torch.equal(padded[:3], outputs["decode-g4-d32-b32-bf16-splits-unpadded"])


def test_long_tables_split_and_a_full_batch_does_not() -> None:
    # The cases above run both paths: several splits (and a split past the length) and one.
    for name, splits in (("decode-g1-d16-b16-one-split", 1), ("decode-g3-d80-b16-splits", 3)):
        c = CASES[name]
        seqs, width = c["tables"].shape
        block_size, kv_heads = c["k"].shape[1:3]
        keys = keys_per_tile(block_size)
        assert _decode_splits(seqs, kv_heads, width * block_size, keys)[0] == splits
    assert _decode_splits(512, 8, 4096 * 16, 16) == (1, 4096)
    splits, tiles = _decode_splits(1, 8, 4096 * 16, 16)
    assert splits > 1 and splits * tiles >= 4096


def test_the_interpreter_is_needed_before_triton_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    if torch.cuda.is_available() or isinstance(triton.language.zeros, InterpretedFunction):
        pytest.skip("triton was imported under the interpreter, or CUDA is here")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # too late for this process
    assert not available()
    c = CASES["decode-g1-d16-b16-one-split"]
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        paged_decode_attention(
            c["q"], c["k"], c["v"], c["tables"], c["lengths"], 1.0, torch.empty_like(c["q"])
        )


def test_rejects_mismatched_inputs() -> None:
    c = CASES["prefill-g1-d16-b16-scratch"]
    q, k, v, table = c["q"], c["k"], c["v"], c["table"]
    with pytest.raises(ValueError, match="does not fit"):
        paged_prefill_attention(q[:, :1], k, v, table, 21, 1.0, torch.empty_like(q[:, :1]))
    with pytest.raises(ValueError, match="share one of"):
        paged_prefill_attention(q.double(), k, v, table, 21, 1.0, torch.empty_like(q.double()))
    with pytest.raises(ValueError, match="context"):
        paged_prefill_attention(q, k, v, table, 20, 1.0, torch.empty_like(q))
    with pytest.raises(ValueError, match="int32/int64"):
        paged_prefill_attention(q, k, v, table.float(), 21, 1.0, torch.empty_like(q))
    d = CASES["decode-g1-d16-b16-one-split"]
    with pytest.raises(ValueError, match="lengths"):
        paged_decode_attention(
            d["q"], d["k"], d["v"], d["tables"], d["lengths"][:2], 1.0, torch.empty_like(d["q"])
        )


# What the interpreter does not check: the kernels as Triton builds them for CUDA (sm_90 here,
# as on an H100/H200), types and all, down to a cubin. No GPU needed: Triton bundles ptxas.
HALF = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
PARTIALS = {name: "*fp32" for name in ("max_ptr", "sum_ptr", "acc_ptr")}
BUILDS: dict[str, tuple[dict[str, str], dict[str, Any], int]] = {
    "decode_split": (
        {**HALF, **PARTIALS, "table_ptr": "*i32", "length_ptr": "*i64", "start_ptr": "*i64"},
        {"BLOCK_SIZE": 16, "KEYS": 16, "HEADS": 6, "GROUP": 3, "GROUP_PAD": 4, "HEAD_DIM": 80}
        | {"DIM_PAD": 128, "HAS_STARTS": True, "HAS_SOFTCAP": True, "ONE_SPLIT": False},
        8,
    ),
    "decode_reduce": (
        {**PARTIALS, "out_ptr": "*bf16"},
        {"HEAD_DIM": 80, "DIM_PAD": 128, "SPLITS_PAD": 4},
        4,
    ),
    "prefill": (
        {**HALF, "table_ptr": "*i64"},
        {"BLOCK_SIZE": 32, "KEYS": 32, "HEADS": 8, "GROUP": 4, "GROUP_PAD": 4, "BLOCK_Q": 16}
        | {"HEAD_DIM": 128, "DIM_PAD": 128, "HAS_WINDOW": True, "HAS_SOFTCAP": True}
        | {"DOT_F32": False, "PRECISION": "ieee"},
        8,
    ),
}


@pytest.mark.parametrize("name", list(BUILDS))
def test_builds_for_cuda_without_a_gpu(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gpu.kernels.triton import paged_decode, paged_prefill

    split, reduce = paged_decode._decode_kernels(False)
    kernel = {"decode_split": split, "decode_reduce": reduce}.get(name)
    kernel = kernel or paged_prefill._prefill_kernel(False)
    pointers, constants, warps = BUILDS[name]
    names = kernel.arg_names
    # Scalars: ints as i32, the two floats as fp32.
    signature = {n: pointers.get(n, "fp32" if n in ("scale", "softcap") else "i32") for n in names}
    signature |= {n: "constexpr" for n in constants}
    source = ASTSource(kernel, signature, {(names.index(n),): v for n, v in constants.items()})
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    options = {"num_warps": warps, "enable_fp_fusion": True}
    built = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    assert built.asm["cubin"]
