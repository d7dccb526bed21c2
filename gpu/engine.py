"""The engine: `add` requests, call `step()` until `has_work()` is false, `abort` at will.

Synchronous and single-threaded: one step = schedule → run the model once → collect tokens.
It does no I/O and no logging; each step returns its statistics for the caller to log, trace
and export. Everything a request needs is checked in `add`, which raises `RequestRejected`
with the code of the `messages.admission` rule it broke; nothing is ever truncated silently.
A request with a constraint (a JSON schema, a regex, a choice, a grammar) gets its grammar
there too (`gpu.grammar`): one that cannot be compiled is rejected with
`invalid_response_format`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from gpu.admission import check_admission as check_admission  # callers find it here too
from gpu.backends.backend import StepSample
from gpu.backends.choose import build_backend
from gpu.block_allocator import BlockAllocator, blocks_for
from gpu.choices import ChoiceGroups
from gpu.encoder.spec import EmbeddingSpec
from gpu.engine_config import EngineConfig, size_kv_pool
from gpu.engine_io import Completion as Completion  # `gpu.engine` is where callers find them
from gpu.engine_io import EngineRequest as EngineRequest
from gpu.engine_io import StepOutput as StepOutput
from gpu.engine_io import StepStats as StepStats
from gpu.errors import RequestRejected
from gpu.grammar.compiler import GrammarCompiler
from gpu.grammar.mask import TokenMasks
from gpu.grammar.matcher import GrammarMatcher
from gpu.kv_pool import PAD_BLOCK, KVPool
from gpu.loading.loader import LoadedModel
from gpu.model_config import GEMMA_FAMILY
from gpu.models.layers import long_rope_rows
from gpu.output_processor import OutputProcessor
from gpu.prefix_hash import root_key
from gpu.scheduler import ScheduledBatch, Scheduler
from gpu.sequence import Sequence as Seq
from gpu.speculative.build import build_speculator
from gpu.step_observer import StepObserver
from messages.error_codes import ErrorCode


class Engine:
    embedding: EmbeddingSpec | None = None  # a generative model's: `gpu.encoder` embeds

    def __init__(
        self,
        model: LoadedModel,
        config: EngineConfig | None = None,
        *,
        draft: LoadedModel | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`draft`: the draft model, when `config.speculative_model` names one (loaded by the
        caller: `ops.models.engine_options.build_engine`)."""
        self.model = model
        self.config = config = config or EngineConfig()
        self.draft_model = draft
        self.max_model_len = config.resolved_max_model_len(model.config)
        self.num_blocks = size_kv_pool(model, config, self.max_model_len)  # for sequences
        self.kv = KVPool(
            model.config,
            self.num_blocks + 1,  # and the padding block
            config.block_size,
            # Enough to gather every running sequence's blocks at full length.
            workspace_blocks=config.max_num_seqs
            * blocks_for(self.max_model_len, config.block_size),
            dtype=model.dtype,
            device=model.device,
        )
        self.allocator = BlockAllocator(self.num_blocks + 1)
        # The padding block is held for good, so no sequence is ever given it.
        pad = self.allocator.allocate()
        if pad != PAD_BLOCK:
            raise RuntimeError(f"a fresh allocator handed out block {pad}, not {PAD_BLOCK}")
        windows = {model.config.layer_window(i) for i in range(model.config.num_layers)}
        # Every layer local (and the model windows its attention): blocks behind the window
        # are released as sequences grow (entries become PAD_BLOCK, which the scheduler's
        # RELEASED_BLOCK names).
        local_only = model.config.arch in GEMMA_FAMILY and None not in windows
        scheduling = config.scheduler_config()
        if local_only:
            scheduling = replace(scheduling, window=model.config.sliding_window)
        self.long_rope = long_rope_rows(model.config)
        # Prefix caching needs a block's K/V to depend on its tokens and the model alone: not
        # with blocks released behind a window, nor LongRoPE (a long sequence re-rotates all).
        self.prefix_caching = config.prefix_caching and not local_only and self.long_rope is None
        prefix_key = None
        if self.prefix_caching:
            prefix_key = root_key(model.digest, model.quantization, str(model.dtype))
        self.scheduler = Scheduler(scheduling, self.allocator, clock, prefix_key=prefix_key)
        window = max((w for w in windows if w is not None), default=None)
        self.backend = build_backend(
            model,
            self.kv,
            config,
            window=window,
            long_rope=self.long_rope,
            max_blocks=blocks_for(self.max_model_len, config.block_size),
        )
        self.backend.capture()  # CUDA graphs, where taken: at start, on the stepping thread
        self._ops = self.backend.ops  # as built: an observer may wrap them
        self.clock = clock
        self.sequences: dict[str, Seq] = {}  # by sequence id (a request's, or its choices')
        self.groups: ChoiceGroups[Completion] = ChoiceGroups()  # requests with n > 1
        self.peak_blocks_used = 0
        self.grammars = GrammarCompiler(
            model.tokenizer, model.config.vocab_size, model.eos_token_ids
        )
        self.matchers: dict[str, GrammarMatcher] = {}  # constrained requests' grammar state
        self._masks: TokenMasks | None = None  # built with the first constrained request
        self.observer: StepObserver | None = None  # `observe`: told each step's phases
        original = None if self.long_rope is None else self.long_rope[0]
        self.outputs = OutputProcessor(
            model.tokenizer, model.eos_token_ids, self.max_model_len, self.matchers, original
        )
        # Speculative decoding, when the config asks (`gpu.speculative`); None: off.
        self.speculator = build_speculator(model, config, self.max_model_len, original, draft)

    # -- admission ---------------------------------------------------------------------

    def validate(self, request: EngineRequest) -> None:
        """Raise `RequestRejected` with the code the request deserves, or return if it can run."""
        check_admission(
            request, self.config, self.max_model_len, self.model.config.vocab_size, self.sequences
        )
        if request.request_id in self.groups or any(
            i in self.sequences for i in self.groups.ids(request)
        ):
            raise RequestRejected(
                ErrorCode.DUPLICATE_REQUEST, f"request {request.request_id!r} is already running"
            )

    def prepare(self, request: EngineRequest) -> None:
        """`add`'s slow part, ahead of it and on any thread: compile the request's grammar
        (the first one also builds the library's view of the vocabulary) into the cache `add`
        reads. Raises `RequestRejected` as `add` would for a constraint that cannot compile."""
        if request.params.constraint is not None:
            self.grammars.prepare(request.params.constraint)

    def add(self, request: EngineRequest) -> None:
        self.validate(request)
        for one in self.groups.split(request):  # n > 1: one sequence per choice
            self._add(one)

    def _add(self, request: EngineRequest) -> None:
        constraint = request.params.constraint
        matcher = self.grammars.matcher(constraint) if constraint is not None else None
        seq = Seq(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            params=request.params,
            arrival_time=request.arrival_time if request.arrival_time is not None else self.clock(),
            priority=request.priority,
        )
        self.sequences[seq.request_id] = seq
        if matcher is not None:
            if self._masks is None:
                self._masks = TokenMasks(self.grammars.mask_words, self.model.device)
            self.matchers[seq.request_id] = matcher
        self.scheduler.add(seq)

    def abort(self, request_id: str, reason: str = "cancelled") -> Completion | None:
        """Stop a request now; returns its partial completion, or None if it is unknown."""
        ids = self.groups.children_of(request_id)
        done = [self._finish(self.sequences[i], reason) for i in ids if i in self.sequences]
        gathered = self.groups.gather(done)
        return gathered[0] if gathered else None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix no running request holds (a benchmark's cold start);
        returns how many blocks were freed."""
        return self.allocator.drop_cached()

    @property
    def attention_kernel(self) -> str:
        """What decode attention runs on: "native-paged", "triton-paged" or "sdpa-gather"."""
        return self.backend.name

    @property
    def blocks_used(self) -> int:
        """KV blocks held by sequences (the padding block is not counted)."""
        return self.allocator.num_used - 1

    # -- the step ------------------------------------------------------------------------

    def observe(self, observer: StepObserver | None) -> None:
        """Tell `observer` where each step's time goes (`gpu.step_observer`); None: stop."""
        self.observer = observer
        self.backend.ops = self._ops if observer is None else observer.wrap(self._ops)

    def step(self) -> StepOutput:
        """One step: guess (when speculating), schedule, run the model once, hand the sampled
        tokens to the output processor, then free what stopped."""
        start_ns = time.time_ns()
        observer = self.observer
        if observer is not None:
            observer.step_began()
        speculator = self.speculator
        if speculator is not None:
            speculator.propose(self.scheduler.running, self.matchers)
        batch = self.scheduler.schedule()
        if observer is not None:
            observer.phase_done("schedule")
        out, forward_ns = StepSample([]), 0
        if not batch.is_empty:
            out, forward_ns = self._run(batch, observer)
        progress = self.outputs.apply(batch, out, self.clock())
        self.scheduler.advance(batch, progress.accepted)
        if speculator is not None:
            speculator.clear()
        self.peak_blocks_used = max(self.peak_blocks_used, self.blocks_used)
        finished = [self._finish(seq, reason) for seq, reason in progress.stopped]
        for seq in progress.recompute:
            if not seq.is_finished:
                seq.num_computed_tokens = 0  # LongRoPE: prefilled again from position 0
        finished = self.groups.gather(finished)  # a choice waits for its request's others
        if observer is not None:
            observer.phase_done("collect")
            observer.step_done()
        end_ns = time.time_ns()
        if speculator is not None:
            speculator.measured(
                decode_only=batch.num_prefill_tokens == 0,
                drafted=progress.num_verified_seqs > 0,
                tokens=len(progress.new_tokens),
                seconds=(end_ns - start_ns) / 1e9,
            )
        stats = StepStats(
            start_ns=start_ns,
            end_ns=end_ns,
            num_seqs=len(batch.chunks),
            num_prefill_tokens=batch.num_prefill_tokens,
            num_decode_tokens=batch.num_decode_tokens,
            num_preempted=len(batch.preempted),
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            kv_blocks_used=self.blocks_used,
            kv_blocks_total=self.num_blocks,
            kv_blocks_cached=self.allocator.num_cached,
            prompt_tokens=batch.prompt_tokens,
            cached_prompt_tokens=batch.cached_tokens,
            proposer=speculator.name if speculator and progress.num_verified_seqs else None,
            num_verified_seqs=progress.num_verified_seqs,
            num_draft_tokens=progress.num_draft_tokens,
            num_accepted_draft_tokens=progress.num_accepted_draft_tokens,
            forward_ns=forward_ns,
        )
        return StepOutput(progress.new_tokens, finished, stats, progress.new_logprobs)

    @torch.inference_mode()
    def _run(self, batch: ScheduledBatch, observer: StepObserver | None) -> tuple[StepSample, int]:
        """The batch through the backend: its sampled tokens (and logprobs where asked), and
        the prompt logprobs its scored prompt positions gave; and the host's nanoseconds in
        the forward call (`StepStats.forward_ns`)."""
        backend = self.backend
        step = backend.prepare(batch)
        if observer is not None:
            observer.phase_done("prepare")
        began = time.perf_counter_ns()
        logits = backend.compute(step)
        forward_ns = time.perf_counter_ns() - began
        if observer is not None:
            observer.phase_done("forward")
        sampled = backend.sample(step, logits, self.matchers, self._masks)
        if observer is not None:
            observer.phase_done("sample")
        return sampled, forward_ns

    def _finish(self, seq: Seq, reason: str) -> Completion:
        kv_blocks = len(seq.block_table)  # before the scheduler frees them
        self.scheduler.finish(seq, reason)
        del self.sequences[seq.request_id]
        self.matchers.pop(seq.request_id, None)
        if self.speculator is not None:
            self.speculator.release(seq.request_id)
        seq.finish_time = self.clock()
        return self.outputs.completion(seq, reason, kv_blocks)
