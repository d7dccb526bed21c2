"""ops.quant.evaluate: perplexity, KL divergence and top-1 agreement on small tensors worked
out by hand; `score` and `compare` on a tiny checkpoint (windows and chunks change nothing)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gpu.loading.loader import LoadedModel, load_model
from ops.quant.evaluate import (
    Scores,
    compare,
    kl_divergence,
    kl_rows,
    perplexity,
    score,
    top1_agreement,
)


def _scores(probs: list[list[float]], targets: list[int], keep: bool = True) -> Scores:
    return Scores.of(torch.tensor(probs).log(), torch.tensor(targets), keep)


def test_scores_pick_the_targets_and_the_most_likely_tokens() -> None:
    s = _scores([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]], [2, 0])
    assert s.tokens == 2
    assert torch.allclose(s.target_logprobs, torch.tensor([0.3, 0.5]).log())
    assert s.top1.tolist() == [1, 0]
    assert _scores([[0.5, 0.5]], [0], keep=False).logprobs is None


def test_perplexity_is_the_exponentiated_mean_negative_log_likelihood() -> None:
    uniform = _scores([[0.25] * 4] * 3, [0, 1, 2])
    assert perplexity(uniform) == pytest.approx(4.0)
    s = _scores([[0.5, 0.5], [0.9, 0.1]], [0, 1])  # p(target) 0.5 and 0.1
    assert perplexity(s) == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.1)) / 2))
    certain = _scores([[1.0, 0.0]], [0])
    assert perplexity(certain) == pytest.approx(1.0)


def test_kl_divergence_is_the_mean_over_positions_of_kl_reference_to_other() -> None:
    reference = _scores([[0.5, 0.5], [0.25, 0.75]], [0, 1])
    other = _scores([[0.9, 0.1], [0.25, 0.75]], [0, 1])
    first = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # 0.5108 nats
    assert kl_divergence(reference, other) == pytest.approx(first / 2)  # the second row: 0
    assert kl_divergence(reference, reference) == pytest.approx(0.0, abs=1e-12)
    # KL(p || q) is not KL(q || p): the reference's distribution weights the sum
    backward = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert kl_divergence(other, reference) == pytest.approx(backward / 2)
    rows = kl_rows(reference.logprobs, other.logprobs)  # type: ignore[arg-type]
    assert rows.tolist() == pytest.approx([first, 0.0])


def test_top1_agreement_is_the_share_of_positions_with_the_same_argmax() -> None:
    a = _scores([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5], [0.1, 0.9]], [0, 0, 0, 0])
    b = _scores([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.2, 0.8]], [0, 0, 0, 0])
    assert top1_agreement(a, b) == pytest.approx(0.75)
    assert top1_agreement(a, a) == 1.0


def test_scores_of_different_texts_or_without_distributions_are_refused() -> None:
    a = _scores([[0.5, 0.5]], [0])
    with pytest.raises(ValueError, match="different texts"):
        top1_agreement(a, _scores([[0.5, 0.5]], [1]))
    with pytest.raises(ValueError, match="distributions"):
        kl_divergence(a, _scores([[0.5, 0.5]], [0], keep=False))


def test_cat_joins_rows_and_drops_distributions_unless_all_have_them() -> None:
    a, b = _scores([[0.5, 0.5]], [0]), _scores([[0.2, 0.8]], [1])
    both = Scores.cat([a, b])
    assert both.tokens == 2 and both.logprobs is not None and both.logprobs.shape == (2, 2)
    assert Scores.cat([a, _scores([[0.2, 0.8]], [1], keep=False)]).logprobs is None


# -- scoring through the engine's machinery, on a tiny random-weight checkpoint ----------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    from tests.tiny_models import build_tiny_checkpoint

    folder = build_tiny_checkpoint("llama", tmp_path_factory.mktemp("evaluate") / "llama")
    return load_model(Path(folder), device="cpu", dtype=torch.float32)


def _ids(model: LoadedModel, n: int) -> list[int]:
    text = "Paged attention keeps the KV cache in fixed-size blocks. 1234567890 + 42. " * 20
    ids = model.tokenizer.encode(text)
    assert len(ids) >= n
    return ids[:n]


def test_score_predicts_every_token_but_the_first_and_chunks_change_nothing(
    tiny: LoadedModel,
) -> None:
    ids = _ids(tiny, 100)
    whole = score(tiny, ids, chunk=100)
    assert whole.tokens == 99 and whole.targets.tolist() == ids[1:]
    assert whole.logprobs is not None and whole.logprobs.shape == (99, tiny.config.vocab_size)
    assert torch.allclose(whole.logprobs.exp().sum(-1), torch.ones(99), atol=1e-5)
    chunked = score(tiny, ids, chunk=7)  # prefill chunks continuing a context in the pool
    assert chunked.logprobs is not None
    torch.testing.assert_close(chunked.logprobs, whole.logprobs, atol=1e-4, rtol=1e-4)
    assert perplexity(chunked) == pytest.approx(perplexity(whole), rel=1e-5)


def test_score_cuts_a_long_text_into_windows_each_a_fresh_sequence(tiny: LoadedModel) -> None:
    ids = _ids(tiny, 100)
    windows = score(tiny, ids, context=40, chunk=16)  # 40 + 40 + 20 tokens: 39 + 39 + 19 rows
    assert windows.tokens == 97
    assert windows.targets.tolist() == ids[1:40] + ids[41:80] + ids[81:100]
    alone = score(tiny, ids[40:80])  # the second window, scored on its own
    assert alone.logprobs is not None and windows.logprobs is not None
    torch.testing.assert_close(windows.logprobs[39:78], alone.logprobs, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        score(tiny, ids[:1])


def test_compare_a_model_with_itself_agrees_everywhere(tiny: LoadedModel) -> None:
    ids = _ids(tiny, 60)
    c = compare(tiny, tiny, ids, chunk=16)
    assert c.tokens == 59
    assert c.ppl == pytest.approx(c.reference_ppl) == pytest.approx(perplexity(score(tiny, ids)))
    assert c.kl == pytest.approx(0.0, abs=1e-9) and c.top1_agreement == 1.0
    assert set(c.to_dict()) == {"tokens", "reference_ppl", "ppl", "kl", "top1_agreement"}
