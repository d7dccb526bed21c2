"""The engine against transformers: same greedy tokens, close logits, batch invariance.

Every check runs on both linear kernels, packed weights (the CPU default: in panels for the
native kernels, or oneDNN's layout without a compiler) and `nn.Linear` (what GPUs and
`pack=False` get), and on both decode attentions: the native
kernel reading the pool in place (the CPU default) and SDPA over gathered blocks.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpu.backends.native_decode_step import implements
from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.kernels.native import cpu_kernels
from gpu.loading.loader import LoadedModel, load_model
from gpu.models.gemma import GemmaForCausalLM
from gpu.models.gpt2 import GPT2ForCausalLM
from gpu.models.llama import LlamaForCausalLM
from gpu.sequence import SamplingParams
from ops.models.offline import run_all
from tests.tiny_models import ARCHS, EXTRA_ARCHS, LONGROPE_ORIGINAL

# Small blocks, a small per-step budget: long prompts are prefilled in several chunks that
# share steps with other sequences' decodes, and every sequence spans many blocks.
CHUNKY = EngineConfig(block_size=4, max_num_batched_tokens=48, num_kv_blocks=2048)
LOGITS_ATOL = 1e-4  # float32 on CPU: fused projections and paged attention reorder sums
KERNELS = ("packed", "torch")  # pack=True (native-panels or onednn-packed), pack=False
ATTENTIONS = {"native-paged": CHUNKY, "sdpa-gather": replace(CHUNKY, native_kernels=False)}


def random_prompts(
    vocab: int, count: int, seed: int, low: int = 1, high: int = 160
) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:  # type: ignore[no-untyped-def]
    """transformers' greedy continuation, running past EOS like `ignore_eos` does.

    (`min_new_tokens` would not do: it forbids EOS instead of ignoring it.)
    """
    hf.generation_config.eos_token_id = None
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


def engine_tokens(
    model: LoadedModel,
    prompts: list[list[int]],
    params: SamplingParams,
    config: EngineConfig = CHUNKY,
    engines: list[Engine] | None = None,  # given: the engine built is appended
) -> list[list[int]]:
    engine = Engine(model, config)
    if engines is not None:
        engines.append(engine)
    run = run_all(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)])
    return [c.token_ids for c in run.completions]


def engine_logits(
    model: LoadedModel, prompt: list[int], config: EngineConfig = CHUNKY
) -> torch.Tensor:
    """Next-token logits at every position of `prompt`, computed in chunks through the pool."""
    from gpu.scheduler import ScheduledChunk
    from gpu.sequence import Sequence

    engine = Engine(model, config)
    seq = Sequence("x", prompt, SamplingParams(), arrival_time=0.0)
    rows = []
    for start in range(0, len(prompt), 7):
        seq.output_token_ids = []
        end = min(start + 7, len(prompt))
        engine.scheduler.kv_cache.allocate(seq, end)
        chunk = ScheduledChunk.of(seq, start, end - start)
        inputs = replace(engine.backend.build([chunk]), logits_rows=torch.arange(end - start))
        with torch.inference_mode():
            rows.append(engine.backend.run_model(inputs))
    return torch.cat(rows)


@pytest.fixture(scope="module")
def models(tiny_checkpoints: dict[str, Path]) -> dict[tuple[str, str], tuple[LoadedModel, object]]:
    """(arch, linear kernel) -> our model and transformers' reference."""
    from transformers import AutoModelForCausalLM

    loaded = {}
    for arch, path in tiny_checkpoints.items():
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for pack in (True, False):
            model = load_model(path, pack=pack)
            loaded[arch, "packed" if pack else "torch"] = (model, hf)
            assert (model.linear_kernel == "torch") == (not pack)
    assert {kernel for _, kernel in loaded} == set(KERNELS)
    return loaded


