"""Every error the gateway answers with, and OpenAI's shape for it.

    raise ApiError(429, "too many requests in flight", code="rate_limit_exceeded",
                   headers={"Retry-After": "1"})

is answered `429 {"error": {"message", "type", "param", "code"}}` (`error_body`), the shape the
`openai` SDKs turn into their typed exceptions (`RateLimitError`, `AuthenticationError`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from messages.errors import BatchLineRefused
from ops.errors import OpsError


class GatewayStartError(OpsError):
    """The gateway cannot start as configured (keys missing beyond loopback, no broker)."""


class ApiError(Exception):
    """An HTTP error answer: `status`, OpenAI's error object fields, extra `headers`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    @classmethod
    def refused(cls, refused: BatchLineRefused) -> ApiError:
        """What the mapper or the door's `check_request` refused: 400 with its code."""
        return cls(400, refused.message, code=str(refused.code), param=refused.param)

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, code=self.code, param=self.param)


def error_type(status: int) -> str:
    """OpenAI's `type` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "missing or invalid API key: send `Authorization: Bearer KEY`",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def not_found(kind: str, name: str) -> ApiError:
    return ApiError(404, f"no {kind} {name!r}", code="not_found")


def too_many(max_inflight: int) -> ApiError:
    return ApiError(
        429,
        f"{max_inflight} requests are in flight, the most this gateway takes; retry later",
        code="rate_limit_exceeded",
        headers={"Retry-After": "1"},
    )


def too_large(max_body_bytes: int) -> ApiError:
    return ApiError(
        413, f"the request body is over {max_body_bytes} bytes", code="request_too_large"
    )


def timed_out(seconds: float) -> ApiError:
    return ApiError(
        504, f"no result within {seconds:g} s; the request was cancelled", code="timeout"
    )


def broker_unavailable(detail: str) -> ApiError:
    return ApiError(503, f"the Kafka broker cannot be reached ({detail})", code="unavailable")


def no_worker(model: str | None, retry_after_s: int = 5) -> ApiError:
    """No live worker serves `model` (None: no live worker at all): answered at once."""
    what = f"model {model!r}" if model is not None else "any model"
    return ApiError(
        503,
        f"no live worker serves {what} now; retry later",
        code="no_worker",
        param="model" if model is not None else None,
        headers={"Retry-After": str(retry_after_s)},
    )


def wrong_task(model: str | None, url: str, embeds: bool) -> ApiError:
    """`model` (None: every model served) does not do what `url` asks: it is an embedding
    model asked to generate (`embeds`), or a generative one asked for embeddings."""
    what = f"model {model!r} is" if model is not None else "the models served are"
    if embeds:
        message = f"{what} for embeddings: it does not generate text; send {url} to a "
        message += "generative model, or ask for embeddings at /v1/embeddings"
    else:
        message = f"{what} for generation: it does not embed; send /v1/embeddings to an "
        message += "embedding model (`GET /v1/models` shows each model's task)"
    return ApiError(400, message, code="unsupported_task", param="model")


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"the model {model!r} is not served by this gateway's fleet",
        code="model_not_found",
        param="model",
    )


def tokenizer_unavailable(model: str, why: str) -> ApiError:
    return ApiError(
        503,
        f"the tokenizer of model {model!r} is not available on the gateway's host ({why})",
        code="tokenizer_unavailable",
        param="model",
    )
