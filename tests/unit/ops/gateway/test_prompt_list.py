"""A list of prompts split into one body each, and their answers merged as OpenAI indexes them."""

from __future__ import annotations

import pytest

from ops.gateway.errors import ApiError
from ops.gateway.prompt_list import MAX_PROMPTS, merge_answers, split_prompts


def test_one_prompt_in_any_form_is_not_split() -> None:
    for prompt in ("a text", ["one text"], [1, 2, 3]):
        assert split_prompts({"prompt": prompt, "max_tokens": 3}) is None


def test_several_texts_or_token_lists_become_one_body_each() -> None:
    bodies = split_prompts({"prompt": ["a", "b"], "max_tokens": 3, "n": 2})
    assert bodies == [
        {"prompt": "a", "max_tokens": 3, "n": 2},
        {"prompt": "b", "max_tokens": 3, "n": 2},
    ]
    assert split_prompts({"prompt": [[1, 2]]}) == [{"prompt": [1, 2]}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ["a", [1, 2]]}, "prompt"),
        ({"prompt": ["p"] * (MAX_PROMPTS + 1)}, "prompt"),
        ({"prompt": ["a", "b"], "stream": True}, "stream"),
    ],
)
def test_what_cannot_be_split_is_a_400_naming_its_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        split_prompts(body)
    assert (caught.value.status, caught.value.param) == (400, param)


def answer(texts: list[str], prompt_tokens: int) -> tuple[int, dict]:
    choices = [{"index": j, "text": t, "finish_reason": "stop"} for j, t in enumerate(texts)]
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(texts),
        "total_tokens": prompt_tokens + len(texts),
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    return 200, {"id": "cmpl-1", "object": "text_completion", "choices": choices, "usage": usage}


def test_choices_are_indexed_prompt_by_prompt_and_usage_summed() -> None:
    status, body = merge_answers([answer(["a0", "a1"], 4), answer(["b0", "b1"], 6)], n=2)
    assert status == 200
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "a0"), (1, "a1"), (2, "b0"), (3, "b1"),
    ]  # fmt: skip
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_the_first_refusal_answers_for_all() -> None:
    refused = (400, {"error": {"code": "prompt_too_long"}})
    assert merge_answers([answer(["a"], 1), refused, (404, {})], n=1) == refused
