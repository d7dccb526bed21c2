"""tool_choice "auto" end to end on a tiny model whose chat template has a Hermes tool format:
chat body → request (`to_request`) → the ingest's rendering (`ModelFront`) → the engine, under
the tools constraint compiled for the model (`engine_request`) → result → answer.

The model has random weights; `logit_bias` on its `<tool_call>` token (one token of its
vocabulary, as in Qwen's) steers it to open a call. From there the grammar alone keeps the call
on its tool's schema, so the answer holds a parsed, schema-valid `tool_calls`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest

from actors.in_flight import engine_request
from actors.ingest.model_front import ModelFront
from actors.mail import Admitted, RecordRef
from actors.results import engine_outcome
from actors.telemetry.trace_context import TraceContext
from gpu.engine import Engine
from gpu.engine_config import EngineConfig
from gpu.loading.loader import load_model
from messages.openai_batch import CHAT_COMPLETIONS_URL, BatchInputLine
from messages.openai_batch_answers import answer_line
from messages.openai_batch_mapping import calls_tool, to_request
from ops.models.offline import run_all
from tests.tool_templates import FORECAST, build_tool_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """A tiny random llama with `<tool_call>` tokens and a Hermes-style chat template."""
    folder = build_tool_checkpoint(tmp_path_factory.mktemp("tiny-tools") / "tiny-tools")
    return Engine(load_model(folder, name="tiny-tools"), EngineConfig(max_num_seqs=4))


def run(engine: Engine, body: dict[str, Any]) -> dict[str, Any]:
    """`body` through the mapping, the ingest's rendering, the engine and the answer."""
    front = ModelFront.of_engine(engine)
    line = BatchInputLine(custom_id="c1", url=CHAT_COMPLETIONS_URL, body=body)
    request = to_request(line, "r1")
    prompt = front.prompt_tokens(request)
    now = time.monotonic()
    item = Admitted(
        request=request,
        record=RecordRef("requests", 0, 1, 0),
        prompt_token_ids=prompt,
        reply_topic="results",
        content_type="application/json",
        trace=TraceContext(),
        consumed_at=now,
        deadline=None,
    )
    (completion,) = run_all(engine, [engine_request(item, prompt)]).completions
    result = engine_outcome(item, completion, model=front.ref, worker="w", queued_ms=0).result
    out = answer_line("c1", CHAT_COMPLETIONS_URL, result, tool_call=calls_tool(line))
    assert out.response is not None
    body_out: dict[str, Any] = json.loads(json.dumps(out.response.body, default=_builtins))
    return body_out


def _builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)


def test_the_model_reads_as_hermes_and_sees_its_tools(engine: Engine) -> None:
    front = ModelFront.of_engine(engine)
    assert front.ref.tool_format == "hermes"
    line = BatchInputLine(
        custom_id="c0",
        url=CHAT_COMPLETIONS_URL,
        body={"messages": [{"role": "user", "content": "Oslo?"}], "tools": [FORECAST]},
    )
    prompt = front.prompt_tokens(to_request(line, "r0"))
    shown = engine.model.tokenizer.decode(prompt, skip_special_tokens=False)
    assert '"name": "forecast"' in shown and "<tools>" in shown


def test_an_auto_call_steered_to_start_is_parsed_and_valid(engine: Engine) -> None:
    trigger = engine.model.tokenizer.inner.token_to_id("<tool_call>")
    body = {
        "messages": [{"role": "user", "content": "What is the weather in Oslo for 3 days?"}],
        "tools": [FORECAST],  # tool_choice omitted: "auto"
        "parallel_tool_calls": False,
        "logit_bias": {str(trigger): 100},
        "max_tokens": 80,
    }
    answer = run(engine, body)
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["function"]["name"] == "forecast"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, FORECAST["function"]["parameters"])  # type: ignore[index]


def test_a_second_turn_renders_the_call_and_its_result(engine: Engine) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "forecast", "arguments": '{"city": "Oslo", "days": 3}'},
    }
    messages = [
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    front = ModelFront.of_engine(engine)
    line = BatchInputLine(
        custom_id="c2",
        url=CHAT_COMPLETIONS_URL,
        body={"messages": messages, "tools": [FORECAST]},
    )
    shown = engine.model.tokenizer.decode(
        front.prompt_tokens(to_request(line, "r2")), skip_special_tokens=False
    )
    assert '{"name": "forecast", "arguments": {"city": "Oslo", "days": 3}}' in shown
    assert "<tool_response>\nsunny\n</tool_response>" in shown
