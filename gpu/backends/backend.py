"""`Backend`: one execution strategy for the engine's steps, chosen once when the engine is built.

A backend owns how a `ScheduledBatch` becomes the step's inputs and metadata (`prepare`), the
layer operations the model's one forward is written in (`ops`, `gpu/backends/layer_ops.py`),
and its whole-step fast paths, each a wrapper around that forward: the static decode path
(`gpu/backends/decode_graphs.py`: CUDA graphs on CUDA, run eagerly elsewhere) and, on the
native CPU backend, the one-call decode step (`gpu/backends/native.py`). The engine calls
`prepare`, `compute` and `sample` in turn (it times `compute`, an observer each).

    backend      ops          decode attention              fast paths
    torch        TorchOps     SDPA over gathered blocks     -
    native       KernelOps    tokenmill's C kernels         one-call decode step, static decodes
    triton       KernelOps    Triton kernels                CUDA graphs
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from gpu.backends.decode_graphs import DecodeGraphs
from gpu.backends.layer_ops import LayerOps
from gpu.backends.metadata import ModelInputs
from gpu.backends.step_batch import StepBuilder
from gpu.grammar.mask import TokenMasks
from gpu.grammar.matcher import GrammarMatcher
from gpu.kv_pool import KVPool
from gpu.logprobs import (
    TokenLogprob,
    prompt_logprobs,
    raw_logprobs,
    read_sampled,
    read_step,
    unpack_prompt_row,
)
from gpu.penalties import apply_penalties, penalty_rows
from gpu.sampling import SamplingRows, apply_mask, sample_tokens, sampling_rows
from gpu.scheduler import ScheduledBatch, ScheduledChunk

# A chunk that samples, the token sampled at each of its sampled rows (one; a verify chunk's
# 1 + len(draft), `gpu.speculative.verify`) and each one's logprobs (None: none asked).
Sampled = tuple[ScheduledChunk, list[int], list[TokenLogprob | None]]
# A prefill chunk of a request asking prompt logprobs: its scored positions' logprobs, in order
# (`Sequence.unscored_prompt_positions`).
Scored = tuple[ScheduledChunk, list[TokenLogprob]]


class StepSample(NamedTuple):
    """What a step's logits give: the sampled tokens, and the prompt logprobs scored."""

    sampled: list[Sampled]
    scored: Sequence[Scored] = ()


class CausalLM(Protocol):
    """A model file's model (`gpu/models/`): one forward, written in `LayerOps`."""

    def __call__(
        self, inputs: ModelInputs, kv: KVPool, ops: LayerOps
    ) -> torch.Tensor: ...  # [rows, vocab] float32


@dataclass(frozen=True)
class PreparedStep:
    """A step ready to compute: its chunks in step order, the ones that sample, and its inputs
    (`inputs`, or a static decode step's padded buffer `padded` of `size` rows)."""

    chunks: list[ScheduledChunk]  # decodes first, shortest context first, then prefills
    sampling: list[ScheduledChunk]  # the chunks whose logits are sampled, in row order
    # (`ScheduledChunk.num_sampled` rows each)
    rows: SamplingRows  # their sampling parameters (staged with the inputs)
    inputs: ModelInputs | None = None
    size: int = 0
    padded: torch.Tensor | None = None  # [words] in the graphs' layout(size)
    # Prompt positions whose logits score the next prompt token, by chunk: their logits rows
    # follow the sampled rows (prefills only: the static decode path never has any).
    scored: Mapping[ScheduledChunk, range] = field(default_factory=dict)


@dataclass(frozen=True)
class StaticDecodes:
    """The static decode path's sizes: enabled when a backend is built with one."""

    max_seqs: int
    max_blocks: int  # block-table width, enough for a sequence of max_model_len


