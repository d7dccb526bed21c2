"""`tokenmill bench quant`'s table for a person (without --json): pure functions of the report."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

HEADER = (
    "model",
    "scheme",
    "weights",
    "MB held",
    "MB loaded",
    "×fp32",
    "b1 tok/s",
    "×fp32",
    "bN tok/s",
    "×fp32",
    "ppl",
    "×fp32",
    "top-1",
)
NUMERIC = frozenset(range(3, len(HEADER)))  # right-aligned columns


def cell(value: float | None, digits: int = 1) -> str:
    """A figure with `digits` decimals, '-' when not measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def row_cells(model: str, row: dict[str, Any]) -> list[str]:
    """One table line's cells for one row of the report."""
    if "skipped" in row:
        return [model, row["scheme"], f"skipped: {row['skipped']}"]
    vs = row.get("vs_fp32", {})
    top1 = row.get("top1_agreement")
    return [
        model,
        row["scheme"],
        f"{row['weights']} ({row['dtype']})" if row["weights"] != "none" else row["dtype"],
        cell(row["weight_mb"]),
        cell(row["loaded_mb"]),
        cell(vs.get("weight_bytes"), 3),
        cell(row["decode_tokens_per_s"]),
        cell(vs.get("decode"), 2),
        cell(row["batch_tokens_per_s"]),
        cell(vs.get("batch"), 2),
        cell(row.get("perplexity"), 2),
        cell(vs.get("perplexity"), 4),
        "-" if top1 is None else f"{100 * top1:.1f}%",
    ]


def render(
    header: Sequence[str], lines: Sequence[Sequence[str]], right: Collection[int] = NUMERIC
) -> str:
    """Columns padded to their widest cell, those in `right` right-aligned; a line shorter
    than the header (a skipped row) runs its last cell on across the remaining columns."""
    full = [list(header), *[list(cells) for cells in lines if len(cells) == len(header)]]
    widths = [max(len(cells[i]) for cells in full) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        if len(cells) < len(header):
            head = [c.ljust(widths[i]) for i, c in enumerate(cells[:-1])]
            return "  ".join([*head, cells[-1]]).rstrip()
        padded = [
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *[line(cells) for cells in lines]])


def target_lines(model: dict[str, Any]) -> list[str]:
    """'  int8_decode_vs_fp32  1.72  (target ≥ 1.6: met)' for each of a model's targets."""
    out = []
    for name, t in model["targets"].items():
        sign = "≤" if t.get("at_most") else "≥"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']}"
        out.append(
            f"  {model['name']} {name:<24} {value:>7}  (target {sign} {t['target']}: {verdict})"
        )
    return out


def quant_table(report: dict[str, Any]) -> str:
    """The whole report as one table, then the targets and what the figures are."""
    env, s = report["environment"], report["settings"]
    d, b = s["decode"], s["batch"]
    lines = [
        f"{env['device']} · {env['threads']} threads · quantized linears: "
        f"{env['quantized_linear_kernel']} · native kernels "
        f"{'on' if env['native_kernels'] else 'off'} · load {env['host_load_1m_at_start']} → "
        f"{env['host_load_1m_at_end']}",
        f"b1: batch 1, a {d['prompt_tokens']}-token prompt and {d['new_tokens']} new tokens "
        f"(bf16: {d['bf16_tokens']}); bN: {b['requests']} requests of {b['prompt_tokens']} "
        f"prompt + {b['new_tokens']} new tokens, decoding together (prefill included)",
        "MB held: what the model module holds (oneDNN-packed copies and RoPE tables included; "
        "×fp32 is of this); MB loaded: the weights alone; neither counts the KV pool",
        "",
    ]
    rows = [row_cells(m["name"], row) for m in report["models"] for row in m["rows"]]
    lines.append(render(HEADER, rows))
    lines.append("")
    for model in report["models"]:
        lines += target_lines(model)
    if report.get("quality"):
        lines.append(f"  note: {report['quality']}")
    lines += [f"  warning: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)
