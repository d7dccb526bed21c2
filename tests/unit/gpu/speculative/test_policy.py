"""Stepping aside: each batch-size group speculates while it measures faster that way."""

from gpu.speculative.policy import StepAside, group_of


def test_groups_are_powers_of_two() -> None:
    assert [group_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 64)] == [0, 1, 2, 2, 3, 3, 4, 6]


def test_tries_speculation_then_plain_then_keeps_the_faster() -> None:
    policy = StepAside(explore_every=1000)
    assert policy.speculate(1)
    policy.measured(1, True, tokens=3, seconds=0.01)  # 300 tok/s
    assert not policy.speculate(1)
    policy.measured(1, False, tokens=1, seconds=0.01)  # 100 tok/s
    assert all(policy.speculate(1) for _ in range(10))


def test_a_large_batch_that_loses_steps_aside() -> None:
    policy = StepAside(explore_every=1000)
    policy.measured(64, True, tokens=70, seconds=0.2)  # 350 tok/s
    policy.measured(64, False, tokens=64, seconds=0.1)  # 640 tok/s
    assert not any(policy.speculate(60) for _ in range(10))
    assert policy.speculate(1)  # another group: not measured yet, so it tries


def test_explores_the_other_way_now_and_then() -> None:
    policy = StepAside(explore_every=4)
    policy.measured(1, True, tokens=3, seconds=0.01)
    policy.measured(1, False, tokens=1, seconds=0.01)
    choices = [policy.speculate(1) for _ in range(8)]
    assert choices == [True, True, False, False] * 2  # the 3rd and 4th of every 4: plain


def test_a_change_of_traffic_turns_the_choice() -> None:
    policy = StepAside(explore_every=1000)
    policy.measured(1, True, tokens=3, seconds=0.01)
    policy.measured(1, False, tokens=1, seconds=0.01)
    for _ in range(20):  # guesses stop matching: each speculative step is slower
        policy.measured(1, True, tokens=1, seconds=0.02)
    assert not policy.speculate(1)
    speculative, plain = policy.goodput(1)
    assert speculative is not None and plain is not None and speculative < plain


def test_nothing_measured_from_empty_or_timeless_steps() -> None:
    policy = StepAside()
    policy.measured(0, True, tokens=1, seconds=0.01)
    policy.measured(1, True, tokens=1, seconds=0.0)
    assert policy.goodput(1) == (None, None)
