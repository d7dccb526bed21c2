"""The copy workload: every prompt well-formed, the kinds mixed in any count, and requests made
through the model's chat template (a fake tokenizer: no model)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from ops.bench.copy_prompts import KINDS, PROMPTS
from ops.bench.copy_workload import copy_prompts, copy_requests, describe_copy

FENCE = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def test_there_are_24_distinct_prompts_four_of_each_kind() -> None:
    assert len(PROMPTS) == 24
    assert len({p.text for p in PROMPTS}) == 24
    assert {k: sum(p.kind == k for p in PROMPTS) for k in KINDS} == dict.fromkeys(KINDS, 4)


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"{p.kind}:{p.text[:30]}")
def test_every_prompt_is_an_instruction_then_the_material_to_copy(prompt: Any) -> None:
    instruction, blank, *material = prompt.text.split("\n")
    assert prompt.text == prompt.text.strip()
    assert instruction.endswith((".", ":")) and blank == ""
    assert len("\n".join(material)) >= 120  # a long span for the answer to copy
    assert prompt.text.count("```") % 2 == 0  # fences paired


def test_the_code_in_the_prompts_is_what_it_says() -> None:
    blocks = [m.groups() for p in PROMPTS for m in FENCE.finditer(p.text)]
    assert {lang for lang, _ in blocks} == {"python", "javascript"}
    for lang, code in blocks:
        if lang == "python":
            compile(code, "<prompt>", "exec")  # the bugs are in behaviour, not syntax


def test_the_json_and_csv_to_reformat_parse() -> None:
    (to_yaml,) = [p for p in PROMPTS if p.text.startswith("Convert this JSON")]
    assert json.loads(to_yaml.text.split("\n\n", 1)[1])["server"]["port"] == 8080
    (csv,) = [p for p in PROMPTS if p.text.startswith("Convert this CSV")]
    rows = csv.text.split("\n\n", 1)[1].split("\n")
    assert len({len(r.split(",")) for r in rows}) == 1 and len(rows) == 9


def test_any_count_of_prompts_takes_the_kinds_in_turn() -> None:
    assert [p.kind for p in copy_prompts(8)] == [*KINDS, *KINDS[:2]]
    assert sorted(copy_prompts(), key=PROMPTS.index) == list(PROMPTS)
    assert len(copy_prompts(100)) == 24


class _Tokenizer:
    chat_template = "{{ fake }}"

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        (message,) = messages
        return f"<user>{message['content']}<assistant>"

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        assert not add_special_tokens  # the template holds them
        return [[ord(c) % 100 for c in text[:40]] for text in texts]


def _engine(max_model_len: int = 512, template: str | None = "{{ fake }}") -> Any:
    tokenizer = _Tokenizer()
    tokenizer.chat_template = template  # type: ignore[assignment]
    return SimpleNamespace(
        model=SimpleNamespace(name="fake", tokenizer=tokenizer), max_model_len=max_model_len
    )


def test_requests_are_greedy_and_stop_at_eos() -> None:
    requests = copy_requests(_engine(), 6, 64)
    assert [r.request_id for r in requests] == [f"copy-{i}" for i in range(6)]
    for r, p in zip(requests, copy_prompts(6), strict=True):
        assert r.prompt_token_ids == [ord(c) % 100 for c in f"<user>{p.text}"[:40]]
        assert r.params.temperature == 0 and not r.params.ignore_eos
        assert r.params.max_new_tokens == 64
    described = describe_copy(requests)
    assert described["name"] == "copy" and described["requests"] == 6
    assert described["kinds"] == dict.fromkeys(KINDS, 1)
    assert described["prompt_tokens"] == 6 * 40 and described["max_new_tokens"] == 64


def test_requests_need_a_chat_template_and_room() -> None:
    with pytest.raises(ValueError, match="no chat template"):
        copy_requests(_engine(template=None), None, 64)
    with pytest.raises(ValueError, match="max_model_len 100"):
        copy_requests(_engine(max_model_len=100), None, 64)
