"""`tokenmill quantize` end to end: the checkpoint it writes loads, holds exactly the layers
its report kept in float, scores as the model it quantized in memory, reads back the same
config and tokenizer, and a changed byte makes it fail to load, saying so. On tiny
random-weight checkpoints (fast), and once on the real SmolLM2 through the CLI (slow)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import ops.quant.cli as quant_cli
from gpu.errors import CheckpointError
from gpu.loading.loader import LoadedModel, load_model
from gpu.loading.model_config import config_from_hf, load_hf_config
from gpu.models.packed_linear import PackedLinear
from gpu.quant.linear import QuantizedEmbedding, QuantizedLinear
from gpu.quant.scheme import Quantization
from ops.quant import sensitivity
from ops.quant.chart import THRESHOLD_MARK, bar, layer_table
from ops.quant.checkpoint import WEIGHTS, hf_config
from ops.quant.evaluate import score
from ops.quant.sensitivity import (
    LayerSensitivity,
    QuantizeReport,
    default_calibration,
    kept_layers,
    quantize_checkpoint,
    quantized_layers,
)

TAMPERED = "does not match the sha256 its config.json records"


def _layers(model: LoadedModel) -> tuple[set[str], set[str]]:
    """The model's float linear layers and its quantized ones, by module name."""
    floats, quantized = set(), set()
    for name, m in model.module.named_modules():
        if isinstance(m, nn.Linear | PackedLinear):
            floats.add(name)
        elif isinstance(m, QuantizedLinear):
            quantized.add(name)
    return floats, quantized


def _check_layers(model: LoadedModel, report: QuantizeReport) -> None:
    floats, quantized = _layers(model)
    assert floats == set(report.kept) | set(report.unfit)
    assert quantized == set(report.quantized)
    if model.config.tie_word_embeddings:  # the table is the head, quantized or not
        assert isinstance(model.module.embed_tokens, QuantizedEmbedding) == ("lm_head" in quantized)


def _flip_a_byte(path: Path, at: int) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


# -- tiny checkpoints -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.tiny_models import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("quantize")
    return {arch: build_tiny_checkpoint(arch, root / arch) for arch in ("llama_tied", "qwen2")}


@pytest.fixture(scope="module")
def written(
    tiny: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, QuantizeReport]:
    """llama_tied (a tied head, as SmolLM2) in int4-g32, every layer whose quantization alone
    raises perplexity at all kept in float."""
    out = tmp_path_factory.mktemp("written") / "int4"
    report = quantize_checkpoint(
        tiny["llama_tied"], "int4", out, default_calibration(), 0.0, tokens=64
    )
    return out, report


def test_the_checkpoint_holds_exactly_the_layers_the_report_kept(
    written: tuple[Path, QuantizeReport], tiny: dict[str, Path]
) -> None:
    out, report = written
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",  # copied from the HF source
        WEIGHTS,
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert report.scheme == "int4-g32" and report.calibration_tokens == 64
    assert len(report.layers) == 3 * 4 + 1  # qkv, o, gate_up, down per layer; the head
    assert report.kept == kept_layers(report.layers, 0.0)
    assert report.kept and report.quantized  # random weights: some of each
    deltas = [r.delta_ppl for r in report.layers]
    assert deltas == sorted(deltas, reverse=True)
    model = load_model(out, quantization="auto", device="cpu")
    _check_layers(model, report)
    assert set(model.quantization.split("+")) == {"int4-g32", "float32"}
    recorded = json.loads((out / "config.json").read_text())["quantization_config"]
    assert recorded["quant_method"] == "tokenmill" and recorded["scheme"] == "int4-g32"
    assert recorded["kept"] == report.kept and recorded["calibration_tokens"] == 64
    assert set(recorded["sha256"]) == {WEIGHTS}
    # the comparison is of the written checkpoint: its perplexity is not the float model's
    assert report.calibration_eval.reference_ppl == pytest.approx(report.float_ppl, rel=1e-4)
    assert report.calibration_eval.top1_agreement <= 1.0
    assert json.loads(report.to_json())["kept"] == report.kept


def test_the_checkpoint_scores_as_the_model_quantized_in_memory(
    written: tuple[Path, QuantizeReport], tiny: dict[str, Path]
) -> None:
    out, report = written
    ids = sensitivity.calibration_tokens(
        load_model(out, device="cpu"), default_calibration().read_text(), 64, "calibration"
    )
    float_model = load_model(tiny["llama_tied"], device="cpu")
    scheme = Quantization.parse("int4")
    with quantized_layers(float_model.module, float_model.config, report.quantized, scheme):
        in_memory = score(float_model, ids)
    loaded = score(load_model(out, quantization="auto", device="cpu"), ids)
    assert in_memory.logprobs is not None and loaded.logprobs is not None
    torch.testing.assert_close(loaded.logprobs, in_memory.logprobs, atol=1e-5, rtol=1e-5)
    # and the float layers came back: the float model scores as before
    again = score(float_model, ids)
    assert all(not isinstance(m, QuantizedLinear) for m in float_model.module.modules())
    assert again.logprobs is not None
    assert not torch.allclose(again.logprobs, in_memory.logprobs)


