"""Structured output's pure parts and the engine's use of them, on the tiny random llama:
JSON schemas, regexes, choices and Lark/GBNF grammars.

Random weights make the point: whatever the logits, the mask alone keeps the output on the
grammar, so every output that stops parses and validates; the schemas bound every string,
number and array, so every one of them stops well within its token budget.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from gpu.engine import Engine, EngineRequest
from gpu.engine_config import EngineConfig
from gpu.errors import RequestRejected
from gpu.grammar.compiler import GrammarCompiler
from gpu.grammar.mask import StepMask, TokenMasks, banned_bits_table, expand_banned
from gpu.loading.loader import LoadedModel, load_model
from gpu.sampling import sample
from gpu.sequence import Constraint, SamplingParams
from messages.error_codes import ErrorCode
from ops.models.offline import run_all
from tests.unit.gpu.test_engine import CHUNKY, random_prompts

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -9, "maximum": 9},
                    "y": {"type": "integer", "minimum": -9, "maximum": 9},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["point", "ok"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"enum": ["red", "green", "blue"]},
        "minItems": 1,
        "maxItems": 3,
    },
    "enum": {"enum": ["yes", "no", 3, None]},
    "required": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"const": "fixed"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "number": {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
}


def constraint(schema: dict[str, Any], strict: bool = True) -> Constraint:
    return Constraint.json(json.dumps(schema, separators=(",", ":")), strict)


def constrained(schema: dict[str, Any], **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=48, constraint=constraint(schema), **kw)


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoints: dict[str, Path]) -> LoadedModel:
    return load_model(tiny_checkpoints["llama"])


@pytest.fixture(scope="module")
def compiler(tiny_llama: LoadedModel) -> GrammarCompiler:
    m = tiny_llama
    return GrammarCompiler(m.tokenizer, m.config.vocab_size, m.eos_token_ids)


def encode(model: LoadedModel, text: str) -> list[int]:
    return model.tokenizer.encode(text, add_special_tokens=False)


# -- the matcher ------------------------------------------------------------------------------


def test_a_matcher_accepts_its_json_and_terminates(
    tiny_llama: LoadedModel, compiler: GrammarCompiler
) -> None:
    matcher = compiler.matcher(constraint(SCHEMAS["pattern"]))
    tokens = encode(tiny_llama, '{"code":"ABC-12"}')
    for n in range(1, len(tokens)):
        matcher.advance(tokens[:n])
        assert not matcher.is_terminated and matcher.failed is None
    matcher.advance(tokens)
    assert matcher.is_terminated and matcher.failed is None


def test_advancing_again_to_the_same_tokens_changes_nothing(
    tiny_llama: LoadedModel, compiler: GrammarCompiler
) -> None:
    """A preempted sequence keeps its output: the engine's advance after the recompute sees
    the tokens it has seen, and must neither consume them twice nor roll back."""
    matcher = compiler.matcher(constraint(SCHEMAS["pattern"]))
    tokens = encode(tiny_llama, '{"code":"AB')
    matcher.advance(tokens)
    matcher.advance(tokens)
    matcher.advance(list(tokens))
    assert matcher.num_accepted == len(tokens) and matcher.failed is None
    rest = encode(tiny_llama, 'C-12"}')
    matcher.advance(tokens + rest)
    assert matcher.is_terminated and matcher.failed is None


def test_a_token_off_the_grammar_fails_the_matcher(
    tiny_llama: LoadedModel, compiler: GrammarCompiler
) -> None:
    matcher = compiler.matcher(constraint(SCHEMAS["number"]))
    matcher.advance(encode(tiny_llama, '{"x"'))
    assert matcher.failed is not None


def test_one_compile_per_distinct_schema(compiler: GrammarCompiler) -> None:
    first = compiler.matcher(constraint(SCHEMAS["enum"]))
    size = len(compiler._compiled)
    second = compiler.matcher(constraint(SCHEMAS["enum"]))
    assert len(compiler._compiled) == size
    assert first.inner is not second.inner  # each sequence its own state


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        ({"type": "string", "pattern": "(?<=a)b"}, False),  # look-behind: no regular grammar
        ({"type": "wobbly"}, False),
        ({"type": "string", "format": "no-such-format"}, True),
        ({"$ref": "#/$defs/missing"}, False),
    ],
)
def test_a_schema_the_library_cannot_compile_is_invalid_response_format(
    compiler: GrammarCompiler, schema: dict[str, Any], strict: bool
) -> None:
    with pytest.raises(RequestRejected) as caught:
        compiler.matcher(constraint(schema, strict))
    assert caught.value.code == ErrorCode.INVALID_RESPONSE_FORMAT


# -- regex, choice and grammar constraints ----------------------------------------------------

# Each kind with a text in its language (and a bounded language: random weights stop within it).
REGEX = r"[A-Z]{3}-[0-9]{2}"
CHOICES = ["red", "green", "blue", "dark blue"]
LARK = """
start: greeting " " name "!"
greeting: "hi" | "hello"
name: /[a-z]{1,8}/
"""
GBNF = 'root ::= "a" [0-9] [0-9]? "."'
KINDS: dict[str, tuple[Constraint, str, str]] = {  # the constraint, a sentence, its language
    "regex": (Constraint("regex", REGEX), "ABC-12", REGEX),
    "choice": (Constraint("choice", json.dumps(CHOICES)), "dark blue", "red|green|blue|dark blue"),
    "lark": (Constraint("grammar", LARK), "hello bob!", "(hi|hello) [a-z]{1,8}!"),
    "gbnf": (Constraint("grammar", GBNF), "a12.", "a[0-9][0-9]?[.]"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_accepts_its_sentence_and_terminates(
    tiny_llama: LoadedModel, compiler: GrammarCompiler, kind: str
) -> None:
    rule, sentence, _ = KINDS[kind]
    matcher = compiler.matcher(rule)
    tokens = encode(tiny_llama, sentence)
    matcher.advance(tokens)
    assert matcher.is_terminated and matcher.failed is None


@pytest.mark.parametrize(("kind", "wrong"), [("regex", "abc"), ("choice", "pink"), ("lark", "yo")])
def test_text_off_each_kind_fails_its_matcher(
    tiny_llama: LoadedModel, compiler: GrammarCompiler, kind: str, wrong: str
) -> None:
    matcher = compiler.matcher(KINDS[kind][0])
    matcher.advance(encode(tiny_llama, wrong))
    assert matcher.failed is not None


def test_a_choice_that_prefixes_another_may_stop_or_go_on(
    tiny_llama: LoadedModel, compiler: GrammarCompiler
) -> None:
    """Of "blue" and "blueish", "blue" is complete yet may go on: the matcher accepts (EOS
    may end it there) but is not terminated."""
    matcher = compiler.matcher(Constraint("choice", json.dumps(["blue", "blueish"])))
    matcher.advance(encode(tiny_llama, "blue"))
    assert not matcher.is_terminated and matcher.failed is None
    assert matcher.inner.is_accepting()


def test_the_cache_keys_the_kind(compiler: GrammarCompiler) -> None:
    """The same text as a regex and as a grammar are two grammars."""
    compiler.matcher(Constraint("regex", "yes"))
    size = len(compiler._compiled)
    compiler.matcher(Constraint("regex", "yes"))
    assert len(compiler._compiled) == size
    compiler.matcher(Constraint("grammar", 'start: "yes"'))
    compiler.matcher(Constraint("choice", '["yes"]'))
    assert len(compiler._compiled) == size + 2


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        (Constraint("regex", "(?<=a)b"), "the regex"),  # look-behind: not a regular language
        (Constraint("regex", "a("), "the regex"),
        (Constraint("grammar", "start: missing_rule"), "the grammar"),
        (Constraint("grammar", "%%% not a grammar"), "the grammar"),  # neither Lark nor GBNF
        (Constraint("choice", "not a list"), "the choice"),
    ],
)
def test_a_constraint_the_library_cannot_compile_is_invalid_response_format(
    compiler: GrammarCompiler, rule: Constraint, named: str
) -> None:
    with pytest.raises(RequestRejected) as caught:
        compiler.matcher(rule)
    assert caught.value.code == ErrorCode.INVALID_RESPONSE_FORMAT
    message = str(caught.value)
    assert message.startswith(f"{named} cannot be compiled: ") and "\n" not in message


def test_a_long_source_is_not_quoted_whole(compiler: GrammarCompiler) -> None:
    with pytest.raises(RequestRejected) as caught:
        compiler.matcher(Constraint("regex", "(" * 5000 + "a"))
    assert len(str(caught.value)) < 500


# -- the mask ---------------------------------------------------------------------------------


def test_expand_maps_bit_t_to_column_t() -> None:
    bitmask = torch.tensor([[0b101, -(2**31)], [-1, 0]], dtype=torch.int32)  # [2 rows, 2 words]
    table = banned_bits_table(torch.device("cpu"))
    allowed = ~expand_banned(bitmask, table, 70)  # a padded vocabulary: columns 64.. banned
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, 63]
    assert allowed[1].nonzero().flatten().tolist() == list(range(32))
    assert expand_banned(bitmask, table, 40).shape == (2, 40)


def test_masks_cover_only_the_constrained_rows(
    tiny_llama: LoadedModel, compiler: GrammarCompiler
) -> None:
    matcher = compiler.matcher(constraint(SCHEMAS["number"]))
    matcher.advance(encode(tiny_llama, '{"n":'))
    masks = TokenMasks(compiler.mask_words, torch.device("cpu"), threads=1)
    vocab = tiny_llama.config.vocab_size
    mask = masks.build([None, matcher, None], vocab)
    assert mask is not None and mask.rows.tolist() == [1]
    assert mask.banned.shape == (1, vocab)
    ids = (~mask.banned[0]).nonzero().flatten().tolist()
    assert ids and all(matcher.allowed(t) for t in ids)
    assert not any(matcher.allowed(t) for t in set(range(vocab)) - set(ids))
    assert masks.build([None, None], vocab) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_picks_only_allowed_tokens(temperature: float) -> None:
    logits = torch.randn(4, 50)
    banned = torch.ones(3, 50, dtype=torch.bool)
    banned[:, 7] = False
    banned[1, 3] = False
    mask = StepMask(torch.tensor([0, 1, 2]), banned)  # row 3 is unconstrained
    params = [SamplingParams(temperature=temperature, seed=i) for i in range(4)]
    tokens = sample(logits, params, [5] * 4, mask=mask)
    assert tokens[0] == 7 and tokens[1] in (3, 7) and tokens[2] == 7
    assert tokens[3] == sample(logits[3:], params[3:], [5])[0]


# -- through the engine -----------------------------------------------------------------------


def check_valid(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema)


def test_every_constrained_output_validates_and_others_are_unchanged(
    tiny_llama: LoadedModel,
) -> None:
    prompts = random_prompts(tiny_llama.config.vocab_size, 2 * len(SCHEMAS), seed=11)
    plain = SamplingParams(max_new_tokens=12, ignore_eos=True)
    requests = []
    for i, name in enumerate(SCHEMAS):
        requests.append(EngineRequest(f"json-{name}", prompts[2 * i], constrained(SCHEMAS[name])))
        sampled = constrained(SCHEMAS[name], temperature=1.0, seed=i)
        requests.append(EngineRequest(f"seeded-{name}", prompts[2 * i + 1], sampled))
        requests.append(EngineRequest(f"plain-{i}", prompts[2 * i], plain))
    together = run_all(Engine(tiny_llama, CHUNKY), requests)
    by_id = {c.request_id: c for c in together.completions}
    assert set(by_id) == {r.request_id for r in requests}
    for name, schema in SCHEMAS.items():
        for kind in ("json", "seeded"):
            done = by_id[f"{kind}-{name}"]
            assert done.finish_reason == "stop", (name, done.text)
            check_valid(done.text, schema)
    alone = run_all(
        Engine(tiny_llama, CHUNKY), [r for r in requests if r.request_id.startswith("plain")]
    )
    for c in alone.completions:
        assert by_id[c.request_id].token_ids == c.token_ids


def test_constrained_sequences_survive_preemption(tiny_llama: LoadedModel) -> None:
    prompts = random_prompts(tiny_llama.config.vocab_size, 12, seed=12, low=20, high=60)
    names = list(SCHEMAS)
    requests = [
        EngineRequest(
            str(i), p, constrained(SCHEMAS[names[i % len(names)]], temperature=0.8, seed=i)
        )
        for i, p in enumerate(prompts)
    ]
    roomy = run_all(Engine(tiny_llama, CHUNKY), requests)
    tight = run_all(
        Engine(
            tiny_llama,
            EngineConfig(
                block_size=4, max_num_batched_tokens=48, num_kv_blocks=40, max_model_len=160
            ),
        ),
        requests,
    )
    assert sum(c.num_preemptions for c in tight.completions) > 0
    for i, (a, b) in enumerate(zip(roomy.completions, tight.completions, strict=True)):
        assert a.token_ids == b.token_ids
        assert b.finish_reason == "stop"
        check_valid(b.text, SCHEMAS[names[i % len(names)]])


def test_json_cut_off_by_max_new_tokens_finishes_with_length(tiny_llama: LoadedModel) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    params = SamplingParams(max_new_tokens=3, constraint=constraint(schema))
    prompt = random_prompts(tiny_llama.config.vocab_size, 1, seed=13)[0]
    done = run_all(Engine(tiny_llama, CHUNKY), [EngineRequest("cut", prompt, params)])
    (completion,) = done.completions
    assert completion.finish_reason == "length" and len(completion.token_ids) == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(completion.text)


def test_every_kind_through_the_engine_stays_in_its_language(tiny_llama: LoadedModel) -> None:
    """Greedy and sampled, beside a JSON request: each output that stops is a sentence."""
    prompts = random_prompts(tiny_llama.config.vocab_size, 2 * len(KINDS), seed=14)
    requests = [EngineRequest("json", prompts[0], constrained(SCHEMAS["required"]))]
    for i, (kind, (rule, _, _)) in enumerate(KINDS.items()):
        greedy = SamplingParams(max_new_tokens=24, constraint=rule)
        sampled = SamplingParams(max_new_tokens=24, constraint=rule, temperature=1.0, seed=i)
        requests.append(EngineRequest(f"greedy-{kind}", prompts[2 * i], greedy))
        requests.append(EngineRequest(f"sampled-{kind}", prompts[2 * i + 1], sampled))
    done = run_all(Engine(tiny_llama, CHUNKY), requests)
    by_id = {c.request_id: c for c in done.completions}
    check_valid(by_id["json"].text, SCHEMAS["required"])
    for kind, (_, _, language) in KINDS.items():
        for how in ("greedy", "sampled"):
            completion = by_id[f"{how}-{kind}"]
            assert completion.finish_reason == "stop", (kind, completion.text)
            assert re.fullmatch(language, completion.text), (kind, completion.text)


def test_the_engine_rejects_a_regex_it_cannot_compile(tiny_llama: LoadedModel) -> None:
    engine = Engine(tiny_llama, CHUNKY)
    bad = SamplingParams(constraint=Constraint("regex", "(?=x)"))
    with pytest.raises(RequestRejected) as caught:
        engine.add(EngineRequest("bad", [1, 2, 3], bad))
    assert caught.value.code == ErrorCode.INVALID_RESPONSE_FORMAT
    assert not engine.has_work() and not engine.matchers


def test_the_engine_rejects_a_schema_it_cannot_compile(tiny_llama: LoadedModel) -> None:
    engine = Engine(tiny_llama, CHUNKY)
    bad = SamplingParams(constraint=constraint({"type": "string", "pattern": "(?=x)"}))
    with pytest.raises(RequestRejected) as caught:
        engine.add(EngineRequest("bad", [1, 2, 3], bad))
    assert caught.value.code == ErrorCode.INVALID_RESPONSE_FORMAT
    assert not engine.has_work() and not engine.matchers


def test_prepare_compiles_ahead_and_add_finds_it(tiny_llama: LoadedModel) -> None:
    engine = Engine(tiny_llama, CHUNKY)
    request = EngineRequest("ahead", [1, 2, 3], constrained(SCHEMAS["required"]))
    engine.prepare(request)
    compiled = dict(engine.grammars._compiled)
    engine.add(request)
    assert engine.grammars._compiled == compiled and "ahead" in engine.matchers
    engine.abort("ahead")
    assert not engine.matchers
