"""`tokenmill batch show`'s cells for one output line: text, finish reason, token counts."""

from __future__ import annotations

from typing import Any

from ops.batch.table import answer_text


def line(usage: dict[str, Any]) -> dict[str, Any]:
    body = {"choices": [{"message": {"content": " Paris. "}, "finish_reason": "stop"}]}
    return {"custom_id": "a", "response": {"status_code": 200, "body": body | {"usage": usage}}}


def test_a_chat_answer_shows_its_text_finish_and_tokens() -> None:
    usage = {"prompt_tokens": 40, "completion_tokens": 3}
    assert answer_text(line(usage)) == ("Paris.", "stop", "40+3")


def test_prompt_tokens_served_from_the_prefix_cache_are_shown() -> None:
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    assert answer_text(line(usage))[2] == "40+3 (32 cached)"


def test_an_error_line_shows_its_code() -> None:
    error = {"code": "invalid_request", "message": "no", "line": 3}
    text, finish, tokens = answer_text({"custom_id": "x", "error": error})
    assert "invalid_request" in text and (finish, tokens) == ("", "")


def test_an_embeddings_answer_shows_its_vectors_and_tokens() -> None:
    data = [
        {"object": "embedding", "index": i, "embedding": [0.5, -0.25, 0.125, 1.0]} for i in (0, 1)
    ]
    body = {"object": "list", "data": data, "model": "e", "usage": {"prompt_tokens": 9}}
    out = {"custom_id": "d", "response": {"status_code": 200, "body": body}}
    assert answer_text(out) == ("2 vectors × 4: [0.5000, -0.2500, 0.1250, …]", "", "9")
    body["data"] = [{"object": "embedding", "index": 0, "embedding": "AAAAPw=="}]
    assert answer_text(out)[0] == "1 vector (base64)"
