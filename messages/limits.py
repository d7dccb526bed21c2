"""The documented limits of the wire contract: sizes, the range of every number, and the
bound they put on a result.

Every field a result echoes back (the id, the metadata, the Kafka key) or grows with (text and
token ids, bounded by `max_new_tokens`) has a maximum here, checked when a record is decoded.
So a result's encoded size is bounded by construction: `result_size_bound` is what a worker
checks against its producer's limit at start, before it can ever make a result it cannot send.
Every number a request carries has a range here too, checked at the door.
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

# The range of every number a request carries, checked at the door (`messages.validation`,
# `messages.admission`). The wire admits integers of thousands of digits and any float, so
# these bounds are what keeps the worker's arithmetic (deadlines, priorities, lengths) from
# overflowing and every value storable as the engine stores it (int64, float32).
INT64_LIMIT = 2**63  # int64 is [-INT64_LIMIT, INT64_LIMIT): so is any integer in a schema
MIN_SCHEMA_VERSION = 0  # `v` in [0, INT64_LIMIT): unused, read alike, but int64 like the rest
MAX_NEW_TOKENS = 2**20  # `max_new_tokens` in [1, this]; the model's own, smaller cap comes later
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # `timeout_ms` in [1, this]: a week
# `priority` in [MIN_PRIORITY, MAX_PRIORITY]: small on purpose. The scheduler ages a waiting
# request one level per `aging_seconds` (10 s by default), so the lowest priority overtakes the
# highest within (MAX - MIN) levels of waiting (about half an hour at the default).
MIN_PRIORITY = -100
MAX_PRIORITY = 100
MAX_SEED = INT64_LIMIT  # `seed` in [0, this)
TOKEN_ID_LIMIT = 2**31  # ids in `prompt_token_ids`, `stop_token_ids`, and `top_k`: [0, this)
MAX_TEMPERATURE = 1e6  # `temperature` in [0, this]; far past uniform, far below float32's max
# `top_p` in [MIN_TOP_P, 1]. Any top_p under the top token's probability keeps that one token,
# so smaller values mean nothing more; under float32's smallest normal (1.2e-38) the device
# would read 0 and keep no token at all.
MIN_TOP_P = 1e-9
MAX_STREAM_INTERVAL_TOKENS = MAX_NEW_TOKENS  # `stream_interval_tokens` in [1, this]
MAX_STREAM_INTERVAL_MS = float(MAX_TIMEOUT_MS)  # `stream_interval_ms` in [0, this]
MAX_SCHEMA_DEPTH = 64  # arrays and objects nested in a `response_format` schema
# Constraints beyond JSON (`messages.structured_output`), each compiled once per distinct text
# by the engine that runs it: a regex of 1 to MAX_REGEX_CHARS characters, a Lark/GBNF grammar
# of 1 to MAX_GRAMMAR_CHARS (a JSON schema's limit too), a choice of 1 to MAX_CHOICE_STRINGS
# strings of 1 to MAX_CHOICE_STRING_CHARS each.
MAX_REGEX_CHARS = 16 * 1024
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_CHOICE_STRINGS = 1024
MAX_CHOICE_STRING_CHARS = 512
# OpenAI's function tools in a batch line (`messages.openai_tools`): at most MAX_TOOLS, names of
# 1 to MAX_TOOL_NAME_CHARS of a-z, A-Z, 0-9, '_' and '-' (OpenAI's rules); the call's JSON
# schema, all tools' together, within the JSON schema's limit.
MAX_TOOLS = 128
MAX_TOOL_NAME_CHARS = 64
# Penalties and biases (`gpu.penalties`). `presence_penalty` and `frequency_penalty` in
# [-MAX_PENALTY, MAX_PENALTY], OpenAI's range. `repetition_penalty` in
# [MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY] (1 = off): it divides positive logits, and a
# tiny one would push them past float32's range. `min_p` in [0, 1]. `logit_bias`: at most
# MAX_LOGIT_BIAS_ENTRIES ids (OpenAI's limit), each bias in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]
# (-100 bans a token, +100 all but forces it). `min_tokens` in [0, max_new_tokens].
MAX_PENALTY = 2.0
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 2.0
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0
# `logprobs` in [0, MAX_LOGPROBS] (None: off): the alternatives reported per generated token,
# as vLLM's and OpenAI's chat cap (`top_logprobs` ≤ 20). A result with logprobs grows with them
# and is not within `result_size_bound`: one past the producer's limit is `result_too_large`.
MAX_LOGPROBS = 20
# `prompt_logprobs` has the same range: the alternatives reported per prompt token.
MAX_PROMPT_LOGPROBS = MAX_LOGPROBS
# `n` in [1, MAX_CHOICES]: the choices of one request, each a sequence in the engine (sharing the
# prompt's KV blocks); admission and backpressure count all of them.
MAX_CHOICES = 16

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


def number_text(value: int | float) -> str:
    """`value` for an error message: a request's integer may have thousands of digits."""
    text = str(value)
    if len(text) <= 24:
        return text
    return f"{text[:12]}… ({len(text.lstrip('-'))} digits)"


# Embeddings (`messages.embedding`): inputs in one `EmbedRequest` (OpenAI's limit).
MAX_EMBED_INPUTS = 2048
