"""A step's small inputs, staged on the host and sent to the device in one copy.

Every index tensor a step needs (token ids, positions, slots, block tables, lengths, rows to
sample, sampling parameters) is written, as the step is prepared, into one host buffer of
int64 words, and the filled part goes to the device in one non-blocking copy. Each value is
then a view of one persistent device buffer: no step allocates its inputs, blocks on a
host→device copy, or reads a device tensor back.

On CUDA the host buffer is pinned, so the copy is a true asynchronous DMA; before the buffer is
written again the previous copy is waited for (an event, not a device-wide sync: that copy
was queued ahead of the previous step's model and is long done). On the CPU the host buffer
is the device buffer and there is no copy at all.

Float32 values take half a word each (`put_floats`); their view is reinterpreted, not
converted, so they arrive bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Staged:
    """Where `put` or `put_floats` left values: words `offset .. offset + words - 1`."""

    offset: int
    count: int
    words: int
    floats: bool = False


class StepInputs:
    def __init__(self, device: torch.device, capacity: int = 1 << 14) -> None:
        """`capacity`: int64 words to start with; the buffers double when a step needs more
        (between steps, never inside a captured graph)."""
        self.device = device
        self._allocate(capacity)
        self._used = 0
        self._copied: torch.cuda.Event | None = None

    def _allocate(self, capacity: int) -> None:
        on_cuda = self.device.type == "cuda"
        self.host = torch.empty(capacity, dtype=torch.int64, pin_memory=on_cuda)
        self.words = self.host.numpy()
        self.buffer = (
            torch.empty(capacity, dtype=torch.int64, device=self.device) if on_cuda else self.host
        )

    @property
    def capacity(self) -> int:
        return self.host.numel()

    def begin(self) -> None:
        """Start a step's inputs; the previous step's views are not to be used after this."""
        if self._copied is not None:
            self._copied.synchronize()  # the last copy out of the host buffer is done
            self._copied = None
        self._used = 0

    def _reserve(self, words: int) -> int:
        offset = self._used
        if offset + words > self.capacity:
            old = self.words[:offset].copy()
            self._allocate(max(2 * self.capacity, offset + words))
            self.words[:offset] = old
        self._used = offset + words
        return offset

    def put(self, values: Sequence[int] | np.ndarray) -> Staged:
        """Stage int64 values; `view` gives them on the device after `send`."""
        count = len(values)
        offset = self._reserve(count)
        self.words[offset : offset + count] = values
        return Staged(offset, count, count)

    def put_rows(self, rows: Sequence[Sequence[int]], width: int, pad: int) -> Staged:
        """Stage a [len(rows), width] int64 matrix, each row padded with `pad`."""
        offset = self._reserve(len(rows) * width)
        matrix = self.words[offset : offset + len(rows) * width].reshape(len(rows), width)
        for i, row in enumerate(rows):
            head = row[:width]
            matrix[i, : len(head)] = head
            matrix[i, len(head) :] = pad
        return Staged(offset, len(rows) * width, len(rows) * width)

    def put_floats(self, values: Sequence[float]) -> Staged:
        """Stage float32 values, two to a word."""
        count = len(values)
        words = (count + 1) // 2
        offset = self._reserve(words)
        self.words[offset : offset + words].view(np.float32)[:count] = values
        return Staged(offset, count, words, floats=True)

    def send(self) -> None:
        """Copy what this step staged to the device: one non-blocking copy (none on CPU)."""
        if self.buffer is self.host or not self._used:
            return
        self.buffer[: self._used].copy_(self.host[: self._used], non_blocking=True)
        self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._copied.record()

    def view(self, staged: Staged) -> torch.Tensor:
        """The staged values on the device: int64 [count], or float32 [count]."""
        words = self.buffer[staged.offset : staged.offset + staged.words]
        if staged.floats:
            return words.view(torch.float32)[: staged.count]
        return words
