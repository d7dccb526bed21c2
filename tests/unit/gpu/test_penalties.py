"""Penalties, logit bias and min_tokens: the host's rows (counts from the token lists, as of
the position sampled) and the tensor math against each formula written out."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.penalties import apply_penalties, penalty_rows
from gpu.sampling import sample, sample_tokens, sampling_rows
from gpu.sequence import SamplingParams, Sequence
from tests.unit.gpu.test_sampling import OpLog, never_drawn, random_logits

VOCAB = 12
EOS = 11


def seq(params: SamplingParams, prompt: list[int], output: list[int] | None = None) -> Sequence:
    s = Sequence("r", list(prompt), params, arrival_time=0.0)
    s.output_token_ids = list(output or [])
    return s


def adjusted(logits: torch.Tensor, seqs: list[Sequence], ends: list[int]) -> torch.Tensor:
    rows = penalty_rows(seqs, ends, [EOS])
    assert rows is not None
    return apply_penalties(logits, rows.to_tensors("cpu"))


def test_rows_without_any_penalty_stage_nothing() -> None:
    plain = [seq(SamplingParams(), [1, 2]), seq(SamplingParams(temperature=1.0, min_p=0.1), [3])]
    assert penalty_rows(plain, [2, 1], [EOS]) is None


def test_presence_and_frequency_follow_openais_formula() -> None:
    logits = random_logits(1, seed=1, vocab=VOCAB)
    params = SamplingParams(presence_penalty=0.7, frequency_penalty=0.3)
    s = seq(params, prompt=[4, 4, 9], output=[1, 1, 1, 2])
    got = adjusted(logits, [s], [s.num_tokens])
    want = logits.clone()
    for token, count in ((1, 3), (2, 1)):  # the completion's tokens only: 4 and 9 untouched
        want[0, token] -= 0.3 * count + 0.7
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_divides_positive_and_multiplies_negative_seen_logits(penalty: float) -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.0, 3.0] + [0.5] * (VOCAB - 6)])
    s = seq(SamplingParams(repetition_penalty=penalty), prompt=[0, 1], output=[2, 3, 4, 3])
    got = adjusted(logits, [s], [s.num_tokens])
    want = logits.clone()
    for token in (0, 1, 2, 3, 4):  # prompt and completion, each once however often seen
        value = float(logits[0, token])
        want[0, token] = value / penalty if value > 0 else value * penalty
    assert torch.equal(got, want)


def test_counts_stop_at_the_position_sampled() -> None:
    # A recomputed sequence's last chunk samples at its end; an earlier end (the scheduler
    # never samples there, but the count must not look past it) counts only what precedes.
    s = seq(SamplingParams(frequency_penalty=1.0), prompt=[5, 5], output=[1, 2, 3])
    logits = torch.zeros(1, VOCAB)
    got = adjusted(logits, [s], [s.num_prompt_tokens + 2])
    assert got[0, :4].tolist() == [0.0, -1.0, -1.0, 0.0]


def test_logit_bias_adds_and_min_tokens_bans_eos_and_stop_tokens() -> None:
    logits = random_logits(3, seed=2, vocab=VOCAB)
    early = SamplingParams(min_tokens=3, stop_token_ids=(7,), logit_bias=((0, 5.0), (3, -2.5)))
    done = SamplingParams(min_tokens=2, stop_token_ids=(7,))
    ignoring = SamplingParams(min_tokens=3, ignore_eos=True)
    seqs = [seq(early, [1], [2, 2]), seq(done, [1], [2, 2]), seq(ignoring, [1])]
    got = adjusted(logits, seqs, [s.num_tokens for s in seqs])
    want = logits.clone()
    want[0, 0] += 5.0
    want[0, 3] -= 2.5
    want[0, [EOS, 7]] = -math.inf  # two tokens of three out: still banned
    # Row 1 has its two tokens: nothing banned. Row 2 ignores EOS and has no stop tokens.
    assert torch.equal(got, want)


def test_rows_without_penalties_are_untouched_bit_for_bit_beside_penalized_ones() -> None:
    logits = random_logits(4, seed=3, vocab=VOCAB)
    logits[1, 5] = -math.inf  # a masked token stays masked
    penalized = SamplingParams(
        presence_penalty=1.0, frequency_penalty=-0.5, repetition_penalty=1.7, logit_bias=((5, 9.0),)
    )
    seqs = [
        seq(SamplingParams(), [1, 2, 3], [4, 4]),
        seq(penalized, [5, 6], [5, 7]),
        seq(SamplingParams(temperature=0.5), [1], [1]),
        seq(penalized, [8], []),
    ]
    got = adjusted(logits, seqs, [s.num_tokens for s in seqs])
    assert torch.equal(got[[0, 2]], logits[[0, 2]])
    assert got[1, 5] == -math.inf
    assert not torch.equal(got[3], logits[3])
    assert logits[1, 5] == -math.inf and torch.isfinite(logits[3]).all()  # input left as it was


def test_a_greedy_row_is_penalized_before_its_argmax() -> None:
    logits = torch.tensor([[1.0, 0.9, 0.0] + [-5.0] * (VOCAB - 3)])
    s = seq(SamplingParams(frequency_penalty=0.5), [2], [0])
    assert sample(logits, [s.params], [s.num_tokens]) == [0]
    rows = penalty_rows([s], [s.num_tokens], [EOS])
    assert sample(logits, [s.params], [s.num_tokens], penalties=rows) == [1]


def test_penalties_read_nothing_back_and_do_the_same_work_for_one_row_and_for_thirty_two() -> None:
    def ops(n: int, device: str) -> list[str]:
        params = [
            SamplingParams(
                temperature=0.0 if i % 2 else 1.0,
                seed=i,
                presence_penalty=0.5,
                repetition_penalty=1.2,
                logit_bias=((1, 3.0),),
                min_tokens=4,
                min_p=0.1,
            )
            for i in range(n)
        ]
        seqs = [seq(p, [1, 2, 3], [4, 5]) for p in params]
        ends = [s.num_tokens for s in seqs]
        rows = sampling_rows(params, ends, never_drawn, penalty_rows(seqs, ends, [EOS]))
        assert rows.penalties is not None and rows.any_min_p
        t, pen = rows.to_tensors(device), rows.penalties.to_tensors(device)
        logits = random_logits(n, seed=n, vocab=64).to(device)
        with OpLog() as log:
            tokens = sample_tokens(logits, t, None, True, False, penalties=pen, any_min_p=True)
        assert tokens.shape == (n,)
        return log.ops

    one = ops(1, "cpu")
    assert not {"_local_scalar_dense", "item", "nonzero", "masked_select"} & set(one), one
    assert one == ops(32, "cpu")
    ops(32, "meta")  # no data: any read back, or any shape that follows values, fails


def reference(logits: torch.Tensor, s: Sequence, end: int) -> torch.Tensor:  # [vocab]
    """One row, each rule written out in vLLM's order, one token at a time."""
    p, row = s.params, logits.clone()
    out = s.output_token_ids[: end - s.num_prompt_tokens]
    if len(out) < p.min_tokens:
        for token in {*p.stop_token_ids, *([] if p.ignore_eos else [EOS])}:
            row[token] = -math.inf
    for token, bias in p.logit_bias:
        row[token] += bias
    for token in set(s.prompt_token_ids) | set(out):
        row[token] = (
            row[token] / p.repetition_penalty
            if row[token] > 0
            else row[token] * p.repetition_penalty
        )
    for token in set(out):
        row[token] -= p.frequency_penalty * out.count(token) + p.presence_penalty
    return row


