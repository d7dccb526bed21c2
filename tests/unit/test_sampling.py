"""Sampling: greedy, top-k / top-p filters, and per-request seeds that ignore the batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.sampling import filter_logits, sample, seed_for_position
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


def test_seed_for_position_is_distinct_for_nearby_pairs() -> None:
    bases = [0, 1 << 16, 1 << 32, (1 << 63) - 64]
    pairs = {(b + ds, p) for b in bases for ds in range(-32, 32) for p in range(256)}
    values = {seed_for_position(s, p) for s, p in pairs}
    assert len(values) == len(pairs)
    # Every value is a seed torch.Generator.manual_seed accepts.
    assert all(0 <= v < 1 << 63 for v in values)


def test_seed_for_position_is_a_function_of_its_arguments() -> None:
    assert seed_for_position(42, 7) == seed_for_position(42, 7)
    assert seed_for_position(42, 7) != seed_for_position(7, 42)
