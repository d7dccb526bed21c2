"""Where a swap command's model name may point: only inside the configured models directory.

A control command names a model by alias (`smollm2-135m`) or by a path relative to the models
directory. Whatever it names is resolved to a real path (symlinks followed, `..` collapsed)
and refused unless it lies inside the models directory, so a command can never make a worker
read an arbitrary file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

AliasResolver = Callable[[str], Path | None]  # alias → its path (may fetch), None if not one


class ModelPathRefused(ValueError):
    """The named model is not a checkpoint inside the models directory."""


def resolve_in_models_dir(
    name: str, models_dir: Path, aliases: AliasResolver | None = None
) -> Path:
    """The real path of the model `name` names, or `ModelPathRefused` saying why not."""
    if not name or "\x00" in name:
        raise ModelPathRefused("no model named")
    if ".." in Path(name).parts:
        raise ModelPathRefused(f"{name!r}: '..' is not allowed in a model path")
    candidate = aliases(name) if aliases is not None else None
    if candidate is None:
        path = Path(name)
        candidate = path if path.is_absolute() else models_dir / path
    try:
        root = models_dir.resolve(strict=True)
    except OSError as exc:
        raise ModelPathRefused(f"the models directory {models_dir} is not readable: {exc}") from exc
    try:
        real = candidate.resolve(strict=True)
    except OSError as exc:
        raise ModelPathRefused(f"{name!r}: no such model in {root}") from exc
    if not real.is_relative_to(root):
        raise ModelPathRefused(f"{name!r} resolves to {real}, outside the models directory {root}")
    return real
