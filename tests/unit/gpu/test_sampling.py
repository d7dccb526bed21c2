"""Sampling: greedy, top-k / top-p filters, per-request seeds that ignore the batch, and a
sampler a CUDA graph can hold (no host reads, no per-row Python work)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from gpu.grammar.mask import StepMask
from gpu.sampling import (
    SamplingTensors,
    filter_logits,
    sample,
    sample_tokens,
    sampling_rows,
)
from gpu.sequence import SamplingParams

VOCAB = 32


def random_logits(rows: int, seed: int, vocab: int = VOCAB, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale  # [rows, vocab]; ties have zero odds


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


temperatures = st.floats(1e-3, 1e3)
seeds = st.integers(0, 2**32)


def test_greedy_is_argmax() -> None:
    logits = random_logits(16, seed=0)
    tokens = sample(logits, [SamplingParams()] * 16, list(range(16)), generator())
    assert tokens == logits.argmax(dim=-1).tolist()


def test_greedy_rows_stay_argmax_beside_sampled_rows() -> None:
    logits = random_logits(6, seed=1)
    params = [SamplingParams(temperature=0.0 if i % 2 else 2.0, seed=i) for i in range(6)]
    tokens = sample(logits, params, [10] * 6, generator())
    greedy = logits.argmax(dim=-1).tolist()
    assert tokens[1::2] == greedy[1::2]


@settings(max_examples=40, deadline=None)
@given(temperature=temperatures, seed=seeds, logits_seed=st.integers(0, 1000))
def test_top_k_one_is_greedy_whatever_the_temperature(
    temperature: float, seed: int, logits_seed: int
) -> None:
    logits = random_logits(4, seed=logits_seed)
    params = [SamplingParams(temperature=temperature, top_k=1, seed=seed)] * 4
    assert sample(logits, params, [1, 2, 3, 4]) == logits.argmax(dim=-1).tolist()


@settings(max_examples=40, deadline=None)
@given(temperature=temperatures, seed=seeds, logits_seed=st.integers(0, 1000))
def test_a_tiny_top_p_is_greedy(temperature: float, seed: int, logits_seed: int) -> None:
    logits = random_logits(4, seed=logits_seed)
    params = [SamplingParams(temperature=temperature, top_p=1e-6, seed=seed)] * 4
    assert sample(logits, params, [1, 2, 3, 4]) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 1e-50])
def test_top_k_one_is_greedy_even_at_a_tiny_temperature(temperature: float) -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.5]])
    assert sample(logits, [SamplingParams(temperature=temperature, top_k=1, seed=0)], [3]) == [1]


def test_tokens_outside_the_top_k_are_never_sampled() -> None:
    logits = random_logits(1, seed=2, vocab=8, scale=1.0)  # a fairly flat distribution
    top3 = set(logits[0].topk(3).indices.tolist())
    rows = 400
    params = [SamplingParams(temperature=3.0, top_k=3, seed=s) for s in range(rows)]
    tokens = sample(logits.expand(rows, -1), params, [5] * rows)
    assert set(tokens) == top3  # all three drawn, nothing else


def test_tokens_outside_the_nucleus_are_never_sampled() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])
    logits = probs.log().unsqueeze(0)
    rows = 400
    # top_p 0.65: {0.4, 0.3} reaches it; the tokens after are cut.
    params = [SamplingParams(temperature=1.0, top_p=0.65, seed=s) for s in range(rows)]
    tokens = sample(logits.expand(rows, -1), params, [5] * rows)
    assert set(tokens) == {0, 1}


def test_filter_logits_zeroes_outside_the_filters_and_renormalizes() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25] * 4])
    filtered = filter_logits(
        probs.log(),
        temperature=torch.tensor([1.0, 1.0, 1.0]),
        top_k=torch.tensor([0, 2, 0]),
        top_p=torch.tensor([0.7, 1.0, 1.0]),
    )  # [3, 4]
    expected = torch.tensor([[0.625, 0.375, 0, 0], [0, 0, 3 / 7, 4 / 7], [0.25] * 4])
    assert torch.allclose(filtered, expected, atol=1e-6), filtered


def test_sampled_frequencies_follow_the_softmax() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    rows = 4000
    params = [SamplingParams(temperature=1.0)] * rows
    tokens = sample(probs.log().expand(rows, -1), params, [0] * rows, generator(3))
    freq = torch.bincount(torch.tensor(tokens), minlength=4).float() / rows
    # 4000 draws: one standard error is at most 0.008; 0.03 is almost four.
    assert torch.allclose(freq, probs, atol=0.03, rtol=0), freq


def test_temperature_sharpens_and_flattens() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    rows = 2000
    logits = probs.log().expand(rows, -1)

    def top_share(temperature: float) -> float:
        params = [SamplingParams(temperature=temperature)] * rows
        return sample(logits, params, [0] * rows, generator(4)).count(0) / rows

    assert top_share(0.3) > 0.85 > 0.6 > top_share(1.0) > 0.4 > top_share(5.0)


def test_same_seed_and_position_draw_the_same_token() -> None:
    logits = torch.zeros(1, 1000)  # flat: every token equally likely
    params = [SamplingParams(temperature=1.0, seed=1234)]
    first = sample(logits, params, [17], generator(0))
    assert sample(logits, params, [17], generator(99)) == first  # the shared generator is unused


@settings(max_examples=30, deadline=None)
@given(
    seed=seeds,
    position=st.integers(0, 4096),
    logits_seed=st.integers(0, 1000),
    others=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.7, 1.0, 1.5]),  # temperature
            st.sampled_from([0, 1, 5]),  # top_k
            st.sampled_from([1.0, 0.9, 0.3]),  # top_p
            st.none() | seeds,
            st.integers(0, 4096),  # position
        ),
        max_size=6,
    ),
    index=st.integers(0, 6),
)
def test_a_seeded_row_draws_the_same_token_whatever_shares_the_batch(
    seed: int,
    position: int,
    logits_seed: int,
    others: list[tuple[float, int, float, int | None, int]],
    index: int,
) -> None:
    params = SamplingParams(temperature=1.0, seed=seed)
    logits = random_logits(1 + len(others), seed=logits_seed, scale=1.0)  # [1 + others, vocab]
    alone = sample(logits[:1], [params], [position])

    index = min(index, len(others))
    batch_params = [
        SamplingParams(temperature=t, top_k=k, top_p=p, seed=s) for t, k, p, s, _ in others
    ]
    batch_positions = [pos for *_, pos in others]
    batch_params.insert(index, params)
    batch_positions.insert(index, position)
    batch_logits = torch.cat([logits[1:][:index], logits[:1], logits[1:][index:]])
    tokens = sample(batch_logits, batch_params, batch_positions, generator(logits_seed))
    assert tokens[index] == alone[0]


def test_different_seeds_draw_different_tokens_from_a_flat_distribution() -> None:
    rows = 100
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(rows)]
    tokens = sample(torch.zeros(rows, 1000), params, [0] * rows)
    # 100 uniform draws from 1000 tokens: about 95 distinct ones are expected.
    assert len(set(tokens)) >= 85


def test_one_seed_draws_different_tokens_at_different_positions() -> None:
    rows = 100
    params = [SamplingParams(temperature=1.0, seed=7)] * rows
    tokens = sample(torch.zeros(rows, 1000), params, list(range(rows)))
    assert len(set(tokens)) >= 85


def test_sampling_rows_lists_each_rows_parameters() -> None:
    draws = iter([111, 222])
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.5, top_k=4, top_p=0.9, seed=-1),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=2.0, seed=2**70 + 3),
        SamplingParams(temperature=1e-6),  # under GREEDY_BELOW: greedy
        SamplingParams(temperature=1.0),
    ]
    rows = sampling_rows(params, [3, 4, 5, 6, 7, 8], lambda: next(draws))
    assert rows.temperature == [0.0, 0.5, 1.0, 2.0, 0.0, 1.0]
    assert rows.top_k == [0, 4, 0, 0, 0, 0]
    assert rows.top_p == [1.0, 0.9, 1.0, 1.0, 1.0, 1.0]
    # Seeds wrap into 63 bits; only the unseeded sampled rows draw one.
    assert rows.seeds == [0, 2**63 - 1, 111, 3, 0, 222]
    assert rows.positions == [3, 4, 5, 6, 7, 8]
    assert rows.any_sampled
    t = rows.to_tensors("cpu")
    assert (t.temperature.dtype, t.top_k.dtype, t.top_p.dtype) == (
        torch.float32,
        torch.int64,
        torch.float32,
    )
    assert (t.seeds.dtype, t.positions.dtype) == (torch.int64, torch.int64)


def never_drawn() -> int:
    raise AssertionError("a greedy or seeded row drew a seed")


def test_greedy_rows_draw_no_seeds_and_skip_the_sampling_math() -> None:
    rows = sampling_rows([SamplingParams(), SamplingParams(temperature=1e-6)], [0, 1], never_drawn)
    assert not rows.any_sampled
    logits = random_logits(2, seed=5)
    tokens = sample_tokens(logits, rows.to_tensors("cpu"), None, rows.any_sampled)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_without_any_sampled_every_row_takes_the_argmax() -> None:
    logits = random_logits(8, seed=6)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(8)]
    t = sampling_rows(params, [0] * 8, never_drawn).to_tensors("cpu")
    assert torch.equal(sample_tokens(logits, t, None, any_sampled=False), logits.argmax(dim=-1))


@pytest.mark.parametrize("others", ["greedy", "sampled", "mixed"])
@pytest.mark.parametrize("index", range(7))
def test_a_seeded_row_draws_alike_alone_and_at_any_row_of_seven(others: str, index: int) -> None:
    vocab = 500
    target = random_logits(1, seed=21, vocab=vocab, scale=1.0)  # [1, vocab]; fairly flat
    other_params = {
        "greedy": [SamplingParams()] * 6,
        "sampled": [SamplingParams(temperature=0.8, top_k=20, seed=s) for s in range(6)],
        "mixed": [SamplingParams(temperature=1.3 * (i % 2)) for i in range(6)],
    }[others]
    logits = random_logits(7, seed=22, vocab=vocab, scale=1.0)
    logits[index] = target[0]
    positions = [100 + i for i in range(7)]
    positions[index] = 9
    drawn = set()
    for seed in range(10):
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        alone = sample(target, [params], [9])
        batch_params = [*other_params[:index], params, *other_params[index:]]
        tokens = sample(logits, batch_params, positions, generator(seed))
        assert tokens[index] == alone[0]
        drawn.add(alone[0])
    assert len(drawn) > 5  # the seeds really do draw different tokens


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("vary", ["seed", "position"])
def test_draws_follow_the_softmax_of_logits_over_temperature(temperature: float, vary: str) -> None:
    logits = torch.tensor([1.0, 0.2, -0.5, 0.0, -1.5])
    rows = 20_000
    if vary == "seed":
        params = [SamplingParams(temperature=temperature, seed=s) for s in range(rows)]
        positions = [3] * rows
    else:
        params = [SamplingParams(temperature=temperature, seed=7)] * rows
        positions = list(range(rows))
    tokens = sample(logits.expand(rows, -1), params, positions)
    counts = torch.bincount(torch.tensor(tokens), minlength=5).double()
    expected = (logits.double() / temperature).softmax(dim=-1) * rows
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # Four degrees of freedom: a true sampler exceeds 25 with odds about 5e-5. The seeds are
    # fixed, so this passes or fails the same every run.
    assert chi2 < 25, (chi2, counts.tolist(), expected.tolist())


def test_banned_tokens_are_never_sampled() -> None:
    vocab, rows = 16, 300
    logits = torch.zeros(rows, vocab)
    banned = torch.zeros(rows, vocab, dtype=torch.bool)
    banned[:, ::2] = True  # even tokens
    mask = StepMask(rows=torch.arange(rows), banned=banned)
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(rows)]
    tokens = sample(logits, params, [0] * rows, mask=mask)
    assert {t % 2 for t in tokens} == {1} and len(set(tokens)) == vocab // 2


class OpLog(TorchDispatchMode):
    """Records the name of every aten op dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def step_inputs(
    rows: int, device: str, vocab: int = 64
) -> tuple[torch.Tensor, SamplingTensors, StepMask]:
    params = [
        SamplingParams(temperature=1.0, top_k=5, top_p=0.9, seed=i) if i % 2 else SamplingParams()
        for i in range(rows)
    ]
    t = sampling_rows(params, list(range(rows)), never_drawn).to_tensors(device)
    banned = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
    banned[:, 3] = True
    mask = StepMask(rows=torch.arange(rows, device=device), banned=banned)  # every row
    return random_logits(rows, seed=rows, vocab=vocab).to(device), t, mask


