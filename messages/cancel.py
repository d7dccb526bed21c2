"""`CancelRequest`: what goes on the cancel topic to stop a request early.

    {"v": 1, "id": "job-17"}

Every worker reads the cancel topic (a consumer group of its own, like the control topic) and
aborts the request with that `id` wherever it holds it: in a length bucket, queued for the
engine, prefilling or decoding. The request's one result is then sent as usual, with
`finish_reason: "cancelled"` and the tokens made so far (none if it never reached the
engine). An id a worker does not hold (unknown, finished, or run by another worker) is left
alone there.

Unsigned on purpose: a cancel only ends a request early, so whoever may produce requests may
cancel them, and who may write the topic is Kafka's ACLs' to decide (control commands, which
change what the fleet runs, are signed instead). Records are keyed by the request id and
carry the `tokenmill-schema: CancelRequest/1` header.

Limits: a cancel record's value is at most `MAX_CANCEL_BYTES` (a cancel is an id and a short
reason; a larger record is refused unread), and its `id` at most `messages.limits.MAX_ID_BYTES`
of UTF-8, as a request's (no request can have a longer one). A worker refuses (counts, logs,
skips) a cancel past either, so every cancel it holds is small.
"""

from __future__ import annotations

import msgspec

from messages.codec import Codec

CANCEL_SCHEMA = "CancelRequest/1"
MAX_CANCEL_BYTES = 4096  # a cancel record's value; its id is bounded by limits.MAX_ID_BYTES


class CancelRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Stop request `id`. `reason`: free text for logs and traces (e.g. "user", "batch")."""

    v: int = 1
    id: str
    reason: str = ""


cancel_codec = Codec(CancelRequest)
