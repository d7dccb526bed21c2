"""The scheduler, driven the way the engine drives it, with a fake clock and fake tokens.

Each step: `schedule()`, `advance(batch)`, append a token to every sequence whose chunk
samples, and `finish(seq, "length")` once it has `max_new_tokens`. `check_batch` and
`check_state` assert the scheduler's invariants at every step of every test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.block_allocator import BlockAllocator
from gpu.scheduler import RELEASED_BLOCK, ScheduledBatch, Scheduler, SchedulerConfig
from gpu.sequence import SamplingParams, Sequence, SequenceStatus

FAKE_TOKEN = 7
NO_AGING = 1e12  # aging_seconds so large that effective priority is just `priority`


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    """A scheduler plus the engine's side of the loop, recording what each step did."""

    scheduler: Scheduler
    clock: FakeClock
    tick: float = 1.0  # fake seconds per step
    steps: int = 0
    finished: list[Sequence] = field(default_factory=list)
    # Chunks each sequence ran since it last (re)started from position 0: (start, end).
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # Every chunk ever, per sequence, and the step at which each sequence first ran.
    history: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    first_step: dict[str, int] = field(default_factory=dict)
    # Per step: how many of the batch's tokens were decodes.
    decode_tokens: list[int] = field(default_factory=list)

    @classmethod
    def make(cls, num_blocks: int = 64, tick: float = 1.0, **config: Any) -> Harness:
        clock = FakeClock()
        allocator = BlockAllocator(num_blocks + reserved(config))
        if reserved(config):
            assert allocator.allocate() == RELEASED_BLOCK  # held, as the engine's padding is
        scheduler = Scheduler(SchedulerConfig(**config), allocator, clock)
        return cls(scheduler, clock, tick)

    def add(
        self,
        request_id: str,
        prompt_len: int,
        max_new_tokens: int,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> Sequence:
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=list(range(1, prompt_len + 1)),
            params=SamplingParams(max_new_tokens=max_new_tokens),
            arrival_time=self.clock.now if arrival_time is None else arrival_time,
            priority=priority,
        )
        self.scheduler.add(seq)
        return seq

    def step(self) -> ScheduledBatch:
        s = self.scheduler
        running_before = list(s.running)
        computed_before = {id(seq): seq.num_computed_tokens for seq in s.running + s.waiting}
        now = self.clock()
        batch = s.schedule()
        check_batch(s, batch, running_before, computed_before, now)

        sampling = [c.seq for c in batch.chunks if c.samples]
        self.decode_tokens.append(batch.num_decode_tokens)
        s.advance(batch)
        for victim in batch.preempted:
            self.spans[victim.request_id] = []
        for chunk in batch.chunks:
            rid = chunk.seq.request_id
            self.spans.setdefault(rid, []).append((chunk.start, chunk.end))
            self.history.setdefault(rid, []).append((chunk.start, chunk.end))
            self.first_step.setdefault(rid, self.steps)
        for seq in sampling:
            seq.output_token_ids.append(FAKE_TOKEN)
            if len(seq.output_token_ids) >= seq.params.max_new_tokens:
                s.finish(seq, "length")
                self.finished.append(seq)
        check_state(s)
        self.steps += 1
        self.clock.now += self.tick
        return batch

    def run_until_idle(self, max_steps: int) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work():
                return
            self.step()
        raise AssertionError(f"work left after {max_steps} steps: {describe(self.scheduler)}")


def reserved(config: dict[str, Any]) -> int:
    """Blocks held outside any sequence: with a window, the one released entries point at."""
    return 1 if config.get("window") is not None else 0


def describe(s: Scheduler) -> str:
    def one(seq: Sequence) -> str:
        return f"{seq.request_id}(computed={seq.num_computed_tokens}/{seq.num_tokens})"

    return f"running={[one(q) for q in s.running]} waiting={[one(q) for q in s.waiting]}"


