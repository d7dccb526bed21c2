"""Property: a call made under tool_choice "auto" always parses and validates against its
tool's schema, whatever the schema and whatever tokens the model picks.

Random tool schemas (objects of strings, numbers, integers, booleans, enums, arrays and nested
objects, with random required subsets); the auto grammar compiled for SmolLM2's real
vocabulary; a random walk through it that writes some text, opens a call (the trigger), then
picks any token the grammar's mask allows (leaning towards tokens that close a string, an
object or an array, so the walk ends) until the grammar has ended. The output, parsed as the
answer parses it, holds one call, which `jsonschema` finds valid.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu.loading.gguf import read_gguf_header
from gpu.loading.tokenizer import Tokenizer
from messages.tool_formats import HERMES_OPEN, ToolFormat, auto_grammar
from messages.tool_parsing import parse_calls

pytestmark = pytest.mark.slow

NAMES = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=8)
LEAVES = st.one_of(
    st.sampled_from([{"type": t} for t in ("string", "number", "integer", "boolean")]),
    st.lists(
        st.text(alphabet=string.ascii_letters, min_size=1, max_size=6),
        min_size=1,
        max_size=4,
        unique=True,
    ).map(lambda values: {"type": "string", "enum": values}),
)


@st.composite
def objects(draw: st.DrawFn, values: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    properties = draw(st.dictionaries(NAMES, values, min_size=1, max_size=4))
    required = [name for name in properties if draw(st.booleans())]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        inner.map(lambda items: {"type": "array", "items": items, "maxItems": 3}), objects(inner)
    ),
    max_leaves=6,
)
TOOLS = st.lists(
    st.tuples(NAMES, objects(VALUES)), min_size=1, max_size=3, unique_by=lambda t: t[0]
)
CLOSERS = ('"', "}", "]", ",")


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> tuple[Tokenizer, llguidance.LLTokenizer, list[str]]:
    tokenizer = read_gguf_header(smollm2_path)[1]
    library = llguidance.LLTokenizer(
        tokenizer.inner.to_str(),
        n_vocab=tokenizer.vocab_size,
        eos_token=list(tokenizer.eos_token_ids),
    )
    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.vocab_size)]
    return tokenizer, library, texts


# How each format's call is opened (SmolLM2 has no marker tokens: they are text here).
OPENERS = {
    ToolFormat.DEFAULT: ["", "Sure. ", "Let me check:\n"],
    ToolFormat.MISTRAL: ["[TOOL_CALLS]", "Sure. [TOOL_CALLS]"],
    ToolFormat.LLAMA3_JSON: ["{"],
}


def walk(
    smollm2: tuple[Tokenizer, llguidance.LLTokenizer, list[str]],
    lark: str,
    seed: int,
    fmt: ToolFormat = ToolFormat.DEFAULT,
) -> str:
    """Text, the trigger, then random allowed tokens until the grammar ends."""
    tokenizer, library, texts = smollm2
    rng = random.Random(seed)
    m = llguidance.LLMatcher(library, llguidance.grammar_from("lark", lark), log_level=0)
    assert not m.is_error(), m.get_error()
    opener = rng.choice(OPENERS[fmt]) + (HERMES_OPEN if fmt is ToolFormat.DEFAULT else "")
    out = tokenizer.encode(opener, add_special_tokens=False)
    assert m.consume_tokens(out)
    eos = set(tokenizer.eos_token_ids)
    for _ in range(3000):
        if m.is_stopped():
            break
        bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint32)
        allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
        allowed = [int(t) for t in allowed if t < len(texts)]
        assert allowed, "the grammar left no token"
        if eos & set(allowed):
            break  # the call is whole; the answer may end here
        closing = [t for t in allowed if any(c in texts[t] for c in CLOSERS)]
        token = rng.choice(closing if closing and rng.random() < 0.6 else allowed)
        assert m.consume_token(token)
        out.append(token)
    else:
        pytest.fail("the walk did not end in 3000 tokens")
    return tokenizer.decode(out)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tools=TOOLS, seed=st.integers(0, 2**32 - 1), fmt=st.sampled_from(list(OPENERS)))
def test_an_auto_call_always_validates_against_its_tools_schema(
    smollm2: tuple[Tokenizer, llguidance.LLTokenizer, list[str]],
    tools: list[tuple[str, dict[str, Any]]],
    seed: int,
    fmt: ToolFormat,
) -> None:
    lark = auto_grammar(fmt, tools, parallel=False, special={}, lenient=False)
    text = walk(smollm2, lark, seed, fmt)
    parsed = parse_calls(text, fmt)
    assert len(parsed.calls) == 1, text
    call = parsed.calls[0]
    schema = dict(tools)[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
