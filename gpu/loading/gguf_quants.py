"""GGUF tensors with torch, in bounded chunks: dequantized to the dtype the model wants, or kept
as the integers and per-group scales they are (`to_quantized`, a `QuantizedWeight`).

Each block type the engine knows is unpacked once, here, into its integers and float32 group
scales and offsets, with the same arithmetic, in the same order, as gguf-py's `gguf.quants` (the
reference the tests hold this module to, bit for bit). `dequantize` runs Q8_0, Q5_0, Q4_K and
Q6_K (the types of a Q4_K_M file), Q4_1 and Q5_1 through those unpackers and any other type
through gguf-py.
Either way a tensor is read a slice of blocks at a time into its output, so the scratch stays
small whatever the tensor's size and the output is in its final form from the start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from gpu.quantized_weight import QuantizedWeight

_CHUNK_ELEMENTS = 1 << 21  # elements per slice: 8 MiB of float32 scratch at most
_QK_K = 256

# A block's integers [blocks, block_size] (uint8 in [0, 15] for 4-bit types, else int8), and
# float32 scales and offsets (None: 0) [blocks, groups]: w = scale * q + offset in each group.
_Unpacked = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]

Q = GGMLQuantizationType


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Bytes [blocks, 2] → their float16 values as float32 [blocks, 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes [..., 16] → 32 values: the low nibbles are elements 0..15, the high 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """A little-endian u32 as bytes [blocks, 4] → bit i for element i, [blocks, 32]."""
    bits = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh[:, :, None] >> bits) & 1).reshape(-1, 32)


def _q8_0(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 34] = d (f16), 32 × int8
    return b[:, 2:].contiguous().view(torch.int8), _f16(b[:, :2]), None


def _q4_0(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 18] = d (f16), 16 bytes of two nibbles; w = d * (q - 8)
    d = _f16(b[:, :2])
    # As d * q + (-8 d): both products are exact in float32 (11-bit d times a 4-bit q), so
    # their sum is d * (q - 8) exactly, but a zero comes out +0 where gguf-py's is -0 (d < 0).
    return _nibbles(b[:, 2:]), d, d * -8.0


def _q4_1(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 20] = d, m (f16), 16 bytes of two nibbles; w = d * q + m
    return _nibbles(b[:, 4:]), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 22] = d (f16), qh (32 fifth bits, u32), qs (16 bytes of two low nibbles)
    q = (_nibbles(b[:, 6:]) | (_fifth_bits(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return q, _f16(b[:, :2]), None


def _q5_1(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 24] = d, m (f16), qh (u32), qs (16 bytes); w = d * q + m, q in [0, 31]
    q = (_nibbles(b[:, 8:]) | (_fifth_bits(b[:, 4:8]) << 4)).to(torch.int8)
    return q, _f16(b[:, :2]), _f16(b[:, 2:4])


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: d, dmin and 12 bytes of 6-bit scales and mins → each sub-block's float32
    scale d * sc and offset -(dmin * m), [blocks, 8] (gguf-py's d * q - dm, as d * q + -dm)."""
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    s = b[:, 4:16].reshape(-1, 3, 4)
    lo, hi, mixed = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([lo & 0x3F, (mixed & 0x0F) | ((lo >> 2) & 0x30)], dim=1)
    mn = torch.cat([hi & 0x3F, (mixed >> 4) | ((hi >> 2) & 0x30)], dim=1)
    return d * sc.float(), -(dmin * mn.float())


def _q4_k(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 144] = d, dmin (f16), 12 bytes of scales/mins, 128 bytes of nibbles
    n = b.shape[0]
    scales, offsets = _k_scales(b)
    qs = b[:, 16:].reshape(n, -1, 1, 32)  # [blocks, 4, 1, 32]: 64 elements per 32 bytes
    q = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, _QK_K)
    return q, scales, offsets


def _q5_k(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 176] = d, dmin (f16), 12 bytes of scales/mins, qh (32 bytes), qs (128 bytes)
    n = b.shape[0]
    scales, offsets = _k_scales(b)
    qs = b[:, 48:].reshape(n, -1, 1, 32)
    low = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, -1, 32)  # [blocks, 8, 32]
    bits = torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)
    high = (b[:, None, 16:48] >> bits) & 1  # sub-block j's fifth bits: bit j of qh
    q = (low | (high << 4)).to(torch.int8).reshape(n, _QK_K)
    return q, scales, offsets


def _q6_k(b: torch.Tensor) -> _Unpacked:
    # b: [blocks, 210] = ql (128), qh (64), 16 int8 scales, d (f16); 16 groups of 16
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[:, 208:210]) * scales  # [blocks, 16]
    ql = ql.reshape(n, -1, 1, 64)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2).reshape(n, -1, 32)  # [blocks, 8, 32]
    qh = qh.reshape(n, -1, 1, 32)
    high = torch.cat([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], dim=2).reshape(n, -1, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return q.reshape(n, _QK_K), d, None


# type → (unpacker, bits, group) of the `QuantizedWeight` it maps onto without loss
_UNPACKERS: dict[GGMLQuantizationType, tuple[Callable[[torch.Tensor], _Unpacked], int, int]] = {
    Q.Q4_0: (_q4_0, 4, 32),
    Q.Q4_1: (_q4_1, 4, 32),
    Q.Q4_K: (_q4_k, 4, 32),
    Q.Q5_0: (_q5_0, 8, 32),
    Q.Q5_1: (_q5_1, 8, 32),
    Q.Q5_K: (_q5_k, 8, 32),
    Q.Q6_K: (_q6_k, 8, 16),
    Q.Q8_0: (_q8_0, 8, 32),
}
QUANTIZED_TYPES = tuple(_UNPACKERS)
_OFFSET_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_1, Q.Q5_K)  # those with a minimum (Q4_0: -8 d)
# Bit-identical to gguf-py through `_values`; Q4_0 is not (the sign of a zero, above). Q4_1
# and Q5_1 are SmolLM2's types: gguf-py's row-by-row numpy took 3 s of its 5 s load.
TORCH_TYPES = (Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q5_1)


