"""`EncoderEngine`: the engine of an embedding model, with the generative engine's interface.

`add` an `EngineRequest` whose `embed` lists its inputs (tokens final: task prompt, special
tokens and truncation applied by the caller, `gpu.encoder.inputs`); `step()` runs queued
inputs packed flat up to the token budget (`EngineConfig.max_num_batched_tokens`; an input
longer than the budget runs alone), each whole in one forward, every token seeing its own
sequence (`gpu.encoder.attention`), no K/V kept; the last hidden states are pooled and
projected as the folder's sentence-transformers pipeline says (`gpu.encoder.pipeline`). A
request finishes in the step that runs its last input: its `Completion.embeddings` holds one
float32 vector per input, in order. `encode` is the same path, synchronous, for callers that
hold their inputs (a benchmark, tests).

Synchronous, no I/O, as `gpu.engine.Engine`; it satisfies `actors.in_flight.EngineLike`.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gpu.backends.choose import step_kernels
from gpu.backends.kernel_ops import KernelOps
from gpu.backends.layer_ops import LayerOps
from gpu.backends.torch_ops import TorchOps
from gpu.encoder.attention import EncoderOps, packed_inputs
from gpu.encoder.fused_norms import fuse_norms
from gpu.encoder.inputs import special_counts
from gpu.encoder.pipeline import Pipeline, read_pipeline
from gpu.encoder.pooling import pool
from gpu.encoder.spec import EmbeddingSpec
from gpu.engine_config import EngineConfig
from gpu.engine_io import Completion, EmbedJob, EngineRequest, StepOutput, StepStats
from gpu.errors import RequestRejected, UnsupportedPipeline
from gpu.kv_pool import KVPool
from gpu.loading.loader import LoadedModel, load_model
from gpu.models.gemma import GemmaForCausalLM
from gpu.step_observer import StepObserver
from messages.error_codes import ErrorCode

SCAN = 256  # queued inputs looked over per step for ones that still fit the budget


@dataclass
class _Running:
    """An admitted request: its vectors as they come."""

    request: EngineRequest
    arrival: float
    vectors: list[np.ndarray | None]
    left: int  # inputs not yet run
    tokens: int  # over all its inputs
    counted: bool = False  # its tokens were counted in a step's `prompt_tokens`


@dataclass(order=True)
class _Input:
    key: tuple[int, int]  # (-priority, arrival order): the queue's order
    index: int = field(compare=False)  # in its request's inputs
    tokens: Sequence[int] = field(compare=False)
    owner: _Running = field(compare=False)


class EncoderEngine:
    def __init__(
        self,
        model: LoadedModel,
        pipeline: Pipeline,
        config: EngineConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`model`: the pipeline's Transformer, loaded (`load_encoder_engine` does both)."""
        if not isinstance(model.module, GemmaForCausalLM) or not model.config.bidirectional:
            raise UnsupportedPipeline(
                model.path,
                f"the encoder runs Gemma 3 with bidirectional attention only, not "
                f"{model.config.arch}",
            )
        self.model = model
        self.module: GemmaForCausalLM = model.module
        self.pipeline = pipeline.to(model.device)
        self.config = config = config or EngineConfig()
        self.clock = clock
        limit = min(
            pipeline.max_seq_length or model.config.max_position_embeddings,
            model.config.max_position_embeddings,
        )
        if config.max_model_len is not None:
            limit = min(limit, config.max_model_len)
        self.max_model_len = limit
        self.embedding = EmbeddingSpec(
            dimensions=pipeline.dimensions,
            max_tokens=limit,
            prompts=dict(pipeline.prompts),
            default_prompt_name=pipeline.default_prompt_name,
            pooling="+".join(pipeline.pooling.modes),
            normalized=pipeline.normalized,
            specials=special_counts(model.tokenizer),
        )
        kernels = step_kernels(model, config)  # as the generative engine chooses them
        inner: LayerOps = TorchOps() if kernels is None else KernelOps(kernels)
        if kernels is not None:
            fuse_norms(self.module, kernels)
        self._ops: LayerOps = EncoderOps(inner, kernels)
        self.ops: LayerOps = self._ops  # as the forward sees them (an observer may wrap them)
        # The forward hands each layer its K/V view; an encoder keeps none: one slot, unused.
        self._no_kv = KVPool(model.config, 1, 1, 0, model.dtype, model.device)
        self.observer: StepObserver | None = None
        self.running: dict[str, _Running] = {}
        self.queue: list[_Input] = []  # sorted by key
        self._order = itertools.count()

    # -- requests ------------------------------------------------------------------------

    def prepare(self, request: EngineRequest) -> None:
        """Nothing to prepare ahead of `add` (no grammars)."""

    def validate(self, request: EngineRequest) -> None:
        """Raise `RequestRejected` (or ValueError: not an embedding request) as `add` would."""
        job = request.embed
        if job is None:
            raise ValueError(f"request {request.request_id!r} is not an embedding request")
        if request.request_id in self.running:
            raise RequestRejected(
                ErrorCode.DUPLICATE_REQUEST, f"request {request.request_id!r} is already running"
            )
        self._check(job)

    def _check(self, job: EmbedJob) -> None:
        if not job.inputs or any(len(tokens) == 0 for tokens in job.inputs):
            raise RequestRejected(ErrorCode.EMPTY_PROMPT, "an embedding input has no tokens")
        for i, tokens in enumerate(job.inputs):
            if len(tokens) > self.max_model_len:
                raise RequestRejected(
                    ErrorCode.PROMPT_TOO_LONG,
                    f"input {i} has {len(tokens)} tokens; the model takes {self.max_model_len}",
                )
            vocab = self.model.config.vocab_size
            if min(tokens) < 0 or max(tokens) >= vocab:
                raise RequestRejected(
                    ErrorCode.TOKEN_OUT_OF_VOCABULARY,
                    f"input {i} has a token id outside the vocabulary (0 .. {vocab - 1})",
                )
        width = self.embedding.dimensions
        if job.dimensions is not None and not 0 < job.dimensions <= width:
            raise RequestRejected(
                ErrorCode.INVALID_DIMENSIONS,
                f"dimensions must be 1 .. {width}, got {job.dimensions}",
            )

    def add(self, request: EngineRequest) -> None:
        self.validate(request)
        job = request.embed
        assert job is not None  # validate's
        arrival = request.arrival_time if request.arrival_time is not None else self.clock()
        owner = _Running(
            request,
            arrival,
            [None] * len(job.inputs),
            len(job.inputs),
            sum(len(t) for t in job.inputs),
        )
        self.running[request.request_id] = owner
        for index, tokens in enumerate(job.inputs):
            item = _Input((-request.priority, next(self._order)), index, tokens, owner)
            bisect.insort(self.queue, item)

    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None:
        """Stop a request now (its vectors are dropped); None if it is unknown."""
        owner = self.running.pop(request_id, None)
        if owner is None:
            return None
        self.queue = [item for item in self.queue if item.owner is not owner]
        return self._completion(owner, reason, ())

    def has_work(self) -> bool:
        return bool(self.queue)

    def observe(self, observer: StepObserver | None) -> None:
        """Tell `observer` each step's phases (prepare, forward, collect); None: stop."""
        self.observer = observer
        self.ops = self._ops if observer is None else observer.wrap(self._ops)

    # -- the step ------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """Run the queued inputs that fit the token budget, oldest first (and any after them
        that still fit); finish the requests whose last input ran."""
        start_ns = time.time_ns()
        observer = self.observer
        if observer is not None:
            observer.step_began()
        batch = self._take()
        if observer is not None:
            observer.phase_done("schedule")
        finished: list[Completion] = []
        new_prompt_tokens = 0
        if batch:
            dims = [item.owner.request.embed.dimensions for item in batch]  # type: ignore[union-attr]
            vectors = self._vectors([item.tokens for item in batch], dims, observer)
            for item, vector in zip(batch, vectors, strict=True):
                owner = item.owner
                if not owner.counted:
                    owner.counted = True
                    new_prompt_tokens += owner.tokens
                owner.vectors[item.index] = vector
                owner.left -= 1
                if owner.left == 0:
                    del self.running[owner.request.request_id]
                    done = tuple(v for v in owner.vectors if v is not None)
                    finished.append(self._completion(owner, "stop", done))
        if observer is not None:
            observer.phase_done("collect")
            observer.step_done()
        tokens = sum(len(item.tokens) for item in batch)
        stats = StepStats(
            start_ns=start_ns,
            end_ns=time.time_ns(),
            num_seqs=len(batch),
            num_prefill_tokens=tokens,
            num_decode_tokens=0,
            num_preempted=0,
            num_waiting=len(self.queue),
            num_running=len(self.running),
            kv_blocks_used=0,
            kv_blocks_total=0,
            prompt_tokens=new_prompt_tokens,
        )
        return StepOutput([], finished, stats)

    def encode(
        self, inputs: Sequence[Sequence[int]], dimensions: int | None = None
    ) -> list[np.ndarray]:
        """One float32 vector per input, in order: `inputs` run longest first, packed up to the
        token budget, outside the queue (the direct path: a benchmark, tests). ValueError for
        what `add` would refuse."""
        if not inputs:
            return []
        try:
            self._check(EmbedJob(tuple(inputs), dimensions))
        except RequestRejected as exc:
            raise ValueError(exc.message) from exc
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        out: list[np.ndarray | None] = [None] * len(inputs)
        budget = self.config.max_num_batched_tokens
        batch: list[int] = []
        used = 0
        for i in [*order, None]:
            if batch and (i is None or used + len(inputs[i]) > budget):
                vectors = self._vectors([inputs[j] for j in batch], [dimensions] * len(batch))
                for j, vector in zip(batch, vectors, strict=True):
                    out[j] = vector
                batch, used = [], 0
            if i is not None:
                batch.append(i)
                used += len(inputs[i])
        return [v for v in out if v is not None]

    def _take(self) -> list[_Input]:
        """The step's inputs: the queue's first, then any of the next SCAN that still fit."""
        budget = self.config.max_num_batched_tokens
        taken: list[int] = []
        used = 0
        for position, item in enumerate(self.queue[:SCAN]):
            if not taken or used + len(item.tokens) <= budget:
                taken.append(position)
                used += len(item.tokens)
            if used >= budget:
                break
        batch = [self.queue[p] for p in taken]
        for p in reversed(taken):
            del self.queue[p]
        return batch

    @torch.inference_mode()
    def _vectors(
        self,
        sequences: Sequence[Sequence[int]],
        dimensions: Sequence[int | None],
        observer: StepObserver | None = None,
    ) -> list[np.ndarray]:
        """The pipeline's vectors of `sequences` (one forward), each cut to its dimensions."""
        inputs = packed_inputs(sequences, self.model.device)
        if observer is not None:
            observer.phase_done("prepare")
        states = self.module.hidden_states(inputs, self._no_kv, self.ops)  # [tokens, hidden]
        pooled = pool(states.float(), [len(s) for s in sequences], self.pipeline.pooling.modes)
        vectors = self.pipeline.project(pooled).cpu()  # [sequences, dimensions]
        if observer is not None:
            observer.phase_done("forward")
        out = []
        for vector, width in zip(vectors, dimensions, strict=True):
            if width is not None and width < vector.shape[0]:  # Matryoshka
                vector = vector[:width]
                if self.embedding.normalized:
                    vector = F.normalize(vector, p=2.0, dim=0)
            out.append(vector.numpy().copy())
        return out

    def _completion(
        self, owner: _Running, reason: str, vectors: tuple[np.ndarray, ...]
    ) -> Completion:
        return Completion(
            request_id=owner.request.request_id,
            prompt_tokens=owner.tokens,
            token_ids=[],
            text="",
            finish_reason=reason,
            arrival_time=owner.arrival,
            first_token_time=None,
            finish_time=self.clock(),
            num_preemptions=0,
            embeddings=vectors,
        )


def load_encoder_engine(
    path: Path,
    *,
    name: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    config: EngineConfig | None = None,
) -> EncoderEngine:
    """The encoder engine of the sentence-transformers folder `path`: its pipeline read
    (`read_pipeline`: `UnsupportedPipeline`, `CheckpointError`), its Transformer loaded as
    `gpu.loading.loader.load_model` loads any model (packed native linears on a float32 CPU)."""
    path = Path(path)
    pipeline = read_pipeline(path)
    config = config or EngineConfig()
    model = load_model(
        pipeline.model_dir,
        name=name or path.name,
        dtype=dtype,
        device=device,
        quantization=config.quantization,
    )
    return EncoderEngine(model, pipeline, config)