class Backend:
    name = "sdpa-gather"  # what decode attention runs on (`Engine.attention_kernel`)
    in_place = False  # decode attention reads the pool in place (one group, no masks)

    def __init__(
        self,
        model: CausalLM,
        kv: KVPool,
        ops: LayerOps,
        device: torch.device,
        *,
        seed: int = 0,
        window: int | None = None,
        long_rope: tuple[int, int] | None = None,
        static_decodes: StaticDecodes | None = None,
        eos_token_ids: Collection[int] = (),
    ) -> None:
        """`window`: the model's sliding window, if some layers have one. `long_rope`:
        LongRoPE's (original, max_positions). `static_decodes`: take decode-only steps through
        static buffers (`DecodeGraphs`); only for backends whose attention reads in place.
        `eos_token_ids`: what `min_tokens` bans besides a request's stop tokens."""
        self.eos_token_ids = frozenset(eos_token_ids)
        self.model = model
        self.kv = kv
        self.ops = ops
        self.device = device
        self.builder = StepBuilder(
            kv, device, in_place=self.in_place, seed=seed, window=window, long_rope=long_rope
        )
        self.graphs: DecodeGraphs | None = None
        if static_decodes is not None:
            if not self.in_place:
                raise ValueError("static decode steps need attention that reads the pool in place")
            self.graphs = DecodeGraphs(
                lambda inputs: self.forward(inputs),  # late-bound: a wrapped forward is seen
                device,
                max_seqs=static_decodes.max_seqs,
                max_blocks=static_decodes.max_blocks,
                window=window,
                long_rope=long_rope is not None,
            )

    # -- the three phases of a step ------------------------------------------------------

    def prepare(self, batch: ScheduledBatch) -> PreparedStep:
        """The batch's inputs, staged and sent to the device in one copy."""
        # Decodes first, shortest context first (so length groups are contiguous), then prefills.
        # (a verify chunk, `gpu.speculative.verify`, counts as decodes: `StepBuilder.build`)
        chunks = sorted(batch.chunks, key=lambda c: (not _decodes(c), c.end if _decodes(c) else 0))
        size = None
        if self.graphs is not None and all(c.is_decode for c in chunks):
            size = self.graphs.size_for(len(chunks))
        sampling = chunks if size is not None else [c for c in chunks if c.samples]
        rows_of = _rows(sampling)
        params = [c.seq.params for c, _ in rows_of]
        # Tokens before each row's: a guess's row follows the guesses before it (which the
        # penalties count as the completion's, as they will be if accepted).
        ends = [c.end - len(c.draft) + j for c, j in rows_of]
        penalties = penalty_rows([c.seq for c, _ in rows_of], ends, self.eos_token_ids)
        rows = sampling_rows(params, ends, self.builder.draw_seed, penalties)
        if size is not None:
            assert self.graphs is not None
            padded = self.graphs.stage(self.builder, chunks, size, rows)
            return PreparedStep(chunks, sampling, rows, size=size, padded=padded)
        scored = {
            c: positions
            for c in chunks
            if not c.is_decode and (positions := c.seq.unscored_prompt_positions(c.start, c.end))
        }
        inputs = self.builder.build(chunks, rows, scored)
        return PreparedStep(chunks, sampling, rows, inputs=inputs, scored=scored)

    def compute(self, step: PreparedStep) -> torch.Tensor:  # [sampled + scored rows, vocab]
        """The step's forward: a static decode step's replay, or `forward`."""
        if step.padded is not None:
            assert self.graphs is not None
            return self.graphs.run(step.size, step.padded)[: len(step.chunks)]
        assert step.inputs is not None
        return self.forward(step.inputs)

    @torch.inference_mode()
    def sample(
        self,
        step: PreparedStep,
        logits: torch.Tensor,  # [sampled rows + scored prompt rows, vocab] float32
        matchers: Mapping[str, GrammarMatcher] | None = None,
        masks: TokenMasks | None = None,
    ) -> StepSample:
        """The sampled next token of each chunk that samples, with its logprobs where its
        request asks (`gpu.logprobs`: of these raw logits), and the prompt logprobs of the
        step's scored positions. `matchers`: the grammar of each constrained request, by id,
        whose masks `masks` builds."""
        prompt = None
        rows_of = _rows(step.sampling)
        if step.scored:  # their logits rows follow the sampled rows
            n = len(rows_of)
            targets = self.builder.prompt_targets()
            assert targets is not None
            k = max(c.seq.params.prompt_logprobs or 0 for c in step.scored)
            prompt = prompt_logprobs(logits[n:], targets, k)
            logits = logits[:n]
            if not step.sampling:
                _, _, rows = read_step(logits.new_empty(0, dtype=torch.long), None, prompt)
                return StepSample([], _scored(step, rows))
        if not step.sampling:
            return StepSample([])
        # Before anything changes the logits: logprobs are the model's own (None: none asks).
        raw = raw_logprobs(logits, [c.seq.params.logprobs for c, _ in rows_of])
        mask = None
        if matchers and masks is not None:
            rows_matchers = [matchers.get(c.seq.request_id) for c, _ in rows_of]
            # A guess's row is masked where its grammar stands after the guesses before it.
            ahead = [c.draft[:j] for c, j in rows_of]
            mask = masks.build(rows_matchers, logits.shape[-1], ahead)
        tensors = self.builder.sampling_tensors()
        penalties = self.builder.penalty_tensors()
        if tensors is None:  # every row greedy: only the argmax is used
            tokens = apply_penalties(apply_mask(logits, mask), penalties).argmax(dim=-1)
        else:
            tokens = sample_tokens(
                logits,
                tensors,
                mask,
                True,
                step.rows.any_filtered,
                penalties=penalties,
                any_min_p=step.rows.any_min_p,
            )
        if prompt is not None:  # tokens, logprobs and prompt logprobs in the step's one read
            ids_out, logprobs, rows = read_step(tokens, raw, prompt)
            return StepSample(_by_chunk(step.sampling, ids_out, logprobs), _scored(step, rows))
        if raw is not None:  # tokens and logprobs in the step's one read
            ids_out, logprobs = read_sampled(tokens, raw)
            return StepSample(_by_chunk(step.sampling, ids_out, logprobs))
        ids_out = tokens.tolist()  # the step's one read from the device
        return StepSample(_by_chunk(step.sampling, ids_out, [None] * len(ids_out)))

    @torch.inference_mode()
    # -- the forward ---------------------------------------------------------------------

    def build(self, chunks: list[ScheduledChunk]) -> ModelInputs:
        """The inputs of `chunks` (decodes first) without sampling: for callers that score
        text or compare paths (valid until the next step)."""
        return self.builder.build(chunks)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [rows, vocab] float32
        """The step's logits: a backend's whole-step fast path where one applies, else the
        model's forward."""
        return self.run_model(inputs)

    def run_model(self, inputs: ModelInputs) -> torch.Tensor:  # [rows, vocab] float32
        """The model's one forward, in this backend's operations."""
        return self.model(inputs, self.kv, self.ops)

    def capture(self) -> None:
        """Capture the static decode path as CUDA graphs (at start, on the stepping thread)."""
        if self.graphs is not None and self.device.type == "cuda":
            with torch.inference_mode():
                self.graphs.capture()


