"""The output processor: a step's sampled tokens become each request's progress.

One place decides, for every sequence the step touched:

- which tokens it gets: one per plain decode; a verify chunk's kept guesses and one token of
  the model's own (`gpu.speculative.verify`), appended in order with their logprobs;
- when it stops: a stop token, EOS, a stop string or the grammar's end, found at whichever
  token of the run it falls on (the tokens after it are dropped), or its length limit;
- the prompt logprobs its prompt chunks scored;
- its `Completion` at the end: the text (decoded once, cut at a stop string), logprobs, the
  counts and times, ready for the result mapping (`actors.results.engine_outcome`).

It reads and writes `Sequence`s only: the engine keeps the step (schedule, run, hand over
here, then free what stopped), and `n` > 1 choices are gathered by `gpu.choices` after it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpu.backends.backend import StepSample
from gpu.engine_io import Completion
from gpu.grammar.matcher import GrammarMatcher
from gpu.logprobs import CompletionLogprobs, TokenLogprob
from gpu.scheduler import ScheduledBatch
from gpu.sequence import Sequence
from gpu.speculative.verify import accepted_run


class Tokenizer(Protocol):
    """What the processor needs of `gpu.loading.tokenizer.Tokenizer` (the core imports
    nothing of gpu.loading)."""

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str: ...


@dataclass
class StepProgress:
    """What a step did to its requests (`OutputProcessor.apply`)."""

    new_tokens: list[tuple[str, int]] = field(default_factory=list)  # in the order appended
    new_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)  # theirs, if asked
    stopped: list[tuple[Sequence, str]] = field(default_factory=list)  # and why
    accepted: dict[Sequence, int] = field(default_factory=dict)  # guesses kept, per verify
    recompute: list[Sequence] = field(default_factory=list)  # past LongRoPE's original length
    num_verified_seqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_token_ids: Collection[int],
        max_model_len: int,
        matchers: Mapping[str, GrammarMatcher],
        long_rope_original: int | None = None,
    ) -> None:
        """`matchers`: the engine's constrained requests' grammars, by sequence id (read
        live). `long_rope_original`: LongRoPE's original length, if the model has it."""
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.matchers = matchers
        self.long_rope_original = long_rope_original
        self._token_texts: dict[int, str] = {}  # logprobs' token texts; at most the vocabulary

    def apply(self, batch: ScheduledBatch, sample: StepSample, now: float) -> StepProgress:
        """Append the step's tokens to their sequences; say who stopped and what was kept."""
        progress = StepProgress()
        for chunk, entries in sample.scored:
            chunk.seq.prompt_logprobs.extend(entries)
        for chunk in batch.chunks:
            seq = chunk.seq
            if seq.params.max_new_tokens == 0 and chunk.end == seq.num_prompt_tokens:
                progress.stopped.append((seq, "length"))  # a scored prompt, no token
        for chunk, tokens, logprobs in sample.sampled:
            seq = chunk.seq
            kept = accepted_run(chunk.draft, tokens) if chunk.draft else 0
            before = seq.num_tokens
            appended = 0
            for token, logprob in zip(tokens[: kept + 1], logprobs, strict=False):
                seq.output_token_ids.append(token)
                appended += 1
                if logprob is not None:
                    seq.output_logprobs.append(logprob)
                    progress.new_logprobs.setdefault(seq.request_id, []).append(logprob)
                if seq.first_token_time is None:
                    seq.first_token_time = now
                progress.new_tokens.append((seq.request_id, token))
                reason = self.stop_reason(seq, token)
                if reason is not None:
                    progress.stopped.append((seq, reason))
                    break
            if chunk.draft:
                kept = min(kept, appended)  # a stop inside the run drops the guesses after it
                progress.accepted[seq] = kept
                progress.num_verified_seqs += 1
                progress.num_draft_tokens += len(chunk.draft)
                progress.num_accepted_draft_tokens += kept
                seq.num_draft_tokens += len(chunk.draft)
                seq.num_accepted_draft_tokens += kept
            original = self.long_rope_original
            if original is not None and before <= original < seq.num_tokens:
                # LongRoPE: grown past the original length, the sequence switches to the long
                # factors, and its K/V (short-rotated) are recomputed as transformers does.
                # Its blocks stay; the scheduler prefills it again from position 0.
                progress.recompute.append(seq)
        return progress

    # -- stopping ------------------------------------------------------------------------

    def stop_reason(self, seq: Sequence, token: int) -> str | None:
        """Why `seq` stops at `token`, its newest output token (None: it goes on)."""
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
            if p.stop and self.stop_string_at(seq, tail_only=True) is not None:
                return "stop"
        if len(seq.output_token_ids) >= p.max_new_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def stop_string_at(self, seq: Sequence, *, tail_only: bool = False) -> int | None:
        """Where the earliest stop string begins in the decoded output, if one occurs.

        With `tail_only`, only the last few tokens are decoded: a stop string that the newest
        token completes lies within them (a character spans at most 4 byte-level tokens), so a
        token costs O(longest stop), not O(output).
        """
        span = self.stop_string_span(seq, tail_only=tail_only)
        return None if span is None else span[0]

    def stop_string_span(self, seq: Sequence, *, tail_only: bool = False) -> tuple[int, int] | None:
        """Where the earliest stop string begins and ends in the decoded output (decoded as
        its text is: `skip_special_tokens`), if one occurs (`stop_string_at`)."""
        tokens, min_tokens = seq.output_token_ids, seq.params.min_tokens
        tail = 4 * max(len(s) for s in seq.params.stop) + 4
        if tail_only and len(tokens) - min_tokens > tail:  # the tail is all past min_tokens
            tokens = tokens[-tail:]
            min_tokens = 0
        skip = seq.params.skip_special_tokens
        text = self.tokenizer.decode(tokens, skip_special_tokens=skip)
        before = 0  # under min_tokens, a stop string counts once a token past them ends it
        if min_tokens > 1:
            before = len(self.tokenizer.decode(tokens[: min_tokens - 1], skip_special_tokens=skip))
        stops = seq.params.stop
        hits = [
            (i, i + len(s)) for s in stops if (i := text.find(s, max(0, before - len(s) + 1))) >= 0
        ]
        return min(hits) if hits else None

    # -- the answer ----------------------------------------------------------------------

    def completion(self, seq: Sequence, reason: str, kv_blocks: int) -> Completion:
        """A finished sequence's answer (`seq.finish_time` set)."""
        assert seq.finish_time is not None
        p = seq.params
        shown = seq.output_token_ids
        ender = bool(shown) and (shown[-1] in p.stop_token_ids or shown[-1] in self.eos_token_ids)
        if reason == "stop" and ender and not p.include_stop_str_in_output:
            shown = shown[:-1]  # the stop token or EOS that ended it is not part of the text
        text = self.tokenizer.decode(shown, skip_special_tokens=p.skip_special_tokens)
        if p.stop and (span := self.stop_string_span(seq)) is not None:
            text = text[: span[1] if p.include_stop_str_in_output else span[0]]
        prompt_logprobs, prompt_text = self._prompt_logprobs(seq)
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
            draft_tokens=seq.num_draft_tokens,
            accepted_draft_tokens=seq.num_accepted_draft_tokens,
        )

    def _logprobs(self, seq: Sequence) -> CompletionLogprobs | None:
        """`seq`'s logprobs with its tokens' texts, if its request asked for them."""
        if seq.params.logprobs is None:
            return None
        return CompletionLogprobs.of(seq.output_token_ids, seq.output_logprobs, self.token_text)

    def _prompt_logprobs(self, seq: Sequence) -> tuple[CompletionLogprobs | None, str | None]:
        """`seq`'s prompt logprobs and prompt text, if its request asked for them."""
        if seq.params.prompt_logprobs is None:
            return None, None
        prompt = seq.prompt_token_ids
        logprobs = CompletionLogprobs.of_prompt(prompt, seq.prompt_logprobs, self.token_text)
        return logprobs, self.tokenizer.decode(prompt)

    def token_text(self, token: int) -> str:
        """One token decoded alone, special tokens included (kept: decoding costs µs)."""
        text = self._token_texts.get(token)
        if text is None:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            self._token_texts[token] = text
        return text
