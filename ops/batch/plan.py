"""`BatchPlan`: the decisions of one batch run, with no I/O: per input line, per result, per
request that could not be sent. `ops/batch/runner.py` performs them (Kafka, the output file).

    plan = BatchPlan(options, answered, progress)
    plan.plan(7, raw_line)        -> InFlight to send | BatchOutputLine (error line) | None (skip)
    plan.track(in_flight)         after taking a window slot, before sending
    plan.settle(result)           -> BatchOutputLine | InFlight to send again | None (not ours)
    plan.unsendable(id, reason)   -> BatchOutputLine for a request Kafka would not take
    plan.abandoned(id)            -> BatchOutputLine (cancelled) for one its cancel left unanswered

The window (`max_inflight` slots) bounds what is in flight: `track` follows taking a slot;
`settle` and `unsendable` give it back, except when a request is sent again in its place.

A `/v1/embeddings` line becomes an `EmbedRequest` (`messages.openai_embeddings`) and its
`EmbedResult` an embeddings answer; nothing of a settled result is kept (its vectors go to the
output line and are gone), so memory stays bounded by the window whatever the file's length.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace

from msgspec import structs

from messages.embedding import EmbedRequest, EmbedResult
from messages.error_codes import ErrorCode
from messages.errors import BatchLineRefused
from messages.openai_batch import EMBEDDINGS_URL, BatchInputLine, BatchOutputLine
from messages.openai_batch_answers import answer_line, refusal_line
from messages.openai_batch_mapping import LineCode, calls_tool, parse_line, to_request
from messages.openai_embeddings import to_embed_request
from messages.request import GenerateRequest
from messages.result import ErrorInfo, FinishReason, GenerateResult
from ops.batch.ids import Fingerprints
from ops.batch.output import Answered
from ops.batch.progress import Progress
from ops.batch.summary import BatchSummary

# A worker that drains or fails a step answers what it holds with these; the line deserves
# another worker's (or another step's) answer, not a final error. Sent at most this often.
RETRIED_CODES = frozenset({ErrorCode.SHUTTING_DOWN, ErrorCode.ENGINE_ERROR})
MAX_ATTEMPTS = 3
CANCELLED = ErrorCode.CANCELLED  # how an embedding result says it was cancelled


@dataclass(frozen=True)
class InFlight:
    """A request sent (or about to be) and what its answer is for."""

    request: GenerateRequest | EmbedRequest
    custom_id: str
    url: str
    line: int
    attempt: int = 1
    tool_call: bool = False  # answered as `tool_calls` (`calls_tool`)


class BatchPlan:
    def __init__(
        self,
        *,
        answered: Answered,
        progress: Progress,
        summary: BatchSummary,
        max_inflight: int,
        results_topic: str,
        model: str | None = None,
        default_max_tokens: int | None = None,
        openai_defaults: bool = False,
    ) -> None:
        self.answered = answered
        self.progress = progress
        self.summary = summary
        self.results_topic = results_topic
        self.model = model
        self.default_max_tokens = default_max_tokens
        self.openai_defaults = openai_defaults  # omitted fields as OpenAI reads them
        self.seen = Fingerprints()  # custom_ids read so far, to refuse duplicates
        self.pending: dict[str, InFlight] = {}  # request id → what it answers
        self.window = asyncio.Semaphore(max_inflight)
        self.tag = uuid.uuid4().hex[:8]  # request ids differ between runs of the same file
        self.cancelling = False  # `batch cancel`: nothing more is sent, nor sent again

    def plan(self, number: int, raw: bytes) -> InFlight | BatchOutputLine | None:
        """What to do with input line `number`: a request to send, an error line, or skip."""
        refused: BatchLineRefused | None = None
        try:
            line = parse_line(raw)
            custom_id: str | None = line.custom_id
        except BatchLineRefused as exc:
            refused, custom_id = exc, exc.custom_id
        if custom_id is not None and not self.seen.add(custom_id):
            refused = BatchLineRefused(
                LineCode.DUPLICATE_CUSTOM_ID,
                f"custom_id {custom_id!r} appears on an earlier line",
                param="custom_id",
            )
            custom_id = None
        if self.answered.answers(custom_id, number):
            self.summary.already += 1
            return None
        if refused is None:
            try:
                request = self._request(line, f"batch-{self.tag}-{number}")
            except BatchLineRefused as exc:
                refused = exc
            else:
                request.reply_to = self.results_topic  # whatever the worker's default
                return InFlight(
                    request, line.custom_id, line.url, number, tool_call=calls_tool(line)
                )
        return self._refusal(refused, number)

    def _request(self, line: BatchInputLine, request_id: str) -> GenerateRequest | EmbedRequest:
        if line.url == EMBEDDINGS_URL:
            return to_embed_request(line, request_id, model=self.model)
        return to_request(
            line,
            request_id,
            model=self.model,
            default_max_tokens=self.default_max_tokens,
            openai_defaults=self.openai_defaults,
        )

    def track(self, sending: InFlight) -> None:
        self.pending[sending.request.id] = sending
        self.summary.sent += 1

    def settle(self, result: GenerateResult | EmbedResult) -> BatchOutputLine | InFlight | None:
        """The output line for `result` if it answers one of ours still in flight, or the
        request to send again in its place when the worker could not run it."""
        done = self.pending.pop(result.id, None)
        if done is None:
            return None  # someone else's, or a second answer to the same request
        retry = result.error is not None and self._retries(done, result.error.code)
        if retry and not self.cancelling:
            again = replace(
                done,
                request=structs.replace(done.request, id=f"{done.request.id}-r{done.attempt}"),
                attempt=done.attempt + 1,
            )
            self.summary.retried += 1
            return again  # the caller tracks and sends it, in the same window slot
        self.window.release()
        summary = self.summary
        if result.error is None:
            summary.ok += 1
        else:
            summary.refused += 1
            summary.errors_by_code[str(result.error.code)] += 1
        completion_tokens = 0
        if isinstance(result, GenerateResult):
            summary.cancelled += result.finish_reason is FinishReason.CANCELLED
            completion_tokens = result.usage.completion_tokens
        else:  # an embedding's cancel is its error (it has no finish reason)
            summary.cancelled += result.error is not None and result.error.code == CANCELLED
            summary.embeddings += len(result.data)
        summary.prompt_tokens += result.usage.prompt_tokens
        summary.completion_tokens += completion_tokens
        self.progress.answered(result.error is None, completion_tokens)
        return answer_line(done.custom_id, done.url, result, tool_call=done.tool_call)

    def _retries(self, done: InFlight, code: ErrorCode) -> bool:
        return code in RETRIED_CODES and done.attempt < MAX_ATTEMPTS

    def abandoned(self, request_id: str) -> BatchOutputLine:
        """The line for a request still unanswered well after its cancel (it never reached a
        worker, or its worker is gone): cancelled, with no tokens (an embedding request: the
        error `cancelled`, as a worker answers one it cancels). A late result is ignored."""
        cancelled: GenerateResult | EmbedResult
        done = self.pending.get(request_id)
        if done is not None and isinstance(done.request, EmbedRequest):
            why = ErrorInfo(code=CANCELLED, message="cancelled before a worker answered it")
            cancelled = EmbedResult(id=request_id, error=why)
        else:
            cancelled = GenerateResult(id=request_id, finish_reason=FinishReason.CANCELLED)
        line = self.settle(cancelled)
        if not isinstance(line, BatchOutputLine):
            raise KeyError(f"{request_id} is not in flight")
        return line

    def unsendable(self, request_id: str, reason: BaseException) -> BatchOutputLine:
        """The error line for a request Kafka refused to take (larger than it allows)."""
        done = self.pending.pop(request_id)
        self.window.release()
        refused = BatchLineRefused(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"the request is larger than Kafka takes ({reason})",
            custom_id=done.custom_id,
        )
        return self._refusal(refused, done.line)

    def _refusal(self, refused: BatchLineRefused, number: int) -> BatchOutputLine:
        self.summary.line_errors += 1
        self.summary.errors_by_code[str(refused.code)] += 1
        self.progress.answered(False, 0)
        return refusal_line(refused, line_number=number)
