"""gpu.loading.gguf_quants.to_quantized and GGUFTensors.quantized: GGUF blocks kept quantized.

Every mapped type against `dequantize` (itself held to gguf-py bit for bit), on random blocks and
on gguf-py's own quantization; a tiny GGUF written here; the real SmolLM2 and Gemma 3 files.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

import gpu.loading.gguf_quants
from gpu.loading.gguf import load_gguf, read_gguf_config
from gpu.loading.gguf_quants import QUANTIZED_TYPES, dequantize, to_quantized
from gpu.loading.gguf_reader import read_gguf
from gpu.loading.gguf_tensors import GGUFTensors
from gpu.quantized_weight import QuantizedWeight

Q = GGMLQuantizationType
# type → (bits, group, has offsets, q's range): what each type maps onto
MAPPING = {
    Q.Q4_0: (4, 32, True, (0, 15)),
    Q.Q4_1: (4, 32, True, (0, 15)),
    Q.Q4_K: (4, 32, True, (0, 15)),
    Q.Q5_0: (8, 32, False, (-16, 15)),
    Q.Q5_1: (8, 32, True, (0, 31)),
    Q.Q5_K: (8, 32, True, (0, 31)),
    Q.Q6_K: (8, 16, False, (-32, 31)),
    Q.Q8_0: (8, 32, False, (-128, 127)),
}
# Where each type keeps its float16 scales (byte offsets in a block); the rest is random bits.
_SCALES = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q4_K: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.Q8_0: (0,),
}
GGUF_QUANTIZES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)  # gguf-py has no K-quant quantizer


def random_blocks(qtype: GGMLQuantizationType, blocks: int, seed: int) -> np.ndarray:
    """Random bytes for every field, with finite float16 scales (random bits could be NaN)."""
    rng = np.random.default_rng(seed)
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint8)
    for offset in _SCALES[qtype]:
        scales = rng.uniform(-2.0, 2.0, size=blocks).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(blocks, 2)
    return raw


def _assert_same(weight: QuantizedWeight, want: torch.Tensor, qtype: GGMLQuantizationType) -> None:
    """Bit for bit; Q4_0 (d * q + -8 d) equal in value, its zeros' sign aside."""
    got = weight.dequantize()
    assert torch.equal(got, want), (got - want).abs().max()
    same_bits = got.view(torch.int32) == want.view(torch.int32)
    if qtype == Q.Q4_0:
        assert bool((same_bits | (want == 0)).all())
    else:
        assert bool(same_bits.all())


def test_the_mapped_types() -> None:
    assert set(QUANTIZED_TYPES) == set(MAPPING)


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_blocks_map_without_loss(qtype: GGMLQuantizationType, seed: int) -> None:
    block_size, _ = GGML_QUANT_SIZES[qtype]
    rows, per_row = 16, 4
    raw = random_blocks(qtype, rows * per_row, seed)
    shape = (rows, per_row * block_size)
    weight = to_quantized(raw.reshape(rows, -1), qtype, shape)
    assert weight is not None
    bits, group, has_offsets, (low, high) = MAPPING[qtype]
    assert (weight.bits, weight.group, weight.shape) == (bits, group, shape)
    assert (weight.offsets is not None) == has_offsets
    assert weight.scales.shape == (rows, shape[1] // group)
    q = weight.integers()
    assert (int(q.min()), int(q.max())) == (low, high)  # random bits reach both ends
    _assert_same(weight, dequantize(raw, qtype, shape, torch.float32), qtype)


@pytest.mark.parametrize("qtype", GGUF_QUANTIZES, ids=lambda t: t.name)
def test_gguf_quantized_values_map_without_loss(qtype: GGMLQuantizationType) -> None:
    values = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32)
    packed = quantize(values, qtype)
    weight = to_quantized(packed, qtype, values.shape)
    assert weight is not None
    _, _, _, (low, high) = MAPPING[qtype]
    q = weight.integers()
    assert low <= int(q.min()) and int(q.max()) <= high
    want = dequantize(packed, qtype, values.shape, torch.float32)
    _assert_same(weight, want, qtype)
    assert np.abs(weight.dequantize().numpy() - values).max() < 0.5  # it is the data, quantized


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
def test_chunks_cover_the_tensor(
    qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 blocks a slice over 10: slices end mid-row, and the last is short.
    block_size, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, 10, seed=7)
    shape = (2, 5 * block_size)
    whole = to_quantized(raw, qtype, shape)
    monkeypatch.setattr(gpu.loading.gguf_quants, "_CHUNK_ELEMENTS", 3 * block_size)
    sliced = to_quantized(raw, qtype, shape)
    assert whole is not None and sliced is not None
    assert all(torch.equal(a, b) for a, b in zip(whole.tensors(), sliced.tensors(), strict=True))
    _assert_same(sliced, dequantize(raw, qtype, shape, torch.float32), qtype)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.Q8_1])
