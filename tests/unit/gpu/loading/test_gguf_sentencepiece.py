"""gpu.loading.gguf_sentencepiece: Gemma 3 270M's tokenizer, rebuilt from the real GGUF, against
transformers' tokenizer for the same file (`AutoTokenizer.from_pretrained(folder, gguf_file=...)`).

The tiny synthetic vocabulary is tested in test_gguf_gemma3.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu.loading.gguf import read_gguf_header
from gpu.loading.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "   three leading spaces, two  inner,   and three   ",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nafter a blank line\r\nwindows",
    "\n\n\n",
    "Ünïcödé: naïve café, Straße, ØÆÅ, ñ",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Ελληνικά και Русский текст, עברית, العربية",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "math ∑ ∫ √ ≠ ≤ ∞ and arrows → ⇒ ←",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "<html><body><div class='x'>text</div></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "digits 0 12 345 6789 3.14159 -42 1e10 1,000,000 2026-12-01",
    "phone +1 (555) 123-4567, id #A1B2C3",
    "ALL CAPS and MiXeD cAsE and snake_case and camelCase",
    "can't won't it's I'd you're",
    "\u200bzero\u200bwidth and \u00a0non-breaking",
    "control <start_of_turn> and <end_of_turn> inline, <bos> too",
    "<start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n",
    "a" * 300,
    "",
]


@pytest.fixture(scope="module")
def ours(gemma3_path: Path) -> Tokenizer:
    return read_gguf_header(gemma3_path)[1]


@pytest.fixture(scope="module")
def theirs(gemma3_path: Path) -> Iterator[Any]:
    from transformers import AutoTokenizer

    yield AutoTokenizer.from_pretrained(str(gemma3_path.parent), gguf_file=gemma3_path.name)


@pytest.mark.slow
def test_same_vocabulary_and_specials(ours: Tokenizer, theirs: Any) -> None:
    assert ours.vocab_size == len(theirs) == 262_144
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token)
    assert ours.inner.get_vocab(with_added_tokens=True) == theirs.get_vocab()
    assert ours.inner.get_added_tokens_decoder().keys() == theirs.added_tokens_decoder.keys()


@pytest.mark.slow
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encodes_like_transformers(ours: Tokenizer, theirs: Any, add_special_tokens: bool) -> None:
    for text in TEXTS:
        want = theirs(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert ours.encode(text, add_special_tokens=add_special_tokens) == want, repr(text)
    batch = ours.encode_batch(TEXTS, add_special_tokens=add_special_tokens)
    assert batch == theirs(TEXTS, add_special_tokens=add_special_tokens)["input_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decodes_like_transformers(ours: Tokenizer, theirs: Any, skip_special_tokens: bool) -> None:
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        want = theirs.decode(ids, skip_special_tokens=skip_special_tokens)
        assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == want, repr(text)
        if skip_special_tokens and "<" not in text:
            assert want == text  # SentencePiece with byte fallback: lossless


@pytest.mark.slow
def test_chat_template_as_transformers(ours: Tokenizer, theirs: Any) -> None:
    # This file carries no `tokenizer.chat_template`; neither side invents one.
    assert theirs.chat_template is None
    assert ours.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        ours.apply_chat_template([{"role": "user", "content": "Hi"}])