def test_config_and_tokenizer_read_back_the_same(
    written: tuple[Path, QuantizeReport], tiny: dict[str, Path]
) -> None:
    out, _ = written
    assert load_hf_config(out) == load_hf_config(tiny["llama_tied"])
    source = load_model(tiny["llama_tied"], device="cpu", pack=False).tokenizer
    back = load_model(out, device="cpu", pack=False).tokenizer
    text = "def add(a, b):\n    return a + b  # 1234567890 <|endoftext|>"
    assert back.encode(text) == source.encode(text)
    assert (back.bos_token, back.eos_token, back.eos_token_ids) == (
        source.bos_token,
        source.eos_token,
        source.eos_token_ids,
    )


def test_biases_split_back_into_q_k_v(tiny: dict[str, Path], tmp_path: Path) -> None:
    """qwen2: q/k/v biases, an untied head; int8 with nothing kept."""
    out = tmp_path / "qwen2"
    threshold = 1e9
    report = quantize_checkpoint(
        tiny["qwen2"], "int8", out, default_calibration(), threshold, tokens=32
    )
    assert report.kept == [] and report.scheme == "int8"
    model = load_model(out, quantization="auto", device="cpu")
    _check_layers(model, report)
    assert not isinstance(model.module.embed_tokens, QuantizedEmbedding)  # untied: float
    source = load_model(tiny["qwen2"], device="cpu")
    qkv = model.module.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantizedLinear) and qkv.bias is not None
    torch.testing.assert_close(qkv.bias, source.module.layers[0].self_attn.qkv_proj.bias)


def test_a_changed_checkpoint_fails_to_load_saying_so(
    written: tuple[Path, QuantizeReport], tmp_path: Path
) -> None:
    out = tmp_path / "copy"
    shutil.copytree(written[0], out)
    _flip_a_byte(out / WEIGHTS, (out / WEIGHTS).stat().st_size // 2)
    with pytest.raises(CheckpointError, match=TAMPERED) as caught:
        load_model(out, quantization="auto", device="cpu")
    assert caught.value.path == str(out / WEIGHTS)
    assert "after tokenmill quantize wrote it" in str(caught.value)


def test_an_unlisted_or_unrecorded_weight_file_is_refused(
    written: tuple[Path, QuantizeReport], tmp_path: Path
) -> None:
    out = tmp_path / "copy"
    shutil.copytree(written[0], out)
    shutil.copyfile(out / WEIGHTS, out / "extra.safetensors")
    with pytest.raises(CheckpointError, match="not listed"):
        load_model(out, device="cpu")
    (out / "extra.safetensors").unlink()
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]["sha256"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="records no sha256"):
        load_model(out, device="cpu")


def test_bad_arguments_are_refused_before_any_work(tiny: dict[str, Path], tmp_path: Path) -> None:
    source = tiny["llama_tied"]
    with pytest.raises(ValueError, match="--to must be one of"):
        quantize_checkpoint(source, "auto", tmp_path / "a")
    with pytest.raises(ValueError, match="finite number >= 0"):
        quantize_checkpoint(source, "int8", tmp_path / "a", keep_threshold=-0.1)
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    with pytest.raises(ValueError, match="fewer than the 64 asked for"):
        quantize_checkpoint(source, "int8", tmp_path / "a", short, tokens=64)
    with pytest.raises(ValueError, match="not linear layers"):
        quantize_checkpoint(source, "int8", tmp_path / "a", layers=["layers.0.nope"], tokens=16)
    assert not (tmp_path / "a").exists()


# -- config.json from a ModelConfig ------------------------------------------------------


@pytest.mark.parametrize(
    "arch", ["llama", "llama_tied", "llama_scaled", "qwen2", "mistral", "qwen3", "gemma2", "gemma3"]
)
def test_a_written_config_reads_back_into_an_equal_model_config(arch: str) -> None:
    from tests.tiny_models import hf_config as transformers_config

    config = config_from_hf(transformers_config(arch, 320, 0).to_dict(), Path(arch))
    assert config_from_hf(hf_config(config), Path("written")) == config


def test_configs_a_config_json_cannot_say_are_refused() -> None:
    from tests.tiny_models import hf_config as transformers_config

    for arch in ("gpt2", "mixtral"):
        config = config_from_hf(transformers_config(arch, 320, 0).to_dict(), Path(arch))
        with pytest.raises(ValueError, match=r"cannot write a config\.json"):
            hf_config(config)


# -- the CLI and its chart -----------------------------------------------------------------


def test_cli_constants_are_the_libraries() -> None:
    assert quant_cli.TARGETS == sensitivity.TARGETS
    assert quant_cli.DEFAULT_KEEP_THRESHOLD == sensitivity.DEFAULT_KEEP_THRESHOLD
    assert quant_cli.DEFAULT_TOKENS == sensitivity.DEFAULT_TOKENS
    assert quant_cli.MIN_TOKENS == sensitivity.MIN_TOKENS


