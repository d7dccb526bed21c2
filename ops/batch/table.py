"""A batch output file as a table for people: `tokenmill batch show` (and `make demo`)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

_decoder = msgspec.json.Decoder()


def answer_text(line: dict[str, Any]) -> tuple[str, str, str]:
    """(text or error, finish reason, prompt+completion tokens, with the prompt tokens the
    prefix cache served) of one output line; of an embeddings answer, (its vectors' count,
    width and first values, "", its tokens)."""
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
    if body.get("object") == "list":
        return _vectors(body), "", str((body.get("usage") or {}).get("prompt_tokens", 0))
    choice = (body.get("choices") or [{}])[0]
    text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
    usage = body.get("usage") or {}
    tokens = f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)}"
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if cached:
        tokens += f" ({cached} cached)"
    own = (choice.get("tokenmill") or {}).get("finish_reason")  # cancelled, where OpenAI's has none
    return str(text or "").strip(), str(own or choice.get("finish_reason", "")), tokens


def _vectors(body: dict[str, Any]) -> str:
    """ "2 vectors × 768: [0.0123, -0.0456, 0.0789, …]" (base64 ones: their width unread)."""
    data = body.get("data") or []
    first = (data[0] if data else {}).get("embedding")
    count = f"{len(data)} vector{'s' if len(data) != 1 else ''}"
    if isinstance(first, list):
        shown = ", ".join(f"{v:.4f}" for v in first[:3])
        return f"{count} × {len(first)}: [{shown}{', …' if len(first) > 3 else ''}]"
    return f"{count} (base64)"


def print_table(path: Path, limit: int) -> None:
    """Print the `limit` lines of the output file at `path` with the smallest custom_ids,
    reading it in bounded memory; lines that are not output lines are counted, not shown."""
    counts = {"lines": 0, "unreadable": 0}
    rows = heapq.nsmallest(
        limit, _output_lines(path, counts), key=lambda line: str(line.get("custom_id") or "")
    )
    table = Table(title=f"{path} ({counts['lines']} lines)", show_lines=True)
    for column in ("custom_id", "answer", "finish", "tokens"):
        table.add_column(column)
    for line in rows:
        try:
            cells = answer_text(line)
        except (AttributeError, TypeError, IndexError):  # a JSON object of another shape
            cells = ("[red]not a batch output line[/]", "", "")
        table.add_row(str(line.get("custom_id") or "-"), *cells)
    Console().print(table)
    if len(rows) < counts["lines"]:
        print(f"… {counts['lines'] - len(rows)} more lines in {path}")
    if counts["unreadable"]:
        print(f"{counts['unreadable']} lines of {path} are not batch output lines")


def _output_lines(path: Path, counts: dict[str, int]) -> Iterator[dict[str, Any]]:
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return  # a partial last line, still being written
            try:
                line = _decoder.decode(raw)
            except (msgspec.DecodeError, RecursionError):
                line = None
            if isinstance(line, dict):
                counts["lines"] += 1
                yield line
            else:
                counts["unreadable"] += 1
