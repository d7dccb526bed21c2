"""Fixtures shared by every test layer."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF, fetched once into the user's cache dir."""
    from ops.models import resolve_model

    return resolve_model("smollm2-135m")
