"""`tokenmill bench`: benchmarks that print JSON (placeholder until the engine bench lands)."""

from __future__ import annotations

import click


@click.group()
def bench() -> None:
    """Benchmarks; each prints one JSON document."""