def urgency(s: Scheduler, seq: Sequence, now: float) -> tuple[float, float]:
    """The scheduler's order: smaller is more urgent."""
    return (-s.effective_priority(seq, now), seq.arrival_time)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def check_batch(
    s: Scheduler,
    batch: ScheduledBatch,
    running_before: list[Sequence],
    computed_before: dict[int, int],
    now: float,
) -> None:
    cfg = s.config
    assert batch.num_tokens <= cfg.max_num_batched_tokens, "token budget exceeded"
    assert len(s.running) <= cfg.max_num_seqs
    seqs = [c.seq for c in batch.chunks]
    assert len({id(q) for q in seqs}) == len(seqs), "a sequence scheduled twice in one step"
    for chunk in batch.chunks:
        seq = chunk.seq
        assert chunk.num_tokens >= 1
        assert seq.status is SequenceStatus.RUNNING and seq in s.running
        # A chunk continues exactly where the K/V in the pool ends.
        assert chunk.start == seq.num_computed_tokens == computed_before[id(seq)]
        assert chunk.end <= seq.num_tokens
        assert len(seq.block_table) * cfg.block_size >= chunk.end, "chunk's K/V has no block"
    for victim in batch.preempted:
        assert victim not in seqs
        assert victim in running_before
        assert victim.status is SequenceStatus.WAITING and victim in s.waiting
        assert victim.num_computed_tokens == 0 and victim.block_table == []
        # The victim ranks below everything that kept running (or ties with it).
        for kept in s.running:
            assert urgency(s, kept, now) <= urgency(s, victim, now)
    if batch.preempted:
        # Nothing joins in a step that had to preempt.
        assert all(q in running_before for q in s.running)


def check_state(s: Scheduler) -> None:
    """Invariants between steps: blocks conserved, tables tight, queues consistent."""
    a = s.allocator
    bs, window = s.config.block_size, s.config.window
    assert a.num_free + a.num_used == a.num_blocks
    owned = [b for q in s.running for b in q.block_table if window is None or b != RELEASED_BLOCK]
    assert a.num_used == len(owned) + reserved({"window": window})
    assert len(set(owned)) == len(owned), "a block is in two tables"
    assert all(a.ref_count(b) == 1 for b in owned)
    assert len(s.running) <= s.config.max_num_seqs
    for seq in s.running:
        assert seq.status is SequenceStatus.RUNNING
        # Every computed token has a block, and no block is held beyond them.
        assert len(seq.block_table) == blocks_for(seq.num_computed_tokens, bs)
        assert 0 < seq.num_computed_tokens < seq.num_tokens
        if window is not None:
            # Released: exactly the blocks before the next query's window.
            dead = max(0, seq.num_computed_tokens - window + 1) // bs
            assert seq.block_table[:dead] == [RELEASED_BLOCK] * dead
            assert RELEASED_BLOCK not in seq.block_table[dead:]
    for seq in s.waiting:
        assert seq.status is SequenceStatus.WAITING
        assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert not {id(q) for q in s.running} & {id(q) for q in s.waiting}


def covers_once(spans: list[tuple[int, int]], end: int) -> bool:
    """True when the spans are contiguous from 0 and cover [0, end) exactly once."""
    position = 0
    for start, stop in spans:
        if start != position:
            return False
        position = stop
    return position == end


# -- examples ------------------------------------------------------------------------------


def test_a_single_request_prefills_then_decodes_one_token_per_step() -> None:
    h = Harness.make(block_size=4, max_num_batched_tokens=64)
    seq = h.add("a", prompt_len=6, max_new_tokens=4)
    batches = [h.step() for _ in range(4)]
    assert [(c.start, c.num_tokens) for b in batches for c in b.chunks] == [
        (0, 6),
        (6, 1),
        (7, 1),
        (8, 1),
    ]
    assert h.decode_tokens == [0, 1, 1, 1]
    assert seq.is_finished and seq.finish_reason == "length"
    assert seq.output_token_ids == [FAKE_TOKEN] * 4
    assert not h.scheduler.has_work()
    assert h.scheduler.allocator.num_used == 0


def test_a_batch_still_counts_its_decodes_after_the_sampled_tokens_are_appended() -> None:
    h = Harness.make(block_size=4)
    h.add("a", prompt_len=6, max_new_tokens=4)
    h.step()
    batch = h.step()  # a decode, sampled and appended as Engine.step does
    assert h.decode_tokens[-1] == 1
    assert (batch.num_decode_tokens, batch.num_prefill_tokens) == (1, 0)


def test_an_empty_scheduler_schedules_nothing() -> None:
    h = Harness.make()
    batch = h.step()
    assert batch.is_empty and batch.num_tokens == 0 and batch.preempted == ()


