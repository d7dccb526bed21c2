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
from gpu.logprobs import CompletionLogprobs
from gpu.model_config import GEMMA_FAMILY
from gpu.models.layers import long_rope_rows
from gpu.prefix_hash import root_key
from gpu.scheduler import ScheduledBatch, Scheduler
from gpu.sequence import Sequence as Seq
from gpu.step_observer import StepObserver
from messages.error_codes import ErrorCode


class Engine:
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
        self.eos_token_ids = frozenset(model.eos_token_ids)
        self.peak_blocks_used = 0
        self.grammars = GrammarCompiler(
            model.tokenizer, model.config.vocab_size, model.eos_token_ids
        )
        self.matchers: dict[str, GrammarMatcher] = {}  # constrained requests' grammar state
        self._masks: TokenMasks | None = None  # built with the first constrained request
        self.observer: StepObserver | None = None  # `observe`: told each step's phases
        self._token_texts: dict[int, str] = {}  # logprobs' token texts; at most the vocabulary

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
        start_ns = time.time_ns()
        observer = self.observer
        if observer is not None:
            observer.step_began()
        batch = self.scheduler.schedule()
        if observer is not None:
            observer.phase_done("schedule")
        out = StepSample([])
        if not batch.is_empty:
            out = self._run(batch, observer)
        self.scheduler.advance(batch)
        self.peak_blocks_used = max(self.peak_blocks_used, self.blocks_used)
        now = self.clock()
        new_tokens: list[tuple[str, int]] = []
        finished: list[Completion] = []
        for chunk, entries in out.scored:
            chunk.seq.prompt_logprobs.extend(entries)
        for chunk in batch.chunks:
            seq = chunk.seq
            if seq.params.max_new_tokens == 0 and chunk.end == seq.num_prompt_tokens:
                finished.append(self._finish(seq, "length"))  # a scored prompt, no token
        for chunk, token, logprob in out.sampled:
            seq = chunk.seq
            seq.output_token_ids.append(token)
            if logprob is not None:
                seq.output_logprobs.append(logprob)
            if seq.first_token_time is None:
                seq.first_token_time = now
            new_tokens.append((seq.request_id, token))
            reason = self._stop_reason(seq, token)
            if reason is not None:
                finished.append(self._finish(seq, reason))
            elif self.long_rope is not None and seq.num_tokens == self.long_rope[0] + 1:
                # LongRoPE: grown past the original length, the sequence switches to the long
                # factors, and its K/V (short-rotated) are recomputed as transformers does.
                # Its blocks stay; the scheduler prefills it again from position 0.
                seq.num_computed_tokens = 0
        finished = self.groups.gather(finished)  # a choice waits for its request's others
        if observer is not None:
            observer.phase_done("collect")
            observer.step_done()
        stats = StepStats(
            start_ns=start_ns,
            end_ns=time.time_ns(),
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
        )
        return StepOutput(new_tokens, finished, stats)

    @torch.inference_mode()
    def _run(self, batch: ScheduledBatch, observer: StepObserver | None) -> StepSample:
        """The batch through the backend: its sampled tokens (and logprobs where asked), and
        the prompt logprobs its scored prompt positions gave."""
        backend = self.backend
        if observer is None:
            return backend.run(batch, self.matchers, self._masks)
        step = backend.prepare(batch)
        observer.phase_done("prepare")
        logits = backend.compute(step)
        observer.phase_done("forward")
        sampled = backend.sample(step, logits, self.matchers, self._masks)
        observer.phase_done("sample")
        return sampled

    def _stop_reason(self, seq: Seq, token: int) -> str | None:
        p = seq.params
        matcher = self.matchers.get(seq.request_id)
        if matcher is not None:
            # Keyed on the accepted output tokens: a recomputed (preempted) sequence's
            # matcher is where its output left it.
            matcher.advance(seq.output_token_ids)
            if matcher.failed is not None:
                return "error"
            if matcher.is_terminated:
                return "stop"  # the output is complete; only EOS could follow
        # Under min_tokens nothing stops (EOS and stop tokens are banned then too).
        if len(seq.output_token_ids) >= p.min_tokens:
            if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
                return "stop"
            if p.stop and self._stop_string_at(seq, tail_only=True) is not None:
                return "stop"
        if len(seq.output_token_ids) >= p.max_new_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _stop_string_at(self, seq: Seq, *, tail_only: bool = False) -> int | None:
        """Where the earliest stop string begins in the decoded output, if one occurs.

        With `tail_only`, only the last few tokens are decoded: a stop string that the newest
        token completes lies within them (a character spans at most 4 byte-level tokens), so a
        step costs O(longest stop), not O(output).
        """
        tokens, min_tokens = seq.output_token_ids, seq.params.min_tokens
        tail = 4 * max(len(s) for s in seq.params.stop) + 4
        if tail_only and len(tokens) - min_tokens > tail:  # the tail is all past min_tokens
            tokens = tokens[-tail:]
            min_tokens = 0
        text = self.model.tokenizer.decode(tokens)
        before = 0  # under min_tokens, a stop string counts once a token past them ends it
        if min_tokens > 1:
            before = len(self.model.tokenizer.decode(tokens[: min_tokens - 1]))
        stops = seq.params.stop
        hits = [i for s in stops if (i := text.find(s, max(0, before - len(s) + 1))) >= 0]
        return min(hits) if hits else None

    def _finish(self, seq: Seq, reason: str) -> Completion:
        kv_blocks = len(seq.block_table)  # before the scheduler frees them
        self.scheduler.finish(seq, reason)
        del self.sequences[seq.request_id]
        self.matchers.pop(seq.request_id, None)
        seq.finish_time = self.clock()
        shown = seq.output_token_ids
        if reason == "stop" and shown and shown[-1] in seq.params.stop_token_ids:
            shown = shown[:-1]  # like EOS, a stop token ends the text without appearing in it
        text = self.model.tokenizer.decode(shown)
        prompt_logprobs, prompt_text = self._prompt_logprobs(seq)
        if seq.params.stop and (cut := self._stop_string_at(seq)) is not None:
            text = text[:cut]
        return Completion(
            request_id=seq.request_id,
            prompt_tokens=seq.num_prompt_tokens,
            token_ids=list(seq.output_token_ids),
            text=text,
            finish_reason=reason,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
            num_preemptions=seq.num_preemptions,
            num_kv_blocks=kv_blocks,
            cached_tokens=seq.num_cached_tokens,
            logprobs=self._logprobs(seq),
            prompt_logprobs=prompt_logprobs,
            prompt_text=prompt_text,
        )

    def _logprobs(self, seq: Seq) -> CompletionLogprobs | None:
        """`seq`'s logprobs with its tokens' texts, if its request asked for them."""
        if seq.params.logprobs is None:
            return None
        return CompletionLogprobs.of(seq.output_token_ids, seq.output_logprobs, self._token_text)

    def _prompt_logprobs(self, seq: Seq) -> tuple[CompletionLogprobs | None, str | None]:
        """`seq`'s prompt logprobs and prompt text, if its request asked for them."""
        if seq.params.prompt_logprobs is None:
            return None, None
        prompt = seq.prompt_token_ids
        logprobs = CompletionLogprobs.of_prompt(prompt, seq.prompt_logprobs, self._token_text)
        return logprobs, self.model.tokenizer.decode(prompt)

    def _token_text(self, token: int) -> str:
        """One token decoded alone, special tokens included (kept: decoding costs µs)."""
        text = self._token_texts.get(token)
        if text is None:
            text = self.model.tokenizer.decode([token], skip_special_tokens=False)
            self._token_texts[token] = text
        return text
