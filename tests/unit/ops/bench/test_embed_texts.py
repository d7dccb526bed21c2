"""The embed bench's texts: seeded, in the kinds' shares, of the kinds' lengths, from the prose."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ops.bench.embed_texts import KINDS, corpus_words, describe, make_texts


def test_the_same_seed_gives_the_same_texts_and_another_seed_others() -> None:
    assert make_texts(50, seed=3) == make_texts(50, seed=3)
    assert make_texts(50, seed=3) != make_texts(50, seed=4)


def test_a_thousand_texts_come_in_the_kinds_shares_and_lengths() -> None:
    texts = make_texts(1000)
    assert len(texts) == 1000
    counts = Counter(t.kind for t in texts)
    assert counts == {k.name: round(k.share * 1000) for k in KINDS}
    ranges = {k.name: (k.min_words, k.max_words) for k in KINDS}
    for text in texts:
        low, high = ranges[text.kind]
        assert low <= text.words <= high
    # Over 512 words is over 512 tokens: every word is at least one token.
    assert all(t.words > 512 for t in texts if t.kind == "document")
    assert [t.kind for t in texts[:20]] != sorted(t.kind for t in texts[:20])  # shuffled


def test_a_count_the_shares_do_not_divide_is_made_up_with_sentences() -> None:
    texts = make_texts(7)
    assert len(texts) == 7
    assert make_texts(1)[0].kind in {k.name for k in KINDS}


def test_texts_start_at_sentences_and_wrap_around_a_small_corpus(tmp_path: Path) -> None:
    prose = tmp_path / "prose.txt"
    prose.write_text("Alpha beta gamma. Delta epsilon zeta eta. Theta iota kappa!")
    words, starts = corpus_words([prose])
    assert words[0] == "Alpha" and starts == [0, 3, 7]
    texts = make_texts(20, seed=1, words=(words, starts))
    assert all(t.text.split()[0] in {"Alpha", "Delta", "Theta"} for t in texts)
    longest = max(texts, key=lambda t: t.words)
    assert longest.words > len(words)  # wrapped around the corpus


def test_describe_counts_words_and_tokens_by_kind() -> None:
    texts = make_texts(40)
    tokens = [t.words * 2 for t in texts]
    summary = describe(texts, tokens)
    assert summary["texts"] == 40 and summary["tokens"] == 2 * summary["words"]
    assert sum(k["texts"] for k in summary["kinds"].values()) == 40
    assert summary["over_512_tokens"] == sum(1 for n in tokens if n > 512)
    assert "tokens" not in describe(texts)
