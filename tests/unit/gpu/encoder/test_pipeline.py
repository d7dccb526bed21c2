"""gpu.encoder.pipeline: a sentence-transformers folder's modules.json and module configs,
read on small folders written here; what it cannot serve is refused with a typed error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpu.encoder import is_embedding_model
from gpu.encoder.pipeline import NORMALIZE, Dense, read_pipeline
from gpu.errors import CheckpointError, UnsupportedPipeline
from tests.unit.gpu.encoder.st_folders import (
    MAX_SEQ_LENGTH,
    PROMPTS,
    module,
    write_dense,
    write_json,
    write_pipeline,
)


def test_reads_the_pipeline_of_an_embeddinggemma_like_folder(tmp_path: Path) -> None:
    pipeline = read_pipeline(write_pipeline(tmp_path))
    assert pipeline.model_dir == tmp_path
    assert pipeline.hidden_size == 64
    assert pipeline.pooling.modes == ("mean",)
    assert pipeline.pooling.include_prompt
    first, second, last = pipeline.steps
    assert isinstance(first, Dense) and isinstance(second, Dense) and last == NORMALIZE
    assert (first.activation, first.bias is not None) == ("tanh", True)
    assert (second.activation, second.bias is None) == ("identity", True)
    assert pipeline.dimensions == 48 and pipeline.normalized
    assert pipeline.prompts == {k: v or "" for k, v in PROMPTS.items()}  # null reads as ""
    assert pipeline.default_prompt_name is None
    assert pipeline.max_seq_length == MAX_SEQ_LENGTH
    assert is_embedding_model(tmp_path)


def test_project_runs_dense_layers_then_normalize(tmp_path: Path) -> None:
    pipeline = read_pipeline(write_pipeline(tmp_path))
    first, second, _ = pipeline.steps
    assert isinstance(first, Dense) and isinstance(second, Dense)
    x = torch.randn(3, 64)
    expected = F.normalize(torch.tanh(x @ first.weight.T + first.bias) @ second.weight.T, dim=-1)
    torch.testing.assert_close(pipeline.project(x), expected)


@pytest.mark.parametrize(
    ("config", "modes"),
    [
        ({"pooling_mode_cls_token": True}, ("cls",)),
        ({"pooling_mode_lasttoken": True, "pooling_mode_cls_token": True}, ("cls", "lasttoken")),
        ({}, ("mean",)),  # no mode set: sentence-transformers' default
        ({"pooling_mode": "weightedmean"}, ("weightedmean",)),  # the newer key
        ({"pooling_mode": ["max", "mean_sqrt_len_tokens"]}, ("max", "mean_sqrt_len_tokens")),
    ],
)
def test_pooling_modes_old_and_new_keys(
    tmp_path: Path, config: dict[str, object], modes: tuple[str, ...]
) -> None:
    pipeline = read_pipeline(write_pipeline(tmp_path, pooling=config, dense=False))
    assert pipeline.pooling.modes == modes
    assert pipeline.dimensions == 64 * len(modes)


def test_no_dense_no_normalize(tmp_path: Path) -> None:
    pipeline = read_pipeline(write_pipeline(tmp_path, dense=False, normalize=False))
    assert pipeline.steps == () and not pipeline.normalized and pipeline.dimensions == 64


def test_default_prompt_and_no_max_seq_length(tmp_path: Path) -> None:
    folder = write_pipeline(tmp_path, default_prompt_name="query", max_seq_length=None)
    pipeline = read_pipeline(folder)
    assert pipeline.default_prompt_name == "query" and pipeline.max_seq_length is None


def test_a_dense_layer_without_an_activation_is_tanh(tmp_path: Path) -> None:
    folder = write_pipeline(tmp_path)
    write_dense(folder / "2_Dense", 64, 96, bias=True, activation="", seed=1)
    first = read_pipeline(folder).steps[0]
    assert isinstance(first, Dense) and first.activation == "tanh"


def test_the_transformer_in_a_subfolder(tmp_path: Path) -> None:
    folder = write_pipeline(tmp_path)
    write_json(folder / "0_Transformer" / "config.json", {"hidden_size": 64})
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    write_json(folder / "modules.json", modules)
    assert read_pipeline(folder).model_dir == folder / "0_Transformer"


def test_not_an_embedding_model(tmp_path: Path) -> None:
    assert not is_embedding_model(tmp_path)  # no modules.json
    with pytest.raises(CheckpointError, match=r"modules\.json"):
        read_pipeline(tmp_path)
    write_json(tmp_path / "modules.json", [module(0, "Transformer", "")])
    assert not is_embedding_model(tmp_path)  # no Pooling
    write_json(tmp_path / "config.json", {"hidden_size": 64})
    with pytest.raises(UnsupportedPipeline, match="no Pooling"):
        read_pipeline(tmp_path)
    (tmp_path / "modules.json").write_text("{not json")
    assert not is_embedding_model(tmp_path)


def _edit(path: Path, **changes: object) -> None:
    write_json(path, {**json.loads(path.read_text()), **changes})


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda f: _edit(f / "2_Dense" / "config.json", activation_function="my.Swish"),
            "activation 'my.Swish'",
        ),
        (lambda f: _edit(f / "2_Dense" / "config.json", use_residual=True), "use_residual"),
        (lambda f: _edit(f / "1_Pooling" / "config.json", include_prompt=False), "include_prompt"),
        (lambda f: _edit(f / "1_Pooling" / "config.json", pooling_mode="median"), "median"),
        (lambda f: _edit(f / "sentence_bert_config.json", do_lower_case=True), "do_lower_case"),
        (lambda f: _edit(f / "1_Pooling" / "config.json", word_embedding_dimension=32), "pools 32"),
        (
            lambda f: write_dense(f / "3_Dense", 48, 48, bias=False, activation="", seed=2),
            "takes 48 values, not 96",
        ),
        (
            lambda f: write_json(
                f / "modules.json",
                [
                    module(0, "Transformer", ""),
                    module(1, "Pooling", "1_Pooling"),
                    module(2, "LSTM", "2_LSTM"),
                ],
            ),
            "LSTM",
        ),
        (
            lambda f: write_json(f / "modules.json", [module(0, "Pooling", "1_Pooling")]),
            "first module",
        ),
    ],
)
def test_refuses_what_it_cannot_serve(tmp_path: Path, edit: object, match: str) -> None:
    folder = write_pipeline(tmp_path)
    edit(folder)  # type: ignore[operator]
    with pytest.raises(UnsupportedPipeline, match=match):
        read_pipeline(folder)


def test_malformed_files_are_checkpoint_errors(tmp_path: Path) -> None:
    folder = write_pipeline(tmp_path)
    (folder / "2_Dense" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        read_pipeline(folder)
    folder = write_pipeline(tmp_path / "b")
    write_dense(folder / "2_Dense", 64, 80, bias=True, activation="", seed=1)
    _edit(folder / "2_Dense" / "config.json", out_features=96)  # the weights are 80 wide
    with pytest.raises(CheckpointError, match="shape"):
        read_pipeline(folder)
    folder = write_pipeline(tmp_path / "c", default_prompt_name="nope")
    with pytest.raises(CheckpointError, match="default_prompt_name"):
        read_pipeline(folder)
