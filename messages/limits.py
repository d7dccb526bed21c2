"""The documented size limits of the wire contract, and the bound they put on a result.

Every field a result echoes back (the id, the metadata, the Kafka key) or grows with (text and
token ids, bounded by `max_new_tokens`) has a maximum here, checked when a record is decoded.
So a result's encoded size is bounded by construction: `result_size_bound` is what a worker
checks against its producer's limit at start, before it can ever make a result it cannot send.
"""

from __future__ import annotations

MAX_ID_BYTES = 512  # `id`, UTF-8 (results are keyed by it)
MAX_KEY_BYTES = 1024  # the request record's Kafka key
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # each
MAX_STOP_TOKEN_IDS = 64
MAX_METADATA_ENTRIES = 64
MAX_METADATA_CHARS = 16384  # keys and values together (echoed back)
MAX_ERROR_MESSAGE_CHARS = 1024  # an error result's message is cut to this
MAX_NAME_CHARS = 512  # the worker id, a model name or digest, a topic name (a config's own)

# JSON's worst case per character: a control character is written as \u00XX (6 bytes); any
# other is at most 4 bytes of UTF-8 (MessagePack never writes more than JSON).
_WORST_BYTES_PER_CHAR = 6
_TOKEN_ID_BYTES = 11  # up to 10 digits and a comma
_FIXED_BYTES = 4096  # field names, numbers, usage, timings, source, model ref, braces


def result_size_bound(*, max_new_tokens: int, max_token_bytes: int) -> int:
    """The largest encoded `GenerateResult` a request within the limits can produce.

    `max_token_bytes`: the most bytes one token decodes to on its own (in a text, `n` tokens
    are at most `n` times that many bytes, so at most that many characters).
    """
    text = max_new_tokens * max_token_bytes * _WORST_BYTES_PER_CHAR
    token_ids = max_new_tokens * _TOKEN_ID_BYTES
    echoed = (MAX_ID_BYTES + MAX_METADATA_CHARS + MAX_ERROR_MESSAGE_CHARS) * _WORST_BYTES_PER_CHAR
    names = 4 * MAX_NAME_CHARS * _WORST_BYTES_PER_CHAR  # worker, model name, digest, topic
    metadata_entries = MAX_METADATA_ENTRIES * 8  # quotes, colon, comma per key and value
    return text + token_ids + echoed + names + metadata_entries + _FIXED_BYTES


def cut(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with an ellipsis when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
