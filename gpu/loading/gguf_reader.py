"""A GGUF file's header, read in one pass: metadata values, tensor infos, tensor data mapped.

gguf-py's `GGUFReader` keeps a numpy view per element of every metadata array, which for a
262,144-token vocabulary (three such arrays) takes 10-20 s on a small machine; this reader
decodes numeric arrays with one `np.frombuffer` each and strings with `struct`, in well under a
second. Tensor data is not read: each tensor is a read-only view of the file's memory map.

Format (GGUF v2/v3, little-endian): magic `GGUF`, version u32, tensor count u64, metadata count
u64; each metadata entry a string key, a u32 value type and the value; each tensor info a name,
u32 dims, u64 per dim (innermost first), u32 ggml type, u64 offset into the data section, which
starts at the next multiple of `general.alignment` (default 32) after the infos.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_VERSIONS = (2, 3)
_STRING, _ARRAY = 8, 9
# fixed-size value types: struct format, numpy dtype
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "?"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_VALUES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF file (the caller names the file)."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor: its ggml shape (innermost first, as the file lists it) and its raw data."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # values for F32/F16, else the blocks' bytes (uint8); read-only, mapped


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, Any]  # key → value; arrays as lists
    tensors: list[GGUFTensorInfo]
    data_offset: int  # where the tensor data starts (the header's size in bytes)


def read_gguf(path: Path) -> GGUFHeader:
    """Parse `path`; raises GGUFFormatError (or OSError) on a file that is not a whole GGUF."""
    with path.open("rb") as f:
        try:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file cannot be mapped
            raise GGUFFormatError(f"cannot map the file: {exc}") from exc
    try:
        return _Parser(buffer).header()
    except (struct.error, ValueError, UnicodeDecodeError, KeyError, IndexError) as exc:
        if isinstance(exc, GGUFFormatError):
            raise
        raise GGUFFormatError(f"{type(exc).__name__}: {exc}") from exc


class _Parser:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.at = 0

    def header(self) -> GGUFHeader:
        if self.buffer[:4] != b"GGUF":
            raise GGUFFormatError("no GGUF magic at the start")
        self.at = 4
        version, tensor_count, field_count = self._unpack("<IQQ")
        if version not in _VERSIONS:
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 or 3)")
        fields: dict[str, Any] = {}
        for _ in range(field_count):
            key = self._string()
            (kind,) = self._unpack("<I")
            fields[key] = self._value(kind)
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = int(fields.get("general.alignment", 32))
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
        data_offset = -(-self.at // alignment) * alignment
        tensors = [self._tensor(data_offset, *info) for info in infos]
        return GGUFHeader(fields=fields, tensors=tensors, data_offset=data_offset)

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        end = self.at + length
        if end > len(self.buffer):
            raise GGUFFormatError("a string runs past the end of the file")
        text = self.buffer[self.at : end].decode("utf-8")
        self.at = end
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._unpack("<IQ")
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item][1])
                values = np.frombuffer(self.buffer, dtype, count, self.at)
                self.at += count * dtype.itemsize
                return values.tolist()
            return [self._value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise GGUFFormatError(f"unknown metadata value type {kind}")
        return self._unpack(_SCALARS[kind][0])[0]

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        (dims,) = self._unpack("<I")
        shape = self._unpack(f"<{dims}Q")
        (kind,) = self._unpack("<I")
        (offset,) = self._unpack("<Q")
        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            raise GGUFFormatError(f"tensor {name!r} has unknown ggml type {kind}") from None
        return name, tuple(int(d) for d in shape), qtype, int(offset)

    def _tensor(
        self,
        data_offset: int,
        name: str,
        shape: tuple[int, ...],
        qtype: GGMLQuantizationType,
        at: int,
    ) -> GGUFTensorInfo:
        count = int(np.prod(shape))
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        if count % block_size:
            raise GGUFFormatError(f"tensor {name!r}: {count} elements in {block_size}-blocks")
        start = data_offset + at
        if qtype in _VALUES:
            data = np.frombuffer(self.buffer, _VALUES[qtype], count, start)
        else:
            data = np.frombuffer(self.buffer, np.uint8, count // block_size * type_size, start)
        return GGUFTensorInfo(name=name, shape=shape, tensor_type=qtype, data=data)
