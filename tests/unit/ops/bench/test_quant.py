"""`tokenmill bench quant`: the CLI on SmolLM2 (fp32 and int8, a few tokens) gives the report's
fields; ratios, targets and the table are pure functions of rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.bench.cli import bench
from ops.bench.quant import parse_schemes
from ops.bench.quant_report import add_ratios, targets
from ops.bench.quant_table import HEADER, cell, quant_table, render, row_cells

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


@pytest.mark.slow
def test_cli_reports_fp32_and_int8_rows(smollm2_path: Path, tmp_path: Path) -> None:
    heldout = tmp_path / "heldout.txt"
    heldout.write_text(HELDOUT)
    args = "quant -m smollm2-135m --schemes int8,fp32 --decode-tokens 2 --batch 2"
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
    assert model["name"] == "smollm2-135m" and model["arch"] == "llama"
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
    assert int8["loaded_bytes"] < fp32["loaded_bytes"] / 3  # int8 linears and a tied head
    assert int8["vs_fp32"]["weight_bytes"] == round(int8["weight_bytes"] / fp32["weight_bytes"], 3)
    assert 0.5 < int8["top1_agreement"] <= 1.0
    assert 0.9 < int8["vs_fp32"]["perplexity"] < 1.2
    assert set(model["targets"]) == {
        "int8_decode_vs_fp32",
        "int4_decode_vs_fp32",
        "int8_perplexity_vs_fp32",
    }
    assert model["targets"]["int4_decode_vs_fp32"]["met"] is None  # no int4 row


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


def _report() -> dict[str, Any]:
    rows = [
        _row("fp32", 512.0, 40.0, 400.0, 10.0),
        _row("int8", 128.0, 70.0, 380.0, 10.1),
        _row("int4", 64.0, 90.0, 300.0, None),
        {"scheme": "gguf", "skipped": "not a GGUF file"},
    ]
    return {
        "environment": {
            "device": "cpu",
            "threads": 2,
            "quantized_linear_kernel": "native",
            "native_kernels": True,
            "host_load_1m_at_start": 1.0,
            "host_load_1m_at_end": 1.5,
        },
        "settings": {
            "decode": {"prompt_tokens": 128, "new_tokens": 128, "bf16_tokens": 32},
            "batch": {"requests": 64, "prompt_tokens": 32, "new_tokens": 32},
        },
        "quality": None,
        "warnings": ["the host was busy"],
        "models": [{"name": "m", "rows": add_ratios(rows), "targets": targets(rows)}],
    }


def test_ratios_and_targets_against_the_fp32_row() -> None:
    model = _report()["models"][0]
    _, int8, int4, gguf = model["rows"]
    assert int8["vs_fp32"] == {
        "weight_bytes": 0.25,
        "loaded_bytes": 0.25,
        "decode": 1.75,
        "batch": 0.95,
        "perplexity": 1.01,
    }
    assert int4["vs_fp32"]["perplexity"] is None and "vs_fp32" not in gguf
    t = model["targets"]
    assert (t["int8_decode_vs_fp32"]["value"], t["int8_decode_vs_fp32"]["met"]) == (1.75, True)
    assert (t["int4_decode_vs_fp32"]["value"], t["int4_decode_vs_fp32"]["met"]) == (2.25, False)
    assert t["int8_perplexity_vs_fp32"] == {
        "target": 1.02,
        "at_most": True,
        "value": 1.01,
        "met": True,
    }
    no_fp32 = add_ratios([_row("int8", 128.0, 70.0, 380.0, 10.1)])
    assert set(no_fp32[0]["vs_fp32"].values()) == {None}


def test_cells_and_columns() -> None:
    assert (cell(None), cell(1.234), cell(1.234, 3)) == ("-", "1.2", "1.234")
    rows = _report()["models"][0]["rows"]
    int8 = row_cells("m", rows[1])
    assert len(int8) == len(HEADER)
    assert int8[:4] == ["m", "int8", "int8 (float32)", "128.0"]
    assert int8[-1] == "95.0%" and int8[-3] == "10.10"
    assert row_cells("m", rows[3]) == ["m", "gguf", "skipped: not a GGUF file"]
    lines = render(("a", "MB held"), [["x", "1.0"], ["longer", "22.5"], ["y: skipped"]], {1}).split(
        "\n"
    )
    assert lines == [
        "a       MB held",
        "------  -------",
        "x           1.0",
        "longer     22.5",
        "y: skipped",
    ]


def test_table_has_every_row_and_target() -> None:
    text = quant_table(_report())
    assert "quantized linears: native" in text and "bN: 64 requests" in text
    schemes = [line.split()[1] for line in text.split("\n") if line.startswith("m ")]
    assert schemes == ["fp32", "int8", "int4", "gguf"]
    assert "int8_decode_vs_fp32" in text and "(target ≥ 1.6: met)" in text
    assert "(target ≥ 2.5: NOT met)" in text and "(target ≤ 1.02: met)" in text
    assert text.endswith("warning: the host was busy")
