"""ModelFront and the fields a request leaves to the model or to the chat template:
`model_defaults` filled from the model's limits and recommended sampling, the prompt cut to
`truncate_prompt_tokens`, and the template's `add_generation_prompt`, `continue_final_message`
and `chat_template_kwargs`. The real tokenizer of `test_model_front`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from actors.ingest.model_front import ModelFront
from gpu.engine_config import EngineConfig
from gpu.loading.sampling_defaults import SamplingDefaults, read_sampling_defaults
from gpu.loading.tokenizer import Tokenizer
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.request import ChatMessage, GenerateRequest
from tests.unit.actors.ingest.test_model_front import (
    CHATML,
    IM_END,
    MAX_MODEL_LEN,
    MAX_NEW_TOKENS,
    front_of,
    request,
    write_tokenizer_folder,
)

ALL = ["max_new_tokens", "temperature", "top_p", "top_k"]
# A template that reads a variable of its own, as Qwen3's reads `enable_thinking`.
THINKING = (
    CHATML + "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = write_tokenizer_folder(tmp_path_factory.mktemp("chat") / "t", THINKING)
    return Tokenizer.from_hf_folder(folder)


@pytest.fixture(scope="module")
def front(tokenizer: Tokenizer) -> ModelFront:
    return front_of(tokenizer)


def chat(*turns: tuple[str, str], **fields: object) -> GenerateRequest:
    messages = [ChatMessage(role=r, content=c) for r, c in turns or [("user", "Hi there")]]
    return request(messages=messages, **fields)


# --- model_defaults --------------------------------------------------------------------------


def test_an_omitted_length_runs_to_the_worker_s_limit(front: ModelFront) -> None:
    asked = request(model_defaults=["max_new_tokens"], max_new_tokens=16)
    front.prompt_tokens(asked)
    assert asked.max_new_tokens == MAX_NEW_TOKENS


def test_an_omitted_length_stops_at_the_context_s_end(front: ModelFront) -> None:
    asked = request(prompt_token_ids=[5] * 70, model_defaults=["max_new_tokens"])
    ids = front.prompt_tokens(asked)
    assert len(ids) + asked.max_new_tokens == MAX_MODEL_LEN < len(ids) + MAX_NEW_TOKENS


def test_a_given_length_is_kept(front: ModelFront) -> None:
    asked = request(max_new_tokens=5, model_defaults=["temperature"])
    front.prompt_tokens(asked)
    assert asked.max_new_tokens == 5


def test_omitted_sampling_takes_openai_s_defaults_when_the_model_recommends_none(
    front: ModelFront,
) -> None:
    asked = request(model_defaults=ALL)
    front.prompt_tokens(asked)
    assert (asked.temperature, asked.top_p, asked.top_k) == (1.0, 1.0, 0)


def test_omitted_sampling_takes_the_model_s_recommendation(front: ModelFront) -> None:
    recommending = dataclasses.replace(
        front, sampling_defaults=SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20)
    )
    asked = request(model_defaults=ALL, temperature=0.3)
    recommending.prompt_tokens(asked)
    assert (asked.temperature, asked.top_p, asked.top_k) == (0.6, 0.95, 20)
    given = request(temperature=0.3, model_defaults=["top_p"])
    recommending.prompt_tokens(given)
    assert (given.temperature, given.top_p, given.top_k) == (0.3, 0.95, 0)


def test_filling_again_is_the_same(front: ModelFront) -> None:
    asked = request(model_defaults=ALL)
    first = front.prompt_tokens(asked)
    filled = (asked.max_new_tokens, asked.temperature, asked.top_p, asked.top_k)
    assert front.prompt_tokens(asked) == first
    assert (asked.max_new_tokens, asked.temperature, asked.top_p, asked.top_k) == filled


def test_without_model_defaults_the_wire_s_values_run(front: ModelFront) -> None:
    asked = request()
    front.prompt_tokens(asked)
    assert (asked.max_new_tokens, asked.temperature, asked.top_k) == (4, 0.0, 0)


# --- the model's recommendation, read from its files -----------------------------------------


def test_generation_config_json_is_read(tmp_path: Path) -> None:
    config = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "do_sample": True}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    assert read_sampling_defaults(tmp_path) == SamplingDefaults(0.7, 0.8, 20)


def test_a_folder_without_generation_config_recommends_nothing(tmp_path: Path) -> None:
    assert read_sampling_defaults(tmp_path) == SamplingDefaults()


@pytest.mark.parametrize("text", ["{not json", '{"temperature": "hot", "top_k": 1.5}', "[1]"])
def test_a_malformed_recommendation_is_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "generation_config.json").write_text(text)
    assert read_sampling_defaults(tmp_path) == SamplingDefaults()


def test_an_engine_s_front_reads_its_model_folder(tokenizer: Tokenizer, tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.5}))
    engine = SimpleNamespace(
        model=SimpleNamespace(
            name="m",
            digest="d",
            path=tmp_path,
            tokenizer=tokenizer,
            config=SimpleNamespace(vocab_size=tokenizer.vocab_size),
        ),
        max_model_len=128,
        config=EngineConfig(max_new_tokens=32),
    )
    assert ModelFront.of_engine(engine).sampling_defaults.temperature == 0.5


# --- truncate_prompt_tokens ------------------------------------------------------------------


def test_truncation_keeps_the_last_tokens(front: ModelFront) -> None:
    whole = front.prompt_tokens(request())
    assert front.prompt_tokens(request(truncate_prompt_tokens=3)) == whole[-3:]
    assert front.prompt_tokens(request(truncate_prompt_tokens=500)) == whole


def test_truncation_saves_a_prompt_over_the_limit(front: ModelFront) -> None:
    ids = list(range(5, 5 + 120))
    with pytest.raises(InvalidRequest) as info:
        front.prompt_tokens(request(prompt_token_ids=ids))
    assert info.value.code is ErrorCode.PROMPT_TOO_LONG
    kept = front.prompt_tokens(request(prompt_token_ids=ids, truncate_prompt_tokens=-1))
    assert kept == ids[-front.max_prompt_tokens :]


# --- the chat template -----------------------------------------------------------------------


def text_of(front: ModelFront, asked: GenerateRequest) -> str:
    return front.tokenizer.decode(front.prompt_tokens(asked), skip_special_tokens=False)  # type: ignore[attr-defined]


def test_without_a_generation_prompt_the_assistant_s_turn_is_not_opened(
    front: ModelFront,
) -> None:
    opened = text_of(front, chat())
    closed = text_of(front, chat(add_generation_prompt=False))
    assert opened.endswith("<|im_start|>assistant\n") and closed.endswith(f"{IM_END}\n")


def test_continuing_the_final_message_leaves_it_open(front: ModelFront) -> None:
    asked = chat(
        ("user", "Name a fox."),
        ("assistant", "The quick brown"),
        add_generation_prompt=False,
        continue_final_message=True,
    )
    text = text_of(front, asked)
    assert text.endswith("The quick brown") and IM_END not in text.split("assistant")[-1]


def test_template_kwargs_reach_the_template(front: ModelFront) -> None:
    assert "<nothink>" in text_of(front, chat(chat_template_kwargs={"enable_thinking": False}))
    assert "<nothink>" not in text_of(front, chat())


def test_template_kwargs_cannot_replace_the_messages(front: ModelFront) -> None:
    asked = chat(chat_template_kwargs={"messages": [], "add_generation_prompt": False})
    assert text_of(front, asked) == text_of(front, chat())


def test_a_template_that_does_not_write_the_content_cannot_continue_it(
    tmp_path: Path,
) -> None:
    hiding = "{% for m in messages %}[{{ m['role'] }}]{% endfor %}"
    tok = Tokenizer.from_hf_folder(write_tokenizer_folder(tmp_path / "t", hiding))
    asked = chat(add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(ValueError, match="continue_final_message"):
        front_of(tok).prompt_tokens(asked)


def test_the_chatml_template_is_unchanged_by_the_defaults(tmp_path: Path) -> None:
    tok = Tokenizer.from_hf_folder(write_tokenizer_folder(tmp_path / "t", CHATML))
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages) == tok.apply_chat_template(
        messages, add_generation_prompt=True, continue_final_message=False, template_kwargs={}
    )
