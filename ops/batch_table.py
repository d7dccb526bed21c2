"""A batch output file as a table for people: `tokenmill batch show` (and `make demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

_decoder = msgspec.json.Decoder()


def answer_text(line: dict[str, Any]) -> tuple[str, str, str]:
    """(text or error, finish reason, prompt+completion tokens) of one output line."""
    if line.get("error"):
        error = line["error"]
        return (
            f"[red]{error.get('code')}[/] (line {error.get('line')}): {error.get('message')}",
            "",
            "",
        )
    response = line.get("response") or {}
    body = response.get("body") or {}
    if response.get("status_code") != 200:
        error = body.get("error") or {}
        status = response.get("status_code")
        return f"[red]{status} {error.get('code')}[/]: {error.get('message')}", "", ""
    choice = (body.get("choices") or [{}])[0]
    text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
    usage = body.get("usage") or {}
    tokens = f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)}"
    return str(text or "").strip(), str(choice.get("finish_reason", "")), tokens


def print_table(path: Path, limit: int | None = None) -> None:
    """Print up to `limit` lines of the output file at `path`, sorted by custom_id."""
    with path.open("rb") as f:
        lines = [_decoder.decode(raw) for raw in f if raw.endswith(b"\n")]
    lines.sort(key=lambda line: str(line.get("custom_id") or ""))
    shown = lines if limit is None else lines[:limit]
    table = Table(title=f"{path} ({len(lines)} lines)", show_lines=True)
    for column in ("custom_id", "answer", "finish", "tokens"):
        table.add_column(column)
    for line in shown:
        table.add_row(str(line.get("custom_id") or "-"), *answer_text(line))
    Console().print(table)
    if len(shown) < len(lines):
        print(f"… {len(lines) - len(shown)} more lines in {path}")
