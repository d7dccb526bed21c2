"""Turns a `ScheduledBatch` into tensors, runs the model once, and samples.

All per-step index tensors are built here, once, on the host from small Python lists (block
tables, lengths), copied to the device in one go, and expanded to per-token slots there.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from gpu.block_allocator import blocks_for
from gpu.decode_graphs import PAD_LENGTH, PAD_SLOT, PAD_TOKEN, DecodeGraphs
from gpu.grammar.mask import TokenMasks
from gpu.grammar.matcher import JsonMatcher
from gpu.kernels.step_kernels import StepKernels
from gpu.kv_pool import PAD_BLOCK, KVPool
from gpu.models.attention import AttentionMetadata, DecodeGroup, PrefillSpan
from gpu.sampling import SamplingRows, SamplingTensors, apply_mask, sample_tokens, sampling_rows
from gpu.scheduler import ScheduledBatch, ScheduledChunk
from gpu.step_clock import StepClock
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


class CausalLM(Protocol):
    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv: KVPool,
        meta: AttentionMetadata,
        logits_rows: torch.Tensor,
    ) -> torch.Tensor: ...


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv: KVPool,
        device: torch.device,
        seed: int = 0,
        kernels: StepKernels | None = None,
        window: int | None = None,
        long_rope: tuple[int, int] | None = None,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        """`kernels`: a kernel library whose decode attention reads the pool in place (all
        decodes in one group: tokenmill's native CPU kernels, or Triton's on CUDA); None: SDPA
        over gathered blocks, grouped by length.
        `window`: the model's sliding window, if some layers have one: each step's metadata
        then carries its view through the window too (`AttentionMetadata.local`).
        `long_rope`: LongRoPE's (original, max_positions) (`gpu.models.layers.long_rope_rows`):
        each step's metadata then carries the rope table row of every token.
        `graphs`: the static decode path (`gpu.decode_graphs`), taken by steps of decodes
        only that fit it."""
        self.model = model
        self.long_rope = long_rope
        self.window = window
        self.kv = kv
        self.device = device
        self.kernels = kernels
        self.graphs = graphs
        self.block_size = kv.block_size
        # Seeds of unseeded sampled rows, drawn on the host: no device generator to read.
        self._seeds = random.Random(seed)
        self.inputs = StepInputs(device)
        self._sampling: tuple[Staged, ...] | None = None
        self._rows = Staged(0, 0, 0)  # the last `prepare`'s rows to sample

    def _draw_seed(self) -> int:
        return self._seeds.getrandbits(63)

    def _rope_rows(self, seq_tokens: int, start: int, end: int) -> range | list[int]:
        """The rope table rows of positions start .. end - 1 (the positions themselves,
        except for LongRoPE)."""
        if self.long_rope is None:
            return range(start, end)
        original, offset = self.long_rope
        # A sequence longer than `original` is rotated by the long factors throughout.
        shift = offset if seq_tokens > original else 0
        return [p + shift if p < original else p for p in range(start, end)]

    def prepare(
        self,
        chunks: list[ScheduledChunk],
        timing: StepClock | None = None,
        sampling: SamplingRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Inputs for chunks (decodes first): ids, positions, metadata, rows to sample.

        Everything is staged on the host first and sent in one copy (`StepInputs`); the
        tensors returned are views of the device buffer, valid until the next `prepare`.
        `sampling`: the sampled rows' parameters, sent in the same copy (`sampling_tensors`)."""
        stage = self.inputs
        stage.begin()
        ids: list[int] = []
        positions: list[int] = []
        rope_rows: list[int] = []
        slot_mapping: list[int] = []
        sample_rows: list[int] = []
        bs = self.block_size
        partial: list[int] = []  # blocks first written this step whose tail stays unwritten
        for chunk in chunks:
            seq = chunk.seq
            last = (chunk.end - 1) // bs
            if chunk.end % bs and last * bs >= chunk.start:
                partial.append(seq.block_table[last])
            table = seq.block_table
            slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(chunk.start, chunk.end))
            ids.extend(seq.token_slice(chunk.start, chunk.end))
            positions.extend(range(chunk.start, chunk.end))
            if self.long_rope is not None:
                rope_rows.extend(self._rope_rows(seq.num_tokens, chunk.start, chunk.end))
            if chunk.samples:
                sample_rows.append(len(ids) - 1)

        decodes = [c for c in chunks if c.is_decode]
        lengths_of = [c.end for c in decodes]
        # The kernels stop at each sequence's length: one group pads nothing they read.
        runs = group_by_length(lengths_of) if self.kernels is None else [(0, len(decodes))]
        runs = runs if decodes else []
        staged_ids, staged_positions = stage.put(ids), stage.put(positions)
        staged_slots = stage.put(slot_mapping)
        staged_rope = stage.put(rope_rows) if self.long_rope is not None else None
        staged_partial = stage.put(partial) if partial else None
        staged_groups = []
        for begin, end in runs:
            members = decodes[begin:end]
            width = blocks_for(members[-1].end, bs)
            tables = [c.seq.block_table for c in members]
            staged_groups.append((stage.put_rows(tables, width, PAD_BLOCK), width))
        staged_spans = [
            stage.put(c.seq.block_table[: blocks_for(c.end, bs)]) if c.start else None
            for c in chunks[len(decodes) :]
        ]
        staged_lengths = stage.put(lengths_of)
        # Only mid-prompt chunks: the K/V writes are the whole point; logits of row 0 unused.
        self._rows = stage.put(sample_rows or [0])
        local = None
        if self.window is not None:
            local = _LocalStaging.stage(self, chunks, decodes, runs)
        self._stage_sampling(sampling)
        stage.send()

        if staged_partial is not None:
            self.kv.zero(stage.view(staged_partial))
        all_lengths = stage.view(staged_lengths)
        groups: list[DecodeGroup] = []
        for (begin, end), (staged_blocks, width) in zip(runs, staged_groups, strict=True):
            lengths = all_lengths[begin:end]
            mask = None
            if self.kernels is None:
                keys = torch.arange(width * bs, device=self.device)
                valid = keys.unsqueeze(0) < lengths.unsqueeze(1)  # [members, width * block_size]
                mask = valid.view(end - begin, 1, 1, -1)
            groups.append(DecodeGroup(begin, end, stage.view(staged_blocks), lengths, mask))

        spans: list[PrefillSpan] = []
        row = len(decodes)
        for chunk, staged_table in zip(chunks[len(decodes) :], staged_spans, strict=True):
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
            timing=timing,
            kernels=self.kernels,
            local=None if local is None else local.build(self, groups, slots, timing),
            rope_rows=None if staged_rope is None else stage.view(staged_rope),
        )
        return stage.view(staged_ids), stage.view(staged_positions), meta, sample_rows

    @torch.inference_mode()
    def run(
        self,
        batch: ScheduledBatch,
        timing: StepClock | None = None,
        matchers: Mapping[str, JsonMatcher] | None = None,
        masks: TokenMasks | None = None,
    ) -> list[tuple[ScheduledChunk, int]]:
        """Compute the batch; return the sampled next token of each chunk that samples.
        `timing`: where to add the time of prepare, forward (and attention) and sample.
        `matchers`: the grammar of each constrained request, by id, whose masks `masks`
        builds (after the forward is launched, so on CUDA the two overlap)."""
        lap = timing.now() if timing is not None else 0.0
        # Decodes first, shortest context first (so length groups are contiguous), then prefills.
        chunks = sorted(batch.chunks, key=lambda c: (not c.is_decode, c.end if c.is_decode else 0))
        size = None
        if self.graphs is not None and all(c.is_decode for c in chunks):
            size = self.graphs.size_for(len(chunks))
        sampling = chunks if size is not None else [c for c in chunks if c.samples]
        params = [c.seq.params for c in sampling]
        rows = sampling_rows(params, [c.end for c in sampling], self._draw_seed)
        if size is not None:
            assert self.graphs is not None
            staged = self._stage_padded_decodes(chunks, size, rows)
            if timing is not None:
                lap = timing.lap("prepare", lap)
            logits = self.graphs.run(size, staged)[: len(chunks)]
        else:
            ids, positions, meta, _ = self.prepare(chunks, timing, rows)
            if timing is not None:
                lap = timing.lap("prepare", lap)
            logits = self.model(ids, positions, self.kv, meta, self.inputs.view(self._rows))
        if timing is not None:
            lap = timing.lap("forward", lap)
        if not sampling:
            return []
        mask = None
        if matchers and masks is not None:
            rows_matchers = [matchers.get(c.seq.request_id) for c in sampling]
            mask = masks.build(rows_matchers, logits.shape[-1])
        tensors = self.sampling_tensors()
        if tensors is None:  # every row greedy: only the argmax is used
            tokens = apply_mask(logits, mask).argmax(dim=-1)
        else:
            tokens = sample_tokens(logits, tensors, mask, True, rows.any_filtered)
        ids_out = tokens.tolist()  # the step's one read from the device
        if timing is not None:
            timing.lap("sample", lap)
        return list(zip(sampling, ids_out, strict=True))

    def _stage_padded_decodes(
        self, chunks: list[ScheduledChunk], size: int, sampling: SamplingRows | None = None
    ) -> torch.Tensor:
        """A decode-only step's inputs in `DecodeGraphs.layout(size)`, padded rows after the
        real ones; returns them on the device as one [words] tensor."""
        assert self.graphs is not None
        layout, stage, bs = self.graphs.layout(size), self.inputs, self.block_size
        stage.begin()
        pad = size - len(chunks)
        positions = [c.start for c in chunks]
        lengths = [c.end for c in chunks]
        tables = [c.seq.block_table for c in chunks]
        fields = {
            "ids": [c.seq.token_slice(c.start, c.end)[0] for c in chunks] + [PAD_TOKEN] * pad,
            "positions": positions + [0] * pad,
            "slots": [t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)]
            + [PAD_SLOT] * pad,
            "lengths": lengths + [PAD_LENGTH] * pad,
        }
        if layout.window:
            assert self.window is not None
            fields["starts"] = [max(0, n - self.window) for n in lengths] + [0] * pad
        if layout.long_rope:
            fields["rope_rows"] = [
                self._rope_rows(c.seq.num_tokens, c.start, c.end)[0] for c in chunks
            ] + [0] * pad
        first = stage.put(fields["ids"])
        for name in layout.fields[1:-1]:
            stage.put(fields[name])
        stage.put_rows(tables + [[]] * pad, layout.width, PAD_BLOCK)
        # Blocks this step starts (a decode at a block's first offset): their tails zeroed.
        partial = [t[p // bs] for t, p in zip(tables, positions, strict=True) if p % bs == 0]
        staged_partial = stage.put(partial) if partial else None
        self._stage_sampling(sampling)
        stage.send()
        if staged_partial is not None:
            self.kv.zero(stage.view(staged_partial))
        return stage.view(Staged(first.offset, layout.words, layout.words))

    def _stage_sampling(self, rows: SamplingRows | None) -> None:
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
        )

    def sampling_tensors(self) -> SamplingTensors | None:
        """The last step's staged sampling parameters on the device (None: all greedy)."""
        if self._sampling is None:
            return None
        return SamplingTensors(*(self.inputs.view(s) for s in self._sampling))


@dataclass(frozen=True)
class _LocalStaging:
    """The step seen through the sliding window, staged with the rest of the step's inputs:
    a query at p sees (p - window, p], and only the blocks holding those positions are read."""

    window: int
    # per decode group: (starts for the kernels, or each member's first block; blocks from
    # those firsts (SDPA only); their width)
    groups: tuple[tuple[Staged, Staged | None, int], ...]
    spans: tuple[tuple[ScheduledChunk, int, Staged | None], ...]  # (chunk, first block, blocks)

    @classmethod
    def stage(
        cls,
        runner: ModelRunner,
        chunks: list[ScheduledChunk],
        decodes: list[ScheduledChunk],
        runs: list[tuple[int, int]],
    ) -> _LocalStaging:
        assert runner.window is not None
        window, bs, stage = runner.window, runner.block_size, runner.inputs
        groups: list[tuple[Staged, Staged | None, int]] = []
        for begin, end in runs:
            members = decodes[begin:end]
            starts = [max(0, c.end - window) for c in members]
            if runner.kernels is not None:  # the kernel skips what precedes each start
                groups.append((stage.put(starts), None, 0))
                continue
            firsts = [start // bs for start in starts]
            width = max(blocks_for(c.end, bs) - f for c, f in zip(members, firsts, strict=True))
            tables = [c.seq.block_table[f:] for c, f in zip(members, firsts, strict=True)]
            groups.append((stage.put(firsts), stage.put_rows(tables, width, PAD_BLOCK), width))
        spans = []
        for chunk in chunks[len(decodes) :]:
            first = max(0, chunk.start - window + 1) // bs  # the block of the first key seen
            blocks = None
            if chunk.start:
                blocks = stage.put(chunk.seq.block_table[first : blocks_for(chunk.end, bs)])
            spans.append((chunk, first, blocks))
        return cls(window, tuple(groups), tuple(spans))

    def build(
        self,
        runner: ModelRunner,
        groups: list[DecodeGroup],
        slots: torch.Tensor,
        timing: StepClock | None,
    ) -> AttentionMetadata:
        window, bs, stage, device = self.window, runner.block_size, runner.inputs, runner.device
        local_groups: list[DecodeGroup] = []
        for group, (staged, staged_blocks, width) in zip(groups, self.groups, strict=True):
            if staged_blocks is None:
                local_groups.append(replace(group, starts=stage.view(staged)))
                continue
            # key j of member m is at position firsts[m] * bs + j
            base = stage.view(staged).unsqueeze(1) * bs
            keys = base + torch.arange(width * bs, device=device).unsqueeze(0)
            lengths = group.lengths.unsqueeze(1)
            valid = (keys < lengths) & (keys >= lengths - window)  # [members, width * bs]
            mask = valid.view(group.end - group.begin, 1, 1, -1)
            blocks = stage.view(staged_blocks)
            local_groups.append(DecodeGroup(group.begin, group.end, blocks, group.lengths, mask))

        spans: list[PrefillSpan] = []
        row = sum(g.end - g.begin for g in groups)
        for chunk, first, staged_table in self.spans:
            n = chunk.num_tokens
            query_pos = torch.arange(chunk.start, chunk.end, device=device).unsqueeze(1)
            if staged_table is None:
                key_pos = query_pos.view(1, -1)
                mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
                spans.append(PrefillSpan(row, row + n, n, None, mask if n > window else None))
            else:
                key_pos = torch.arange(first * bs, chunk.end, device=device).unsqueeze(0)
                mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
                blocks = stage.view(staged_table)
                spans.append(PrefillSpan(row, row + n, chunk.end - first * bs, blocks, mask))
            row += n
        return AttentionMetadata(
            slot_mapping=slots,
            decodes=tuple(local_groups),
            prefills=tuple(spans),
            timing=timing,
            kernels=runner.kernels,
            window=window,
        )
