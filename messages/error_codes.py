"""The closed set of error codes a result can carry. Part of the wire contract.

A code never changes meaning and is never removed; new ones are added at the end. Clients
match on the code; the message beside it is for people and may change.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    # The record's bytes are not a request at all (the raw record also goes to the DLQ).
    INVALID_ENCODING = "invalid_encoding"  # not UTF-8 text (JSON) / not MessagePack
    INVALID_JSON = "invalid_json"  # text, but not a JSON object
    MESSAGE_TOO_LARGE = "message_too_large"  # over the worker's max_request_bytes
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"  # content-type header we cannot read
    SCHEMA_VIOLATION = "schema_violation"  # a known field has the wrong type
    MISSING_ID = "missing_id"  # no `id`, or an empty one: the result could not be keyed
    # A request, but one that cannot run.
    INVALID_PROMPT = "invalid_prompt"  # not exactly one of prompt / prompt_token_ids / messages
    EMPTY_PROMPT = "empty_prompt"
    PROMPT_TOO_LONG = "prompt_too_long"
    INVALID_MAX_TOKENS = "invalid_max_tokens"  # max_new_tokens ≤ 0
    MAX_TOKENS_TOO_LARGE = "max_tokens_too_large"
    INVALID_SAMPLING_PARAMS = "invalid_sampling_params"  # temperature, top_p, top_k, stop
    UNKNOWN_MODEL = "unknown_model"
    TOKEN_OUT_OF_VOCABULARY = "token_out_of_vocabulary"
    DUPLICATE_REQUEST = "duplicate_request"  # the same id is already running on this worker
    DEADLINE_EXCEEDED = "deadline_exceeded"  # expired before or while it ran
    INVALID_REPLY_TO = "invalid_reply_to"  # not a legal Kafka topic name
    # The worker's side.
    ENGINE_ERROR = "engine_error"
    SHUTTING_DOWN = "shutting_down"  # the worker drained before the request could finish
    INVALID_REQUEST = "invalid_request"  # a rejection without a more specific code
    # Size limits of `messages/limits.py`, and where a result may go.
    ID_TOO_LONG = "id_too_long"  # `id` over MAX_ID_BYTES (the result's id is then "")
    KEY_TOO_LARGE = "key_too_large"  # the record's Kafka key over MAX_KEY_BYTES
    REPLY_TO_NOT_ALLOWED = "reply_to_not_allowed"  # internal, the worker's own, or not allowed
    REPLY_TO_REFUSED = "reply_to_refused"  # the broker refused it (no such topic, no access)
    RESULT_TOO_LARGE = "result_too_large"  # larger than the reply topic or producer accepts
    QUARANTINED = "quarantined"  # the record was in flight when workers crashed, too often
    # Structured output: a malformed response_format or structured_output, two constraints in
    # one request, or a schema, regex or grammar the grammar library cannot compile.
    INVALID_RESPONSE_FORMAT = "invalid_response_format"
    # A record the Kafka client could not read as sent: a header key that is not UTF-8, a
    # corrupt or undecompressable batch (`actors.kafka.record_reader`). Dead-lettered.
    UNREADABLE_RECORD = "unreadable_record"
    # The worker failed admitting this one record in a way no rule names (a bug): answered,
    # counted (`tokenmill_requests_total{code="internal_error"}`), and the worker goes on.
    INTERNAL_ERROR = "internal_error"
    # Embeddings (`messages.embedding`). A generation request sent to a worker that serves an
    # embedding model, or an embedding request to one that serves a generative model.
    UNSUPPORTED_TASK = "unsupported_task"
    INVALID_DIMENSIONS = "invalid_dimensions"  # not in 1 .. the model's width (or not offered)
    UNKNOWN_PROMPT_NAME = "unknown_prompt_name"  # not one of the model's task prompts
    # An embedding request cancelled (a cancel record) before its vectors were made: an
    # `EmbedResult` has no finish reason to say so (a `GenerateResult` says `cancelled`).
    CANCELLED = "cancelled"


# Codes whose record cannot be read as a request: the raw bytes go to the dead-letter topic.
# (A result that cannot be delivered, or a quarantined record, is dead-lettered too.)
DEAD_LETTER_CODES = frozenset(
    {
        ErrorCode.INVALID_ENCODING,
        ErrorCode.INVALID_JSON,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.UNSUPPORTED_CONTENT_TYPE,
        ErrorCode.SCHEMA_VIOLATION,
        ErrorCode.MISSING_ID,
        ErrorCode.ID_TOO_LONG,
        ErrorCode.KEY_TOO_LARGE,
        ErrorCode.QUARANTINED,  # the raw record, not run again
        ErrorCode.UNREADABLE_RECORD,
    }
)
