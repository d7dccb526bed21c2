"""The memory planner: the formulas, the largest batch, the advice, and their invariants."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu.errors import MemoryPlanError
from gpu.memory.activation_reserve import activation_reserve_bytes, decode_graph_reserve_bytes
from gpu.memory.kv_budget import kv_budget_bytes, num_kv_blocks
from gpu.memory.model_sizes import canonical_dtype, dtype_bytes, kv_bytes_per_token, weights_bytes
from gpu.memory.plan import default_max_batched_tokens, plan_memory
from gpu.model_config import ModelConfig

GiB = 2**30
MiB = 2**20

SMOLLM2_135M = ModelConfig(
    arch="llama",
    vocab_size=49152,
    hidden_size=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    max_position_embeddings=8192,
    norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_theta=100000.0,
)

GPT2 = ModelConfig(
    arch="gpt2",
    vocab_size=50257,
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    num_kv_heads=12,
    head_dim=64,
    intermediate_size=3072,
    max_position_embeddings=1024,
    norm_eps=1e-5,
    tie_word_embeddings=True,
    activation="gelu_new",
)


# --- the formulas ---------------------------------------------------------------------------


def test_smollm2_parameter_count_matches_the_real_checkpoint() -> None:
    # embed 49152×576 = 28,311,552 (tied head: no extra)
    # per layer: q,k,v,o 576×(576+192+192) + 576×576 = 884,736; MLP 3×576×1536 = 2,654,208;
    #            two RMSNorms 1,152 → 3,540,096; × 30 layers = 106,202,880
    # final norm 576 → 134,515,008 (the count Hugging Face reports for SmolLM2-135M)
    assert SMOLLM2_135M.num_parameters() == 134_515_008


def test_gpt2_parameter_count_matches_the_real_checkpoint() -> None:
    # wte 50257×768 + wpe 1024×768 + 12 × 7,087,872 + ln_f 1,536 = 124,439,808 (HF "gpt2")
    assert GPT2.num_parameters() == 124_439_808


def test_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token(SMOLLM2_135M, "fp32") == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(SMOLLM2_135M, "bfloat16") == 23_040
    assert kv_bytes_per_token(GPT2, "float32") == 2 * 12 * 12 * 64 * 4 == 73_728


def test_weights_bytes() -> None:
    assert weights_bytes(SMOLLM2_135M, "float32") == 134_515_008 * 4
    assert weights_bytes(SMOLLM2_135M, "fp16") == 134_515_008 * 2
    assert weights_bytes(GPT2, "bf16") == 124_439_808 * 2


def test_decode_graph_reserve_covers_the_largest_graphs_step() -> None:
    """The CUDA graphs' pool: a decode step of max_batch tokens, its logits and inputs; it
    grows with the batch and is below a whole step's activation reserve (no attention
    buffers: the kernels read the pool in place)."""
    c = SMOLLM2_135M
    small = decode_graph_reserve_bytes(c, "bfloat16", 1)
    large = decode_graph_reserve_bytes(c, "bfloat16", 64)
    assert 0 < small < large
    assert large >= 64 * c.vocab_size * (2 + 4)  # the logits alone, bf16 and their fp32 copy
    full = activation_reserve_bytes(c, "bfloat16", 64, 64, max_context_len=2048)
    assert large < full


def test_activation_reserve_follows_its_documented_formula() -> None:
    # T = 2048 tokens, B = 8 rows, C = 2048 context, bf16
    per_token = 2048 * (4 * 576 + 3 * 576 + 3 * 192 + 3 * 1536) * 2  # 37,748,736
    logits = 8 * 49152 * (2 + 4 * 8)  # 13,369,344
    scores = 9 * 2048 * 2048 * 8  # 301,989,888
    gathered = 2 * 8 * 2048 * (192 + 576) * 2  # 50,331,648
    got = activation_reserve_bytes(SMOLLM2_135M, "bf16", 2048, 8, max_context_len=2048)
    assert got == per_token + logits + scores + gathered == 403_439_616


def test_activation_reserve_context_defaults_to_max_position_embeddings() -> None:
    explicit = activation_reserve_bytes(GPT2, "fp32", 512, 4, max_context_len=1024)
    assert activation_reserve_bytes(GPT2, "fp32", 512, 4) == explicit


def test_activation_reserve_counts_one_token_per_decoding_sequence() -> None:
    # 64 decodes need 64 tokens in the step even if max_batched_tokens says 16.
    assert activation_reserve_bytes(GPT2, "fp32", 16, 64) == activation_reserve_bytes(
        GPT2, "fp32", 64, 64
    )


def test_default_max_batched_tokens() -> None:
    assert default_max_batched_tokens(1, 100) == 100  # only 100 tokens exist
    assert default_max_batched_tokens(8, 100) == 800
    assert default_max_batched_tokens(64, 100) == 2048  # at least 2048 a step ...
    assert default_max_batched_tokens(8, 4096) == 4096  # ... a whole prompt ...
    assert default_max_batched_tokens(8, 32768) == 8192  # ... chunked past 8192
    assert default_max_batched_tokens(4096, 1) == 4096  # one decode token per sequence


def test_dtype_bytes_and_aliases() -> None:
    names = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
    assert [dtype_bytes(d) for d in names] == [4, 4, 2, 2, 2, 2]
    assert dtype_bytes("BF16") == 2
    assert canonical_dtype("bf16") == "bfloat16"
    assert canonical_dtype("float32") == "float32"


def test_unknown_dtype_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"int8.*float32.*bf16"):
        dtype_bytes("int8")


# --- plan_memory ---------------------------------------------------------------------------


def test_plan_adds_up_and_counts_kv_in_whole_blocks() -> None:
    plan = plan_memory(SMOLLM2_135M, dtype="fp32", batch=8, seq_len=2001, budget_bytes=80 * GiB)
    assert plan.kv_tokens_per_sequence == 2016  # ceil(2001 / 16) × 16
    assert plan.kv_bytes == 8 * 2016 * 46_080
    assert plan.weights_bytes == 538_060_032
    assert plan.total_bytes == plan.weights_bytes + plan.kv_bytes + plan.activation_bytes
    assert plan.headroom_bytes == 80 * GiB - plan.total_bytes
    assert plan.fits
    assert plan.dtype == "float32"
    assert plan.num_parameters == 134_515_008
    assert plan.max_batched_tokens == 2048


def test_max_batch_is_the_largest_batch_that_fits() -> None:
    budget = 4 * GiB
    plan = plan_memory(SMOLLM2_135M, dtype="bf16", batch=1, seq_len=2048, budget_bytes=budget)
    n = plan.max_batch
    assert n > 1
    at_n = plan_memory(SMOLLM2_135M, dtype="bf16", batch=n, seq_len=2048, budget_bytes=budget)
    above = plan_memory(SMOLLM2_135M, dtype="bf16", batch=n + 1, seq_len=2048, budget_bytes=budget)
    assert at_n.fits
    assert not above.fits
    assert at_n.max_batch == above.max_batch == n
    assert plan.advice == f"fits with batch ≤ {n} at seq_len 2048"


def test_max_batch_for_gpt2() -> None:
    plan = plan_memory(GPT2, dtype="fp32", batch=4, seq_len=1024, budget_bytes=2 * GiB)
    n = plan.max_batch
    assert plan.fits
    assert plan_memory(GPT2, dtype="fp32", batch=n, seq_len=1024, budget_bytes=2 * GiB).fits
    assert not plan_memory(GPT2, dtype="fp32", batch=n + 1, seq_len=1024, budget_bytes=2 * GiB).fits
    assert plan.kv_bytes == 4 * 1024 * 73_728


def test_max_batch_grows_with_the_budget() -> None:
    batches = [
        plan_memory(
            SMOLLM2_135M, dtype="bf16", batch=1, seq_len=4096, budget_bytes=gib * GiB
        ).max_batch
        for gib in (0, 1, 2, 4, 8, 16, 80)
    ]
    assert batches == sorted(batches)
    assert batches[0] == 0
    assert batches[-1] > batches[-2] > 0


def test_advice_cut_batch_or_use_bf16() -> None:
    plan = plan_memory(SMOLLM2_135M, dtype="fp32", batch=8, seq_len=2048, budget_bytes=GiB)
    assert not plan.fits
    assert plan.max_batch >= 1
    assert plan.advice == f"does not fit: cut batch to ≤ {plan.max_batch} or use bf16"
    half = plan_memory(SMOLLM2_135M, dtype="bf16", batch=8, seq_len=2048, budget_bytes=GiB)
    assert half.fits


def test_advice_cut_seq_len_at_batch_one() -> None:
    plan = plan_memory(SMOLLM2_135M, dtype="bf16", batch=8, seq_len=2048, budget_bytes=600 * MiB)
    assert plan.max_batch == 0
    assert plan.advice.startswith("does not fit even at batch 1: cut seq_len to ≤ ")
    shorter = int(plan.advice.rsplit("≤ ", 1)[1])
    assert shorter % 16 == 0
    assert plan_memory(
        SMOLLM2_135M, dtype="bf16", batch=1, seq_len=shorter, budget_bytes=600 * MiB
    ).fits
    assert not plan_memory(
        SMOLLM2_135M, dtype="bf16", batch=1, seq_len=2048, budget_bytes=600 * MiB
    ).fits


def test_advice_names_bf16_when_only_quantizing_helps() -> None:
    # fp32 weights (513 MiB) alone exceed 400 MiB; bf16 weights (257 MiB) leave room.
    plan = plan_memory(SMOLLM2_135M, dtype="fp32", batch=4, seq_len=512, budget_bytes=400 * MiB)
    assert plan.max_batch == 0
    assert "use bf16" in plan.advice
    assert "cut seq_len" not in plan.advice


def test_advice_when_nothing_helps() -> None:
    plan = plan_memory(SMOLLM2_135M, dtype="bf16", batch=1, seq_len=512, budget_bytes=100 * MiB)
    assert not plan.fits
    assert plan.max_batch == 0
    assert "weights + activation reserve alone need" in plan.advice
    assert "more memory" in plan.advice


def test_plan_is_frozen() -> None:
    plan = plan_memory(GPT2, dtype="fp32", batch=1, seq_len=16, budget_bytes=GiB)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch": 0},
        {"seq_len": 0},
        {"block_size": 0},
        {"budget_bytes": -1},
        {"max_batched_tokens": 0},
        {"dtype": "int4"},
    ],
)
def test_plan_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {
        "dtype": "fp32",
        "batch": 1,
        "seq_len": 16,
        "budget_bytes": GiB,
        **kwargs,
    }
    with pytest.raises(ValueError):
        plan_memory(GPT2, **args)  # type: ignore[arg-type]


# --- what the engine calls -----------------------------------------------------------------


def test_kv_budget_is_what_weights_and_reserve_leave() -> None:
    left = kv_budget_bytes(
        SMOLLM2_135M,
        dtype="bf16",
        device_budget_bytes=4 * GiB,
        max_batched_tokens=2048,
        max_batch=16,
        max_context_len=2048,
    )
    reserve = activation_reserve_bytes(SMOLLM2_135M, "bf16", 2048, 16, max_context_len=2048)
    assert left == 4 * GiB - weights_bytes(SMOLLM2_135M, "bf16") - reserve


def test_kv_budget_raises_with_the_numbers_when_nothing_is_left() -> None:
    with pytest.raises(MemoryPlanError, match=r"no memory left.*weights 256\.57 MiB"):
        kv_budget_bytes(
            SMOLLM2_135M,
            dtype="bf16",
            device_budget_bytes=200 * MiB,
            max_batched_tokens=2048,
            max_batch=16,
        )


def test_num_kv_blocks() -> None:
    per_block = 16 * 46_080
    assert (
        num_kv_blocks(SMOLLM2_135M, dtype="fp32", kv_budget_bytes=10 * per_block, block_size=16)
        == 10
    )
    assert (
        num_kv_blocks(SMOLLM2_135M, dtype="fp32", kv_budget_bytes=11 * per_block - 1, block_size=16)
        == 10
    )
    assert num_kv_blocks(SMOLLM2_135M, dtype="fp32", kv_budget_bytes=0, block_size=16) == 0
    with pytest.raises(ValueError):
        num_kv_blocks(SMOLLM2_135M, dtype="fp32", kv_budget_bytes=GiB, block_size=0)


def test_planner_does_not_import_torch() -> None:
    code = "import sys, gpu.memory.plan, gpu.memory.kv_budget; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- properties ----------------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    arch = draw(st.sampled_from(["llama", "qwen2", "gpt2"]))
    heads = draw(st.integers(1, 16))
    head_dim = draw(st.sampled_from([8, 16, 32, 64, 128]))
    kv_heads = (
        heads
        if arch == "gpt2"
        else draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    )
    return ModelConfig(
        arch=arch,
        vocab_size=draw(st.integers(16, 200_000)),
        hidden_size=heads * head_dim,
        num_layers=draw(st.integers(1, 80)),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=draw(st.integers(8, 30_000)),
        max_position_embeddings=draw(st.integers(16, 131_072)),
        norm_eps=1e-5,
        tie_word_embeddings=draw(st.booleans()),
        attention_bias=arch == "qwen2",
    )


dtypes = st.sampled_from(["float32", "bf16", "fp16"])
budgets = st.integers(0, 200 * GiB)


@given(
    config=configs(),
    dtype=dtypes,
    batch=st.integers(1, 512),
    seq_len=st.integers(1, 32_768),
    block_size=st.sampled_from([1, 8, 16, 32]),
    budget=budgets,
)
def test_plan_invariants(
    config: ModelConfig, dtype: str, batch: int, seq_len: int, block_size: int, budget: int
) -> None:
    plan = plan_memory(
        config,
        dtype=dtype,
        batch=batch,
        seq_len=seq_len,
        budget_bytes=budget,
        block_size=block_size,
    )
    assert plan.total_bytes == plan.weights_bytes + plan.kv_bytes + plan.activation_bytes
    assert plan.fits == (plan.total_bytes <= budget)
    assert plan.headroom_bytes == budget - plan.total_bytes
    assert plan.kv_tokens_per_sequence % block_size == 0
    assert 0 <= plan.kv_tokens_per_sequence - seq_len < block_size
    assert plan.fits == (batch <= plan.max_batch)
    assert plan.advice.startswith("fits" if plan.fits else "does not fit")


@given(
    config=configs(),
    dtype=dtypes,
    seq_len=st.integers(1, 8192),
    budget=budgets,
)
def test_max_batch_is_tight(config: ModelConfig, dtype: str, seq_len: int, budget: int) -> None:
    n = plan_memory(config, dtype=dtype, batch=1, seq_len=seq_len, budget_bytes=budget).max_batch
    if n:
        assert plan_memory(config, dtype=dtype, batch=n, seq_len=seq_len, budget_bytes=budget).fits
    assert not plan_memory(
        config, dtype=dtype, batch=n + 1, seq_len=seq_len, budget_bytes=budget
    ).fits


@given(config=configs(), dtype=dtypes, seq_len=st.integers(1, 8192), a=budgets, b=budgets)
def test_max_batch_is_monotonic_in_budget(
    config: ModelConfig, dtype: str, seq_len: int, a: int, b: int
) -> None:
    low, high = sorted((a, b))
    at_low = plan_memory(config, dtype=dtype, batch=1, seq_len=seq_len, budget_bytes=low)
    at_high = plan_memory(config, dtype=dtype, batch=1, seq_len=seq_len, budget_bytes=high)
    assert at_low.max_batch <= at_high.max_batch


@given(
    config=configs(),
    dtype=dtypes,
    budget=st.integers(0, 200 * GiB),
    block_size=st.integers(1, 64),
)
def test_num_kv_blocks_fill_but_never_exceed_the_budget(
    config: ModelConfig, dtype: str, budget: int, block_size: int
) -> None:
    blocks = num_kv_blocks(config, dtype=dtype, kv_budget_bytes=budget, block_size=block_size)
    block_bytes = block_size * kv_bytes_per_token(config, dtype)
    assert blocks * block_bytes <= budget
    assert (blocks + 1) * block_bytes > budget


@given(
    config=configs(),
    dtype=dtypes,
    device=budgets,
    tokens=st.integers(1, 16_384),
    batch=st.integers(1, 1024),
)
def test_kv_budget_plus_fixed_costs_is_the_device_budget(
    config: ModelConfig, dtype: str, device: int, tokens: int, batch: int
) -> None:
    fixed = weights_bytes(config, dtype) + activation_reserve_bytes(config, dtype, tokens, batch)
    if fixed >= device:
        with pytest.raises(MemoryPlanError):
            kv_budget_bytes(
                config,
                dtype=dtype,
                device_budget_bytes=device,
                max_batched_tokens=tokens,
                max_batch=batch,
            )
    else:
        left = kv_budget_bytes(
            config,
            dtype=dtype,
            device_budget_bytes=device,
            max_batched_tokens=tokens,
            max_batch=batch,
        )
        assert left + fixed == device