tokens = st.lists(st.integers(0, VOCAB - 1), max_size=12)
row_params = st.builds(
    SamplingParams,
    presence_penalty=st.sampled_from([0.0, -2.0, 0.5, 2.0]),
    frequency_penalty=st.sampled_from([0.0, -1.0, 0.25, 2.0]),
    repetition_penalty=st.sampled_from([1.0, 0.01, 0.7, 1.3, 2.0]),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-100, 100), max_size=4).map(
        lambda d: tuple(d.items())
    ),
    min_tokens=st.integers(0, 6),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=2).map(tuple),
    ignore_eos=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(row_params, tokens.filter(bool), tokens), min_size=1, max_size=6))
def test_every_row_matches_the_rules_written_out(
    rows: list[tuple[SamplingParams, list[int], list[int]]],
) -> None:
    seqs = [seq(p, prompt, out) for p, prompt, out in rows]
    ends = [s.num_tokens for s in seqs]
    logits = random_logits(len(seqs), seed=len(seqs), vocab=VOCAB)
    rows_ = penalty_rows(seqs, ends, [EOS])
    got = logits if rows_ is None else apply_penalties(logits, rows_.to_tensors("cpu"))
    for i, (s, end) in enumerate(zip(seqs, ends, strict=True)):
        want = reference(logits[i], s, end)
        assert torch.allclose(got[i], want, atol=1e-4, rtol=1e-5), (i, s.params)
