"""`tokenmill gateway` as the clients people already use call it, unchanged: LangChain's
`ChatOpenAI`, LiteLLM (`openai/` models with an `api_base`) and the official `openai` SDK,
against the session broker and a real SmolLM2 worker (tests/integration/gateway_fleet.py).
The gateway serves in this event loop, so every client is used through its async API.

Greedy requests (`temperature=0`, said each time: an omitted temperature is the model's
default sampling, not greedy) make a streamed answer joinable into the plain one.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from messages.openai_batch import CHAT_COMPLETIONS_URL, COMPLETIONS_URL
from tests.integration.gateway_fleet import KEY, MODEL, Fleet, client, direct_text, gateway

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
AT_LENGTH = "Explain in detail how photosynthesis works, step by step."
PROMPT = "The three primary colors are"
GREEDY_ASK = {"messages": QUESTION, "max_tokens": 12, "temperature": 0}
GREEDY_CHAT = {"model": MODEL, **GREEDY_ASK}
GREEDY_TEXT = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0}


@contextlib.asynccontextmanager
async def chat_model(base: str, **options: Any) -> AsyncIterator[ChatOpenAI]:
    """`ChatOpenAI` for the gateway at `base`, on an HTTP client closed after the block (its
    default one is cached for the process and never closed: a socket left to the collector)."""
    async with httpx.AsyncClient(timeout=300) as http:
        yield ChatOpenAI(
            model=MODEL, base_url=base, api_key=KEY, max_retries=0, http_async_client=http,
            **options,
        )  # fmt: skip


# ----------------------------------------------------------------------------- LangChain


async def test_langchain_without_max_tokens_is_not_cut_at_16_tokens(fleet: Fleet) -> None:
    async with gateway(fleet) as base, chat_model(base, temperature=0) as model:
        answer = await model.ainvoke(AT_LENGTH)
    usage = answer.usage_metadata
    assert usage is not None
    finish = answer.response_metadata["finish_reason"]
    assert finish == "stop" or usage["output_tokens"] > 16, (finish, usage, answer.content)


async def test_langchain_stream_joins_to_the_invoked_answer(fleet: Fleet) -> None:
    want = await direct_text(
        fleet,
        CHAT_COMPLETIONS_URL,
        {"model": MODEL, "messages": QUESTION, "max_tokens": 24, "temperature": 0},
    )
    async with gateway(fleet) as base, chat_model(base, temperature=0, max_tokens=24) as model:
        invoked = await model.ainvoke(QUESTION)
        streamed = [chunk async for chunk in model.astream(QUESTION)]
    assert invoked.content == want
    assert len(streamed) > 1  # a stream, not one answer
    assert "".join(str(chunk.content) for chunk in streamed) == want


@tool
def get_weather(city: str) -> str:
    """The weather now in `city`."""
    return f"18 degrees and sunny in {city}"


async def test_langchain_bind_tools_loop_calls_gets_the_result_and_answers(fleet: Fleet) -> None:
    """An agent's loop: a call (forced on the first turn: a 135M model may not choose one),
    the tool's result sent back, then the answer with the tools still bound (`auto`). Strict
    schemas: the arguments hold the tool's properties only (else a tiny model adds its own)."""
    history: list[Any] = [HumanMessage("What is the weather in Paris? Use the tool.")]
    async with gateway(fleet) as base, chat_model(base, temperature=0, max_tokens=256) as model:
        called = await model.bind_tools(
            [get_weather], tool_choice="get_weather", strict=True
        ).ainvoke(history)
        assert isinstance(called, AIMessage)
        assert len(called.tool_calls) == 1, (called.content, called.response_metadata)
        [call] = called.tool_calls
        assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
        history += [called, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
        answer = await model.bind_tools([get_weather], strict=True).ainvoke(history)
    assert isinstance(answer, AIMessage)
    assert not answer.tool_calls and str(answer.content).strip()


# ------------------------------------------------------------------------------- LiteLLM


@pytest.fixture(scope="module")
def litellm() -> Iterator[ModuleType]:
    """LiteLLM, offline but for the gateway: its bundled model cost map instead of fetching
    one at import, and none of the catalogs, checks or tokenizers it fetches on its own."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        env.setenv("LITELLM_OFFLINE_MODE", "true")
        yield importlib.import_module("litellm")


def litellm_options(base: str, api: openai.AsyncOpenAI) -> dict[str, Any]:
    """The gateway as an `openai/` model with an `api_base`. `client`: the SDK client LiteLLM
    calls it with, ours so that it is closed (LiteLLM makes a new one for each text
    completion and never closes it)."""
    return {
        "model": f"openai/{MODEL}", "api_base": base, "api_key": KEY, "num_retries": 0,
        "client": api,
    }  # fmt: skip


async def test_litellm_completion_plain_and_streamed(fleet: Fleet, litellm: ModuleType) -> None:
    want = await direct_text(fleet, CHAT_COMPLETIONS_URL, GREEDY_CHAT)
    async with gateway(fleet) as base, client(base) as api:
        ask = litellm_options(base, api) | GREEDY_ASK
        plain = await litellm.acompletion(**ask)
        stream = await litellm.acompletion(**ask, stream=True)
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
    assert plain.choices[0].message.content == want
    assert plain.choices[0].finish_reason in ("stop", "length")
    assert "".join(pieces) == want


async def test_litellm_text_completion_plain(fleet: Fleet, litellm: ModuleType) -> None:
    want = await direct_text(fleet, COMPLETIONS_URL, {"model": MODEL, **GREEDY_TEXT})
    async with gateway(fleet) as base, client(base) as api:
        plain = await litellm.atext_completion(**litellm_options(base, api), **GREEDY_TEXT)
    assert plain.choices[0].text == want


async def test_litellm_text_completion_stream_joins(fleet: Fleet, litellm: ModuleType) -> None:
    want = await direct_text(fleet, COMPLETIONS_URL, {"model": MODEL, **GREEDY_TEXT})
    async with gateway(fleet) as base, client(base) as api:
        stream = await litellm.atext_completion(
            **litellm_options(base, api), **GREEDY_TEXT, stream=True
        )
        chunks = [chunk async for chunk in stream]
    # LiteLLM's stream wrapper ends with a finish chunk of its own, text None, even though the
    # gateway's last chunk carries the last text and the finish together (test_gateway checks
    # the gateway's own chunks): what a LiteLLM user joins must allow for it.
    assert "".join(chunk.choices[0].text or "" for chunk in chunks) == want


# --------------------------------------------------------------------- the openai SDK


async def test_sdk_chat_without_max_tokens_is_not_cut_at_16_tokens(fleet: Fleet) -> None:
    async with gateway(fleet) as base, client(base) as api:
        answer = await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": AT_LENGTH}], temperature=0
        )
    [choice] = answer.choices
    assert answer.usage is not None
    tokens = answer.usage.completion_tokens
    assert choice.finish_reason == "stop" or tokens > 16, (choice.finish_reason, tokens)


async def test_sdk_unknown_field_is_ignored_and_named_in_a_header(fleet: Fleet) -> None:
    want = await direct_text(fleet, CHAT_COMPLETIONS_URL, GREEDY_CHAT)
    async with gateway(fleet) as base, client(base) as api:
        raw = await api.chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, extra_body={"foo_bar": 1}
        )
    assert "foo_bar" in raw.headers["x-tokenmill-ignored-fields"]
    assert raw.parse().choices[0].message.content == want
