"""gpu.loading.gguf_reader against gguf-py's GGUFReader: the same fields, tensors and bytes."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gpu.loading.gguf_reader import GGUFFormatError, read_gguf
from tests.unit.gpu.loading.test_gguf import write_tiny
from tests.unit.gpu.loading.test_gguf_gemma3 import write_tiny_gemma3


def _assert_same_as_gguf_py(path: Path, *, nested: tuple[str, ...] = ()) -> None:
    """`nested`: arrays of arrays, which gguf-py's `contents()` flattens (the reader keeps them)."""
    ours, ref = read_gguf(path), gguf.GGUFReader(path)
    # gguf-py adds GGUF.version and the counts as pseudo-fields
    fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    mine = dict(ours.fields)
    for key in nested:
        mine[key] = [x for inner in mine[key] for x in inner]
    assert mine == fields
    assert ours.data_offset == ref.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type, mine.name
        assert mine.shape == tuple(int(d) for d in theirs.shape), mine.name
        want = np.asarray(theirs.data).view(np.uint8).reshape(-1)
        assert np.array_equal(np.asarray(mine.data).view(np.uint8).reshape(-1), want), mine.name


def test_tiny_llama_file(tmp_path: Path) -> None:
    write_tiny(tmp_path / "tiny.gguf", meta={"tokenizer.ggml.add_space_prefix": True})
    _assert_same_as_gguf_py(tmp_path / "tiny.gguf")


def test_tiny_gemma3_file(tmp_path: Path) -> None:
    write_tiny_gemma3(tmp_path / "tiny.gguf")
    _assert_same_as_gguf_py(tmp_path / "tiny.gguf")


def test_quantized_tensors_and_nested_arrays(tmp_path: Path) -> None:
    path = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_array("test.floats", [0.5, -1.25])
    writer.add_uint64("test.big", 1 << 40)
    writer.add_int32("test.negative", -7)
    values = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1):
        packed = gguf.quants.quantize(values, qtype)
        writer.add_tensor(f"t.{qtype.name}", packed, raw_shape=packed.shape, raw_dtype=qtype)
    writer.add_tensor("t.f16", values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _assert_same_as_gguf_py(path, nested=("test.nested",))
    header = read_gguf(path)
    assert header.fields["test.nested"] == [[1, 2], [3]]
    assert header.fields["test.big"] == 1 << 40 and header.fields["test.negative"] == -7
    assert [t.shape for t in header.tensors] == [(64, 4)] * 3  # innermost first, as ggml


@pytest.mark.parametrize("keep", [0, 3, 4, 23, 40, 500, -1])
def test_truncated_files_raise_format_error(tmp_path: Path, keep: int) -> None:
    whole = tmp_path / "whole.gguf"
    write_tiny_gemma3(whole)
    data = whole.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep])  # -1: all but the last byte of tensor data
    with pytest.raises(GGUFFormatError):
        read_gguf(cut)


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(GGUFFormatError, match="no GGUF magic"):
        read_gguf(path)


@pytest.mark.slow
def test_real_files(gemma3_path: Path, smollm2_path: Path) -> None:
    _assert_same_as_gguf_py(gemma3_path)
    _assert_same_as_gguf_py(smollm2_path)