def test_other_types_are_not_mapped(qtype: GGMLQuantizationType) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = np.zeros((4, 256 // block_size * type_size), np.uint8)
    assert to_quantized(data, qtype, (4, 256)) is None


def test_only_matrices_of_whole_blocks_are_mapped() -> None:
    raw = random_blocks(Q.Q8_0, 8, seed=0)
    assert to_quantized(raw, Q.Q8_0, (256,)) is None
    assert to_quantized(raw, Q.Q8_0, (2, 4, 32)) is None
    assert to_quantized(raw, Q.Q8_0, (4, 64)) is not None
    k_blocks = random_blocks(Q.Q4_K, 2, seed=0)
    assert to_quantized(k_blocks, Q.Q4_K, (16, 32)) is None  # rows of 32: part of a block each


def test_data_that_does_not_hold_the_shape() -> None:
    raw = random_blocks(Q.Q8_0, 2, seed=0)
    with pytest.raises(ValueError, match="do not hold 96 elements"):
        to_quantized(raw, Q.Q8_0, (3, 32))
    with pytest.raises(ValueError, match="do not hold"):
        to_quantized(raw, Q.Q6_K, (1, 256))


# --- a tiny llama GGUF with a block type per matrix -----------------------------------------

HIDDEN, HEADS, KV_HEADS, INTER, VOCAB = 256, 4, 2, 256, 32
TYPES = {
    "token_embd.weight": ((VOCAB, HIDDEN), Q.Q8_0),
    "blk.0.attn_q.weight": ((HIDDEN, HIDDEN), Q.Q4_K),
    "blk.0.attn_k.weight": ((KV_HEADS * HIDDEN // HEADS, HIDDEN), Q.Q6_K),
    "blk.0.attn_v.weight": ((KV_HEADS * HIDDEN // HEADS, HIDDEN), Q.Q5_K),
    "blk.0.attn_output.weight": ((HIDDEN, HIDDEN), Q.Q4_0),
    "blk.0.ffn_gate.weight": ((INTER, HIDDEN), Q.Q4_1),
    "blk.0.ffn_up.weight": ((INTER, HIDDEN), Q.Q5_0),
    "blk.0.ffn_down.weight": ((HIDDEN, INTER), Q.Q5_1),
}


@pytest.fixture
def tiny(tmp_path: Path) -> GGUFTensors:
    path = tmp_path / "tiny-quantized.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    rng = np.random.default_rng(0)
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, rng.standard_normal(HIDDEN).astype(np.float32))
    for i, (name, ((rows, cols), qtype)) in enumerate(TYPES.items()):
        if qtype in GGUF_QUANTIZES:
            packed = quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
        else:
            block_size, _ = GGML_QUANT_SIZES[qtype]
            packed = random_blocks(qtype, rows * cols // block_size, seed=i).reshape(rows, -1)
        writer.add_tensor(name, packed, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFTensors(read_gguf(path), read_gguf_config(path), path, torch.float32)


def test_tiny_matrices_come_quantized_as_they_dequantize(tiny: GGUFTensors) -> None:
    seen = set()
    for name in tiny:
        weight = tiny.quantized(name)
        want = tiny[name]
        if want.dim() == 1:
            assert weight is None
            continue
        assert weight is not None and weight.shape == tuple(want.shape)
        assert torch.equal(weight.dequantize(), want), name  # q/k rows un-permuted alike
        seen.add((weight.bits, weight.group))
    assert seen == {(4, 32), (8, 32), (8, 16)}


def test_tiny_unknown_name(tiny: GGUFTensors) -> None:
    with pytest.raises(KeyError):
        tiny.quantized("model.layers.7.self_attn.q_proj.weight")


# --- the real files ---------------------------------------------------------------------------

_HF = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _hf_name(gguf_name: str) -> str:
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{_HF[rest]}"


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real(request: pytest.FixtureRequest) -> tuple[str, Path, GGUFTensors]:
    """A real model's tensors, its file fetched first where this machine has none yet (the
    session's `smollm2_path` and `gemma3_path` fixtures), as every real-model test does."""
    alias = request.param
    path = request.getfixturevalue("smollm2_path" if alias == "smollm2-135m" else "gemma3_path")
    tensors = load_gguf(path).tensors
    assert isinstance(tensors, GGUFTensors)
    return alias, path, tensors


@pytest.mark.slow
def test_real_file_weights_stay_quantized(real: tuple[str, Path, GGUFTensors]) -> None:
    alias, path, tensors = real
    in_memory, schemes = 0, Counter[str]()
    for name in tensors:
        weight = tensors.quantized(name)
        if weight is None:
            w = tensors[name]
            assert w.dim() == 1, f"{name} {tuple(w.shape)} is a matrix left unmapped"
            in_memory += w.numel() * w.element_size()
        else:
            in_memory += weight.nbytes
            schemes[weight.scheme] += 1
    ratio = in_memory / path.stat().st_size
    print(f"\n{alias}: {in_memory / 2**20:.1f} MiB in memory, {ratio:.3f}× the file; {schemes}")
    assert ratio <= 1.5


@pytest.mark.slow
def test_real_file_spot_checks(real: tuple[str, Path, GGUFTensors]) -> None:
    _, path, tensors = real
    header = read_gguf(path)
    # q and k (llama: rows permuted in the file), and the first matrix of each block type
    picks = {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}
    first_of_type: dict[GGMLQuantizationType, str] = {}
    for t in header.tensors:
        if len(t.shape) == 2 and t.name != "token_embd.weight":
            first_of_type.setdefault(t.tensor_type, t.name)
    picks |= set(first_of_type.values())
    for gguf_name in sorted(picks):
        name = _hf_name(gguf_name)
        weight = tensors.quantized(name)
        assert weight is not None
        assert torch.equal(weight.dequantize(), tensors[name]), name
    # The embedding (Gemma's: 262144 × 640, 640 MiB in float32): a few rows, against their blocks.
    embedding = next(t for t in header.tensors if t.name == "token_embd.weight")
    weight = tensors.quantized("model.embed_tokens.weight")
    assert weight is not None and weight.shape == tuple(reversed(embedding.shape))
    vocab, hidden = weight.shape
    rows = torch.tensor([0, 1, vocab // 2, vocab - 1])
    raw = embedding.data.reshape(vocab, -1)[rows.numpy()]
    want = dequantize(raw, embedding.tensor_type, (len(rows), hidden), torch.float32)
    assert torch.equal(weight.rows(rows).dequantize(), want)
