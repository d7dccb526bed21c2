"""What one step hands the model: its flat inputs and the attention metadata every layer reads.

A backend builds one `ModelInputs` per step (`gpu/backends/step_batch.py`, or the static
decode buffers of `gpu/backends/decode_graphs.py`). Tokens of a step are laid out flat: the
decode tokens first (one per sequence), then each prefill chunk's tokens in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillSpan:
    """One prefill chunk: rows `begin:end` of the step, at positions `start .. start + n - 1`."""

    begin: int
    end: int
    context: int  # start + n: how many positions the chunk attends to
    blocks: torch.Tensor | None  # [ceil(context / block_size)] the block table's head; None
    # when the chunk is the whole context (start == 0): it attends to its own K/V directly.
    mask: torch.Tensor | None  # [n, context] bool, True = may attend; None = causal, from
    # the lower right: query i, at position context - n + i, sees keys 0 .. context - n + i


@dataclass(frozen=True)
class DecodeGroup:
    """Decodes, rows `begin:end`, attended in one call.

    Each sequence's block table is padded to the group's widest (with block 0). A kernel that
    reads the pool in place stops at each table's length, so all decodes form one group; SDPA
    attends the gathered padding too (masked out), so for it decodes are grouped by similar
    length, keeping that padding, copied and attended for nothing, small.
    """

    begin: int
    end: int
    blocks: torch.Tensor  # [sequences * width] block tables, padded with block 0
    lengths: torch.Tensor  # [sequences] int64 positions each sequence attends to
    mask: torch.Tensor | None  # [sequences, 1, 1, width * block_size] bool, False past each
    # length; None where a kernel attends in place (it needs none)
    starts: torch.Tensor | None = None  # [sequences] int64 first position attended (a window)


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] flat slot receiving each new token's K/V
    decodes: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillSpan, ...]
    window: int | None = None  # the sliding window these groups and spans see; None: all
    local: AttentionMetadata | None = None  # the step through the sliding window, if any

    def for_window(self, window: int | None) -> AttentionMetadata:
        """The view a layer with this sliding window (None: full attention) attends through."""
        if window is None:
            return self
        if self.local is None or self.local.window != window:
            raise ValueError(f"this step was not prepared for a sliding window of {window}")
        return self.local

    @property
    def decodes_only(self) -> int | None:
        """The number of decodes when the step is decodes only, in one group; else None."""
        if self.prefills or len(self.decodes) != 1:
            return None
        return self.decodes[0].end - self.decodes[0].begin


@dataclass(frozen=True)
class ModelInputs:
    """One step's inputs to a model's forward, all on the device."""

    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    rope_rows: torch.Tensor  # [tokens] int64 rows of the rope tables (the positions, except
    # LongRoPE's: `gpu.models.layers.long_rope_rows`)
    attention: AttentionMetadata
    logits_rows: torch.Tensor  # [rows] which tokens' next-token logits are needed
