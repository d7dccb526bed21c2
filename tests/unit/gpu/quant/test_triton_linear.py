"""The Triton weight-only quantized linear (`gpu.quant.triton_linear`) against its reference,
`x.float() @ weight.dequantize().T + bias`, run on the CPU through Triton's interpreter.

Triton 3.x decorates its own library (`tl.zeros`, `tl.interleave`, ...) when `triton` is first
imported, so TRITON_INTERPRET=1 must be set before that import, and torch can import triton
first in a pytest process (torch._dynamo does). So the kernel runs in one child process with
the variable set: this module writes the inputs, the child writes the kernel's outputs, and
the comparison happens here.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu.quant.triton_linear import available, triton_qlinear
from gpu.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from tests.unit.gpu.triton_child import run_interpreted

triton = pytest.importorskip("triton", reason="triton is not importable", exc_type=ImportError)

ROOT = Path(__file__).resolve().parents[4]

CHILD = """
import sys
import torch
before = "triton" in sys.modules
from gpu.quant.triton_linear import available, triton_qlinear
from gpu.quantized_weight import QuantizedWeight
assert ("triton" in sys.modules) == before, "importing the module imported triton"
assert available(), "TRITON_INTERPRET=1 but the interpreter is not in force"
cases = torch.load(sys.argv[1])
outputs = {}
for name, c in cases.items():
    weight = QuantizedWeight(c["bits"], c["group"], c["data"], c["scales"], c["offsets"])
    outputs[name] = triton_qlinear(c["x"], weight, c["bias"])
torch.save(outputs, sys.argv[2])
"""

GROUPS = (16, 32, 128, None)  # None: per output channel
SHAPES = list(itertools.product((1, 5, 33), (24, 100), (128, 256)))  # (m, out, in)
DTYPES = (torch.float32, torch.float16)  # bf16: the interpreter's dot multiplies raw bits


def _weight(bits: int, group: int | None, out: int, inputs: int, offsets: bool) -> QuantizedWeight:
    w = torch.randn(out, inputs)
    q = quantize_int8(w, group) if bits == 8 else quantize_int4(w, group or inputs)
    offs = torch.randn_like(q.scales) * 0.05 if offsets else None
    return QuantizedWeight(bits, q.group, q.data, q.scales, offs)


def _case(
    bits: int,
    group: int | None,
    offsets: bool,
    dtype: torch.dtype,
    shape: tuple[int, int, int],
    bias: bool,
    transposed: bool = False,
) -> dict[str, Any]:
    m, out, inputs = shape
    weight = _weight(bits, group, out, inputs, offsets)
    # transposed: x strided [m, in] with strides (1, m), to exercise both strides.
    x = torch.randn(inputs, m).T if transposed else torch.randn(m, inputs)
    return {
        "x": x.to(dtype),
        "bits": bits,
        "group": weight.group,
        "data": weight.data,
        "scales": weight.scales,
        "offsets": weight.offsets,
        "bias": torch.randn(out) if bias else None,
    }


def _cases() -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    cases = {}
    combos = itertools.product((8, 4), GROUPS, (False, True), DTYPES)
    for i, (bits, group, offsets, dtype) in enumerate(combos):
        shape = SHAPES[(5 * i) % len(SHAPES)]  # every shape, spread over the formats
        name = f"int{bits}-g{group or 'ch'}-{'offs' if offsets else 'sym'}-{dtype}-{shape}"
        cases[name] = _case(bits, group, offsets, dtype, shape, bias=i % 3 == 0)
    # Per-channel with a K tail (100 is no multiple of BLOCK_K), groups no BLOCK_K divides
    # (a scale gathered per element), and x with strides (1, m).
    extra = [
        (8, None, False, torch.float32, (5, 24, 100), True, False),
        (4, None, True, torch.float16, (33, 100, 100), False, False),
        (8, 8, True, torch.float32, (5, 100, 128), True, False),
        (4, 20, True, torch.float32, (33, 24, 100), False, False),
        (4, 32, True, torch.float16, (5, 100, 256), True, True),
    ]
    for bits, group, offsets, dtype, shape, bias, transposed in extra:
        name = f"int{bits}-g{group or 'ch'}-{dtype}-{shape}{'-xT' if transposed else ''}"
        cases[name] = _case(bits, group, offsets, dtype, shape, bias, transposed)
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    result: dict[str, torch.Tensor] = run_interpreted(
        CHILD, CASES, tmp_path_factory.mktemp("qlinear")
    )
    return result


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_dequantized_reference(name: str, outputs: dict[str, torch.Tensor]) -> None:
    c = CASES[name]
    x, bias = c["x"], c["bias"]
    weight = QuantizedWeight(c["bits"], c["group"], c["data"], c["scales"], c["offsets"])
    w = weight.dequantize()  # [out, in]
    want = x.float() @ w.T + (0 if bias is None else bias)
    got = outputs[name]
    assert got.dtype == x.dtype and got.shape == want.shape
    # A worst-case bound per element, from A = |x| @ |w|.T + |bias|. Both sides accumulate in
    # float32 in different orders (and the kernel may fuse q·s + o): at most (in + 4)·2⁻²⁴·A.
    # float16 adds the weights rounded to it (2⁻¹¹·A; x is float16 on both sides) and the
    # output rounded to it (2⁻¹¹·|y|). A nibble or group mix-up is off by O(scale·|x|) per
    # term, orders of magnitude past it.
    mag = x.float().abs() @ w.abs().T + (0 if bias is None else bias.abs())
    bound = (weight.in_features + 4) * 2.0**-24 * mag
    if x.dtype == torch.float16:
        bound = bound + 2.0**-11 * (mag + want.abs())
    err = (got.float() - want).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"error up to {worst:.2f}× the bound"


def test_the_interpreter_is_needed_before_triton_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    if torch.cuda.is_available() or isinstance(triton.language.zeros, InterpretedFunction):
        pytest.skip("triton was imported under the interpreter, or CUDA is here")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # too late for this process
    assert not available()
    weight = quantize_int8(torch.randn(8, 32))
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        triton_qlinear(torch.randn(2, 32), weight)


def test_rejects_mismatched_inputs() -> None:
    weight = quantize_int4(torch.randn(8, 64), 32)
    with pytest.raises(ValueError, match="features"):
        triton_qlinear(torch.randn(2, 32), weight)
    with pytest.raises(ValueError, match="expected one of"):
        triton_qlinear(torch.randn(2, 64).double(), weight)
    with pytest.raises(ValueError, match="bias"):
        triton_qlinear(torch.randn(2, 64), weight, torch.zeros(7))