def _decodes(chunk: ScheduledChunk) -> bool:
    """A decode, or a verify chunk: both attend as decodes (`StepBuilder.build`)."""
    return chunk.is_decode or bool(chunk.draft)


def _rows(sampling: list[ScheduledChunk]) -> list[tuple[ScheduledChunk, int]]:
    """Each sampled row as (its chunk, its index among the chunk's rows)."""
    return [(c, j) for c in sampling for j in range(max(c.num_sampled, 1))]


def _by_chunk(
    sampling: list[ScheduledChunk], ids: list[int], logprobs: Sequence[TokenLogprob | None]
) -> list[Sampled]:
    """The rows read back, grouped by chunk (`_rows`' order)."""
    out: list[Sampled] = []
    begin = 0
    for chunk in sampling:
        end = begin + max(chunk.num_sampled, 1)
        out.append((chunk, ids[begin:end], list(logprobs[begin:end])))
        begin = end
    return out


def _scored(step: PreparedStep, rows: list[list[float]]) -> list[Scored]:
    """The prompt rows read back, as each scored chunk's `TokenLogprob`s (its own k)."""
    out: list[Scored] = []
    begin = 0
    for chunk, positions in step.scored.items():
        k = chunk.seq.params.prompt_logprobs or 0
        end = begin + len(positions)
        out.append((chunk, [unpack_prompt_row(row, k) for row in rows[begin:end]]))
        begin = end
    return out