def _values(unpacked: _Unpacked) -> torch.Tensor:
    """What `QuantizedWeight.dequantize` computes, per block: [blocks, block_size] float32."""
    q, scales, offsets = unpacked
    n = q.shape[0]
    w = q.reshape(n, scales.shape[1], -1).float() * scales[..., None]  # [blocks, groups, group]
    if offsets is not None:
        w = w + offsets[..., None]
    return w.reshape(n, -1)


def _blocks(data: np.ndarray, qtype: GGMLQuantizationType, count: int) -> np.ndarray:
    """The raw data as [blocks, type_size] bytes, checked to hold `count` elements."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.asarray(data).view(np.uint8).reshape(-1)
    if count % block_size or raw.size != count // block_size * type_size:
        raise ValueError(f"{raw.size} bytes of {qtype.name} do not hold {count} elements")
    return raw.reshape(-1, type_size)


def _slices(blocks: np.ndarray, block_size: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(first block, a writable copy of the next few blocks' bytes), `_CHUNK_ELEMENTS` a time."""
    step = max(1, _CHUNK_ELEMENTS // block_size)
    for first in range(0, blocks.shape[0], step):
        # A copy: the reader's memory map is read-only, and torch wants writable memory.
        yield first, torch.from_numpy(np.array(blocks[first : first + step]))


def dequantize(
    data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A GGUF tensor's raw data (as `gguf_reader` maps it) → a new `dtype` tensor of `shape`.

    Raises ValueError for data that does not hold `shape`'s elements, NotImplementedError for a
    type neither this module nor gguf-py can unpack.
    """
    count = int(np.prod(shape))
    out = torch.empty(count, dtype=dtype)
    if qtype in (Q.F32, Q.F16):
        flat = np.asarray(data).reshape(-1)
        if flat.size != count:
            raise ValueError(f"{flat.size} values for {count} elements")
        for start in range(0, count, _CHUNK_ELEMENTS):
            chunk = np.array(flat[start : start + _CHUNK_ELEMENTS], dtype=np.float32)
            out[start : start + chunk.size] = torch.from_numpy(chunk)
        return out.reshape(shape)
    blocks = _blocks(data, qtype, count)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    unpack = _UNPACKERS[qtype][0] if qtype in TORCH_TYPES else None
    for first, some in _slices(blocks, block_size):
        if unpack is not None:
            values = _values(unpack(some))
        else:
            values = torch.from_numpy(np.array(gguf_dequantize(some.numpy(), qtype), np.float32))
        start = first * block_size
        out[start : start + values.numel()] = values.reshape(-1)
    return out.reshape(shape)


def to_quantized(
    data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]
) -> QuantizedWeight | None:
    """A 2-D GGUF tensor `[out, in]` as the integers and group scales it holds, without loss.

    Q4_0, Q4_1 and Q4_K become 4 bits, Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 8 bits, in groups of 32
    (Q6_K: 16), with float32 scales (and offsets, for the types that have a minimum) computed
    as `dequantize` computes them, so `.dequantize()` is `dequantize(..., torch.float32)` bit
    for bit (Q4_0: equal in value; a zero may be +0 where `dequantize` gives -0). None for any
    other type, or a tensor that is not 2-D with rows of whole blocks: read those with
    `dequantize`. Raises ValueError for data that does not hold `shape`'s elements.
    """
    if qtype not in _UNPACKERS or len(shape) != 2:
        return None
    unpack, bits, group = _UNPACKERS[qtype]
    block_size, _ = GGML_QUANT_SIZES[qtype]
    rows, inputs = shape
    if inputs % block_size:
        return None
    blocks = _blocks(data, qtype, rows * inputs)
    per_byte = 2 if bits == 4 else 1
    q_all = torch.empty(rows, inputs // per_byte, dtype=torch.uint8 if bits == 4 else torch.int8)
    scales = torch.empty(rows, inputs // group, dtype=torch.float32)
    offsets = torch.empty_like(scales) if qtype in _OFFSET_TYPES else None
    q_flat, s_flat = q_all.view(-1), scales.view(-1)
    for first, some in _slices(blocks, block_size):
        q, s, o = unpack(some)  # q: [blocks, block_size]; s, o: [blocks, block_size // group]
        if bits == 4:
            pairs = q.reshape(-1, 2)  # element 2j to the low nibble, 2j + 1 to the high
            q = pairs[:, 0] | (pairs[:, 1] << 4)
        start, g = first * block_size // per_byte, first * (block_size // group)
        q_flat[start : start + q.numel()] = q.reshape(-1)
        s_flat[g : g + s.numel()] = s.reshape(-1)
        if offsets is not None and o is not None:
            offsets.view(-1)[g : g + o.numel()] = o.reshape(-1)
    return QuantizedWeight(bits, group, q_all, scales, offsets)
