"""Turns a `ScheduledBatch` into tensors, runs the model once, and samples.

All per-step index tensors are built here, once, on the host from small Python lists (block
tables, lengths), copied to the device in one go, and expanded to per-token slots there.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gpu.attention import AttentionMetadata, PrefillSpan
from gpu.kv_pool import KVPool
from gpu.sampling import sample
from gpu.scheduler import ScheduledBatch, ScheduledChunk


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
    def __init__(self, model: CausalLM, kv: KVPool, device: torch.device, seed: int = 0) -> None:
        self.model = model
        self.kv = kv
        self.device = device
        self.block_size = kv.block_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def _to_device(self, values: list[int]) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=torch.long)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def _slots(self, block_tables: list[list[int]], length: int) -> torch.Tensor:
        """Flat KV slots of positions 0 .. length-1 for each table: [tables, length]."""
        width = -(-length // self.block_size)
        padded = [t[:width] + [0] * (width - len(t[:width])) for t in block_tables]
        blocks = self._to_device([b for row in padded for b in row]).view(len(padded), width)
        offsets = torch.arange(self.block_size, device=self.device)
        slots = blocks.unsqueeze(-1) * self.block_size + offsets  # [tables, width, block_size]
        return slots.flatten(1)[:, :length]

    def prepare(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Inputs for chunks (decodes first): ids, positions, metadata, rows to sample."""
        ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        sample_rows: list[int] = []
        bs = self.block_size
        for chunk in chunks:
            seq = chunk.seq
            for pos in range(chunk.start, chunk.end):
                slot_mapping.append(seq.block_table[pos // bs] * bs + pos % bs)
            ids.extend(seq.token_slice(chunk.start, chunk.end))
            positions.extend(range(chunk.start, chunk.end))
            if chunk.samples:
                sample_rows.append(len(ids) - 1)

        decodes = [c for c in chunks if c.is_decode]
        decode_slots = decode_mask = None
        if decodes:
            lengths = [c.end for c in decodes]
            longest = max(lengths)
            slots = self._slots([c.seq.block_table for c in decodes], longest)
            valid = torch.arange(longest, device=self.device).unsqueeze(0) < self._to_device(
                lengths
            ).unsqueeze(1)  # [decodes, longest]
            # Padding reads slot 0 (always finite; see KVPool), never a stale or unwritten slot.
            decode_slots = torch.where(valid, slots, 0)
            decode_mask = valid.view(len(decodes), 1, 1, longest)

        spans: list[PrefillSpan] = []
        row = len(decodes)
        for chunk in chunks[len(decodes) :]:
            n = chunk.num_tokens
            if chunk.start == 0:
                spans.append(PrefillSpan(row, row + n, None, None))
            else:
                context = self._slots([chunk.seq.block_table], chunk.end)[0]  # [end]
                query_pos = torch.arange(chunk.start, chunk.end, device=self.device).unsqueeze(1)
                key_pos = torch.arange(chunk.end, device=self.device).unsqueeze(0)
                spans.append(PrefillSpan(row, row + n, context, key_pos <= query_pos))
            row += n

        meta = AttentionMetadata(
            slot_mapping=self._to_device(slot_mapping),
            num_decodes=len(decodes),
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=tuple(spans),
        )
        return self._to_device(ids), self._to_device(positions), meta, sample_rows

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[tuple[ScheduledChunk, int]]:
        """Compute the batch; return the sampled next token of each chunk that samples."""
        chunks = sorted(batch.chunks, key=lambda c: not c.is_decode)  # stable: decodes first
        ids, positions, meta, sample_rows = self.prepare(chunks)
        sampling = [c for c in chunks if c.samples]
        if not sampling:
            # Only mid-prompt chunks: the K/V writes are the whole point; no logits needed.
            sample_rows = [0]
        logits = self.model(ids, positions, self.kv, meta, self._to_device(sample_rows))
        if not sampling:
            return []
        tokens = sample(
            logits,
            [c.seq.params for c in sampling],
            [c.end for c in sampling],
            self.generator,
        )
        return list(zip(sampling, tokens, strict=True))
