"""ModelFront for an embedding model: tokenizing an `EmbedRequest` (task prompts, token ids,
truncation) and the model's rules; each task refused by the other's model."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from actors.ingest.model_front import EmbedInputs, ModelFront, result_size_refusal
from gpu.encoder import inputs as encoder_inputs
from messages.embedding import EmbedRequest
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.request import GenerateRequest
from tests.unit.actors.fake_encoder import SPEC, VOCAB, CharTokenizer, FakeEncoder


@pytest.fixture
def front() -> ModelFront:
    return ModelFront.of_engine(FakeEncoder())


def embed(**fields: Any) -> EmbedRequest:
    fields.setdefault("id", "e1")
    fields.setdefault("input", "hello")
    return EmbedRequest(**fields)


def refused(front: ModelFront, request: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        front.tokenize(request)
    assert info.value.message
    return info.value


def text_tokens(text: str, prompt_name: str | None = None) -> list[int]:
    return encoder_inputs.embed_tokens(CharTokenizer(), SPEC, text, prompt_name)


def test_the_front_of_an_encoder_engine_says_it_embeds(front: ModelFront) -> None:
    assert front.embedding == SPEC
    assert front.ref.task == "embed"
    assert (front.max_model_len, front.max_prompt_tokens, front.max_new_tokens) == (16, 16, 0)
    assert front.vocab_size == VOCAB
    assert result_size_refusal(front, 1024) is None, "its results grow with the request"


def test_texts_are_tokenized_each_with_the_models_special_tokens(front: ModelFront) -> None:
    tokens = front.tokenize(embed(input=["ab", "cde"]))
    assert tokens == EmbedInputs((text_tokens("ab"), text_tokens("cde")), truncated=0)
    assert isinstance(tokens, EmbedInputs)
    assert tokens.tokens == [*text_tokens("ab"), *text_tokens("cde")]


def test_a_prompt_name_puts_its_task_prompt_before_each_text(front: ModelFront) -> None:
    tokens = front.tokenize(embed(input=["ab"], prompt_name="query"))
    assert isinstance(tokens, EmbedInputs)
    assert tokens.inputs == (text_tokens("ab", "query"),)
    assert tokens.inputs != (text_tokens("ab"),)


def test_the_models_default_prompt_applies_when_the_request_names_none() -> None:
    engine = FakeEncoder(replace(SPEC, default_prompt_name="document"))
    tokens = ModelFront.of_engine(engine).tokenize(embed(input="ab"))
    assert isinstance(tokens, EmbedInputs)
    assert tokens.inputs == (text_tokens("ab", "document"),)


def test_token_ids_run_as_given(front: ModelFront) -> None:
    tokens = front.tokenize(embed(input=[[7, 8, 9], [10]], prompt_name="query"))
    assert isinstance(tokens, EmbedInputs)
    assert tokens.inputs == ([7, 8, 9], [10])
    one = front.tokenize(embed(input=[7, 8, 9]))
    assert isinstance(one, EmbedInputs) and one.inputs == ([7, 8, 9],)


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"dimensions": 9}, ErrorCode.INVALID_DIMENSIONS, "[1, 8]"),
        ({"prompt_name": "poem"}, ErrorCode.UNKNOWN_PROMPT_NAME, "document, query"),
        ({"input": [[5, VOCAB]]}, ErrorCode.TOKEN_OUT_OF_VOCABULARY, "input 0"),
        ({"input": ["ok", "x" * 15]}, ErrorCode.PROMPT_TOO_LONG, "input 1 is 17 tokens"),
        ({"input": [list(range(3, 20))]}, ErrorCode.PROMPT_TOO_LONG, "at most 16"),
        ({"model": "other-model"}, ErrorCode.UNKNOWN_MODEL, "fake-embed"),
    ],
)
def test_the_models_rules(
    front: ModelFront, fields: dict[str, Any], code: ErrorCode, words: str
) -> None:
    error = refused(front, embed(**fields))
    assert error.code is code
    assert words in error.message


def test_dimensions_up_to_the_models_width_are_taken(front: ModelFront) -> None:
    for dimensions in (1, 4, 8):
        front.tokenize(embed(dimensions=dimensions))


def test_truncate_end_keeps_a_texts_first_tokens_and_counts_it(front: ModelFront) -> None:
    long = "abcdefghijklmnopqrstuvwxyz"
    tokens = front.tokenize(embed(input=["short", long], truncate="end"))
    assert isinstance(tokens, EmbedInputs)
    assert tokens.truncated == 1
    cut, was_cut = encoder_inputs.fit(text_tokens(long), SPEC.max_tokens, "end")
    assert was_cut and tokens.inputs == (text_tokens("short"), list(cut))
    assert len(tokens.inputs[1]) == SPEC.max_tokens


def test_truncate_cuts_token_ids_plainly(front: ModelFront) -> None:
    ids = list(range(3, 23))  # 20 tokens
    end = front.tokenize(embed(input=[ids], truncate="end"))
    start = front.tokenize(embed(input=[ids], truncate="start"))
    assert isinstance(end, EmbedInputs) and isinstance(start, EmbedInputs)
    assert end.inputs == (ids[:16],) and start.inputs == (ids[-16:],)
    assert end.truncated == start.truncated == 1


def test_a_generation_request_to_an_embedding_model_is_unsupported(front: ModelFront) -> None:
    error = refused(front, GenerateRequest(id="g", prompt="hi"))
    assert error.code is ErrorCode.UNSUPPORTED_TASK
    assert "embedding model" in error.message


def test_an_embedding_request_to_a_generative_model_is_unsupported() -> None:
    front = ModelFront(
        name="gen", digest="d", aliases=frozenset({"gen"}), tokenizer=CharTokenizer(),
        vocab_size=VOCAB, max_model_len=64, max_prompt_tokens=64, max_new_tokens=16,
    )  # fmt: skip
    assert front.ref.task == ""
    error = refused(front, embed())
    assert error.code is ErrorCode.UNSUPPORTED_TASK
    assert "generative model" in error.message
    assert front.tokenize(GenerateRequest(id="g", prompt_token_ids=[5, 6])) == [5, 6]
