"""`gpu.choices`: a request's `n` choices split into sequences and gathered into one completion."""

from __future__ import annotations

from dataclasses import replace

from gpu.choices import ChoiceGroups, child_id, choice_seed, merge, parent_of
from gpu.engine import Completion, EngineRequest
from gpu.sequence import SamplingParams


def completion(request_id: str, tokens: list[int], **fields: object) -> Completion:
    values: dict[str, object] = {
        "prompt_tokens": 5,
        "text": "".join(chr(97 + t % 26) for t in tokens),
        "finish_reason": "length",
        "arrival_time": 1.0,
        "first_token_time": 2.0,
        "finish_time": 3.0,
        "num_preemptions": 0,
        **fields,
    }
    return Completion(request_id=request_id, token_ids=tokens, **values)  # type: ignore[arg-type]


def test_choice_seeds_keep_choice_0_and_differ_per_choice() -> None:
    assert choice_seed(None, 3) is None
    assert choice_seed(42, 0) == 42
    seeds = {choice_seed(42, i) for i in range(16)}
    assert len(seeds) == 16
    assert all(s is not None and 0 <= s < 2**63 for s in seeds)
    assert choice_seed(2**63 - 1, 5) == choice_seed(2**63 - 1, 5)


def test_a_request_with_one_choice_is_left_as_it_is() -> None:
    groups = ChoiceGroups()
    request = EngineRequest("r", [1, 2], SamplingParams())
    assert groups.split(request) == [request]
    assert "r" not in groups and groups.children_of("r") == ["r"]
    done = completion("r", [4])
    assert groups.gather([done]) == [done]


def test_children_carry_their_ids_seeds_and_one_choice_each() -> None:
    groups = ChoiceGroups()
    children = groups.split(EngineRequest("r", [1, 2], SamplingParams(n=3, seed=9)))
    assert [c.request_id for c in children] == [child_id("r", i) for i in range(3)]
    assert [c.params.seed for c in children] == [choice_seed(9, i) for i in range(3)]
    assert {c.params.n for c in children} == {1}
    assert "r" in groups and groups.ids(EngineRequest("r", [1], SamplingParams(n=3))) == [
        "r#0",
        "r#1",
        "r#2",
    ]


def test_gather_holds_choices_back_until_the_last_and_then_merges_in_order() -> None:
    groups = ChoiceGroups()
    groups.split(EngineRequest("r", [1, 2], SamplingParams(n=2)))
    other = completion("other", [9])
    second = completion("r#1", [5, 6], finish_time=4.0, num_preemptions=1, cached_tokens=2)
    assert groups.gather([second, other]) == [other]
    assert groups.children_of("r") == ["r#0"]
    [whole] = groups.gather([completion("r#0", [7], first_token_time=1.5, cached_tokens=0)])
    assert whole.request_id == "r" and whole.token_ids == [7]
    assert [c.token_ids for c in whole.choices] == [[7], [5, 6]]
    assert {c.request_id for c in whole.choices} == {"r"}
    assert (whole.first_token_time, whole.finish_time) == (1.5, 4.0)
    assert (whole.num_preemptions, whole.cached_tokens) == (1, 0)
    assert "r" not in groups and groups.children_of("r") == ["r"]


def test_merge_keeps_the_first_choice_on_top() -> None:
    a, b = completion("x#0", [1], finish_reason="stop"), completion("x#1", [2, 3])
    merged = merge("x", [a, b])
    assert (merged.finish_reason, merged.text) == ("stop", a.text)
    assert merged.choices == (replace(a, request_id="x"), replace(b, request_id="x"))


def test_a_child_s_id_names_its_request_and_index() -> None:
    assert parent_of(child_id("r#1", 3)) == ("r#1", 3)
    assert parent_of("plain") is None
    assert parent_of("r#x") is None and parent_of("r#") is None
