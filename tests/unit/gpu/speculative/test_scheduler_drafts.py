"""The scheduler's verify chunks: a decoding sequence's guesses (`Sequence.draft_token_ids`)
ride after its last token within the spare budget and the free blocks, and
`advance(batch, accepted)` keeps the accepted ones' K/V and trims the table past the rest.

`step` drives it as the engine does: schedule, append the kept guesses and one token of the
model's own to every sampling chunk's sequence, then advance.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.prefix_hash import root_key
from gpu.scheduler import RELEASED_BLOCK, ScheduledBatch, Scheduler, SchedulerConfig
from gpu.sequence import SamplingParams, Sequence

ROOT = root_key("sha256:test", "none", "float32")
OWN = 9  # the model's own token after the kept guesses (no guess below is 9)


def make(
    num_blocks: int = 32,
    block_size: int = 4,
    budget: int = 32,
    prefix: bool = False,
    window: int | None = None,
) -> Scheduler:
    allocator = BlockAllocator(num_blocks + (window is not None))
    if window is not None:
        assert allocator.allocate() == RELEASED_BLOCK  # held, as the engine's padding is
    config = SchedulerConfig(
        block_size=block_size,
        max_num_batched_tokens=budget,
        admission_watermark=0.0,
        window=window,
    )
    return Scheduler(config, allocator, lambda: 0.0, prefix_key=ROOT if prefix else None)


def add(s: Scheduler, rid: str, prompt: list[int], priority: int = 0) -> Sequence:
    seq = Sequence(rid, list(prompt), SamplingParams(max_new_tokens=64), 0.0, priority=priority)
    s.add(seq)
    return seq


def step(s: Scheduler, accepted: Mapping[Sequence, int] | None = None) -> ScheduledBatch:
    batch = s.schedule()
    kept = dict(accepted or {})
    for chunk in batch.chunks:
        if chunk.samples:
            chunk.seq.output_token_ids += [*chunk.draft[: kept.get(chunk.seq, 0)], OWN]
    s.advance(batch, kept)
    for seq in s.running + s.waiting:
        seq.draft_token_ids = []
    return batch


def shape(batch: ScheduledBatch) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    return {c.seq.request_id: (c.start, c.num_tokens, c.draft) for c in batch.chunks}


def decoding(s: Scheduler, *prompt_lens: int) -> list[Sequence]:
    """Sequences r0, r1, .. (the first one the most urgent) whose prompts one step computes,
    each with its first token out."""
    seqs = [
        add(s, f"r{i}", list(range(1, n + 1)), priority=len(prompt_lens) - i)
        for i, n in enumerate(prompt_lens)
    ]
    step(s)
    assert all(q.num_uncomputed_tokens == 1 for q in seqs)
    return seqs


def probe(tokens: list[int]) -> Sequence:
    """A sequence to ask the prefix cache about (never scheduled)."""
    return Sequence("probe", tokens, SamplingParams(), 0.0)


# -- verify chunks -------------------------------------------------------------------------


def test_a_decoding_sequence_verifies_its_guesses_after_its_last_token() -> None:
    s = make()
    (seq,) = decoding(s, 5)  # 6 tokens, 5 computed
    seq.draft_token_ids = [11, 12, 13]
    batch = s.schedule()
    (chunk,) = batch.chunks
    assert (chunk.start, chunk.num_tokens, chunk.draft) == (5, 4, (11, 12, 13))
    assert chunk.samples and not chunk.is_decode and chunk.num_sampled == 4
    assert (batch.num_tokens, batch.num_draft_tokens) == (4, 3)
    assert (batch.num_decode_tokens, batch.num_prefill_tokens) == (4, 0)
    assert len(seq.block_table) == blocks_for(5 + 4, 4)  # the guesses' K/V have slots


def test_a_batch_counts_decodes_guesses_and_prefills_apart() -> None:
    s = make()
    a, b = decoding(s, 3, 3)
    a.draft_token_ids = [11, 12]
    add(s, "c", [1, 2, 3, 4, 5])
    batch = s.schedule()
    assert shape(batch) == {"r0": (3, 3, (11, 12)), "r1": (3, 1, ()), "c": (0, 5, ())}
    assert batch.num_draft_tokens == 2
    assert batch.num_decode_tokens == 3 + 1  # a's token and guesses, b's token
    assert batch.num_prefill_tokens == 5
    assert [c.num_sampled for c in batch.chunks] == [3, 1, 1]
    assert b.num_uncomputed_tokens == 1


def test_guesses_take_only_the_budget_the_running_sequences_leave() -> None:
    s = make(budget=8)
    a = add(s, "a", [1, 2], priority=2)
    b = add(s, "b", [1, 2], priority=1)
    c = add(s, "c", list(range(1, 8)))  # 7 tokens: 4 now, 3 left
    step(s)
    assert (a.num_uncomputed_tokens, b.num_uncomputed_tokens, c.num_uncomputed_tokens) == (1, 1, 3)
    a.draft_token_ids = [11] * 6
    batch = s.schedule()
    # 8 - a's token - b's token - c's 3 prompt tokens: 3 guesses.
    assert shape(batch) == {"a": (2, 4, (11, 11, 11)), "b": (2, 1, ()), "c": (4, 3, ())}
    assert batch.num_tokens == 8


def test_no_spare_budget_no_guesses() -> None:
    s = make(budget=3)
    a, _, _ = decoding(s, 1, 1, 1)
    a.draft_token_ids = [11, 12]
    assert all(c.draft == () for c in s.schedule().chunks)


def test_guesses_of_a_sequence_still_computing_its_prompt_or_waiting_are_ignored() -> None:
    s = make(budget=8)
    long = add(s, "long", list(range(1, 13)))
    step(s)  # 8 of 12 computed
    long.draft_token_ids = [11, 12]
    late = add(s, "late", [1, 2, 3])
    late.draft_token_ids = [11, 12]  # waiting: admitted without them
    assert shape(s.schedule()) == {"long": (8, 4, ()), "late": (0, 3, ())}


def test_a_pool_short_of_blocks_trims_the_guesses_without_preempting() -> None:
    s = make(num_blocks=3, block_size=4)
    (seq,) = decoding(s, 5)  # 2 blocks (positions 0-7) held, 1 free; position 5 next
    seq.draft_token_ids = [11] * 7  # positions 6-12: 4 blocks, one more than the pool has
    batch = s.schedule()
    assert shape(batch) == {"r0": (5, 7, (11,) * 6)}  # up to position 11: the last block
    assert batch.preempted == () and s.allocator.num_free == 0


def test_a_pool_short_of_blocks_keeps_the_guesses_that_fit_in_held_blocks() -> None:
    s = make(num_blocks=2, block_size=4)
    (seq,) = decoding(s, 5)  # 2 blocks (positions 0-7) held, none free; position 5 next
    seq.draft_token_ids = [11, 12, 13, 14]  # positions 6-9: 6 and 7 fit in block 1
    assert shape(s.schedule()) == {"r0": (5, 3, (11, 12))}


def test_a_guess_never_preempts_a_less_urgent_sequence() -> None:
    s = make(num_blocks=3, block_size=4)
    a, _ = decoding(s, 5, 3)  # a: blocks for 0-7, b: for 0-3; none free
    a.draft_token_ids = [11] * 6  # positions 6-11: one block more than a holds
    batch = s.schedule()
    assert batch.preempted == ()
    assert shape(batch) == {"r0": (5, 3, (11, 11)), "r1": (3, 1, ())}


def test_guesses_never_take_the_blocks_another_running_sequence_needs() -> None:
    s = make(num_blocks=5, block_size=4)
    a, _ = decoding(s, 4, 4)
    # Each holds one full block; both need a second for position 4; 3 blocks are free.
    # Without the guesses both run; a's 8 guesses (positions 5-12) would take all 3.
    a.draft_token_ids = [11] * 8
    batch = s.schedule()
    assert batch.preempted == ()
    assert shape(batch)["r1"] == (4, 1, ())
    assert 0 < len(shape(batch)["r0"][2]) < 8


# -- advance ---------------------------------------------------------------------------------


def test_advance_with_no_guess_kept_trims_the_table_back_to_the_token() -> None:
    s = make(num_blocks=8, block_size=4)
    (seq,) = decoding(s, 3)  # position 3 next: the end of block 0
    free = s.allocator.num_free
    seq.draft_token_ids = [11] * 6  # positions 4-9: two more blocks
    batch = step(s, {seq: 0})
    assert batch.chunks[0].num_tokens == 7
    assert seq.output_token_ids == [OWN, OWN]
    assert seq.num_computed_tokens == 4 and seq.num_tokens == 5
    assert len(seq.block_table) == 1 and s.allocator.num_free == free
    assert shape(step(s)) == {"r0": (4, 1, ())}  # the next step goes on from there


def test_advance_with_every_guess_kept_keeps_their_blocks() -> None:
    s = make(num_blocks=8, block_size=4)
    (seq,) = decoding(s, 3)
    free = s.allocator.num_free
    seq.draft_token_ids = [11, 12, 13, 14, 15, 16]
    step(s, {seq: 6})
    assert seq.output_token_ids == [OWN, 11, 12, 13, 14, 15, 16, OWN]
    assert seq.num_computed_tokens == 10 and seq.num_tokens == 11
    assert len(seq.block_table) == 3 and s.allocator.num_free == free - 2


def test_advance_with_some_guesses_kept_frees_the_blocks_past_them() -> None:
    s = make(num_blocks=8, block_size=2)
    (seq,) = decoding(s, 3)  # 2 blocks; position 3 next
    free = s.allocator.num_free
    seq.draft_token_ids = [11, 12, 13, 14, 15]  # positions 4-8: 3 more blocks
    step(s, {seq: 2})
    assert seq.num_computed_tokens == 6 and len(seq.block_table) == 3
    assert s.allocator.num_free == free - 1


def test_advance_refuses_more_kept_guesses_than_there_were() -> None:
    s = make()
    (seq,) = decoding(s, 3)
    seq.draft_token_ids = [11, 12]
    batch = s.schedule()
    with pytest.raises(ValueError, match="kept 3 of 2"):
        s.advance(batch, {seq: 3})


def test_a_sequence_finished_during_the_step_is_left_alone() -> None:
    s = make(num_blocks=4)
    (seq,) = decoding(s, 3)
    seq.draft_token_ids = [11, 12, 13, 14, 15]
    batch = s.schedule()
    seq.output_token_ids += [11, OWN]
    s.finish(seq, "stop")  # a stop token among the accepted ones
    s.advance(batch, {seq: 1})
    assert seq.block_table == [] and s.allocator.num_free == 4 and not s.has_work()


def test_only_blocks_full_of_accepted_tokens_are_offered_to_the_prefix_cache() -> None:
    s = make(num_blocks=8, block_size=4, prefix=True)
    (seq,) = decoding(s, 3)  # 1, 2, 3, OWN
    seq.draft_token_ids = [11, 12, 13, 14, 15]  # positions 4-8
    step(s, {seq: 1})  # 11 kept, 12 rejected
    guessed = probe([1, 2, 3, OWN, 11, 12, 13, 14, 15, 16])
    assert s.kv_cache.cached_prefix(guessed) == seq.block_table[:1]  # block 0 only
    seq.draft_token_ids = [12, 13, 14, 15]  # positions 6-9
    step(s, {seq: 4})
    assert seq.token_slice(0, 8) == [1, 2, 3, OWN, 11, OWN, 12, 13]
    again = probe([*seq.token_slice(0, 10), 1])
    assert s.kv_cache.cached_prefix(again) == seq.block_table[:2]
    assert s.kv_cache.cached_prefix(guessed) == seq.block_table[:1]


def test_a_kept_guess_past_the_window_releases_the_blocks_behind_it() -> None:
    s = make(num_blocks=8, block_size=2, window=3)
    (seq,) = decoding(s, 2)  # position 2 next
    seq.draft_token_ids = [11, 12, 13, 14]  # positions 3-6
    step(s, {seq: 3})
    # 6 computed: the next query (6) sees 4 on, so blocks 0 (0-1) and 1 (2-3) are released.
    assert seq.num_computed_tokens == 6
    assert seq.block_table[:2] == [RELEASED_BLOCK] * 2
    assert RELEASED_BLOCK not in seq.block_table[2:] and len(seq.block_table) == 3
    assert s.allocator.num_used == 1 + 1  # the held padding block and block 2 (4-5)
