"""A model's recommended sampling: `generation_config.json` in an HF folder, a GGUF file's
`general.sampling.*` metadata; nothing (None) where the model says nothing or says it wrong."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from gpu.loading.sampling_defaults import SamplingDefaults, read_sampling_defaults


def write_gguf(path: Path, **fields: float | int) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    for key, value in fields.items():
        name = f"general.sampling.{key}"
        if isinstance(value, int):
            writer.add_int32(name, value)
        else:
            writer.add_float32(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_hf_folder_s_generation_config(tmp_path: Path) -> None:
    config = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2]}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    assert read_sampling_defaults(tmp_path) == SamplingDefaults(0.6, 0.95, 20)


def test_a_partial_generation_config(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 1}))
    assert read_sampling_defaults(tmp_path) == SamplingDefaults(temperature=1.0)


def test_a_gguf_file_s_sampling_metadata(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", temp=0.7, top_p=0.8, top_k=40)
    found = read_sampling_defaults(path)
    assert found.temperature == pytest.approx(0.7) and found.top_p == pytest.approx(0.8)
    assert found.top_k == 40


def test_a_gguf_file_without_sampling_metadata(tmp_path: Path) -> None:
    assert read_sampling_defaults(write_gguf(tmp_path / "m.gguf")) == SamplingDefaults()


@pytest.mark.parametrize("name", ["missing", "weights.bin", "broken.gguf"])
def test_anything_else_recommends_nothing(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name != "missing":
        path.write_bytes(b"not a model")
    assert read_sampling_defaults(path) == SamplingDefaults()


@pytest.mark.parametrize("value", [True, "0.7", float("nan"), None, [0.7]])
def test_a_malformed_value_is_none(value: object) -> None:
    assert SamplingDefaults.of({"temperature": value, "top_k": value}) == SamplingDefaults()
