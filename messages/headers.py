"""Kafka header names tokenmill reads and writes, and helpers over aiokafka's header lists.

Headers travel as a sequence of `(str, bytes)` pairs; the first occurrence of a name wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

TRACEPARENT = "traceparent"  # W3C trace context
TRACESTATE = "tracestate"
CONTENT_TYPE = "content-type"
SCHEMA = "tokenmill-schema"  # message type and version, e.g. "GenerateResult/1"
RESULT_SCHEMA = "GenerateResult/1"  # a final result
CHUNK_SCHEMA = "GenerateChunk/1"  # a streamed request's partial result (messages.chunk)
GENERATE_REQUEST_SCHEMA = "GenerateRequest/1"  # optional on a generation request
EMBED_REQUEST_SCHEMA = "EmbedRequest/1"  # an embedding request (messages.embedding)
EMBED_RESULT_SCHEMA = "EmbedResult/1"  # its result

# On dead-lettered records: why, and where the original was read.
DLQ_ERROR_CODE = "tokenmill-error-code"
DLQ_ERROR_MESSAGE = "tokenmill-error-message"
DLQ_SOURCE_TOPIC = "tokenmill-source-topic"
DLQ_SOURCE_PARTITION = "tokenmill-source-partition"
DLQ_SOURCE_OFFSET = "tokenmill-source-offset"
DLQ_TRUNCATED_FROM = "tokenmill-truncated-from"  # original value size, when cut short
DLQ_HEADERS_DROPPED = "tokenmill-headers-dropped"  # how many original headers (too large)
DLQ_KEY_DROPPED = "tokenmill-key-dropped"  # original key size (over the key limit)
DLQ_CRASHES = "tokenmill-crashes"  # on a quarantined record: workers that died with it

# On a request's retries (`<requests topic>.retry.<N>`), its dead letter after the last attempt
# and its result (`messages.attempts`): Spring Kafka's retry-topic convention, in tokenmill's
# names. The attempt this record is (1: the original), as decimal text.
ATTEMPT = "tokenmill-attempt"
# JSON: a list of the failed attempts before this record (worker, code, message, time each).
ATTEMPT_HISTORY = "tokenmill-attempt-history"
# Epoch milliseconds before which a retry is not run (its backoff), as decimal text.
NOT_BEFORE = "tokenmill-not-before"

# Also on dead letters: Kafka Connect's error context, under the names its DeadLetterQueueReporter
# writes with `errors.deadletterqueue.context.headers.enable=true`, so that tools made for
# Connect's DLQs read tokenmill's too. UTF-8 text; partition and offset in decimal.
CONNECT_TOPIC = "__connect.errors.topic"
CONNECT_PARTITION = "__connect.errors.partition"
CONNECT_OFFSET = "__connect.errors.offset"
CONNECT_CONNECTOR_NAME = "__connect.errors.connector.name"  # always CONNECT_CONNECTOR
CONNECT_TASK_ID = "__connect.errors.task.id"  # the worker id
CONNECT_STAGE = "__connect.errors.stage"  # one of Connect's `Stage` names
CONNECT_EXCEPTION = "__connect.errors.exception.class.name"  # see `connect_exception_class`
CONNECT_EXCEPTION_MESSAGE = "__connect.errors.exception.message"  # as DLQ_ERROR_MESSAGE
CONNECT_CONNECTOR = "tokenmill"

# Every header tokenmill itself writes on a dead letter (a trimmed one keeps only these).
DEAD_LETTER_HEADERS = frozenset(
    {
        DLQ_ERROR_CODE,
        DLQ_ERROR_MESSAGE,
        DLQ_SOURCE_TOPIC,
        DLQ_SOURCE_PARTITION,
        DLQ_SOURCE_OFFSET,
        DLQ_TRUNCATED_FROM,
        DLQ_HEADERS_DROPPED,
        DLQ_KEY_DROPPED,
        DLQ_CRASHES,
        ATTEMPT,
        ATTEMPT_HISTORY,
        CONNECT_TOPIC,
        CONNECT_PARTITION,
        CONNECT_OFFSET,
        CONNECT_CONNECTOR_NAME,
        CONNECT_TASK_ID,
        CONNECT_STAGE,
        CONNECT_EXCEPTION,
        CONNECT_EXCEPTION_MESSAGE,
    }
)

Headers = Sequence[tuple[str, bytes]]

# Trace headers are copied from a request to its result; nothing else is.
TRACE_HEADERS = (TRACEPARENT, TRACESTATE)


def header(headers: Iterable[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    """The value of the first header called `name` (case-insensitive), or None."""
    if not headers:
        return None
    wanted = name.lower()
    for key, value in headers:
        if key.lower() == wanted:
            return value
    return None


# W3C Trace Context: a traceparent is 55 characters; vendors must keep tracestate to 512.
_TRACE_HEADER_LIMITS = {TRACEPARENT: 128, TRACESTATE: 512}


def trace_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes]]:
    """The W3C trace-context headers among `headers`, to pass on downstream.

    An oversized one is dropped, not copied: it would make the result too large to send.
    """
    out = []
    for name in TRACE_HEADERS:
        value = header(headers, name)
        if value is not None and len(value) <= _TRACE_HEADER_LIMITS[name]:
            out.append((name, value))
    return out


def connect_exception_class(code: str) -> str:
    """The class-like name a dead letter's CONNECT_EXCEPTION gives for an error code:
    `message_too_large` → `tokenmill.errors.MessageTooLarge`.

    Connect writes a Java class name there, and tools group and match on it as one; derived
    from the code (a closed set that never changes meaning), it is as stable as the code.
    """
    return "tokenmill.errors." + "".join(word.capitalize() for word in code.split("_"))
