"""Frozen wire samples: every message tokenmill reads or writes, as schema version 1 wrote it.

The files under `tests/samples/messages/v1/` are never edited. A change to `messages/` that
stops one of them decoding, or silently drops or renames one of its fields (unknown fields are
ignored, so a rename would otherwise pass), fails here. Add new samples beside them (or a
`v2/` folder) when the schema grows; never rewrite these.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from messages.chunk import GenerateChunk
from messages.codec import JSON, MSGPACK, Codec
from messages.control import Command, Drain, Rollback, SignedCommand, Status, SwapModel
from messages.error_codes import DEAD_LETTER_CODES, ErrorCode
from messages.events import Event, ModelSwapped, StatusReply, WorkerStarted
from messages.request import SCHEMA_VERSION, GenerateRequest
from messages.request_decoding import decode_request
from messages.result import FinishReason, GenerateResult
from messages.validation import check_request

SAMPLES = Path(__file__).parent.parent.parent / "samples" / "messages" / "v1"

SAMPLE_FILES = {
    "chunk_choice_logprobs.json",
    "chunk_stream.json",
    "control_drain.json",
    "control_rollback.json",
    "control_status.json",
    "control_swap_model.json",
    "event_child_restarted.json",
    "event_command_refused.json",
    "event_model_swap_failed.json",
    "event_model_swap_started.json",
    "event_model_swapped.json",
    "event_status_reply.json",
    "event_worker_draining.json",
    "event_worker_started.json",
    "event_worker_stopped.json",
    "request_chat.json",
    "request_full.json",
    "request_full.msgpack",
    "request_json_schema.json",
    "request_logprobs.json",
    "request_minimal.json",
    "request_model_defaults.json",
    "request_no_speculation.json",
    "request_penalties.json",
    "request_prompt_logprobs.json",
    "request_stream.json",
    "request_structured_output.json",
    "request_token_ids.json",
    "request_tools.json",
    "result_deadline.json",
    "result_error.json",
    "result_logprobs.json",
    "result_prompt_logprobs.json",
    "result_speculative.json",
    "result_success.json",
}

# The documented codes, in wire order: a code is never removed or renamed, new ones go last.
ERROR_CODES = [
    "invalid_encoding",
    "invalid_json",
    "message_too_large",
    "unsupported_content_type",
    "schema_violation",
    "missing_id",
    "invalid_prompt",
    "empty_prompt",
    "prompt_too_long",
    "invalid_max_tokens",
    "max_tokens_too_large",
    "invalid_sampling_params",
    "unknown_model",
    "token_out_of_vocabulary",
    "duplicate_request",
    "deadline_exceeded",
    "invalid_reply_to",
    "engine_error",
    "shutting_down",
    "invalid_request",
    "id_too_long",
    "key_too_large",
    "reply_to_not_allowed",
    "reply_to_refused",
    "result_too_large",
    "quarantined",
    "invalid_response_format",
    "unreadable_record",
    "internal_error",
    "unsupported_task",
    "invalid_dimensions",
    "unknown_prompt_name",
    "cancelled",
]
DEAD_LETTERED = {
    "invalid_encoding",
    "invalid_json",
    "message_too_large",
    "unsupported_content_type",
    "schema_violation",
    "missing_id",
    "id_too_long",
    "key_too_large",
    "quarantined",
    "unreadable_record",
}
FINISH_REASONS = ["stop", "length", "deadline", "cancelled", "error"]
EVENT_TYPES = {
    "worker_started",
    "child_restarted",
    "worker_draining",
    "worker_stopped",
    "model_swap_started",
    "model_swapped",
    "model_swap_failed",
    "command_refused",
    "status_reply",
}
COMMAND_TYPES = {"swap_model", "rollback", "drain", "status"}

# Built once, as the workers do; `Event` and `Command` are tagged unions.
CODECS: dict[str, Codec[Any]] = {
    "request": Codec(GenerateRequest),
    "result": Codec(GenerateResult),
    "chunk": Codec(GenerateChunk),
    "control": Codec(SignedCommand),
    "event": Codec(Event),  # type: ignore[arg-type]
}
command_decoder = msgspec.json.Decoder(Command)


def sample_paths() -> list[Path]:
    return sorted(SAMPLES.iterdir())


def content_type(path: Path) -> str:
    return MSGPACK if path.suffix == ".msgpack" else JSON


def codec_for(path: Path) -> Codec[Any]:
    return CODECS[path.name.split("_", 1)[0]]


def loose(path: Path) -> Any:
    data = path.read_bytes()
    return msgspec.msgpack.decode(data) if path.suffix == ".msgpack" else msgspec.json.decode(data)


def load(name: str) -> Any:
    path = SAMPLES / name
    return codec_for(path).decode(path.read_bytes(), content_type(path))


def test_every_sample_is_here_and_known() -> None:
    assert {p.name for p in sample_paths()} == SAMPLE_FILES


@pytest.mark.parametrize("path", sample_paths(), ids=lambda p: p.name)
def test_sample_decodes_and_round_trips(path: Path) -> None:
    codec = codec_for(path)
    message = codec.decode(path.read_bytes(), content_type(path))
    assert isinstance(message, msgspec.Struct)
    for ctype in (JSON, MSGPACK):
        assert codec.decode(codec.encode(message, ctype), ctype) == message


@pytest.mark.parametrize("path", sample_paths(), ids=lambda p: p.name)
def test_no_sample_field_is_lost(path: Path) -> None:
    """Every field the sample holds is still a field, with the same value, after decoding."""
    message = codec_for(path).decode(path.read_bytes(), content_type(path))
    # String keys, as JSON writes them (`logit_bias` is keyed by token id).
    assert_kept(loose(path), msgspec.to_builtins(message, str_keys=True), "")


def assert_kept(original: dict[str, Any], again: dict[str, Any], where: str) -> None:
    """Every key of `original` is in `again` with the same value; nested objects may have
    gained fields added later (with their defaults), never lost one."""
    lost = {k: v for k, v in original.items() if k not in again}
    assert not lost, f"fields no longer in the schema: {sorted(where + k for k in lost)}"
    for key, value in original.items():
        if isinstance(value, dict) and isinstance(again[key], dict):
            assert_kept(value, again[key], f"{where}{key}.")
        else:
            assert again[key] == value, where + key


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("request_*")), ids=lambda p: p.name)
def test_request_samples_pass_the_ingest_gate(path: Path) -> None:
    request = decode_request(path.read_bytes(), content_type(path))
    check_request(request)
    assert request.v == SCHEMA_VERSION == 1


def test_a_request_without_the_extras_runs_as_written() -> None:
    request = load("request_minimal.json")
    assert request.model_defaults == [] and not request.ignore_eos
    assert request.skip_special_tokens and not request.include_stop_str_in_output
    assert request.add_generation_prompt and not request.continue_final_message
    assert request.truncate_prompt_tokens is None and request.chat_template_kwargs == {}


def test_minimal_request_gets_the_boring_defaults() -> None:
    request = load("request_minimal.json")
    assert request == GenerateRequest(id="req-0001", prompt="Write a haiku about Kafka.")
    assert (request.max_new_tokens, request.temperature, request.top_p, request.top_k) == (
        16,
        0.0,
        1.0,
        0,
    )


def test_msgpack_and_json_samples_agree() -> None:
    from_json = load("request_full.json")
    from_msgpack = load("request_full.msgpack")
    assert from_msgpack.deadline == from_json.deadline  # 14:30+02:00 is 12:30Z
    assert from_msgpack.deadline.utcoffset() == timedelta(hours=2)
    differs = {"id", "prompt", "deadline"}
    for field in GenerateRequest.__struct_fields__:
        if field not in differs:
            assert getattr(from_msgpack, field) == getattr(from_json, field), field


def test_chat_sample() -> None:
    request = load("request_chat.json")
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.prompt is None and request.prompt_token_ids is None


def test_tools_sample() -> None:
    request = load("request_tools.json")
    assert request.tools is not None and request.tool_calling is not None
    assert not request.tool_calling.parallel
    assistant, tool = request.messages[1], request.messages[2]
    assert assistant.tool_calls[0].function.name == "get_weather"
    assert (tool.role, tool.tool_call_id) == ("tool", "call_8f2c")


def test_json_schema_sample() -> None:
    request = load("request_json_schema.json")
    assert request.response_format is not None
    assert request.response_format.type == "json_schema" and request.response_format.strict
    schema = msgspec.json.decode(request.response_format.schema_text() or "")
    assert schema["required"] == ["name", "population", "continent"]


def test_structured_output_sample() -> None:
    request = load("request_structured_output.json")
    assert request.structured_output is not None
    assert request.structured_output.rule() == ("choice", '["positive", "negative"]')


def test_penalties_sample() -> None:
    request = load("request_penalties.json")
    assert (request.presence_penalty, request.frequency_penalty) == (0.5, -0.25)
    assert (request.repetition_penalty, request.min_tokens, request.min_p) == (1.1, 4, 0.05)
    assert request.logit_bias == {0: -100.0, 42: 2.5}  # JSON's string keys, as token ids


def test_result_samples() -> None:
    ok = load("result_success.json")
    assert ok.ok and ok.finish_reason is FinishReason.LENGTH
    assert ok.usage.total_tokens == ok.usage.prompt_tokens + ok.usage.completion_tokens
    failed = load("result_error.json")
    assert not failed.ok
    assert failed.error.code is ErrorCode.PROMPT_TOO_LONG
    assert failed.finish_reason is FinishReason.ERROR
    late = load("result_deadline.json")
    assert late.finish_reason is FinishReason.DEADLINE
    assert late.error.code is ErrorCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("control_swap_model.json", SwapModel(model="smollm2-135m")),
        ("control_rollback.json", Rollback()),
        ("control_drain.json", Drain()),
        ("control_status.json", Status()),
    ],
)
def test_control_samples_wrap_a_command(name: str, command: Any) -> None:
    signed = load(name)
    assert isinstance(signed.body, bytes)
    assert re.fullmatch(r"[0-9a-f]{64}", signed.signature)  # hex HMAC-SHA256
    assert signed.nonce and signed.timestamp > 0
    assert command_decoder.decode(signed.body) == command
    assert msgspec.json.decode(msgspec.json.encode(command), type=Command) == command


def test_every_command_type_has_a_sample() -> None:
    tags = {msgspec.json.decode(load(p.name).body)["type"] for p in SAMPLES.glob("control_*")}
    assert tags == COMMAND_TYPES
    assert {c.__struct_config__.tag for c in Command.__args__} == COMMAND_TYPES


def test_every_event_type_has_a_sample() -> None:
    tags = {loose(p)["type"] for p in SAMPLES.glob("event_*")}
    assert tags == EVENT_TYPES
    assert {e.__struct_config__.tag for e in Event.__args__} == EVENT_TYPES
    for path in SAMPLES.glob("event_*"):
        event = load(path.name)
        assert event.__struct_config__.tag == path.stem.removeprefix("event_")
        assert event.worker and event.at > 0


def test_event_samples_carry_model_refs() -> None:
    started = load("event_worker_started.json")
    assert isinstance(started, WorkerStarted)
    assert started.model.digest.startswith("sha256:")
    swapped = load("event_model_swapped.json")
    assert isinstance(swapped, ModelSwapped)
    assert swapped.from_model != swapped.to_model
    status = load("event_status_reply.json")
    assert isinstance(status, StatusReply)
    assert status.kv_blocks_used <= status.kv_blocks_total


# --- the closed enums are part of the wire contract ------------------------------------------


def test_error_codes_are_the_documented_ones_in_order() -> None:
    assert [code.value for code in ErrorCode] == ERROR_CODES


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_error_codes_are_snake_case(code: ErrorCode) -> None:
    assert re.fullmatch(r"[a-z]+(_[a-z]+)*", code.value)
    assert code.name == code.value.upper()


def test_dead_letter_codes() -> None:
    assert {code.value for code in DEAD_LETTER_CODES} == DEAD_LETTERED


def test_finish_reasons() -> None:
    assert [reason.value for reason in FinishReason] == FINISH_REASONS


def test_prompt_logprobs_samples() -> None:
    request = load("request_prompt_logprobs.json")
    assert request.prompt_logprobs == 1 and request.max_new_tokens == 0
    result = load("result_prompt_logprobs.json")
    assert result.prompt_logprobs.unscored_first
    assert result.prompt_logprobs.token_logprobs[1:] == [-7.5, -1.25]
    assert result.prompt_text == "The capital of"
    # Older results (and requests) have none.
    assert load("result_logprobs.json").prompt_logprobs is None
    assert load("result_logprobs.json").logprobs.unscored_first is False
    assert load("request_logprobs.json").prompt_logprobs is None


def test_speculation_samples() -> None:
    assert load("request_no_speculation.json").speculate is False
    usage = load("result_speculative.json").usage
    assert (usage.accepted_draft_tokens, usage.rejected_draft_tokens) == (5, 3)
    # Older requests speculate (when the worker does); older results guessed nothing.
    assert load("request_minimal.json").speculate is True
    old = load("result_success.json").usage
    assert (old.accepted_draft_tokens, old.rejected_draft_tokens) == (0, 0)