def test_cli_prints_the_chart_and_how_to_serve(tiny: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("The quick brown fox jumps over the lazy dog. 1234567890 + 42.\n" * 3)
    args = [str(tiny["llama_tied"]), "--to", "int8", "-o", str(out), "--tokens", "32"]
    args += ["--keep-threshold", "0", "--heldout", str(heldout)]
    result = CliRunner().invoke(quant_cli.quantize, args)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "lm_head" in text and "Δppl" in text and "held-out" in text
    assert f"tokenmill worker --model {out} --quantization auto" in text
    again = CliRunner().invoke(quant_cli.quantize, args)  # out is not empty now
    assert again.exit_code == 2 and "--force" in again.output
    forced = CliRunner().invoke(quant_cli.quantize, [*args, "--force", "--json"])
    assert forced.exit_code == 0, forced.output
    report = json.loads(forced.stdout)
    assert report["scheme"] == "int8" and report["heldout_eval"]["tokens"] > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--keep-threshold", "-1"], "finite number >= 0"),
        (["--keep-threshold", "nan"], "finite number >= 0"),
        (["--calibration", "/no/such/file.txt"], "does not exist"),
        (["--tokens", "4"], "4 is not in the range x>=16"),
        (["--to", "int3"], "'int3' is not one of"),
    ],
)
def test_cli_bad_options(extra: list[str], message: str, tmp_path: Path) -> None:
    args = ["smollm2-135m", "--to", "int8", "-o", str(tmp_path / "o"), *extra]
    result = CliRunner().invoke(quant_cli.quantize, args)
    assert result.exit_code == 2 and message in result.output


def test_cli_missing_model_and_short_text(tiny: dict[str, Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        quant_cli.quantize, ["no-such-model", "--to", "int8", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == 1 and "is neither a known alias nor a path" in result.output
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    args = [str(tiny["llama_tied"]), "--to", "int8", "-o", str(tmp_path / "o")]
    result = CliRunner().invoke(quant_cli.quantize, [*args, "--calibration", str(short)])
    assert result.exit_code == 1 and "fewer than the 512 asked for" in result.output


def test_bars_scale_to_the_largest_and_mark_the_threshold() -> None:
    assert bar(1.0, 1.0, width=8) == "█" * 8
    assert bar(0.5, 1.0, width=8) == "████"
    assert bar(1 / 16, 1.0, width=8) == "▌"  # half a cell
    assert bar(-0.2, 1.0, width=8) == ""
    assert bar(0.0, 1.0, width=8, mark=0.5) == " " * 4 + THRESHOLD_MARK
    assert bar(0.75, 1.0, width=8, mark=0.5) == "██████"  # past the mark: the bar shows it
    rows = [
        LayerSensitivity("lm_head", 11.0, 0.1, 0.02, 0.9, 1.0),
        LayerSensitivity("layers.0.mlp.down_proj", 10.1, 0.01, 0.001, 0.99, 1.0),
    ]
    header, first, second, legend = layer_table(rows, ["lm_head"], 0.02)
    assert "Δppl" in header and first.endswith("kept") and "+10.000%" in first
    assert "kept" not in second and THRESHOLD_MARK in second and "+10.000%" in legend


# -- the real SmolLM2 ------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_quantize_serve_and_tamper(smollm2_path: Path, tmp_path: Path) -> None:
    from gpu.engine import Engine
    from gpu.loading.gguf import read_gguf_config
    from gpu.smoke_test import smoke_test

    out = tmp_path / "smollm2-int4"
    measured = ["lm_head", "layers.0.mlp.down_proj", "layers.29.self_attn.o_proj"]
    args = [str(smollm2_path), "--to", "int4", "-o", str(out), "--tokens", "64", "--json"]
    args += ["--keep-threshold", "0.001", *(f"--only-layer={n}" for n in measured)]
    result = CliRunner().invoke(quant_cli.quantize, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(r["name"] for r in report["layers"]) == sorted(measured)
    assert "lm_head" in report["kept"]  # the tied head and table, in 4 bits: +1% and more
    assert len(report["quantized"]) == 121 - len(report["kept"])

    model = load_model(out, quantization="auto", device="cpu")
    floats, quantized = _layers(model)
    assert floats == set(report["kept"]) and quantized == set(report["quantized"])
    assert not isinstance(model.module.embed_tokens, QuantizedEmbedding)  # kept with the head
    assert model.config == read_gguf_config(smollm2_path)  # config.json written from it
    engine = Engine(model)
    tokens = smoke_test(engine).tokens  # greedy tokens, finite logits
    assert model.tokenizer.decode(tokens).strip()
    assert report["calibration_eval"]["top1_agreement"] > 0.5

    _flip_a_byte(out / WEIGHTS, 1000)  # in the header: the hash catches it first
    with pytest.raises(CheckpointError, match=TAMPERED):
        load_model(out, quantization="auto", device="cpu")
