"""`tokenmill bench quant`: the CLI on a tiny Llama (fp32 and int8, a few tokens) gives the
report's fields; ratios and targets are pure functions of rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from ops.bench.cli import bench
from ops.bench.quant import add_ratios, add_targets, parse_schemes
from ops.bench.report import Report

HELDOUT = (
    "The mill turns slowly in the morning, faster once the wind rises. Every sack of grain is "
    "weighed before it goes in and after it comes out, and the two numbers are written down.\n"
)
ROW_FIELDS = {
    "scheme",
    "dtype",
    "quantization",
    "weights",
    "linear_kernel",
    "weight_bytes",
    "packed_bytes",
    "loaded_bytes",
    "weight_mb",
    "loaded_mb",
    "decode_tokens_per_s",
    "batch_tokens_per_s",
    "batch1",
    "batch",
    "load_s",
    "heldout_tokens",
    "perplexity",
    "top1_agreement",
    "vs_fp32",
}


def test_cli_reports_fp32_and_int8_rows(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    heldout = tmp_path / "heldout.txt"
    heldout.write_text(HELDOUT)
    tiny = str(tiny_checkpoints["llama"])
    args = f"quant -m {tiny} --schemes int8,fp32 --decode-tokens 2 --batch 2"
    args += f" --batch-prompt-tokens 2 --batch-new-tokens 2 --heldout {heldout} --json"
    result = CliRunner().invoke(bench, args.split())
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)

    assert report["benchmark"] == "quant"
    assert report["quality"] is None
    assert isinstance(report["warnings"], list)  # a busy host's, if it was
    assert report["environment"]["quantized_linear_kernel"] in ("native", "dequantize-per-call")
    assert report["settings"]["schemes"] == ["fp32", "int8"]  # fp32 first: the reference
    assert report["settings"]["batch"]["requests"] == 2
    (model,) = report["models"]
    assert model["name"] == tiny and model["arch"] == "llama"
    fp32, int8 = model["rows"]
    for row in (fp32, int8):
        assert set(row) >= ROW_FIELDS
        assert row["batch1"]["new_tokens"] == 2 and row["batch1"]["prompt_tokens"] == 2
        assert row["batch"]["output_tokens"] == 2 * 2
        assert row["decode_tokens_per_s"] > 0 and row["batch_tokens_per_s"] > 0
        assert row["heldout_tokens"] > 16 and row["perplexity"] > 1
    assert (fp32["scheme"], fp32["weights"], fp32["dtype"]) == ("fp32", "none", "float32")
    assert (int8["scheme"], int8["quantization"], int8["weights"]) == ("int8", "int8", "int8")
    assert fp32["vs_fp32"] == {
        "weight_bytes": 1.0,
        "loaded_bytes": 1.0,
        "decode": 1.0,
        "batch": 1.0,
        "perplexity": 1.0,
    }
    assert fp32["top1_agreement"] == 1.0
    assert int8["loaded_bytes"] < fp32["loaded_bytes"] / 2  # int8 linears
    assert int8["vs_fp32"]["weight_bytes"] == round(int8["weight_bytes"] / fp32["weight_bytes"], 3)
    assert 0.5 < int8["top1_agreement"] <= 1.0
    assert 0.9 < int8["vs_fp32"]["perplexity"] < 1.2
    assert set(report["targets"]) == {
        f"{tiny} int8_decode_vs_fp32",
        f"{tiny} int4_decode_vs_fp32",
        f"{tiny} int8_perplexity_vs_fp32",
    }
    assert report["targets"][f"{tiny} int4_decode_vs_fp32"]["met"] is None  # no int4 row


def test_cli_refuses_bad_schemes_and_unpaired_mixed_checkpoints(tmp_path: Path) -> None:
    bad = CliRunner().invoke(bench, ["quant", "-m", "smollm2-135m", "--schemes", "fp32,fp8"])
    assert bad.exit_code == 2 and "fp8" in bad.output
    args = ["quant", "-m", "a", "-m", "b", "--mixed-from", str(tmp_path)]
    unpaired = CliRunner().invoke(bench, args)
    assert unpaired.exit_code == 2 and "one per --model" in unpaired.output


def test_schemes_run_fp32_first() -> None:
    assert parse_schemes("int4, fp32,gguf") == ("fp32", "int4", "gguf")


def _row(scheme: str, mb: float, decode: float, batch: float, ppl: float | None) -> dict[str, Any]:
    return {
        "scheme": scheme,
        "dtype": "float32",
        "weights": "none" if scheme == "fp32" else scheme,
        "weight_bytes": int(mb * 2**20),
        "loaded_bytes": int(mb * 2**20),
        "weight_mb": mb,
        "loaded_mb": mb,
        "decode_tokens_per_s": decode,
        "batch_tokens_per_s": batch,
        "perplexity": ppl,
        "top1_agreement": 1.0 if scheme == "fp32" else 0.95,
    }


def test_ratios_and_targets_against_the_fp32_row() -> None:
    rows = add_ratios([
        _row("fp32", 512.0, 40.0, 400.0, 10.0),
        _row("int8", 128.0, 70.0, 380.0, 10.1),
        _row("int4", 64.0, 90.0, 300.0, None),
        {"scheme": "gguf", "skipped": "not a GGUF file"},
    ])  # fmt: skip
    _, int8, int4, gguf = rows
    assert int8["vs_fp32"] == {
        "weight_bytes": 0.25,
        "loaded_bytes": 0.25,
        "decode": 1.75,
        "batch": 0.95,
        "perplexity": 1.01,
    }
    assert int4["vs_fp32"]["perplexity"] is None and "vs_fp32" not in gguf
    report = Report("quant")
    report["models"] = [{"name": "m", "rows": rows}]
    add_targets(report)
    t = report["targets"]
    assert (t["m int8_decode_vs_fp32"]["value"], t["m int8_decode_vs_fp32"]["met"]) == (1.75, True)
    assert (t["m int4_decode_vs_fp32"]["value"], t["m int4_decode_vs_fp32"]["met"]) == (2.25, False)
    assert t["m int8_perplexity_vs_fp32"] == {
        "target": 1.02,
        "at_most": True,
        "value": 1.01,
        "met": True,
    }
    no_fp32 = add_ratios([_row("int8", 128.0, 70.0, 380.0, 10.1)])
    assert set(no_fp32[0]["vs_fp32"].values()) == {None}
    assert "m int8_decode_vs_fp32: 1.75 (target ≥ 1.6: met)" in report.text()
