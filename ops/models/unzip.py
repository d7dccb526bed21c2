"""Unpacking a model folder's zip without trusting its member names.

A member whose path would land outside the target folder (absolute, `..`, a backslash, a drive)
or that is a symbolic link is refused before anything is written; so is one outside the pinned
root prefix. Members are streamed, so memory holds one chunk.
"""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from ops.errors import ModelIntegrityError

_CHUNK = 1 << 20


def unzip_folder(archive: Path, root: str, folder: Path) -> None:
    """Extract the members of `archive` under `root` (a prefix ending in "/", stripped) into
    `folder`, which must not exist yet. Raises ModelIntegrityError for an unsafe member."""
    with zipfile.ZipFile(archive) as zf:
        members = [(info, _relative(info, root, archive.name)) for info in zf.infolist()]
        folder.mkdir()
        for info, relative in members:
            if relative is None:
                continue
            dest = folder.joinpath(*relative.parts)
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)


def _relative(info: zipfile.ZipInfo, root: str, archive: str) -> PurePosixPath | None:
    """The member's path below `root`; None for the root's own entry."""
    name = info.filename
    if not name.startswith(root):
        raise ModelIntegrityError(f"{archive}: member {name!r} lies outside {root!r}")
    rest = name[len(root) :]
    if not rest.strip("/"):
        return None
    relative = PurePosixPath(rest)
    if (
        relative.is_absolute()
        or "\\" in rest
        or any(part == ".." or ":" in part for part in relative.parts)
    ):
        raise ModelIntegrityError(f"{archive}: member {name!r} would land outside the folder")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ModelIntegrityError(f"{archive}: member {name!r} is a symbolic link")
    return relative