def test_chunked_prefill_mixes_with_decodes_and_covers_the_prompt_once() -> None:
    h = Harness.make(block_size=4, max_num_batched_tokens=8)
    short = h.add("short", prompt_len=2, max_new_tokens=10)
    h.clock.now += 0.5
    long = h.add("long", prompt_len=20, max_new_tokens=2)

    first = h.step()  # short's whole prompt, then as much of long's as the budget allows
    assert [(c.seq, c.start, c.num_tokens) for c in first.chunks] == [(short, 0, 2), (long, 0, 6)]
    mixed = 0
    while not long.output_token_ids:
        batch = h.step()
        assert batch.num_tokens <= 8
        assert {c.seq.request_id for c in batch.chunks} == {"short", "long"}
        assert h.decode_tokens[-1] == 1  # short's decode shares the step with long's chunk
        mixed += 1
    assert mixed == 2
    assert h.spans["long"] == [(0, 6), (6, 13), (13, 20)]
    assert covers_once(h.spans["long"], long.num_prompt_tokens)
    h.run_until_idle(50)
    assert covers_once(h.history["long"], long.num_tokens - 1)


def test_continuous_batching_a_finished_sequence_leaves_and_a_waiting_one_joins() -> None:
    h = Harness.make(block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    a = h.add("a", prompt_len=3, max_new_tokens=2)
    b = h.add("b", prompt_len=3, max_new_tokens=6, arrival_time=0.1)
    c = h.add("c", prompt_len=3, max_new_tokens=2, arrival_time=0.2)

    h.step()  # prefill a and b; c waits for a slot
    assert h.scheduler.running == [a, b] and h.scheduler.waiting == [c]
    h.step()  # a's second token: a finishes
    assert a.is_finished and a.block_table == []
    batch = h.step()
    assert [(x.seq, x.start, x.num_tokens) for x in batch.chunks] == [(b, 4, 1), (c, 0, 3)]
    assert h.scheduler.running == [b, c] and not h.scheduler.waiting


def test_higher_priority_is_admitted_first() -> None:
    h = Harness.make(block_size=4, max_num_seqs=1, aging_seconds=NO_AGING)
    low = h.add("low", prompt_len=4, max_new_tokens=2, priority=0)
    h.clock.now += 1
    high = h.add("high", prompt_len=4, max_new_tokens=2, priority=1)
    h.run_until_idle(20)
    assert h.first_step["high"] < h.first_step["low"]
    assert h.finished == [high, low]


def test_equal_priority_is_first_come_first_served() -> None:
    h = Harness.make(block_size=4, max_num_seqs=1, aging_seconds=NO_AGING)
    later = h.add("later", prompt_len=4, max_new_tokens=2, arrival_time=5.0)
    earlier = h.add("earlier", prompt_len=4, max_new_tokens=2, arrival_time=1.0)
    h.clock.now = 6.0
    h.run_until_idle(20)
    assert h.finished == [earlier, later]


def test_the_most_urgent_waiting_request_is_not_jumped_by_a_smaller_one() -> None:
    h = Harness.make(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    h.add("running", prompt_len=8, max_new_tokens=8)  # holds 2 of 4 blocks, then 3
    h.step()
    h.clock.now += 1
    big = h.add("big", prompt_len=12, max_new_tokens=1)  # needs 3 blocks
    h.clock.now += 1
    small = h.add("small", prompt_len=2, max_new_tokens=1)  # needs 1 block, but is newer
    h.step()
    assert h.scheduler.waiting == [big, small]  # small fits, yet waits behind big
    h.run_until_idle(50)
    assert h.first_step["big"] <= h.first_step["small"]


def test_admission_keeps_the_watermark_free() -> None:
    # 100 blocks, a 10% watermark, one block held by a running sequence: a request needing
    # more than 89 more blocks waits.
    h = Harness.make(num_blocks=100, block_size=1, admission_watermark=0.1)
    h.add("small", prompt_len=1, max_new_tokens=50)
    h.step()
    seq = h.add("big", prompt_len=90, max_new_tokens=1)
    assert all(c.seq is not seq for c in h.step().chunks) and seq in h.scheduler.waiting
    h.scheduler.finish(seq, "cancelled")
    fits = h.add("fits", prompt_len=87, max_new_tokens=1)
    assert any(c.seq is fits for c in h.step().chunks)


def test_with_nothing_running_a_request_may_use_the_whole_pool() -> None:
    h = Harness.make(num_blocks=100, block_size=1, admission_watermark=0.1)
    seq = h.add("whole", prompt_len=99, max_new_tokens=1)
    assert h.step().chunks[0].seq is seq


def test_a_spent_budget_holds_admission_back_until_a_slot_in_it_frees() -> None:
    h = Harness.make(block_size=4, max_num_batched_tokens=2, aging_seconds=NO_AGING)
    for i in range(3):
        h.add(f"s{i}", prompt_len=1, max_new_tokens=3, arrival_time=i)
    per_step = []
    while h.scheduler.has_work():
        per_step.append([c.seq.request_id for c in h.step().chunks])
    assert per_step == [["s0", "s1"]] * 3 + [["s2"]] * 3


def _three_full_sequences(
    victim_priority: int, other_priority: int
) -> tuple[Harness, Sequence, Sequence, Sequence]:
    """A 6-block pool held by three 8-token prompts; the next decode needs a 7th block."""
    h = Harness.make(num_blocks=6, block_size=4, aging_seconds=NO_AGING)
    top = h.add("top", prompt_len=8, max_new_tokens=6, priority=5, arrival_time=2.0)
    older = h.add("older", prompt_len=8, max_new_tokens=6, priority=victim_priority)
    newer = h.add("newer", prompt_len=8, max_new_tokens=6, priority=other_priority, arrival_time=1)
    h.clock.now = 3.0
    h.step()
    assert h.scheduler.allocator.num_free == 0 and len(h.scheduler.running) == 3
    return h, top, older, newer


def test_preemption_evicts_the_newest_among_the_lowest_priority() -> None:
    h, top, older, newer = _three_full_sequences(victim_priority=0, other_priority=0)
    batch = h.step()
    assert batch.preempted == (newer,)
    assert {c.seq for c in batch.chunks} == {top, older}
    assert newer.status is SequenceStatus.WAITING and newer in h.scheduler.waiting
    assert newer.num_computed_tokens == 0 and newer.block_table == []
    assert newer.num_preemptions == 1
    assert newer.output_token_ids == [FAKE_TOKEN]  # what it generated is kept


def test_preemption_evicts_the_lowest_priority_even_when_it_is_older() -> None:
    h, _, older, _ = _three_full_sequences(victim_priority=0, other_priority=1)
    batch = h.step()
    assert batch.preempted == (older,)
    assert older.num_computed_tokens == 0 and older.block_table == []


def test_a_preempted_sequence_is_recomputed_from_position_zero() -> None:
    h, _, _, newer = _three_full_sequences(victim_priority=0, other_priority=0)
    h.step()  # newer is preempted
    while not h.spans.get("newer"):
        h.step()
    restart = h.spans["newer"][0]
    # One chunk recomputes the prompt and the token generated before preemption, and samples.
    assert restart == (0, newer.num_prompt_tokens + 1)
    assert len(newer.output_token_ids) == 2
    h.run_until_idle(50)
    assert newer.is_finished and len(newer.output_token_ids) == 6
    assert covers_once(h.spans["newer"], newer.num_tokens - 1)
    assert h.scheduler.allocator.num_used == 0


def test_a_sequence_preempts_itself_when_only_more_urgent_ones_hold_blocks() -> None:
    h = Harness.make(num_blocks=4, block_size=4, aging_seconds=NO_AGING)
    top = h.add("top", prompt_len=6, max_new_tokens=4, priority=1)  # room in its 2nd block
    low = h.add("low", prompt_len=8, max_new_tokens=4)
    h.step()
    batch = h.step()  # low needs a 5th block; only the more urgent top holds the others
    assert batch.preempted == (low,)
    assert [c.seq for c in batch.chunks] == [top]
    h.run_until_idle(50)
    assert h.finished == [top, low]


def test_a_preempted_long_sequence_is_recomputed_in_chunks() -> None:
    h = Harness.make(num_blocks=8, block_size=4, max_num_batched_tokens=8, aging_seconds=NO_AGING)
    top = h.add("top", prompt_len=4, max_new_tokens=20, priority=1)  # grows to 6 blocks
    low = h.add("low", prompt_len=16, max_new_tokens=8)  # grows to 6 blocks
    h.run_until_idle(100)
    assert top.num_preemptions == 0
    assert low.num_preemptions >= 1
    # After its last preemption low had 16 + 5 tokens: three chunks under a budget of 8,
    # the last of which samples; then plain decodes.
    assert h.spans["low"] == [(0, 8), (8, 16), (16, 21), (21, 22), (22, 23)]
    assert covers_once(h.spans["low"], low.num_tokens - 1)
    assert all(stop - start <= 8 for start, stop in h.history["low"])


def test_finish_returns_the_blocks_of_a_running_sequence() -> None:
    h = Harness.make(block_size=4)
    seq = h.add("a", prompt_len=10, max_new_tokens=5)
    h.step()
    assert h.scheduler.allocator.num_used == 3
    h.scheduler.finish(seq, "cancelled")
    assert seq.status is SequenceStatus.FINISHED and seq.finish_reason == "cancelled"
    assert seq.block_table == [] and h.scheduler.allocator.num_used == 0
    assert not h.scheduler.has_work()


def test_finish_removes_a_waiting_sequence() -> None:
    h = Harness.make()
    seq = h.add("a", prompt_len=10, max_new_tokens=5)
    h.scheduler.finish(seq, "cancelled")
    assert not h.scheduler.has_work() and seq.is_finished


# -- no starvation -------------------------------------------------------------------------


def _old_request_under_constant_arrivals(aging_seconds: float, max_steps: int) -> int | None:
    """Step at which a priority-0 request first runs while priority-1 requests keep arriving."""
    h = Harness.make(block_size=4, max_num_seqs=1, aging_seconds=aging_seconds)
    h.add("old", prompt_len=4, max_new_tokens=3, priority=0)
    for step in range(max_steps):
        h.add(f"new{step}", prompt_len=4, max_new_tokens=3, priority=1)
        h.step()
        if "old" in h.first_step:
            return step
    return None


def test_aging_admits_an_old_request_despite_constant_higher_priority_arrivals() -> None:
    # One slot, 3 steps per request, one tick per step, one priority level per 2 s of waiting:
    # only newcomers from the first 2 s outrank the old request, so it runs by step 6.
    step = _old_request_under_constant_arrivals(aging_seconds=2.0, max_steps=100)
    assert step is not None and step <= 6


def test_without_aging_constant_higher_priority_arrivals_starve_a_request() -> None:
    # The counterpart of the test above: it shows that the arrivals really would starve.
    assert _old_request_under_constant_arrivals(aging_seconds=NO_AGING, max_steps=100) is None


# -- properties ----------------------------------------------------------------------------

BLOCK_SIZE = 4


@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict[str, Any], int, list[tuple[int, int, int, int]]]:
    """(scheduler config, pool size, [(arrival step, prompt len, max new tokens, priority)])."""
    num_blocks = draw(st.integers(2, 12))
    config = {
        "block_size": BLOCK_SIZE,
        "max_num_seqs": draw(st.integers(1, 4)),
        "max_num_batched_tokens": draw(st.integers(1, 16)),
        "aging_seconds": draw(st.sampled_from([0.5, 3.0, NO_AGING])),
        "window": draw(st.sampled_from([None, None, 1, 3, 6, 10])),
    }
    capacity = num_blocks * BLOCK_SIZE
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        # Like the engine's max_model_len check: every request fits the pool on its own.
        prompt = draw(st.integers(1, min(capacity - 1, 30)))
        new = draw(st.integers(1, min(capacity - prompt, 10)))
        requests.append((draw(st.integers(0, 10)), prompt, new, draw(st.integers(0, 2))))
    return config, num_blocks, requests


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_every_request_finishes_and_invariants_hold_every_step(
    workload: tuple[dict[str, Any], int, list[tuple[int, int, int, int]]],
) -> None:
    config, num_blocks, requests = workload
    h = Harness.make(num_blocks=num_blocks, **config)
    seqs: list[Sequence] = []
    last_arrival = max(r[0] for r in requests)
    # Each step advances the most urgent sequence by at least one token; preemption wastes
    # at most one sequence's tokens each time the most urgent sequence changes.
    total = sum(prompt + new for _, prompt, new, _ in requests)
    bound = last_arrival + 1 + total * (2 * len(requests) + 1)
    while h.steps <= bound:
        for i, (arrival, prompt, new, priority) in enumerate(requests):
            if arrival == h.steps:
                seqs.append(h.add(f"r{i}", prompt, new, priority))
        if h.steps > last_arrival and not h.scheduler.has_work():
            break
        h.step()
    else:
        raise AssertionError(f"not done after {bound} steps: {describe(h.scheduler)}")
    assert len(seqs) == len(requests)
    for seq in seqs:
        assert seq.is_finished and len(seq.output_token_ids) == seq.params.max_new_tokens
        # The K/V of every token but the last was computed, in contiguous chunks since the
        # last preemption; without preemption, exactly once.
        assert covers_once(h.spans[seq.request_id], seq.num_tokens - 1)
        if seq.num_preemptions == 0:
            assert covers_once(h.history[seq.request_id], seq.num_tokens - 1)
    assert h.scheduler.allocator.num_used == reserved(config)


class SchedulerMachine(RuleBasedStateMachine):
    """Arrivals, steps, aborts and clock jumps in any order; `check_*` run inside each step."""

    @initialize(
        num_blocks=st.integers(2, 10),
        max_num_seqs=st.integers(1, 4),
        budget=st.integers(1, 12),
        aging=st.sampled_from([0.5, 5.0, NO_AGING]),
        window=st.sampled_from([None, 3, 6]),
    )
    def make(
        self, num_blocks: int, max_num_seqs: int, budget: int, aging: float, window: int | None
    ) -> None:
        self.h = Harness.make(
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            aging_seconds=aging,
            window=window,
        )
        self.reserved = reserved({"window": window})
        self.capacity = num_blocks * BLOCK_SIZE
        self.live: list[Sequence] = []
        self.count = 0

    @rule(data=st.data(), priority=st.integers(0, 2))
    def arrive(self, data: st.DataObject, priority: int) -> None:
        prompt = data.draw(st.integers(1, min(self.capacity - 1, 24)))
        new = data.draw(st.integers(1, min(self.capacity - prompt, 8)))
        self.live.append(self.h.add(f"r{self.count}", prompt, new, priority))
        self.count += 1

    @rule()
    def step(self) -> None:
        self.h.step()
        self.live = [q for q in self.live if not q.is_finished]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self.h.scheduler.finish(seq, "cancelled")
        self.live.remove(seq)
        assert seq.block_table == []

    @rule(seconds=st.floats(0, 30))
    def clock_jumps(self, seconds: float) -> None:
        self.h.clock.now += seconds

    @invariant()
    def state_is_consistent(self) -> None:
        if hasattr(self, "h"):
            check_state(self.h.scheduler)
            s = self.h.scheduler
            assert sorted(map(id, s.running + s.waiting)) == sorted(map(id, self.live))

    def teardown(self) -> None:
        # Whatever happened, the remaining work drains and every block comes back.
        if hasattr(self, "h"):
            self.h.run_until_idle(2000)
            assert self.h.scheduler.allocator.num_used == self.reserved


SchedulerMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestSchedulerMachine = SchedulerMachine.TestCase


def test_a_long_urgent_prefill_does_not_stall_running_decodes() -> None:
    h = Harness.make(num_blocks=64, block_size=4, max_num_batched_tokens=8, aging_seconds=NO_AGING)
    decoders = [h.add(f"d{i}", prompt_len=2, max_new_tokens=20) for i in range(4)]
    h.step()  # all four prompts in one step; from now on they decode
    urgent = h.add("urgent", prompt_len=30, max_new_tokens=2, priority=1)
    for _ in range(4):
        batch = h.step()
        ran = {c.seq.request_id for c in batch.chunks}
        assert {d.request_id for d in decoders} <= ran  # every decode got its token
        assert batch.num_tokens <= 8
    assert urgent.num_computed_tokens > 0  # and the urgent prompt advanced alongside


def test_a_sliding_window_releases_the_blocks_behind_it() -> None:
    """Every layer local with a window of 6: a long sequence holds only its window's blocks,
    and finishing it returns the rest without touching the held block released entries name."""
    h = Harness.make(num_blocks=8, block_size=4, max_num_batched_tokens=8, window=6)
    seq = h.add("long", prompt_len=20, max_new_tokens=30)
    h.step()  # positions 0-7: the next query (8) sees 3 on, in block 0 (0-3): all kept
    assert RELEASED_BLOCK not in seq.block_table
    h.step()  # 8-15: the next query (16) sees 11 on, so blocks 0 (0-3) and 1 (4-7) go
    assert seq.block_table[:2] == [RELEASED_BLOCK] * 2
    assert RELEASED_BLOCK not in seq.block_table[2:]
    held = []
    while not seq.is_finished:
        h.step()
        held.append(sum(b != RELEASED_BLOCK for b in seq.block_table))
    assert seq.num_tokens == 50 > 8 * 4  # longer than the whole pool holds
    assert max(held) <= blocks_for(6, 4) + 1  # the window's blocks and the one being written
    assert h.scheduler.allocator.num_used == 1  # only the held one