def dispatched_ops(rows: int, any_sampled: bool) -> list[str]:
    logits, t, mask = step_inputs(rows, "cpu")
    with OpLog() as log:
        sample_tokens(logits, t, mask, any_sampled)
    return log.ops


@pytest.mark.parametrize("any_sampled", [True, False])
def test_sample_tokens_reads_nothing_back_to_the_host(any_sampled: bool) -> None:
    ops = dispatched_ops(32, any_sampled)
    assert not {"_local_scalar_dense", "item", "nonzero", "masked_select"} & set(ops), ops
    # On the meta device a tensor has no data: any read back, or any shape that depends on
    # values, fails.
    logits, t, mask = step_inputs(32, "meta")
    tokens = sample_tokens(logits, t, mask, any_sampled)
    assert tokens.shape == (32,) and tokens.dtype == torch.int64


@pytest.mark.parametrize("any_sampled", [True, False])
def test_sample_tokens_does_the_same_work_for_one_row_and_for_thirty_two(
    any_sampled: bool,
) -> None:
    one, many = dispatched_ops(1, any_sampled), dispatched_ops(32, any_sampled)
    assert one == many  # no Python loop over rows
    assert ("sort" in one) == any_sampled  # and the greedy-only path skips the sampling math


def test_sample_draws_unseeded_rows_from_the_generator() -> None:
    logits = torch.zeros(50, 1000)
    params = [SamplingParams(temperature=1.0)] * 50
    first = sample(logits, params, [0] * 50, generator(5))
    assert sample(logits, params, [0] * 50, generator(5)) == first
    assert sample(logits, params, [0] * 50, generator(6)) != first
    assert Counter(first).most_common(1)[0][1] < 5  # fresh seeds per row, not one shared


