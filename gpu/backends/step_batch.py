"""Turns a `ScheduledBatch`'s chunks into one step's `ModelInputs`, staged in one copy.

All per-step index tensors are built here, once, on the host from small Python lists (block
tables, lengths), copied to the device in one go (`gpu/step_inputs.py`), and expanded to
per-token slots there. How decodes are grouped is the backend's: a kernel that reads the
pool in place takes every decode in one group, no masks (`in_place`); SDPA over gathered
blocks takes groups of similar length, each with its mask.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import torch

from gpu.backends.metadata import AttentionMetadata, DecodeGroup, ModelInputs, PrefillSpan
from gpu.backends.window_staging import WindowStaging
from gpu.block_allocator import blocks_for
from gpu.kv_pool import PAD_BLOCK, KVPool
from gpu.penalties import PenaltyRows, PenaltyTensors
from gpu.sampling import SamplingRows, SamplingTensors
from gpu.scheduler import ScheduledChunk
from gpu.step_inputs import Staged, StepInputs

# A decode group's longest context is at most GROUP_SLACK × its shortest + GROUP_SLACK_TOKENS.
GROUP_SLACK = 1.25
GROUP_SLACK_TOKENS = 16


def group_by_length(lengths: list[int]) -> list[tuple[int, int]]:
    """Split ascending `lengths` into [begin, end) runs whose padding stays within the slack."""
    runs: list[tuple[int, int]] = []
    begin = 0
    for i, length in enumerate(lengths):
        if length > lengths[begin] * GROUP_SLACK + GROUP_SLACK_TOKENS:
            runs.append((begin, i))
            begin = i
    if lengths:
        runs.append((begin, len(lengths)))
    return runs


def _decode_rows(chunk: ScheduledChunk) -> list[ScheduledChunk]:
    """A decode as itself; a verify chunk as one decode per position (`build`)."""
    if not chunk.draft:
        return [chunk]
    seq = chunk.seq
    return [
        ScheduledChunk(seq, p, 1, samples=True, is_decode=True)
        for p in range(chunk.start, chunk.end)
    ]


class StepBuilder:
    def __init__(
        self,
        kv: KVPool,
        device: torch.device,
        *,
        in_place: bool,
        seed: int = 0,
        window: int | None = None,
        long_rope: tuple[int, int] | None = None,
    ) -> None:
        """`in_place`: decode attention reads the pool in place (one group, no masks).
        `window`: the model's sliding window, if some layers have one: each step's metadata
        then carries its view through the window too (`AttentionMetadata.local`).
        `long_rope`: LongRoPE's (original, max_positions) (`gpu.models.layers.long_rope_rows`):
        each step then carries the rope table row of every token."""
        self.kv = kv
        self.device = device
        self.in_place = in_place
        self.window = window
        self.long_rope = long_rope
        self.block_size = kv.block_size
        # Seeds of unseeded sampled rows, drawn on the host: no device generator to read.
        self._seeds = random.Random(seed)
        self.inputs = StepInputs(device)
        self._sampling: tuple[Staged, ...] | None = None
        self._penalties: tuple[bool, tuple[Staged, ...]] | None = None
        self._prompt_targets: Staged | None = None

    def draw_seed(self) -> int:
        return self._seeds.getrandbits(63)

    def rope_rows(self, seq_tokens: int, start: int, end: int) -> range | list[int]:
        """The rope table rows of positions start .. end - 1 (the positions themselves,
        except for LongRoPE)."""
        if self.long_rope is None:
            return range(start, end)
        original, offset = self.long_rope
        # A sequence longer than `original` is rotated by the long factors throughout.
        shift = offset if seq_tokens > original else 0
        return [p + shift if p < original else p for p in range(start, end)]

    def build(
        self,
        chunks: list[ScheduledChunk],
        sampling: SamplingRows | None = None,
        scored: Mapping[ScheduledChunk, range] | None = None,
    ) -> ModelInputs:
        """Inputs for chunks (decodes first, shortest context first).

        Everything is staged on the host first and sent in one copy; the tensors returned
        are views of the device buffer, valid until the next `build`. `sampling`: the sampled
        rows' parameters, sent in the same copy (`sampling_tensors`). `scored`: prompt
        positions whose logits score the next prompt token, by chunk (prompt logprobs): their
        rows follow the sampled rows in `logits_rows`, in `chunks`' order, and the tokens they
        score are staged too (`prompt_targets`)."""
        stage = self.inputs
        stage.begin()
        ids: list[int] = []
        positions: list[int] = []
        rope_rows: list[int] = []
        slot_mapping: list[int] = []
        sample_rows: list[int] = []
        prompt_rows: list[int] = []
        prompt_targets: list[int] = []
        bs = self.block_size
        partial: list[int] = []  # blocks first written this step whose tail stays unwritten
        for chunk in chunks:
            seq = chunk.seq
            last = (chunk.end - 1) // bs
            if chunk.end % bs and last * bs >= chunk.start:
                partial.append(seq.block_table[last])
            table = seq.block_table
            slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(chunk.start, chunk.end))
            ids.extend(seq.token_slice(chunk.start, chunk.end - len(chunk.draft)))
            ids.extend(chunk.draft)  # a verify chunk's guesses follow its last token
            positions.extend(range(chunk.start, chunk.end))
            if self.long_rope is not None:
                rope_rows.extend(self.rope_rows(seq.num_tokens, chunk.start, chunk.end))
            if chunk.samples:  # the last token's row, and each guess's
                sample_rows.extend(range(len(ids) - chunk.num_sampled, len(ids)))
            if scored and (positions_scored := scored.get(chunk)):
                base = len(ids) - chunk.num_tokens - chunk.start  # row of position 0
                prompt_rows.extend(base + p for p in positions_scored)
                prompt_targets.extend(seq.prompt_token_ids[p + 1] for p in positions_scored)

        # Decode attention rows: one per decode, and one per position of a verify chunk (its
        # last token and each guess: row j attends to the positions up to its own, whose K/V
        # the step writes first), so guesses are checked by the decode kernels, not a prefill.
        decodes = [row for c in chunks if c.is_decode or c.draft for row in _decode_rows(c)]
        prefills = [c for c in chunks if not (c.is_decode or c.draft)]
        rows_of = decodes + prefills  # in token order (the caller puts decodes first)
        lengths_of = [c.end for c in decodes]
        # A kernel stops at each sequence's length: one group pads nothing it reads.
        runs = [(0, len(decodes))] if self.in_place else group_by_length(lengths_of)
        runs = runs if decodes else []
        staged_ids, staged_positions = stage.put(ids), stage.put(positions)
        staged_slots = stage.put(slot_mapping)
        staged_rope = stage.put(rope_rows) if self.long_rope is not None else None
        staged_partial = stage.put(partial) if partial else None
        staged_groups = []
        for begin, end in runs:
            members = decodes[begin:end]
            width = blocks_for(max(c.end for c in members), bs)
            # Each its own blocks, then padding: blocks held for what is not computed yet
            # (guesses) hold what the memory held, NaN maybe, and 0 × NaN is NaN past a mask.
            tables = [c.seq.block_table[: blocks_for(c.end, bs)] for c in members]
            staged_groups.append((stage.put_rows(tables, width, PAD_BLOCK), width))
        staged_spans = [
            stage.put(c.seq.block_table[: blocks_for(c.end, bs)]) if c.start else None
            for c in prefills
        ]
        staged_lengths = stage.put(lengths_of)
        # Only mid-prompt chunks: the K/V writes are the whole point; logits of row 0 unused.
        staged_rows = stage.put(sample_rows + prompt_rows or [0])
        self._prompt_targets = stage.put(prompt_targets) if prompt_targets else None
        local = None
        if self.window is not None:
            local = WindowStaging.stage(
                stage, self.window, bs, self.in_place, rows_of, decodes, runs
            )
        self._stage_sampling(sampling)
        stage.send()

        if staged_partial is not None:
            self.kv.zero(stage.view(staged_partial))
        all_lengths = stage.view(staged_lengths)
        groups: list[DecodeGroup] = []
        for (begin, end), (staged_blocks, width) in zip(runs, staged_groups, strict=True):
            lengths = all_lengths[begin:end]
            mask = None
            if not self.in_place:
                keys = torch.arange(width * bs, device=self.device)
                valid = keys.unsqueeze(0) < lengths.unsqueeze(1)  # [members, width * block_size]
                mask = valid.view(end - begin, 1, 1, -1)
            groups.append(DecodeGroup(begin, end, stage.view(staged_blocks), lengths, mask))

        spans: list[PrefillSpan] = []
        row = len(decodes)
        for chunk, staged_table in zip(prefills, staged_spans, strict=True):
            n = chunk.num_tokens
            blocks = None if staged_table is None else stage.view(staged_table)
            # A chunk over cached context attends lower-right causally: query i, at position
            # start + i, sees keys 0 .. start + i (no mask tensor: `PrefillSpan.mask` None).
            spans.append(PrefillSpan(row, row + n, chunk.end, blocks, None))
            row += n

        slots = stage.view(staged_slots)
        meta = AttentionMetadata(
            slot_mapping=slots,
            decodes=tuple(groups),
            prefills=tuple(spans),
            local=None if local is None else local.build(stage, groups, slots),
        )
        positions_view = stage.view(staged_positions)
        return ModelInputs(
            input_ids=stage.view(staged_ids),
            positions=positions_view,
            rope_rows=positions_view if staged_rope is None else stage.view(staged_rope),
            attention=meta,
            logits_rows=stage.view(staged_rows),
        )

    def stage_padded_decodes(
        self,
        chunks: list[ScheduledChunk],
        fields: dict[str, list[int]],
        tables: list[list[int]],
        width: int,
        sampling: SamplingRows | None = None,
    ) -> torch.Tensor:
        """A decode-only step's inputs laid out field after field (`fields`' order, then the
        block tables [rows, width]); returns them on the device as one [words] tensor."""
        stage, bs = self.inputs, self.block_size
        stage.begin()
        names = list(fields)
        first = stage.put(fields[names[0]])
        for name in names[1:]:
            stage.put(fields[name])
        stage.put_rows(tables, width, PAD_BLOCK)
        words = len(tables) * (len(names) + width)
        # Blocks this step starts (a decode at a block's first offset): their tails zeroed.
        partial = [c.seq.block_table[c.start // bs] for c in chunks if c.start % bs == 0]
        staged_partial = stage.put(partial) if partial else None
        self._stage_sampling(sampling)
        stage.send()
        if staged_partial is not None:
            self.kv.zero(stage.view(staged_partial))
        return stage.view(Staged(first.offset, words, words))

    def _stage_sampling(self, rows: SamplingRows | None) -> None:
        penalties = None if rows is None else rows.penalties
        self._penalties = None if penalties is None else self._stage_penalties(penalties)
        if rows is None or not rows.any_sampled:
            self._sampling = None
            return
        stage = self.inputs
        self._sampling = (
            stage.put_floats(rows.temperature),
            stage.put(rows.top_k),
            stage.put_floats(rows.top_p),
            stage.put(rows.seeds),
            stage.put(rows.positions),
            stage.put_floats(rows.min_p),
        )

    def _stage_penalties(self, rows: PenaltyRows) -> tuple[bool, tuple[Staged, ...]]:
        stage = self.inputs
        return rows.penalized, tuple(
            stage.put_floats(values) if floats else stage.put(values)  # type: ignore[arg-type]
            for values, floats in rows.lists()
        )

    def penalty_tensors(self) -> PenaltyTensors | None:
        """The last step's staged penalties on the device (None: no row has any)."""
        if self._penalties is None:
            return None
        penalized, staged = self._penalties
        return PenaltyTensors.of([self.inputs.view(s) for s in staged], penalized)

    def prompt_targets(self) -> torch.Tensor | None:  # [prompt rows] int64
        """The last `build`'s scored prompt rows' targets on the device (None: none)."""
        return None if self._prompt_targets is None else self.inputs.view(self._prompt_targets)

    def sampling_tensors(self) -> SamplingTensors | None:
        """The last step's staged sampling parameters on the device (None: all greedy)."""
        if self._sampling is None:
            return None
        return SamplingTensors(*(self.inputs.view(s) for s in self._sampling))
