"""A swap may only load from inside the models directory, whatever the name says."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.swap.model_paths import ModelPathRefused, resolve_in_models_dir


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "llama").mkdir(parents=True)
    (root / "small.gguf").write_bytes(b"GGUF")
    (tmp_path / "secret").mkdir()
    (root / "escape").symlink_to(tmp_path / "secret")
    (root / "inside").symlink_to(root / "llama")
    return root


def test_names_inside_resolve(models: Path) -> None:
    assert resolve_in_models_dir("llama", models) == (models / "llama").resolve()
    assert resolve_in_models_dir("small.gguf", models) == (models / "small.gguf").resolve()
    assert resolve_in_models_dir(str(models / "llama"), models) == (models / "llama").resolve()
    assert resolve_in_models_dir("inside", models) == (models / "llama").resolve()


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../secret", "'..'"),
        ("llama/../../secret", "'..'"),
        ("escape", "outside the models directory"),
        ("/etc", "outside the models directory"),
        ("missing", "no such model"),
        ("", "no model named"),
        ("bad\x00name", "no model named"),
    ],
)
def test_names_that_leave_the_directory_are_refused(models: Path, name: str, why: str) -> None:
    with pytest.raises(ModelPathRefused, match=why):
        resolve_in_models_dir(name, models)


def test_an_alias_resolves_but_must_still_be_inside(models: Path, tmp_path: Path) -> None:
    aliases = {"tiny": models / "llama", "elsewhere": tmp_path / "secret"}
    assert resolve_in_models_dir("tiny", models, aliases.get) == (models / "llama").resolve()
    with pytest.raises(ModelPathRefused, match="outside"):
        resolve_in_models_dir("elsewhere", models, aliases.get)
