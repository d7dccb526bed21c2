"""The quantized weight layout: quantizing, dequantizing, widening, fusing, row selection."""

from __future__ import annotations

import pytest
import torch

from gpu.quant.scheme import Quantization
from gpu.quantized_weight import QuantizedWeight, concatenated, quantize_int4, quantize_int8


@pytest.fixture
def w() -> torch.Tensor:
    return torch.randn(48, 256, generator=torch.Generator().manual_seed(0))


def test_int8_per_channel_error_is_at_most_half_a_step(w: torch.Tensor) -> None:
    q = quantize_int8(w)
    assert (q.bits, q.group, q.scheme, q.offsets) == (8, 256, "int8", None)
    step = w.abs().amax(1, keepdim=True) / 127
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    assert q.nbytes == 48 * 256 + 48 * 4


@pytest.mark.parametrize("group", [32, 128])
def test_int4_groups_error_is_at_most_half_a_step(w: torch.Tensor, group: int) -> None:
    q = quantize_int4(w, group)
    assert (q.bits, q.group, q.scheme) == (4, group, f"int4-g{group}")
    assert q.data.shape == (48, 128) and q.data.dtype == torch.uint8
    g = w.view(48, -1, group)
    step = (g.amax(-1) - g.amin(-1)) / 15
    err = (q.dequantize() - w).view(48, -1, group).abs()
    assert (err <= step[..., None] / 2 + 1e-6).all()
    ints = q.integers()
    assert int(ints.min()) >= 0 and int(ints.max()) <= 15


def test_nibble_order_is_low_first() -> None:
    data = torch.tensor([[0x21, 0x43] * 8], dtype=torch.uint8)  # elements 1, 2, 3, 4, ...
    q = QuantizedWeight(4, 32, data, torch.ones(1, 1), None)
    assert q.integers()[0, :4].tolist() == [1, 2, 3, 4]


def test_widening_and_fusing_keep_every_value(w: torch.Tensor) -> None:
    a, b = quantize_int4(w[:16], 32), quantize_int8(w[16:], 16)
    fused = concatenated([a, b])
    assert (fused.bits, fused.group) == (8, 16)
    expected = torch.cat([a.dequantize(), b.dequantize()])
    assert torch.equal(fused.dequantize(), expected)
    same = concatenated([quantize_int4(w[:8], 32), quantize_int4(w[8:], 32)])
    assert (same.bits, same.group) == (4, 32)


def test_rows_select_in_order(w: torch.Tensor) -> None:
    q = quantize_int4(w, 32)
    index = torch.tensor([5, 0, 47])
    assert torch.equal(q.rows(index).dequantize(), q.dequantize()[index])


def test_malformed_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="group 48 does not divide"):
        QuantizedWeight(8, 48, torch.zeros(2, 64, dtype=torch.int8), torch.ones(2, 1), None)
    with pytest.raises(ValueError, match="scales must be float32"):
        QuantizedWeight(8, 32, torch.zeros(2, 64, dtype=torch.int8), torch.ones(2, 3), None)
    with pytest.raises(ValueError, match="4-bit data"):
        QuantizedWeight(4, 32, torch.zeros(2, 32, dtype=torch.int8), torch.ones(2, 2), None)
    with pytest.raises(ValueError, match="cannot be widened"):
        quantize_int8(torch.randn(2, 64)).widened(4, 32)


def test_scheme_names_and_choices() -> None:
    assert Quantization.parse("int4").name == "int4-g32"
    assert Quantization.parse("INT4-G128").group == 128
    assert Quantization.parse(None).name == "none"
    assert not Quantization.parse("none").keeps_file_quantization
    assert Quantization.parse("auto").keeps_file_quantization
    assert not Quantization.parse("int8").keeps_file_quantization
    assert not Quantization.parse("auto").quantizes_floats
    with pytest.raises(ValueError, match="expected one of none, auto, int8"):
        Quantization.parse("int3")
    g128 = Quantization.parse("int4-g128")
    assert (g128.group_for(1536), g128.group_for(576), g128.group_for(96)) == (128, 64, 32)
    assert g128.fits(96) and not g128.fits(48) and not g128.fits(40)
    assert Quantization.parse("int8").fits(48) and not Quantization.parse("int8").fits(40)
