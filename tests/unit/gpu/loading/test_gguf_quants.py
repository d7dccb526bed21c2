"""gpu.loading.gguf_quants: torch dequantization against gguf-py's reference, on random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as reference
from gguf.quants import quantize

import gpu.loading.gguf_quants
from gpu.loading.gguf_quants import TORCH_TYPES, dequantize
from tests.unit.gpu.loading.test_gguf_quantized import random_blocks

Q = GGMLQuantizationType


def _ref(raw: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(np.array(reference(raw, qtype), dtype=np.float32)).reshape(-1)


def test_the_q4_k_m_and_smollm2_types_run_in_torch() -> None:
    assert set(TORCH_TYPES) == {Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q5_1}


@pytest.mark.parametrize("qtype", TORCH_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_gguf_reference_bit_for_bit(qtype: GGMLQuantizationType, seed: int) -> None:
    raw = random_blocks(qtype, 64, seed)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    got = dequantize(raw, qtype, (64 * block_size,), torch.float32)
    want = _ref(raw, qtype)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("qtype", TORCH_TYPES, ids=lambda t: t.name)
def test_chunks_cover_the_tensor(
    qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 blocks a slice over 10 blocks: the last slice is short.
    block_size, _ = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr(gpu.loading.gguf_quants, "_CHUNK_ELEMENTS", 3 * block_size)
    raw = random_blocks(qtype, 10, seed=7)
    shape = (2, 5 * block_size)  # rows of 5 blocks, as GGUFReader hands them: [rows, bytes]
    got = dequantize(raw.reshape(2, -1), qtype, shape, torch.float32)
    assert torch.equal(got, _ref(raw, qtype).reshape(shape))


@pytest.mark.parametrize("qtype", TORCH_TYPES, ids=lambda t: t.name)
def test_straight_to_bfloat16(qtype: GGMLQuantizationType) -> None:
    raw = random_blocks(qtype, 16, seed=3)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    got = dequantize(raw, qtype, (16 * block_size,), torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _ref(raw, qtype).to(torch.bfloat16))  # one rounding, from float32


def test_real_quantized_values_round_trip() -> None:
    # gguf-py quantizes Q8_0 itself: dequantizing its output is close to the input.
    values = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    packed = quantize(values, Q.Q8_0)
    got = dequantize(packed, Q.Q8_0, (4, 64), torch.float32)
    assert torch.equal(got, torch.from_numpy(np.array(reference(packed, Q.Q8_0))))
    assert np.abs(got.numpy() - values).max() < 0.05


def test_other_types_go_through_gguf() -> None:
    raw = random_blocks(Q.Q4_0, 6, seed=1)  # not bit-identical in torch: gguf-py's
    got = dequantize(raw, Q.Q4_0, (6 * 32,), torch.float32)
    assert torch.equal(got, _ref(raw, Q.Q4_0))
    assert torch.equal(got.view(torch.int32), _ref(raw, Q.Q4_0).view(torch.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_tensors(dtype: type) -> None:
    values = np.random.default_rng(2).standard_normal((3, 5)).astype(dtype)
    qtype = Q.F32 if dtype is np.float32 else Q.F16
    got = dequantize(values, qtype, (3, 5), torch.float32)
    assert torch.equal(got, torch.from_numpy(values.astype(np.float32)))


def test_data_that_does_not_hold_the_shape() -> None:
    raw = random_blocks(Q.Q8_0, 2, seed=0)
    with pytest.raises(ValueError, match="do not hold 96 elements"):
        dequantize(raw, Q.Q8_0, (96,), torch.float32)
    with pytest.raises(ValueError, match="values for"):
        dequantize(np.zeros(5, np.float32), Q.F32, (6,), torch.float32)
