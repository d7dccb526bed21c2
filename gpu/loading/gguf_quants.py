"""Dequantizing GGUF tensors with torch, in bounded chunks, straight to the dtype the model wants.

Q8_0, Q5_0, Q4_K and Q6_K (the types of a Q4_K_M file) are unpacked here, vectorised over blocks
with the same arithmetic, in the same order, as gguf-py's `gguf.quants` (the reference the tests
hold these to, bit for bit). Any other type goes through gguf-py itself. Either way a tensor is
dequantized a slice of blocks at a time into its output, so the float32 scratch stays small
whatever the tensor's size and the output is in the target dtype from the start.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

_CHUNK_ELEMENTS = 1 << 21  # float32 scratch per slice: 8 MiB
_QK_K = 256


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Bytes [blocks, 2] → their float16 values as float32 [blocks, 1]."""
    return b.contiguous().view(torch.float16).float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    # b: [blocks, 34] = d (f16), 32 × int8
    d, q = _f16(b[:, :2]), b[:, 2:].contiguous().view(torch.int8).float()
    return q * d  # [blocks, 32]


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    # b: [blocks, 22] = d (f16), qh (32 high bits, u32), qs (16 bytes of two low nibbles)
    d = _f16(b[:, :2])
    # bit i of the little-endian u32 is bit i % 8 of byte i // 8: element i's fifth bit
    bits = torch.arange(8, dtype=torch.uint8, device=b.device)
    high = ((b[:, 2:6, None] >> bits) & 1).reshape(-1, 32)  # [blocks, 32]
    qs = b[:, 6:]
    low = torch.cat([qs & 0x0F, qs >> 4], dim=1)  # elements 0..15 low nibbles, 16..31 high
    q = (low | (high << 4)).to(torch.int8) - 16
    return d * q.float()


def _q4_k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes → eight 6-bit scales and eight 6-bit mins, each [blocks, 8]."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    # b: [blocks, 144] = d, dmin (f16), 12 bytes of scales/mins, 128 bytes of nibbles
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _q4_k_scales(b[:, 4:16])
    d = (d * sc.float()).reshape(n, -1, 1)  # [blocks, 8, 1]
    dm = (dmin * mn.float()).reshape(n, -1, 1)
    qs = b[:, 16:].reshape(n, -1, 1, 32)  # [blocks, 4, 1, 32]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, -1, 32).float()  # [blocks, 8, 32]
    return (d * q - dm).reshape(n, _QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    # b: [blocks, 210] = ql (128), qh (64), 16 int8 scales, d (f16)
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b[:, 208:210]) * scales).reshape(n, _QK_K // 16, 1)  # [blocks, 16, 1]
    ql = ql.reshape(n, -1, 1, 64)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2).reshape(n, -1, 32)  # [blocks, 8, 32]
    qh = qh.reshape(n, -1, 1, 32)
    high = torch.cat([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], dim=2).reshape(n, -1, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, _QK_K // 16, -1).float()).reshape(n, _QK_K)


_TORCH_KERNELS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}
TORCH_TYPES = tuple(_TORCH_KERNELS)


def dequantize(
    data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A GGUF tensor's raw data (as `gguf_reader` maps it) → a new `dtype` tensor of `shape`.

    Raises ValueError for data that does not hold `shape`'s elements, NotImplementedError for a
    type neither this module nor gguf-py can unpack.
    """
    count = int(np.prod(shape))
    out = torch.empty(count, dtype=dtype)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        flat = np.asarray(data).reshape(-1)
        if flat.size != count:
            raise ValueError(f"{flat.size} values for {count} elements")
        for start in range(0, count, _CHUNK_ELEMENTS):
            chunk = np.array(flat[start : start + _CHUNK_ELEMENTS], dtype=np.float32)
            out[start : start + chunk.size] = torch.from_numpy(chunk)
        return out.reshape(shape)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.asarray(data).view(np.uint8).reshape(-1)
    if count % block_size or raw.size != count // block_size * type_size:
        raise ValueError(f"{raw.size} bytes of {qtype.name} do not hold {count} elements")
    blocks = raw.reshape(-1, type_size)
    kernel = _TORCH_KERNELS.get(qtype)
    step = max(1, _CHUNK_ELEMENTS // block_size)
    for first in range(0, blocks.shape[0], step):
        some = blocks[first : first + step]
        if kernel is not None:
            # A copy: the reader's memory map is read-only, and torch wants writable memory.
            values = kernel(torch.from_numpy(np.array(some)))
        else:
            values = torch.from_numpy(np.array(gguf_dequantize(some, qtype), dtype=np.float32))
        start = first * block_size
        out[start : start + values.numel()] = values.reshape(-1)
    return out.reshape(shape)
