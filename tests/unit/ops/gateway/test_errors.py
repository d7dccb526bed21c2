"""OpenAI's error shapes for what the gateway refuses."""

from __future__ import annotations

from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from ops.gateway.errors import ApiError, error_body, timed_out, too_many, unauthorized


def test_the_body_has_openai_s_four_fields() -> None:
    assert error_body(400, "bad", code="invalid_body", param="prompt") == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "invalid_body",
        }
    }


def test_types_follow_the_status() -> None:
    assert unauthorized().body()["error"]["type"] == "authentication_error"
    assert too_many(1).body()["error"]["type"] == "rate_limit_error"
    assert timed_out(2.0).body()["error"]["type"] == "server_error"


def test_a_refusal_of_the_mapper_keeps_its_code_and_param() -> None:
    refused = BatchLineRefused(ErrorCode.INVALID_SAMPLING_PARAMS, "too hot", param="temperature")
    error = ApiError.refused(refused)
    assert (error.status, error.code, error.param) == (
        400,
        "invalid_sampling_params",
        "temperature",
    )


def test_429_says_when_to_retry_and_401_how_to_authenticate() -> None:
    assert too_many(4).headers == {"Retry-After": "1"}
    assert unauthorized().headers == {"WWW-Authenticate": "Bearer"}
    assert unauthorized().code == "invalid_api_key"
