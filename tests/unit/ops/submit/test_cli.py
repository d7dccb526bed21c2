"""`tokenmill submit PROMPT`: the request its options make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from messages.structured_output import StructuredOutput
from ops.submit.cli import _check_embed_options, _embed_request, _prompt_request


def options(**given: Any) -> dict[str, Any]:
    none = dict.fromkeys(("max_new_tokens", "temperature", "seed", "choices", "model", "logprobs"))
    return {"prompt": "Hi", "chat": False, **none, **given}


def test_a_prompt_alone_keeps_the_wire_defaults() -> None:
    request = _prompt_request(options())
    assert (request.prompt, request.n, request.seed, request.temperature) == ("Hi", 1, None, 0.0)
    assert request.id.startswith("submit-")


def test_logprobs_are_asked_only_when_given() -> None:
    assert _prompt_request(options()).logprobs is None
    assert _prompt_request(options(logprobs=0)).logprobs == 0
    assert _prompt_request(options(logprobs=5)).logprobs == 5


def test_prompt_logprobs_are_asked_only_when_given() -> None:
    assert _prompt_request(options()).prompt_logprobs is None
    scoring = _prompt_request(options(prompt_logprobs=2, max_new_tokens=0))
    assert (scoring.prompt_logprobs, scoring.max_new_tokens) == (2, 0)


def test_a_regex_a_choice_or_a_grammar_file_is_the_structured_output(tmp_path: Path) -> None:
    assert _prompt_request(options()).structured_output is None
    regex = _prompt_request(options(regex="[0-9]+")).structured_output
    assert regex == StructuredOutput(regex="[0-9]+")
    choice = _prompt_request(options(choice=("yes", "no"))).structured_output
    assert choice == StructuredOutput(choice=["yes", "no"])
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "a"+\n')
    lark = _prompt_request(options(grammar=str(grammar))).structured_output
    assert lark == StructuredOutput(grammar='start: "a"+\n')
    with pytest.raises(click.UsageError, match="give one of --regex, --choice, --grammar"):
        _prompt_request(options(regex="a", choice=("a",)))


def test_n_seed_and_temperature_are_carried() -> None:
    request = _prompt_request(options(choices=4, seed=7, temperature=0.8, chat=True))
    assert (request.n, request.seed, request.temperature) == (4, 7, 0.8)
    assert request.messages is not None and request.messages[0].content == "Hi"


def test_penalties_and_logit_bias_are_carried_only_when_given() -> None:
    plain = _prompt_request(options())
    assert (plain.presence_penalty, plain.repetition_penalty, plain.logit_bias) == (0.0, 1.0, {})
    request = _prompt_request(
        options(
            presence_penalty=0.5,
            frequency_penalty=-1.0,
            repetition_penalty=1.2,
            min_p=0.1,
            min_tokens=3,
            logit_bias=("50256=-100", "7=2.5"),
        )
    )
    assert (request.presence_penalty, request.frequency_penalty) == (0.5, -1.0)
    assert (request.repetition_penalty, request.min_p, request.min_tokens) == (1.2, 0.1, 3)
    assert request.logit_bias == {50256: -100.0, 7: 2.5}
    with pytest.raises(click.BadParameter, match="TOKEN=BIAS"):
        _prompt_request(options(logit_bias=("seven=1",)))


# --- --embed ----------------------------------------------------------------------------------


def embed_options(**given: Any) -> dict[str, Any]:
    none = dict.fromkeys(("dimensions", "prompt_name", "truncate", "encoding_format", "model"))
    return {"prompt": "Kafka", "jobs_file": None, "embed": True, "stream": False, "chat": False,
            **none, **given}  # fmt: skip


def test_embed_sends_the_prompt_as_an_embed_request_with_its_options() -> None:
    from messages.embedding import EmbedRequest

    plain = _embed_request(embed_options())
    assert isinstance(plain, EmbedRequest) and plain.id.startswith("submit-")
    assert (plain.input, plain.dimensions, plain.truncate, plain.encoding_format) == (
        "Kafka", None, "none", "float",
    )  # fmt: skip
    given = _embed_request(
        embed_options(
            dimensions=128,
            prompt_name="query",
            truncate="end",
            model="eg",
            encoding_format="base64",
        )
    )
    assert (given.dimensions, given.prompt_name, given.truncate) == (128, "query", "end")
    assert (given.model, given.encoding_format) == ("eg", "base64")


def test_embed_options_only_with_embed_and_a_prompt() -> None:
    _check_embed_options(embed_options(dimensions=8))
    with pytest.raises(click.UsageError, match="--dimensions: only with --embed"):
        _check_embed_options(embed_options(embed=False, dimensions=8))
    with pytest.raises(click.UsageError, match="--prompt-name: only with --embed and a PROMPT"):
        _check_embed_options(embed_options(prompt=None, jobs_file="j", prompt_name="query"))
    with pytest.raises(click.UsageError, match="no --stream nor --chat"):
        _check_embed_options(embed_options(stream=True))


def test_a_jobs_file_line_with_input_is_an_embed_request(tmp_path: Path) -> None:
    from messages.embedding import EmbedRequest
    from messages.request import GenerateRequest
    from ops.submit.client import read_jobs

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        '{"id": "e1", "input": ["a", "b"], "dimensions": 64}\n'
        '{"id": "g1", "prompt": "Hi"}\n'
        '{"id": "g2", "prompt": "Hi", "input": "x"}\n'  # a prompt: a generation
        '{"input": "no id"}\n'
    )
    e1, g1, g2, anonymous = read_jobs(jobs)
    assert isinstance(e1, EmbedRequest) and (e1.input, e1.dimensions) == (["a", "b"], 64)
    assert isinstance(g1, GenerateRequest) and isinstance(g2, GenerateRequest)
    assert isinstance(anonymous, EmbedRequest) and anonymous.id.startswith("job-")
    forced = read_jobs(jobs, embed=True)
    assert all(isinstance(r, EmbedRequest) for r in forced)
    jobs.write_text('{"input": 5}\n')
    with pytest.raises(ValueError, match=r"jobs\.jsonl:1"):
        read_jobs(jobs)