def attention_config(attention: str) -> EngineConfig:
    config = ATTENTIONS[attention]
    if attention == "native-paged" and cpu_kernels() is None:
        pytest.skip("no C compiler here: the native kernels are off")
    return config


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_transformers(models, arch: str, kernel: str, attention: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = models[arch, kernel]
    prompts = random_prompts(model.config.vocab_size, 10, seed=1)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ours = engine_tokens(model, prompts, params, attention_config(attention))
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == hf_greedy(hf, prompt, 24), f"prompt of {len(prompt)} tokens diverged"


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_close_to_transformers(models, arch: str, kernel: str, attention: str) -> None:  # type: ignore[no-untyped-def]
    model, hf = models[arch, kernel]
    prompt = random_prompts(model.config.vocab_size, 1, seed=2, low=60, high=61)[0]
    with torch.inference_mode():
        reference = hf(torch.tensor([prompt])).logits[0].float()  # [positions, vocab]
    ours = engine_logits(model, prompt, attention_config(attention))
    torch.testing.assert_close(ours, reference, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_sequence_at_a_time_matches_transformers(models, arch: str) -> None:  # type: ignore[no-untyped-def]
    """Every decode step alone: on every decoder here (the Llama family with its MoE models,
    Gemma, GPT-2) that is the native one-token step."""
    model, hf = models[arch, "packed"]
    prompts = random_prompts(model.config.vocab_size, 4, seed=3)
    alone = replace(attention_config("native-paged"), max_num_seqs=1)
    engines: list[Engine] = []
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ours = engine_tokens(model, prompts, params, alone, engines)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == hf_greedy(hf, prompt, 24), f"prompt of {len(prompt)} tokens diverged"
    one_call = LlamaForCausalLM | GemmaForCausalLM | GPT2ForCausalLM
    if isinstance(model.module, one_call) and cpu_kernels() is not None:
        # The native step runs what it implements: every decoder here.
        decode_step = getattr(engines[0].backend, "decode_step", None)
        assert (decode_step is not None) == implements(model.config)


@pytest.mark.parametrize(
    "arch", ("llama", "llama_tied", "qwen2", "qwen3", "gemma2", "gemma3", "gpt2")
)
def test_batched_decodes_run_as_one_native_call(models, arch: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Decode steps of many sequences take the one-call step over the panels (up to
    `PANEL_ROWS` rows), and give transformers' tokens."""
    from gpu.backends.native_decode_step import DecodeStep
    from gpu.models.packed_linear import PANEL_ROWS

    model, hf = models[arch, "packed"]
    # every prompt prefilled in the first step, so that all twelve then decode together
    config = replace(attention_config("native-paged"), max_num_batched_tokens=2048)
    rows: list[int] = []
    call = DecodeStep.__call__

    def counted(self, x, *args):  # type: ignore[no-untyped-def]
        rows.append(x.shape[0])
        return call(self, x, *args)

    monkeypatch.setattr(DecodeStep, "__call__", counted)
    prompts = random_prompts(model.config.vocab_size, 12, seed=7)
    engines: list[Engine] = []
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    ours = engine_tokens(model, prompts, params, config, engines)
    assert engines[0].backend.decode_step.max_rows == PANEL_ROWS  # type: ignore[attr-defined]
    assert max(rows) == len(prompts), rows  # every sequence decoding, in one call
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == hf_greedy(hf, prompt, 16), f"prompt of {len(prompt)} tokens diverged"


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_longrope_short_prompt_logits(models, attention: str) -> None:  # type: ignore[no-untyped-def]
    """A prompt within original_max_position_embeddings: the short factors (the parity test's
    prompt of 60 is past it, so the long ones)."""
    model, hf = models["phi3", "packed"]
    prompt = random_prompts(model.config.vocab_size, 1, seed=4, low=30, high=31)[0]
    assert len(prompt) < LONGROPE_ORIGINAL < 60
    with torch.inference_mode():
        reference = hf(torch.tensor([prompt])).logits[0].float()
    ours = engine_logits(model, prompt, attention_config(attention))
    torch.testing.assert_close(ours, reference, atol=LOGITS_ATOL, rtol=0)


@pytest.fixture(scope="module")
def extra_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[LoadedModel, object]]:
    """EXTRA_ARCHS (tested on the default kernels only, to keep the matrix small): ours, theirs."""
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny_extra")
    loaded = {}
    for arch in EXTRA_ARCHS:
        path = build_tiny_checkpoint(arch, root / arch)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        loaded[arch] = load_model(path), hf
    return loaded


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("arch", EXTRA_ARCHS)
def test_extra_shapes_match_transformers(extra_models, arch: str, attention: str) -> None:  # type: ignore[no-untyped-def]
    """Logits, then greedy tokens of prompts within and past LongRoPE's original length."""
    model, hf = extra_models[arch]
    if arch == "phi3_partial":
        assert model.config.rotary_dim == model.config.head_dim // 2
    elif arch == "mistral_window":
        assert model.config.sliding_window == 16
    else:
        assert model.config.dense_layers == (1,)
        assert sum(p.numel() for p in hf.parameters()) == model.config.num_parameters()
    config = attention_config(attention)
    prompt = random_prompts(model.config.vocab_size, 1, seed=2, low=60, high=61)[0]
    with torch.inference_mode():
        reference = hf(torch.tensor([prompt])).logits[0].float()
    torch.testing.assert_close(
        engine_logits(model, prompt, config), reference, atol=LOGITS_ATOL, rtol=0
    )
    vocab = model.config.vocab_size
    prompts = [random_prompts(vocab, 1, seed, n, n + 1)[0] for seed, n in ((5, 30), (6, 70))]
    engines: list[Engine] = []
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ours = engine_tokens(model, prompts, params, config, engines)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == hf_greedy(hf, prompt, 24), f"prompt of {len(prompt)} tokens diverged"
    if attention == "native-paged":  # partial rotary, windows, experts: all in one call
        assert getattr(engines[0].backend, "decode_step", None) is not None


@pytest.mark.parametrize("arch", ARCHS)
def test_num_parameters_is_transformers_count(models, arch: str) -> None:  # type: ignore[no-untyped-def]
    """What the memory plan counts from the config alone is what transformers holds (every
    expert of an MoE included)."""
    model, hf = models[arch, "torch"]
    assert model.config.num_parameters() == sum(p.numel() for p in hf.parameters())
