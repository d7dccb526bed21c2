"""Read GenerateResult JSON lines on stdin, print them as a table (`make demo` uses it)."""

from __future__ import annotations

import sys

import msgspec
from rich.console import Console
from rich.table import Table

from messages.result import GenerateResult


def main() -> None:
    decoder = msgspec.json.Decoder(GenerateResult)
    results = [decoder.decode(line) for line in sys.stdin if line.strip()]
    table = Table(title=f"{len(results)} results", show_lines=True)
    for column in ("id", "text", "finish", "tokens", "ttft ms", "total ms"):
        table.add_column(column)
    for r in sorted(results, key=lambda r: r.id):
        text = r.text.strip() if r.error is None else f"[red]{r.error.code}[/]: {r.error.message}"
        ttft = f"{r.timings.ttft_ms:.0f}" if r.timings.ttft_ms is not None else "-"
        table.add_row(
            r.id,
            text,
            r.finish_reason,
            f"{r.usage.prompt_tokens}+{r.usage.completion_tokens}",
            ttft,
            f"{r.timings.total_ms:.0f}",
        )
    Console().print(table)
    if results and results[0].model is not None:
        model = results[0].model
        print(f"model {model.name} ({model.digest[:19]}), worker {results[0].worker}")


if __name__ == "__main__":
    main()
