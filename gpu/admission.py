"""The engine's door: `check_admission`, the rules a request must keep before it is added.

Shared by every engine: the real one (`gpu.engine.Engine.validate`) and the worker's echo
engine (`ops.worker.echo_engine`).
"""

from __future__ import annotations

from collections.abc import Container

from gpu.engine_config import EngineConfig
from gpu.engine_io import EngineRequest
from gpu.errors import RequestRejected
from messages.admission import (
    check_choices,
    check_lengths,
    check_logprobs,
    check_sampling,
    check_vocabulary,
    prompt_limit,
)
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.limits import MAX_PRIORITY, MIN_PRIORITY


def check_admission(
    request: EngineRequest,
    config: EngineConfig,
    max_model_len: int,
    vocab: int,
    running: Container[str],
) -> None:
    """The engine's admission: raise `RequestRejected` for the first rule `request` breaks.

    The rules are `messages.admission`'s (lengths, sampling, vocabulary), plus the engine's
    own: an id already running is a `DUPLICATE_REQUEST`. Shared by every engine (the real one
    and the benchmark's echo engine).
    """
    if request.request_id in running:
        raise RequestRejected(
            ErrorCode.DUPLICATE_REQUEST, f"request {request.request_id!r} is already running"
        )
    try:
        check_lengths(
            len(request.prompt_token_ids),
            request.params.max_new_tokens,
            max_prompt_tokens=prompt_limit(config.max_prompt_tokens, max_model_len),
            max_new_tokens_limit=config.max_new_tokens,
            max_model_len=max_model_len,
            scoring=request.params.prompt_logprobs is not None,
        )
        check_sampling(request.params, vocab_size=vocab)
        check_logprobs(request.params.logprobs)
        check_logprobs(request.params.prompt_logprobs, "prompt_logprobs")
        check_choices(request.params.n)
        check_vocabulary(request.prompt_token_ids, vocab, "prompt_token_ids")
        if not MIN_PRIORITY <= request.priority <= MAX_PRIORITY:  # the scheduler's aging sums it
            raise InvalidRequest(
                ErrorCode.INVALID_REQUEST,
                f"priority must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {request.priority}",
            )
    except InvalidRequest as exc:
        raise RequestRejected(exc.code, exc.message) from None
