"""gpu.encoder.inputs: task prompts and truncation as sentence-transformers' tokenizer does them
(the `tokenizers` library's own truncation is the reference)."""

from __future__ import annotations

import pytest

from gpu.encoder.inputs import embed_tokens, fit, prompt_text, special_counts
from gpu.encoder.spec import EmbeddingSpec
from gpu.errors import RequestRejected, UnknownPromptName
from gpu.loading.tokenizer import Tokenizer
from messages.error_codes import ErrorCode
from tests.unit.gpu.encoder.st_folders import gemma_tokenizer

SPEC = EmbeddingSpec(
    dimensions=48, max_tokens=40, prompts={"query": "task: search | query: ", "none": ""}
)
TEXT = "The quick brown fox jumps over the lazy dog. Kafka topics carry generation jobs."


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(gemma_tokenizer())


def test_the_prompt_goes_before_the_text_with_special_tokens(tokenizer: Tokenizer) -> None:
    tokens = embed_tokens(tokenizer, SPEC, TEXT, "query")
    assert tokens == tokenizer.encode("task: search | query: " + TEXT)
    assert tokens[0] == 2 and tokens[-1] == 1  # <bos> … <eos>
    assert embed_tokens(tokenizer, SPEC, TEXT, None) == tokenizer.encode(TEXT)
    assert embed_tokens(tokenizer, SPEC, TEXT, "none") == tokenizer.encode(TEXT)


def test_the_default_prompt_applies_when_none_is_named() -> None:
    spec = EmbeddingSpec(48, 40, prompts={"query": "q: ", "doc": "d: "}, default_prompt_name="doc")
    assert prompt_text(spec, None) == "d: "
    assert prompt_text(spec, "query") == "q: "


def test_an_unknown_prompt_name_is_a_typed_key_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(UnknownPromptName) as caught:
        embed_tokens(tokenizer, SPEC, TEXT, "passage")
    error = caught.value
    assert isinstance(error, KeyError) and isinstance(error, RequestRejected)
    assert error.code == ErrorCode.UNKNOWN_PROMPT_NAME
    assert (
        str(error) == "prompt_name 'passage' is not one of the model's task prompts (none, query)"
    )


def test_special_counts(tokenizer: Tokenizer) -> None:
    assert special_counts(tokenizer) == (1, 1)


@pytest.mark.parametrize("limit", [3, 10, 17])
@pytest.mark.parametrize(("truncate", "side"), [("end", "right"), ("start", "left")])
def test_fit_cuts_as_the_tokenizer_truncates(
    tokenizer: Tokenizer, limit: int, truncate: str, side: str
) -> None:
    full = tokenizer.encode(TEXT)
    assert len(full) > 17
    reference = gemma_tokenizer()
    reference.enable_truncation(max_length=limit, direction=side)
    expected = reference.encode(TEXT).ids
    assert fit(full, limit, truncate) == (expected, True)
    assert len(expected) == limit and expected[0] == 2 and expected[-1] == 1


def test_fit_leaves_short_inputs_and_none_alone() -> None:
    tokens = [2, 5, 6, 7, 1]
    assert fit(tokens, 5, "end") == (tokens, False)
    assert fit(tokens, 3, "none") == (tokens, False)  # the caller refuses it
    assert fit(tokens, 3, "end", specials=(0, 0)) == ([2, 5, 6], True)  # token ids as given
    assert fit(tokens, 3, "start", specials=(0, 0)) == ([6, 7, 1], True)
    with pytest.raises(ValueError, match="truncate"):
        fit(tokens, 3, "middle")
