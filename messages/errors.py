"""Every exception `messages/` raises on purpose."""

from __future__ import annotations

from messages.error_codes import ErrorCode


class MessageError(Exception):
    """Base class of everything `messages/` raises on purpose."""


class UnsupportedContentType(MessageError):
    """A `content-type` header names an encoding tokenmill does not read."""


class UndecodableRequest(MessageError):
    """A record cannot be read as a `GenerateRequest`.

    Carries what could still be salvaged so the error result reaches the client: the `id` and
    `reply_to` found in the bytes, if any.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        request_id: str = "",
        reply_to: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.reply_to = reply_to


class InvalidRequest(MessageError):
    """A well-formed request that cannot run as asked; `code` says which rule it broke."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BatchLineRefused(MessageError):
    """An OpenAI Batch input line that cannot become a request.

    `code` is a `messages.openai_batch_mapping.LineCode` or, for a body that breaks a request
    rule, an `ErrorCode`; `param` names the offending body field when known (OpenAI's `param`).
    """

    def __init__(
        self, code: str, message: str, *, param: str | None = None, custom_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.custom_id = custom_id  # when the line had a usable one
