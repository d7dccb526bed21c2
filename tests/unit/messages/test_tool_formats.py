"""Tool-call formats: found in real and model-style templates, rendered, parsed, and the auto
grammar checked against SmolLM2's real vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from gpu.loading.chat_template import render_chat
from gpu.loading.gguf import read_gguf_header
from gpu.loading.tokenizer import Tokenizer
from messages.tool_formats import ToolFormat, auto_grammar, detect_format, markers
from messages.tool_parsing import ToolCallStream, parse_calls, stream_for
from messages.tool_prompt import default_tool_messages
from tests.tool_templates import HERMES, LLAMA31, MISTRAL

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# An agent's second turn: the question, the assistant's call, the tool's result.
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Tokenizer:
    return read_gguf_header(smollm2_path)[1]


def render(template: str, messages: list[dict[str, Any]], tools: Any = None) -> str:
    return render_chat(
        template,
        messages,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
        tools=tools,
    )


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (HERMES, ToolFormat.HERMES),
        (LLAMA31, ToolFormat.LLAMA3_JSON),
        (MISTRAL, ToolFormat.MISTRAL),
        ("{{ '<|python_tag|>' }}", ToolFormat.LLAMA3_JSON),
        (None, ToolFormat.DEFAULT),
    ],
)
def test_the_format_is_read_from_the_template(template: str | None, fmt: ToolFormat) -> None:
    assert detect_format(template) is fmt


def test_smollm2s_real_template_has_no_tool_format(smollm2: Tokenizer) -> None:
    assert smollm2.chat_template and "tool" not in smollm2.chat_template
    assert detect_format(smollm2.chat_template) is ToolFormat.DEFAULT


@pytest.mark.parametrize(
    ("template", "call"),
    [
        (HERMES, '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
        (LLAMA31, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
        (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id"'),
    ],
)
def test_a_template_renders_the_tools_and_earlier_calls_itself(template: str, call: str) -> None:
    text = render(template, [*TURNS, {"role": "user", "content": "So?"}], tools=[WEATHER])
    assert call in text  # the arguments an object, written once as JSON (not a string in one)
    assert "22 C, sunny" in text
    assert '"description": "The weather in a city"' in text  # the tools, in plain JSON


def test_without_a_tool_format_the_tools_go_into_the_system_message(smollm2: Tokenizer) -> None:
    assert smollm2.chat_template is not None
    text = render(smollm2.chat_template, TURNS, tools=[WEATHER])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n")
    assert json.dumps(WEATHER) in system
    assert '<tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>' in system
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "</tool_call><|im_end|>"
    ) in text
    assert (
        '<|im_start|>user\n<tool_response>{"tool_call_id": "call_1", "content": "22 C, sunny"}'
        "</tool_response><|im_end|>"
    ) in text


def test_the_default_rendering_merges_tool_results_and_keeps_the_system_text() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        *TURNS,
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "user", "content": "And so?"},
    ]
    out = default_tool_messages(messages, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call the following tools.")
    assert out[3]["content"].count("<tool_response>") == 2
    assert out[3]["content"].endswith("And so?")


def test_no_tools_and_no_tool_turns_render_as_before(smollm2: Tokenizer) -> None:
    assert smollm2.chat_template is not None
    plain = [{"role": "user", "content": "Hi"}]
    assert render(smollm2.chat_template, plain) == smollm2.apply_chat_template(plain)
    assert "tool" not in render(smollm2.chat_template, plain)


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        (
            "hermes",
            'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>',
            "Let me look.",
            [("f", {"a": 1}), ("g", {})],
        ),
        (
            None,
            '<tool_call>{"name": "f", "arguments": {"a": "}{"}}</tool_call>',
            None,
            [("f", {"a": "}{"})],
        ),
        ("llama3_json", '{"name": "f", "parameters": {"a": [1, 2]}}', None, [("f", {"a": [1, 2]})]),
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {}}', None, [("f", {})]),
        ("llama3_json", 'It is {"name": "f"}', 'It is {"name": "f"}', []),
        (
            "mistral",
            '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": true}}]',
            None,
            [("f", {"a": 1}), ("g", {"b": True})],
        ),
        ("mistral", 'Sure [TOOL_CALLS][{"name": "f", "arguments": {}}]', "Sure", [("f", {})]),
        ("hermes", "No call here.", "No call here.", []),
        # cut off inside the arguments: no whole call, so the output is text
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": ', None, []),
    ],
)
def test_calls_are_parsed_in_each_format(
    fmt: str | None, text: str, content: str | None, calls: list[tuple[str, Any]]
) -> None:
    parsed = parse_calls(text, fmt)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in parsed.calls]
    assert got == calls
    assert parsed.content == (content if calls else text)
    assert all(c.id.startswith("call_") for c in parsed.calls)


def test_a_streamed_call_comes_as_openai_deltas_whatever_the_pieces() -> None:
    text = 'Hi <tool_call>{"name": "f", "arguments": {"q": "a<b"}}</tool_call>'
    for size in (1, 2, 5, len(text)):
        stream = ToolCallStream("hermes")
        pieces = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
        pieces.append(stream.finish())
        content = "".join(p.content for p in pieces)
        deltas = [d for p in pieces for d in p.tool_calls]
        assert content == "Hi "
        assert deltas[0].index == 0 and deltas[0].function.name == "f"
        assert deltas[0].type == "function" and str(deltas[0].id).startswith("call_")
        assert all(d.index == 0 for d in deltas)
        assert json.loads("".join(d.function.arguments for d in deltas)) == {"q": "a<b"}
        assert stream.called


def test_text_that_only_looks_like_a_marker_start_is_given_at_the_end() -> None:
    stream = ToolCallStream("hermes")
    assert stream.feed("a <tool").content == "a "
    assert stream.finish().content == "<tool"
    assert not stream.called


# -- the auto grammar, on SmolLM2's vocabulary --------------------------------------------------

FUNCTIONS = [
    ("get_weather", WEATHER["function"]["parameters"]),  # type: ignore[index]
    ("noop", None),
]


def matcher(smollm2: Tokenizer, lark: str) -> llguidance.LLMatcher:
    tokenizer = llguidance.LLTokenizer(
        smollm2.inner.to_str(), n_vocab=smollm2.vocab_size, eos_token=list(smollm2.eos_token_ids)
    )
    m = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("lark", lark), log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepted(smollm2: Tokenizer, lark: str, text: str) -> bool:
    """Whether the grammar takes `text` whole (each token in turn) and may end after it."""
    m = matcher(smollm2, lark)
    ids = smollm2.encode(text, add_special_tokens=False)
    return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


@pytest.mark.parametrize("fmt", [ToolFormat.HERMES, ToolFormat.DEFAULT])
def test_the_hermes_grammar_lets_text_end_anywhere_and_checks_every_call(
    smollm2: Tokenizer, fmt: ToolFormat
) -> None:
    lark = auto_grammar(fmt, FUNCTIONS, parallel=True, special={})
    assert accepted(smollm2, lark, "")
    assert accepted(smollm2, lark, "Just text, maybe with {braces} and <tags>")
    call = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","days":2}}\n</tool_call>'
    assert accepted(smollm2, lark, "Checking. " + call)
    assert accepted(smollm2, lark, call + '\n<tool_call>{"name":"noop","arguments":{}}</tool_call>')
    for wrong in (
        '<tool_call>{"name":"other","arguments":{}}</tool_call>',  # not a tool
        '<tool_call>{"name":"get_weather","arguments":{"days":2}}</tool_call>',  # no city
        '<tool_call>{"name":"noop","arguments":{"x":1}}</tool_call>',  # no arguments allowed
        '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call> then text',
    ):
        assert not accepted(smollm2, lark, wrong), wrong


def test_without_parallel_calls_one_call_ends_the_answer(smollm2: Tokenizer) -> None:
    lark = auto_grammar(ToolFormat.HERMES, FUNCTIONS, parallel=False, special={})
    m = matcher(smollm2, lark)
    ids = smollm2.encode(
        '<tool_call>{"name":"noop","arguments":{}}</tool_call>', add_special_tokens=False
    )
    assert m.consume_tokens(ids)
    assert m.is_stopped()  # nothing but EOS may follow


def test_the_llama_grammar_makes_an_opening_brace_a_call(smollm2: Tokenizer) -> None:
    lark = auto_grammar(ToolFormat.LLAMA3_JSON, FUNCTIONS, parallel=False, special={})
    assert accepted(smollm2, lark, "The weather is fine.")
    assert accepted(smollm2, lark, '{"name":"get_weather","parameters":{"city":"Rome"}}')
    assert not accepted(smollm2, lark, '{"name":"get_weather","arguments":{"city":"Rome"}}')
    assert not accepted(smollm2, lark, '{"anything": 1}')


def test_the_mistral_grammar_takes_a_list_of_calls(smollm2: Tokenizer) -> None:
    lark = auto_grammar(ToolFormat.MISTRAL, FUNCTIONS, parallel=True, special={})
    calls = '[{"name":"noop","arguments":{}},{"name":"get_weather","arguments":{"city":"Rome"}}]'
    assert accepted(smollm2, lark, "Sure.")
    assert accepted(smollm2, lark, "[TOOL_CALLS]" + calls)
    assert not accepted(smollm2, lark, '[TOOL_CALLS][{"name":"nope","arguments":{}}]')
    single = auto_grammar(ToolFormat.MISTRAL, FUNCTIONS, parallel=False, special={})
    assert not accepted(smollm2, single, "[TOOL_CALLS]" + calls)


@pytest.mark.parametrize("fmt", list(ToolFormat))
@pytest.mark.parametrize("parallel", [True, False])
def test_every_grammar_compiles_with_its_markers_as_special_tokens(
    smollm2: Tokenizer, fmt: ToolFormat, parallel: bool
) -> None:
    # SmolLM2's special tokens 1 and 2 stand in for markers that are tokens of their own.
    special = dict(zip(markers(fmt), (1, 2), strict=False))
    lark = auto_grammar(fmt, FUNCTIONS, parallel=parallel, special=special)
    m = matcher(smollm2, lark)
    assert m.validate_tokens([1]) == 1  # the opening marker's token starts a call


def test_a_forced_calls_stream_reads_its_bare_json() -> None:
    stream = stream_for("required", "hermes")
    piece = stream.feed('{"name":"f","arguments":{"a":1}}')
    assert piece.content == "" and piece.tool_calls[0].function.name == "f"
    assert "".join(d.function.arguments for d in piece.tool_calls) == '{"a":1}'
    assert stream_for("auto+functions", "").fmt is ToolFormat.DEFAULT