# --- min_p ----------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_tokens_under_min_p_of_the_top_probability_are_never_sampled(temperature: float) -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    probs = (logits / temperature).softmax(dim=-1)
    min_p = 0.3
    kept = {i for i, p in enumerate(probs.tolist()) if p >= min_p * float(probs.max())}
    rows = 2000
    params = [SamplingParams(temperature=temperature, min_p=min_p, seed=s) for s in range(rows)]
    tokens = sample(logits.expand(rows, -1), params, [0] * rows)
    assert set(tokens) == kept  # after temperature: what survives depends on it
    assert len(kept) < 6


def test_min_p_zero_changes_no_draw_beside_a_row_that_has_it() -> None:
    logits = random_logits(6, seed=40, vocab=200, scale=1.0)
    plain = [SamplingParams(temperature=1.0, top_p=0.9 if i % 3 else 1.0, seed=i) for i in range(6)]
    alone = sample(logits, plain, list(range(6)))
    mixed = [*plain[:5], SamplingParams(temperature=1.0, min_p=0.5, seed=5)]
    assert sample(logits, mixed, list(range(6)))[:5] == alone[:5]


def test_min_p_one_keeps_only_the_top_token_and_greedy_rows_ignore_it() -> None:
    logits = random_logits(8, seed=41)
    params = [SamplingParams(temperature=2.0 * (i % 2), min_p=1.0, seed=i) for i in range(8)]
    rows = sampling_rows(params, [0] * 8, never_drawn)
    assert rows.min_p == [0.0, 1.0] * 4 and rows.any_min_p
    assert sample(logits, params, [0] * 8) == logits.argmax(dim=-1).tolist()


def test_min_p_is_applied_before_top_p() -> None:
    # probs [0.5, 0.2, ten of 0.03]: min_p 0.3 keeps the first two, whose renormalized
    # [0.71, 0.29] top_p 0.6 cuts to the first alone. top_p first would keep two (0.5 < 0.6).
    logits = torch.tensor([0.5, 0.2] + [0.03] * 10).log()
    rows = 500
    params = [SamplingParams(temperature=1.0, min_p=0.3, top_p=0.6, seed=s) for s in range(rows)]
    assert set(sample(logits.expand(rows, -1), params, [0] * rows)) == {0}
    top_p_alone = [SamplingParams(temperature=1.0, top_p=0.6, seed=s) for s in range(rows)]
    assert set(sample(logits.expand(rows, -1), top_p_alone, [0] * rows)) == {0, 1}
