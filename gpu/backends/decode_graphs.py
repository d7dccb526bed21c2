"""Decode steps through static buffers, padded to a few batch sizes; on CUDA, graphs.

A step whose chunks are all decodes (one token a sequence) and whose batch fits the largest
size runs here: its inputs are padded to the next size of `graph_sizes`, copied with one
device copy into that size's input buffer (whose address never changes), and the model runs
over views of that buffer. On CUDA each size's forward is captured once, at engine start, as a
CUDA graph, and a step is one copy plus one replay: no kernel launches from Python. Elsewhere
the same path runs eagerly, which is how the tests show it gives the dynamic path's tokens.

Padded rows are inert: token 0 at position 0, writing its K/V into slot 0 of the padding
block (`PAD_BLOCK`, never a sequence's) and attending to that one slot. Rows do not mix in
any op of the forward (projections, norms, attention), so a padded row can never change a
real one; their logits are dropped.

Attention needs a backend whose decode attention takes the lengths as tensors (a kernel
library's, `in_place`): there are no masks here, because a mask's shape would follow the
contexts. The forward run (and captured) is the backend's, whole-step fast paths included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from gpu.backends.metadata import AttentionMetadata, DecodeGroup, ModelInputs
from gpu.backends.step_batch import StepBuilder
from gpu.sampling import SamplingRows
from gpu.scheduler import ScheduledChunk

# Batch sizes a decode step is padded to, up to the engine's max_num_seqs (then every 32).
BASE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)
PAD_TOKEN = 0
PAD_SLOT = 0  # slot 0 of the padding block
PAD_LENGTH = 1


def graph_sizes(max_seqs: int) -> tuple[int, ...]:
    """The padded batch sizes for an engine of `max_seqs` sequences, ascending; the last is
    `max_seqs` itself."""
    sizes = [s for s in BASE_SIZES if s < max_seqs]
    top = BASE_SIZES[-1]
    while top + 32 < max_seqs:
        top += 32
        sizes.append(top)
    return (*sizes, max_seqs)


@dataclass(frozen=True)
class DecodeLayout:
    """How a padded decode step's inputs lie in its one int64 buffer, field after field."""

    size: int  # rows (sequences, real and padded)
    width: int  # block-table entries per row
    window: bool  # a `starts` field (sliding-window models)
    long_rope: bool  # a `rope_rows` field (LongRoPE)

    @property
    def fields(self) -> tuple[str, ...]:
        names = ["ids", "positions", "slots", "lengths"]
        names += ["starts"] if self.window else []
        names += ["rope_rows"] if self.long_rope else []
        return (*names, "tables")

    @property
    def words(self) -> int:
        return self.size * (len(self.fields) - 1 + self.width)

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each field of `buffer` [words]: [size] vectors, and tables [size, width]."""
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for name in self.fields[:-1]:
            out[name] = buffer[offset : offset + self.size]
            offset += self.size
        out["tables"] = buffer[offset : offset + self.size * self.width].view(self.size, -1)
        return out


class DecodeGraphs:
    def __init__(
        self,
        forward: Callable[[ModelInputs], torch.Tensor],
        device: torch.device,
        *,
        max_seqs: int,
        max_blocks: int,
        window: int | None = None,
        long_rope: bool = False,
    ) -> None:
        """`forward`: the backend's step forward. `max_blocks`: block-table width, enough for a
        sequence of max_model_len. `window`: the model's sliding window, if some layers have
        one. `long_rope`: the model reads its rope tables by row (LongRoPE), not by position."""
        self.forward = forward
        self.device = device
        self.window = window
        self.sizes = graph_sizes(max_seqs)
        self.layouts = {
            size: DecodeLayout(size, max_blocks, window is not None, long_rope)
            for size in self.sizes
        }
        self.inputs = {
            size: self._idle_inputs(layout) for size, layout in self.layouts.items()
        }  # size -> [words] int64, the address each graph reads
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # size -> [size, vocab] logits a graph writes
        self.graph_bytes = 0  # device memory the captured graphs hold

    def _idle_inputs(self, layout: DecodeLayout) -> torch.Tensor:
        buffer = torch.zeros(layout.words, dtype=torch.int64, device=self.device)
        layout.views(buffer)["lengths"].fill_(PAD_LENGTH)
        return buffer

    def size_for(self, rows: int) -> int | None:
        """The padded size a step of `rows` decodes runs at; None: more than the largest."""
        return next((s for s in self.sizes if s >= rows), None)

    def layout(self, size: int) -> DecodeLayout:
        return self.layouts[size]

    def stage(
        self,
        builder: StepBuilder,
        chunks: list[ScheduledChunk],
        size: int,
        sampling: SamplingRows | None = None,
    ) -> torch.Tensor:
        """A decode-only step's inputs in `layout(size)`, padded rows after the real ones; on
        the device as one [words] tensor (`builder`'s one copy, the sampled rows' parameters
        with it)."""
        layout, bs = self.layout(size), builder.block_size
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
                builder.rope_rows(c.seq.num_tokens, c.start, c.end)[0] for c in chunks
            ] + [0] * pad
        ordered = {name: fields[name] for name in layout.fields[:-1]}
        return builder.stage_padded_decodes(
            chunks, ordered, tables + [[]] * pad, layout.width, sampling
        )

    def run(self, size: int, staged: torch.Tensor) -> torch.Tensor:
        """The logits [size, vocab] of a padded decode step whose inputs `staged` [words]
        hold in `layout(size)`'s order (rows past the real ones padded as above)."""
        self.inputs[size].copy_(staged)
        graph = self.graphs.get(size)
        if graph is None:
            return self._forward(size)
        graph.replay()
        return self.outputs[size]

    def _forward(self, size: int) -> torch.Tensor:  # [size, vocab] float32
        layout = self.layouts[size]
        f = layout.views(self.inputs[size])
        group = DecodeGroup(0, size, f["tables"].view(-1), f["lengths"], None)
        local = None
        if self.window is not None:
            local = AttentionMetadata(
                slot_mapping=f["slots"],
                decodes=(DecodeGroup(0, size, group.blocks, group.lengths, None, f["starts"]),),
                prefills=(),
                window=self.window,
            )
        meta = AttentionMetadata(
            slot_mapping=f["slots"], decodes=(group,), prefills=(), local=local
        )
        rows = torch.arange(size, device=self.device)
        rope_rows = f.get("rope_rows", f["positions"])
        return self.forward(ModelInputs(f["ids"], f["positions"], rope_rows, meta, rows))

    def capture(self) -> None:
        """Capture every size's forward as a CUDA graph (largest first, one memory pool):
        at engine start, on the thread that will replay them. CUDA only."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        pool = torch.cuda.graph_pool_handle()
        before = torch.cuda.memory_reserved(self.device)
        with _side_stream(self.device):
            for size in reversed(self.sizes):
                self._forward(size)  # warm-up: Triton compiles, cuBLAS picks its kernels
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = self._forward(size)
                self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        self.graph_bytes = torch.cuda.memory_reserved(self.device) - before


@contextmanager
def _side_stream(device: torch.device) -> Iterator[None]:
    """Warm-up and capture off the default stream, as CUDA graph capture requires."""
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)
