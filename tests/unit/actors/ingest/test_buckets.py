"""Length buckets: placement, the size and token limits, waiting with a fake clock, draining."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.ingest.buckets import BucketConfig, Flushed, LengthBuckets, default_boundaries


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


SHAPE: dict[str, Any] = {"max_batch_tokens": 1000, "max_batch_size": 4, "max_wait_s": 0.010}


def make(
    boundaries: tuple[int, ...] = (32, 64, 128),
    max_batch_tokens: int = 1000,
    max_batch_size: int = 4,
    max_wait_s: float = 0.010,
) -> tuple[LengthBuckets[str], FakeClock]:
    clock = FakeClock()
    config = BucketConfig(boundaries, max_batch_tokens, max_batch_size, max_wait_s)
    return LengthBuckets(config, clock), clock


@pytest.mark.parametrize(
    ("max_model_len", "expected"),
    [
        (100, (32, 64, 100)),
        (32, (32,)),
        (20, (20,)),
        (33, (32, 33)),
        (128, (32, 64, 128)),
        (4096, (32, 64, 128, 256, 512, 1024, 2048, 4096)),
    ],
)
def test_default_boundaries(max_model_len: int, expected: tuple[int, ...]) -> None:
    assert default_boundaries(max_model_len) == expected
    BucketConfig(default_boundaries(max_model_len), **SHAPE)


def test_default_boundaries_need_a_positive_length() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        default_boundaries(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"boundaries": ()}, "empty"),
        ({"boundaries": (0, 32)}, "positive"),
        ({"boundaries": (-8,)}, "positive"),
        ({"boundaries": (64, 32)}, "ascending"),
        ({"boundaries": (32, 32)}, "ascending"),
        ({"boundaries": (32,), "max_batch_tokens": 0}, "max_batch_tokens"),
        ({"boundaries": (32,), "max_batch_size": 0}, "max_batch_size"),
        ({"boundaries": (32,), "max_wait_s": -0.001}, "max_wait_s"),
    ],
)
def test_a_bad_config_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketConfig(**{**SHAPE, **kwargs})


def test_a_zero_wait_is_allowed() -> None:
    assert BucketConfig((32,), **{**SHAPE, "max_wait_s": 0}).max_wait_s == 0


@pytest.mark.parametrize(
    ("num_tokens", "bucket"), [(0, 32), (1, 32), (32, 32), (33, 64), (128, 128), (900, 128)]
)
def test_an_item_goes_to_the_smallest_bucket_that_holds_it(num_tokens: int, bucket: int) -> None:
    buckets, _ = make()
    assert buckets.add("a", num_tokens) == []
    (batch,) = buckets.drain()
    assert (batch.bucket, batch.items, batch.tokens) == (bucket, ["a"], num_tokens)


def test_a_negative_token_count_is_refused() -> None:
    buckets, _ = make()
    with pytest.raises(ValueError, match="num_tokens"):
        buckets.add("a", -1)
    assert len(buckets) == 0


def test_a_bucket_that_reaches_max_batch_size_is_flushed_in_arrival_order() -> None:
    buckets, clock = make(max_batch_size=3)
    assert buckets.add("a", 10) == []
    clock.now = 0.002
    assert buckets.add("b", 20) == []
    assert buckets.add("c", 5) == [Flushed(32, ["a", "b", "c"], 35, "size", 0.002)]
    assert (len(buckets), buckets.tokens) == (0, 0)


def test_a_bucket_that_reaches_max_batch_tokens_exactly_is_flushed() -> None:
    buckets, _ = make(max_batch_tokens=100)
    assert buckets.add("a", 60) == []
    (batch,) = buckets.add("b", 40)
    assert (batch.items, batch.tokens, batch.reason) == (["a", "b"], 100, "tokens")


def test_an_item_that_would_overflow_the_tokens_flushes_what_is_there_first() -> None:
    buckets, _ = make(max_batch_tokens=100)
    buckets.add("a", 60)
    (batch,) = buckets.add("b", 50)
    assert (batch.items, batch.tokens, batch.reason) == (["a"], 60, "tokens")
    assert (len(buckets), buckets.tokens) == (1, 50)


def test_an_item_larger_than_max_batch_tokens_leaves_alone() -> None:
    buckets, _ = make(boundaries=(1000,), max_batch_tokens=100)
    (alone,) = buckets.add("big", 120)
    assert (alone.items, alone.tokens, alone.reason) == (["big"], 120, "tokens")
    buckets.add("a", 40)
    buckets.add("small", 30)
    first, second = buckets.add("huge", 500)
    assert (first.items, first.reason) == (["a", "small"], "tokens")
    assert (second.items, second.tokens, second.reason) == (["huge"], 500, "tokens")
    assert len(buckets) == 0


def test_buckets_do_not_mix() -> None:
    buckets, _ = make(max_batch_size=2)
    buckets.add("short", 10)
    buckets.add("long", 100)
    (batch,) = buckets.add("short again", 20)
    assert (batch.bucket, batch.items) == (32, ["short", "short again"])
    assert (len(buckets), buckets.tokens) == (1, 100)


def test_a_bucket_is_due_once_its_oldest_item_waited_max_wait() -> None:
    buckets, clock = make(max_wait_s=0.010)
    buckets.add("a", 10)
    clock.now = 0.004
    buckets.add("b", 10)
    assert buckets.next_deadline() == pytest.approx(0.010)
    clock.now = 0.009
    assert buckets.due() == []
    clock.now = 0.010
    (batch,) = buckets.due()
    assert (batch.items, batch.reason) == (["a", "b"], "wait")
    assert batch.oldest_wait_s == pytest.approx(0.010)
    assert buckets.due() == []
    assert buckets.next_deadline() is None


def test_a_bucket_wait_clock_restarts_after_a_flush() -> None:
    buckets, clock = make(max_batch_size=2, max_wait_s=0.010)
    buckets.add("a", 10)
    clock.now = 0.008
    buckets.add("b", 10)
    clock.now = 0.009
    buckets.add("c", 10)
    assert buckets.next_deadline() == pytest.approx(0.019)
    clock.now = 0.015
    assert buckets.due() == []


def test_only_buckets_that_waited_long_enough_are_due_oldest_first() -> None:
    buckets, clock = make(max_wait_s=0.010)
    buckets.add("long", 100)
    clock.now = 0.003
    buckets.add("short", 10)
    clock.now = 0.008
    buckets.add("medium", 50)
    assert buckets.next_deadline() == pytest.approx(0.010)
    clock.now = 0.014
    assert [(b.bucket, b.items) for b in buckets.due()] == [(128, ["long"]), (32, ["short"])]
    assert buckets.next_deadline() == pytest.approx(0.018)
    assert (len(buckets), buckets.tokens) == (1, 50)


def test_a_zero_wait_makes_every_held_item_due_at_once() -> None:
    buckets, _ = make(max_wait_s=0)
    buckets.add("a", 10)
    assert buckets.next_deadline() == 0
    assert [b.items for b in buckets.due()] == [["a"]]


def test_drain_returns_everything_held() -> None:
    buckets, clock = make()
    buckets.add("a", 10)
    buckets.add("b", 100)
    clock.now = 1.0
    buckets.add("c", 20)
    drained = buckets.drain()
    assert [(b.bucket, b.items, b.reason) for b in drained] == [
        (32, ["a", "c"], "drain"),
        (128, ["b"], "drain"),
    ]
    assert [b.oldest_wait_s for b in drained] == [1.0, 1.0]
    assert (len(buckets), buckets.tokens, buckets.drain(), buckets.next_deadline()) == (
        0,
        0,
        [],
        None,
    )


def test_len_and_tokens_count_what_is_held() -> None:
    buckets, _ = make()
    buckets.add("a", 10)
    buckets.add("b", 70)
    assert (len(buckets), buckets.tokens) == (2, 80)


configs = st.builds(
    BucketConfig,
    boundaries=st.lists(st.integers(1, 200), min_size=1, max_size=5, unique=True).map(
        lambda bounds: tuple(sorted(bounds))
    ),
    max_batch_tokens=st.integers(1, 300),
    max_batch_size=st.integers(1, 6),
    max_wait_s=st.sampled_from([0.0, 0.001, 0.005, 0.010, 0.1]),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 400)),
        st.tuples(st.just("tick"), st.sampled_from([0.0, 0.0005, 0.001, 0.003, 0.01, 0.2])),
        st.tuples(st.just("due"), st.just(0)),
        st.tuples(st.just("drain"), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(config=configs, ops=operations)
def test_every_item_comes_out_exactly_once_within_the_limits(
    config: BucketConfig, ops: list[tuple[str, float]]
) -> None:
    clock = FakeClock()
    buckets: LengthBuckets[int] = LengthBuckets(config, clock)
    arrival: list[float] = []
    size: list[int] = []
    out: list[int] = []
    out_by_bucket: dict[int, list[int]] = {}

    def home(num_tokens: int) -> int:
        bounds = config.boundaries
        return bounds[min(bisect_left(bounds, num_tokens), len(bounds) - 1)]

    def check(batch: Flushed[int]) -> None:
        assert batch.items
        assert len(batch.items) <= config.max_batch_size
        assert batch.tokens == sum(size[i] for i in batch.items)
        assert batch.tokens <= config.max_batch_tokens or len(batch.items) == 1
        assert all(home(size[i]) == batch.bucket for i in batch.items)
        assert batch.oldest_wait_s == clock.now - arrival[batch.items[0]]
        out.extend(batch.items)
        out_by_bucket.setdefault(batch.bucket, []).extend(batch.items)

    def check_not_full(batch: Flushed[int]) -> None:
        assert len(batch.items) < config.max_batch_size
        assert batch.tokens < config.max_batch_tokens

    for op, value in ops:
        if op == "add":
            item, num_tokens = len(arrival), int(value)
            arrival.append(clock.now)
            size.append(num_tokens)
            for batch in buckets.add(item, num_tokens):
                check(batch)
                if batch.reason == "size":
                    assert len(batch.items) == config.max_batch_size
                else:
                    assert batch.reason == "tokens"
                    assert (
                        item in batch.items or batch.tokens + num_tokens > config.max_batch_tokens
                    )
                    assert item not in batch.items or batch.tokens >= config.max_batch_tokens
        elif op == "tick":
            clock.now += value
        elif op == "due":
            for batch in buckets.due():
                check(batch)
                check_not_full(batch)
                assert batch.reason == "wait"
                assert clock.now >= arrival[batch.items[0]] + config.max_wait_s
            deadline = buckets.next_deadline()
            assert deadline is None or deadline > clock.now
        else:
            for batch in buckets.drain():
                check(batch)
                check_not_full(batch)
                assert batch.reason == "drain"
            assert len(buckets) == buckets.tokens == 0

        held = sorted(set(range(len(arrival))) - set(out))
        assert len(buckets) == len(held)
        assert buckets.tokens == sum(size[i] for i in held)
        expected_deadline = arrival[held[0]] + config.max_wait_s if held else None
        assert buckets.next_deadline() == expected_deadline

    for batch in buckets.drain():
        check(batch)
    assert sorted(out) == list(range(len(arrival)))
    for items in out_by_bucket.values():
        assert items == sorted(items)


def test_drain_can_name_its_reason() -> None:
    buckets: LengthBuckets[str] = LengthBuckets(BucketConfig((32,), **SHAPE))
    buckets.add("a", 3)
    (flushed,) = buckets.drain("idle")
    assert flushed.reason == "idle" and flushed.items == ["a"]
