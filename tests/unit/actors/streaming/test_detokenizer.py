"""Incremental detokenization (actors.streaming.detokenizer) with SmolLM2's real byte-level BPE
tokenizer, whose tokens often end inside a UTF-8 character, and with a SentencePiece-like
decoder that reads its first token apart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from actors.streaming.detokenizer import REPLACEMENT, IncrementalText
from gpu.loading.gguf import read_gguf_header
from gpu.loading.tokenizer import Tokenizer

TEXTS = [
    "Héllo wörld — 日本語 🤖🎉 naïve café",
    "plain ascii, nothing to hold back",
    "🤖🤖🤖 emoji in a row, then 中文字符 and ünïcödé",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Tokenizer:
    return read_gguf_header(smollm2_path)[1]


def complete_prefix(text: str) -> str:
    return text.rstrip(REPLACEMENT)


@pytest.mark.parametrize("text", TEXTS)
def test_text_is_the_whole_decode_up_to_the_last_complete_character(
    tokenizer: Tokenizer, text: str
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids) or text.isascii()
    stream = IncrementalText(tokenizer.decode)
    seen = ""
    for n, token in enumerate(ids, start=1):
        stream.append(token)
        now = stream.text()
        assert now == complete_prefix(tokenizer.decode(ids[:n]))
        assert REPLACEMENT not in now
        assert now.startswith(seen)  # it only grows
        seen = now
    assert seen == text


def test_a_decoder_that_reads_the_first_token_apart_gets_context() -> None:
    # SentencePiece-like: each piece starts with a space, and the text's first one is dropped.
    pieces = [" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog"]

    def decode(ids: Sequence[int]) -> str:
        return "".join(pieces[i] for i in ids).removeprefix(" ")

    stream = IncrementalText(decode)
    for n in range(len(pieces)):
        stream.append(n)
        assert stream.text() == decode(range(n + 1))
    assert stream.text() == "The quick brown fox jumps over the lazy dog"


def test_a_context_that_reads_differently_once_followed_falls_back_to_the_whole_decode() -> None:
    # A decoder that merges "a" + "b" into "c": decoding a window apart would disagree.
    def decode(ids: Sequence[int]) -> str:
        return "".join("ab"[i] for i in ids).replace("ab", "c")

    stream = IncrementalText(decode)
    for token in [0, 0, 0, 0, 0, 1]:
        stream.append(token)
        stream.text()
    assert stream.text() == "aaaac"
