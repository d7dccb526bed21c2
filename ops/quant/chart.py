"""The `tokenmill quantize` report as terminal text: the layers by sensitivity with a bar
chart of their perplexity increase, then the checkpoint against the float model."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ops.quant.evaluate import Comparison
    from ops.quant.sensitivity import LayerSensitivity, QuantizeReport

BAR_WIDTH = 32
_EIGHTHS = " ▏▎▍▌▋▊▉"  # partial blocks: a bar's length in eighths of a character
THRESHOLD_MARK = "┊"


def bar(value: float, scale: float, width: int = BAR_WIDTH, mark: float | None = None) -> str:
    """`value` as a bar of `width` characters for `scale`; `mark` (a value) as a dotted line
    where the bar does not reach it. Negative values draw nothing."""
    eighths = round(max(0.0, min(value / scale, 1.0)) * width * 8) if scale > 0 else 0
    cells = list("█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else ""))
    cells += [" "] * (width - len(cells))
    if mark is not None and scale > 0 and 0 <= mark <= scale:
        at = min(width - 1, int(mark / scale * width))
        if cells[at] == " ":
            cells[at] = THRESHOLD_MARK
    return "".join(cells).rstrip()


def layer_table(rows: list[LayerSensitivity], kept: list[str], threshold: float) -> list[str]:
    """One line a layer, most sensitive first: Δppl, KL, top-1 agreement, bar, kept."""
    if not rows:
        return ["no layer measured"]
    scale = max(max(r.delta_ppl for r in rows), threshold)
    width = max(len("layer"), *(len(r.name) for r in rows))
    lines = [f"{'#':>4}  {'layer':<{width}}  {'Δppl':>8}  {'KL':>8}  {'top-1':>6}"]
    for i, r in enumerate(rows, 1):
        chart = bar(r.delta_ppl, scale, mark=threshold)
        tail = f"  {chart:<{BAR_WIDTH}}  kept" if r.name in kept else f"  {chart}"
        lines.append(
            f"{i:>4}  {r.name:<{width}}  {r.delta_ppl:>+8.3%}  {r.kl:>8.2e}  "
            f"{r.top1_agreement:>6.1%}{tail}".rstrip()
        )
    lines.append(f"{'':>4}  bars: Δppl up to {scale:+.3%}; {THRESHOLD_MARK} the keep threshold")
    return lines


def comparison_line(label: str, c: Comparison) -> str:
    change = c.ppl / c.reference_ppl - 1
    return (
        f"{label:<12} {c.tokens:>6} tokens  ppl {c.reference_ppl:8.3f} → {c.ppl:8.3f} "
        f"({change:+.2%})  top-1 agreement {c.top1_agreement:6.2%}  KL {c.kl:.4f}"
    )


def report_text(report: QuantizeReport) -> str:
    t = report.timings
    lines = [
        f"{report.scheme}: {len(report.layers)} layers, each quantized alone, on "
        f"{report.calibration_tokens} tokens of {report.calibration} (float ppl "
        f"{report.float_ppl:.3f})",
        "",
        *layer_table(report.layers, report.kept, report.keep_threshold),
        "",
        f"sensitivity: {t.get('sensitivity_s', 0.0):.1f} s ({t.get('per_layer_s', 0.0):.2f} s a "
        f"layer); load {t.get('load_s', 0.0):.1f} s, write {t.get('write_s', 0.0):.1f} s, "
        f"compare {t.get('evaluate_s', 0.0):.1f} s, total {t.get('total_s', 0.0):.1f} s",
    ]
    kept = ", ".join(report.kept) or "none"
    lines.append(f"kept in float32 (Δppl above {report.keep_threshold:+.2%}): {kept}")
    if report.unfit:
        lines.append(f"float32, {report.scheme} cannot group them: {', '.join(report.unfit)}")
    lines.append(f"quantized: {len(report.quantized)} layers ({report.quantization})")
    lines.append("")
    lines.append(comparison_line("calibration", report.calibration_eval))
    if report.heldout_eval is not None:
        lines.append(comparison_line("held-out", report.heldout_eval))
    mb = report.checkpoint_bytes / 1e6
    lines.append(f"model.safetensors: {mb:.1f} MB")
    return "\n".join(lines)
