"""ModelFront: model names, tokenization (prompt, token ids, chat) and the model's limits.

A real `gpu.loading.tokenizer.Tokenizer` read from an HF folder: the tiny byte-level BPE the tiny
checkpoints use (trained in milliseconds), with a BOS post-processor so special tokens show,
and a ChatML template in `tokenizer_config.json` for the chat cases.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tokenizers import processors

from actors.ingest.model_front import ModelFront
from gpu.engine_config import EngineConfig
from gpu.loading.tokenizer import Tokenizer
from messages.error_codes import ErrorCode
from messages.errors import InvalidRequest
from messages.request import ChatMessage, GenerateRequest
from messages.result import ModelRef
from tests.tiny_models import SPECIAL, train_tokenizer

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT = [
    ChatMessage(role="system", content="You are terse."),
    ChatMessage(role="user", content="The quick brown fox?"),
]
DIGEST = "sha256:" + "ab" * 32
MAX_MODEL_LEN = 128
MAX_PROMPT_TOKENS = 96
MAX_NEW_TOKENS = 80


def write_tokenizer_folder(folder: Path, chat_template: str | None) -> Path:
    inner = train_tokenizer()
    bos = inner.token_to_id(SPECIAL)
    inner.add_special_tokens([IM_START, IM_END])  # whole tokens, as in SmolLM2's vocabulary
    inner.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL} $A", special_tokens=[(SPECIAL, bos)]
    )
    folder.mkdir(parents=True)
    inner.save(str(folder / "tokenizer.json"))
    config: dict[str, str] = {"bos_token": SPECIAL, "eos_token": SPECIAL}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_hf_folder(
        write_tokenizer_folder(tmp_path_factory.mktemp("chat") / "t", CHATML)
    )


@pytest.fixture(scope="module")
def plain_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = write_tokenizer_folder(tmp_path_factory.mktemp("plain") / "t", None)
    return Tokenizer.from_hf_folder(folder)


def front_of(tok: Tokenizer, **limits: int) -> ModelFront:
    return ModelFront(
        name="tiny-llama",
        digest=DIGEST,
        aliases=frozenset({"tiny-llama", DIGEST}),
        tokenizer=tok,
        vocab_size=tok.vocab_size,
        max_model_len=limits.get("max_model_len", MAX_MODEL_LEN),
        max_prompt_tokens=limits.get("max_prompt_tokens", MAX_PROMPT_TOKENS),
        max_new_tokens=limits.get("max_new_tokens", MAX_NEW_TOKENS),
    )


@pytest.fixture(scope="module")
def front(tokenizer: Tokenizer) -> ModelFront:
    return front_of(tokenizer)


def request(**fields: Any) -> GenerateRequest:
    fields.setdefault("id", "r1")
    fields.setdefault("max_new_tokens", 4)
    if not {"prompt", "prompt_token_ids", "messages"} & fields.keys():
        fields["prompt"] = "The quick brown fox"
    return GenerateRequest(**fields)


def refused(front: ModelFront, req: GenerateRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        front.prompt_tokens(req)
    assert info.value.message
    return info.value


# --- model names -----------------------------------------------------------------------------


def test_unknown_model_is_refused(front: ModelFront) -> None:
    error = refused(front, request(model="llama-70b"))
    assert error.code is ErrorCode.UNKNOWN_MODEL
    assert "'llama-70b'" in error.message and "'tiny-llama'" in error.message


@pytest.mark.parametrize("model", [None, "tiny-llama", DIGEST])
def test_known_names_are_accepted(front: ModelFront, model: str | None) -> None:
    assert front.prompt_tokens(request(model=model))


def test_aliases_of_an_engine(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """The name it was loaded as, the weights' digest, the file's name with and without suffix."""
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    engine = SimpleNamespace(
        model=SimpleNamespace(
            name="smollm2-135m",
            digest=DIGEST,
            path=path,
            tokenizer=tokenizer,
            config=SimpleNamespace(vocab_size=tokenizer.vocab_size),
        ),
        max_model_len=128,
        config=EngineConfig(max_new_tokens=100),
    )
    front = ModelFront.of_engine(engine)
    assert front.aliases == {
        "smollm2-135m",
        DIGEST,
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct.Q4_1",
    }
    for alias in front.aliases:
        assert front.prompt_tokens(request(model=alias))
    assert refused(front, request(model="smollm2")).code is ErrorCode.UNKNOWN_MODEL
    assert front.ref == ModelRef(name="smollm2-135m", digest=DIGEST)
    assert (front.max_prompt_tokens, front.max_new_tokens) == (127, 100)  # max_model_len - 1
    capped = ModelFront.of_engine(
        SimpleNamespace(**{**vars(engine), "config": EngineConfig(max_prompt_tokens=50)})
    )
    assert capped.max_prompt_tokens == 50


# --- tokenization ----------------------------------------------------------------------------


def test_plain_prompt_tokens_are_the_tokenizers(front: ModelFront, tokenizer: Tokenizer) -> None:
    prompt = "Kafka topics carry generation jobs"
    ids = front.prompt_tokens(request(prompt=prompt))
    assert ids == tokenizer.encode(prompt)
    assert ids[0] == tokenizer.inner.token_to_id(SPECIAL)  # special tokens added, as generate does


def test_prompt_token_ids_pass_through(front: ModelFront) -> None:
    ids = [0, 5, front.vocab_size - 1]
    assert front.prompt_tokens(request(prompt_token_ids=ids)) == ids


@pytest.mark.parametrize("bad_offset", [0, 1000])
def test_token_ids_past_the_vocabulary(front: ModelFront, bad_offset: int) -> None:
    bad = front.vocab_size + bad_offset
    error = refused(front, request(prompt_token_ids=[1, bad, 2]))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert f"token id {bad} " in error.message and f"[0, {front.vocab_size})" in error.message


def test_logit_bias_ids_are_checked_against_the_models_vocabulary(front: ModelFront) -> None:
    assert front.prompt_tokens(request(logit_bias={front.vocab_size - 1: -100.0}))
    error = refused(front, request(logit_bias={1: 2.0, front.vocab_size: -100.0}))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY and "logit_bias" in error.message


def test_negative_token_ids(front: ModelFront) -> None:
    error = refused(front, request(prompt_token_ids=[3, -1]))
    assert error.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY


def test_chat_messages_use_the_chat_template(front: ModelFront, tokenizer: Tokenizer) -> None:
    ids = front.prompt_tokens(request(messages=CHAT))
    chat = [{"role": m.role, "content": m.content} for m in CHAT]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert text.startswith(SPECIAL + "<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n")
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    bos, im_start = tokenizer.encode(SPECIAL + IM_START, add_special_tokens=False)
    assert ids.count(bos) == 1 and ids[0] == bos  # the template's BOS, not a second one
    assert ids[1] == im_start and ids.count(im_start) == 3  # system, user, assistant


def test_no_chat_template_refuses_messages(plain_tokenizer: Tokenizer) -> None:
    front = front_of(plain_tokenizer)
    error = refused(front, request(messages=CHAT))
    assert error.code is ErrorCode.INVALID_PROMPT
    assert "no chat template" in error.message and "`prompt`" in error.message
    assert front.prompt_tokens(request(prompt="The quick brown fox"))  # a prompt still works


# --- limits ----------------------------------------------------------------------------------


def test_prompt_at_the_limit_is_accepted(front: ModelFront) -> None:
    ids = [7] * MAX_PROMPT_TOKENS
    assert front.prompt_tokens(request(prompt_token_ids=ids, max_new_tokens=1)) == ids


def test_prompt_too_long(front: ModelFront, tokenizer: Tokenizer) -> None:
    error = refused(front, request(prompt_token_ids=[7] * (MAX_PROMPT_TOKENS + 1)))
    assert error.code is ErrorCode.PROMPT_TOO_LONG
    assert f"{MAX_PROMPT_TOKENS + 1} tokens" in error.message
    assert f"the limit is {MAX_PROMPT_TOKENS}" in error.message
    text = "The quick brown fox jumps over the lazy dog. " * 20
    assert len(tokenizer.encode(text)) > MAX_PROMPT_TOKENS
    assert refused(front, request(prompt=text)).code is ErrorCode.PROMPT_TOO_LONG


def test_max_new_tokens_0_only_to_score_a_prompt(front: ModelFront) -> None:
    assert front.prompt_tokens(
        request(prompt_token_ids=[1, 2], max_new_tokens=0, prompt_logprobs=0)
    )
    error = refused(front, request(prompt_token_ids=[1, 2], max_new_tokens=0))
    assert error.code is ErrorCode.INVALID_MAX_TOKENS


def test_max_new_tokens_over_the_cap(front: ModelFront) -> None:
    assert front.prompt_tokens(request(prompt_token_ids=[1], max_new_tokens=MAX_NEW_TOKENS))
    error = refused(front, request(prompt_token_ids=[1], max_new_tokens=MAX_NEW_TOKENS + 1))
    assert error.code is ErrorCode.MAX_TOKENS_TOO_LARGE
    assert f"over the limit of {MAX_NEW_TOKENS}" in error.message


def test_max_new_tokens_over_the_remaining_context(front: ModelFront) -> None:
    prompt = [1] * 60  # 128 - 60 = 68 positions left, under the cap of 80
    assert front.prompt_tokens(request(prompt_token_ids=prompt, max_new_tokens=68))
    error = refused(front, request(prompt_token_ids=prompt, max_new_tokens=69))
    assert error.code is ErrorCode.MAX_TOKENS_TOO_LARGE
    assert "at most 68 new tokens fit" in error.message
    assert f"max_model_len {MAX_MODEL_LEN}" in error.message


def test_a_prompt_of_no_tokens_is_empty(front: ModelFront) -> None:
    error = refused(front, request(prompt_token_ids=[]))
    assert error.code is ErrorCode.EMPTY_PROMPT


def test_the_model_check_comes_first(front: ModelFront) -> None:
    error = refused(front, request(model="other", prompt_token_ids=[10**9], max_new_tokens=10**6))
    assert error.code is ErrorCode.UNKNOWN_MODEL
