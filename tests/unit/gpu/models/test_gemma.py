"""Gemma's config.json read into a ModelConfig (both the flat and the transformers-5 layout),
its parameter count against transformers' own, and `tokenmill plan` on a config-only folder.
The engine's parity with transformers is in tests/unit/gpu/test_engine.py (ARCHS has gemma2,
gemma3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from gpu.loading.model_config import config_from_hf, load_hf_config
from gpu.model_config import FULL, SLIDING, ModelConfig
from ops.models.plan_cli import plan

# google/gemma-3-270m's config.json as published (transformers 4.55: rope settings flat).
GEMMA3_270M: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "_sliding_window_pattern": 6,
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "intermediate_size": 2048,
    "layer_types": ([SLIDING] * 5 + [FULL]) * 3,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "use_bidirectional_attention": False,
    "vocab_size": 262144,
}

GEMMA2_2B: dict[str, Any] = {
    "model_type": "gemma2",
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 256000,
}


def test_gemma3_270m_config() -> None:
    config = config_from_hf(GEMMA3_270M, Path("config.json"))
    assert config.arch == "gemma3"
    assert config.qk_norm and config.tie_word_embeddings
    assert config.rope_theta == 1e6 and config.rope_local_theta == 1e4
    assert config.attention_scale == 256**-0.5
    assert config.attn_logit_softcapping is None and config.final_logit_softcapping is None
    windows = [config.layer_window(i) for i in range(18)]
    assert windows == ([512] * 5 + [None]) * 3


def test_gemma2_config_alternates_and_soft_caps() -> None:
    config = config_from_hf(GEMMA2_2B, Path("config.json"))
    assert config.arch == "gemma2" and not config.qk_norm
    assert config.layer_types == (SLIDING, FULL) * 13  # transformers' default: even layers slide
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.rope_local_theta is None


def test_transformers_5_layout_reads_the_same() -> None:
    from transformers import Gemma3TextConfig

    flat = config_from_hf(GEMMA3_270M, Path("config.json"))
    fields = {k: v for k, v in GEMMA3_270M.items() if k not in ("architectures", "model_type")}
    saved = Gemma3TextConfig(**fields).to_dict()  # rope settings nested per layer type
    assert "sliding_attention" in saved["rope_parameters"]
    assert config_from_hf(saved, Path("config.json")) == flat


@pytest.mark.parametrize("raw", [GEMMA3_270M, GEMMA2_2B], ids=["gemma3", "gemma2"])
def test_num_parameters_is_transformers_count(raw: dict[str, Any]) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    hf_config = AutoConfig.for_model(raw["model_type"], **fields)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_config)
    expected = sum(p.numel() for p in hf.parameters())  # tied: the embedding counted once
    config: ModelConfig = config_from_hf(raw, Path("config.json"))
    assert config.num_parameters() == expected


def test_plan_on_a_config_only_gemma_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_270M))
    args = ["--model", str(tmp_path), "--dtype", "bf16", "--batch", "2", "--seq-len", "2048"]
    result = CliRunner().invoke(plan, [*args, "--device-memory", "4GiB", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["arch"] == "gemma3"
    assert record["num_parameters"] == load_hf_config(tmp_path).num_parameters()
    assert record["kv_bytes_per_token"] == 2 * 18 * 1 * 256 * 2  # K and V, every layer
    assert record["fits"] is True


@pytest.mark.parametrize("native", [True, False], ids=["native-paged", "sdpa-gather"])
def test_all_local_layers_release_blocks_and_still_match_transformers(
    tmp_path: Path, native: bool
) -> None:
    """Every layer sliding (window 10): blocks behind each window go back to the pool while
    the sequence runs (a small pool reuses them at once), and the tokens stay transformers'."""
    from transformers import AutoModelForCausalLM

    from gpu.engine import Engine, EngineRequest
    from gpu.engine_config import EngineConfig
    from gpu.kv_pool import PAD_BLOCK
    from gpu.loading.loader import load_model
    from gpu.scheduler import RELEASED_BLOCK
    from gpu.sequence import SamplingParams
    from ops.models.offline import run_all
    from tests.tiny_models import build_tiny_checkpoint
    from tests.unit.gpu.test_engine import hf_greedy, random_prompts

    assert RELEASED_BLOCK == PAD_BLOCK
    path = build_tiny_checkpoint("gemma3_local", tmp_path / "gemma3_local")
    model = load_model(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = EngineConfig(
        block_size=4,
        max_num_batched_tokens=48,
        num_kv_blocks=64,
        max_model_len=256,
        native_kernels=native,
    )
    engine = Engine(model, config)
    assert engine.scheduler.config.window == 10
    prompts = random_prompts(model.config.vocab_size, 6, seed=5, low=40, high=120)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    run = run_all(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)])
    # Unreleased, these 6 sequences of up to 143 tokens would need up to 6 × 36 blocks.
    assert sum(-(-(len(p) + 24) // 4) for p in prompts) > 64
    # Released, each holds its window's 3 blocks and the one being written, plus one
    # prefill chunk's 12 blocks at a time (48 tokens a step) before they are released.
    # (Measured: 18. Unreleased, the same run fills all 64 and preempts twice.)
    assert engine.peak_blocks_used <= 6 * 4 + 12
    assert all(c.num_preemptions == 0 for c in run.completions)
    for prompt, completion in zip(prompts, run.completions, strict=True):
        expected = hf_greedy(hf, prompt, 24)
        assert completion.token_ids == expected, f"prompt of {len(prompt)} tokens diverged"


@pytest.mark.parametrize("native", [True, False], ids=["native-paged", "sdpa-gather"])
def test_the_window_view_of_a_step_reads_only_the_windows_blocks(native: bool) -> None:
    """Window 10, blocks of 4: a decode at position 40 sees 31-40, in blocks 7-10 of its table;
    a prefill chunk of 37-44 sees 28-44, blocks 7-11. Nothing before is gathered or read."""
    from gpu.backends.step_batch import StepBuilder
    from gpu.kernels.native import cpu_kernels
    from gpu.kv_pool import KVPool
    from gpu.scheduler import ScheduledChunk
    from gpu.sequence import SamplingParams, Sequence

    kernels = cpu_kernels() if native else None
    if native and kernels is None:
        pytest.skip("no C compiler here: the native kernels are off")
    config = config_from_hf(GEMMA3_270M, Path("config.json"))
    kv = KVPool(config, 64, 4, 32, torch.float32, torch.device("cpu"))
    builder = StepBuilder(kv, torch.device("cpu"), in_place=native, window=10)
    decode = Sequence("d", list(range(41)), SamplingParams(), arrival_time=0.0)
    decode.block_table = list(range(1, 12))  # positions 0-43
    decode.num_computed_tokens = 40
    prefill = Sequence("p", list(range(45)), SamplingParams(), arrival_time=0.0)
    prefill.block_table = list(range(20, 32))
    prefill.num_computed_tokens = 37
    chunks = [ScheduledChunk.of(decode, 40, 1), ScheduledChunk.of(prefill, 37, 8)]
    meta = builder.build(chunks).attention
    local = meta.for_window(10)
    assert local.window == 10 and meta.for_window(None) is meta
    (group,) = local.decodes
    if native:  # the kernel gets the whole table and where to start in it
        assert group.starts is not None and group.starts.tolist() == [31]
    else:
        assert group.blocks.tolist() == decode.block_table[7:11]
        assert group.mask is not None
        seen = group.mask.flatten().nonzero().flatten() + 7 * 4
        assert seen.tolist() == list(range(31, 41))
    (span,) = local.prefills
    assert span.blocks is not None and span.blocks.tolist() == prefill.block_table[7:12]
    assert span.context == 45 - 7 * 4 and span.mask is not None
    for row, query in enumerate(range(37, 45)):  # each query sees its own last 10 positions
        seen = span.mask[row].nonzero().flatten() + 7 * 4
        assert seen.tolist() == list(range(query - 9, query + 1))
    with pytest.raises(ValueError, match="sliding window of 12"):
        meta.for_window(12)
