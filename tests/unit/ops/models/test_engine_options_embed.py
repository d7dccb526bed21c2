"""build_engine on an embedding model (a tiny sentence-transformers folder): the worker gets
the encoder engine; a command that generates is told the model makes vectors."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from gpu.engine_config import EngineConfig
from ops.models.engine_options import EngineChoice, build_engine
from tests.unit.gpu.encoder.st_folders import write_embedding_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedding_model(tmp_path_factory.mktemp("embedder"))


def test_the_worker_gets_an_encoder_engine_for_an_embedding_folder(folder: Path) -> None:
    from gpu.encoder import EncoderEngine

    config = EngineConfig(max_num_batched_tokens=256)
    engine = build_engine(EngineChoice(model=str(folder), engine=config), embeddings=True)
    assert isinstance(engine, EncoderEngine)
    assert engine.config is config and engine.model.name == str(folder)
    assert engine.embedding.dimensions > 0


def test_a_generating_command_is_told_an_embedding_model_makes_vectors(folder: Path) -> None:
    with pytest.raises(click.ClickException, match="is an embedding model"):
        build_engine(EngineChoice(model=str(folder)))
