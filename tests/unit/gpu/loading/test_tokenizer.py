"""`gpu.loading.tokenizer.Tokenizer.vocab_digest`: equal for the same vocabulary, whatever else
differs; different for any change of a token, an id or a special token."""

from __future__ import annotations

import subprocess
import sys

import tokenizers
from tokenizers import AddedToken

from gpu.loading.tokenizer import Tokenizer


def word_level(words: list[str], special: tuple[str, ...] | list[str] = ()) -> Tokenizer:
    inner = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0])
    )
    inner.add_special_tokens([AddedToken(s, special=True) for s in special])
    return Tokenizer(inner)


WORDS = ["<unk>", "a", "b", "c"]


def test_the_same_vocabulary_has_the_same_digest() -> None:
    one = word_level(WORDS, ["<eos>"])
    other = Tokenizer(one.inner, eos_token_ids=[4], chat_template="{{ x }}")  # not the vocab
    assert one.vocab_digest == word_level(WORDS, ["<eos>"]).vocab_digest == other.vocab_digest
    assert one.vocab_digest.startswith("sha256:") and len(one.vocab_digest) == 7 + 64


def test_a_token_an_id_or_a_special_token_changes_it() -> None:
    base = word_level(WORDS, ["<eos>"]).vocab_digest
    assert word_level([*WORDS[:3], "d"], ["<eos>"]).vocab_digest != base  # a token
    assert word_level([WORDS[0], "b", "a", "c"], ["<eos>"]).vocab_digest != base  # ids swapped
    assert word_level(WORDS, ["<end>"]).vocab_digest != base  # a special token
    assert word_level(WORDS).vocab_digest != base


def test_it_is_stable_across_processes() -> None:
    code = (
        "from tests.unit.gpu.loading.test_tokenizer import word_level, WORDS; "
        "print(word_level(WORDS, ['<eos>']).vocab_digest)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == word_level(WORDS, ["<eos>"]).vocab_digest
