"""Logprobs of sampled tokens: the log-softmax of the raw logits, gathered and top-k'd, read
back with the tokens in one read; nothing computed when no row asks."""

from __future__ import annotations

import pytest
import torch

from gpu.logprobs import CompletionLogprobs, TokenLogprob, raw_logprobs, read_sampled

VOCAB = 32


def random_logits(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * 4  # [rows, vocab]


def test_no_row_asking_computes_nothing() -> None:
    assert raw_logprobs(random_logits(3, 0), [None, None, None]) is None


def test_chosen_and_top_k_are_the_log_softmax_of_the_raw_logits() -> None:
    logits = random_logits(4, 1)
    tokens = torch.tensor([3, 0, 31, 7])
    raw = raw_logprobs(logits, [5, 2, 0, 5])
    assert raw is not None
    ids, out = read_sampled(tokens, raw)
    assert ids == [3, 0, 31, 7]
    reference = torch.log_softmax(logits.double(), dim=-1)
    for row, (token, entry) in enumerate(zip(ids, out, strict=True)):
        assert entry is not None
        assert entry.logprob == pytest.approx(reference[row, token].item(), abs=1e-5)
        values, top = reference[row].topk(5)
        k = [5, 2, 0, 5][row]
        assert list(entry.top_ids) == top[:k].tolist()
        assert list(entry.top_logprobs) == pytest.approx(values[:k].tolist(), abs=1e-5)


def test_rows_that_do_not_ask_get_none_beside_rows_that_do() -> None:
    logits = random_logits(3, 2)
    raw = raw_logprobs(logits, [None, 3, None])
    assert raw is not None
    ids, out = read_sampled(logits.argmax(dim=-1), raw)
    assert ids == logits.argmax(dim=-1).tolist()
    assert out[0] is None and out[2] is None
    assert out[1] is not None and len(out[1].top_ids) == 3
    assert out[1].top_ids[0] == ids[1]  # the argmax is the most likely token


def test_values_are_exact_float32_and_ids_exact_through_the_packed_read() -> None:
    logits = random_logits(2, 3)
    raw = raw_logprobs(logits, [20, 20])
    assert raw is not None
    _, out = read_sampled(torch.tensor([1, 2]), raw)
    for row, entry in enumerate(out):
        assert entry is not None
        assert list(entry.top_logprobs) == raw.top_values[row].tolist()  # values exact
        assert list(entry.top_ids) == raw.top_ids[row].tolist()


def test_k_is_capped_by_the_vocabulary() -> None:
    logits = random_logits(1, 4)[:, :8]
    raw = raw_logprobs(logits, [20])
    assert raw is not None
    _, out = read_sampled(torch.tensor([0]), raw)
    assert out[0] is not None and len(out[0].top_ids) == 8


def test_logprobs_do_not_depend_on_what_the_rest_of_the_batch_asks() -> None:
    logits = random_logits(4, 5)
    tokens = logits.argmax(dim=-1)
    alone = raw_logprobs(logits[1:2], [2])
    together = raw_logprobs(logits, [None, 2, 20, 0])
    assert alone is not None and together is not None
    assert read_sampled(tokens[1:2], alone)[1][0] == read_sampled(tokens, together)[1][1]


def test_completion_logprobs_carry_each_tokens_text() -> None:
    entries = [TokenLogprob(-0.5, (4, 9), (-0.5, -1.5)), TokenLogprob(-2.0, (4, 9), (-1.0, -2.0))]
    out = CompletionLogprobs.of([4, 9], entries, lambda token: f"<{token}>")
    assert out.tokens == ["<4>", "<9>"]
    assert out.token_logprobs == [-0.5, -2.0]
    assert out.top_ids == [[4, 9], [4, 9]]
    assert out.top_logprobs == [[-0.5, -1.5], [-1.0, -2.0]]
    assert out.top_tokens == [["<4>", "<9>"], ["<4>", "<9>"]]
