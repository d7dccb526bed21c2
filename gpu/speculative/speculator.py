"""The engine's side of speculation: guesses for the running sequences, within their limits.

Each step, before scheduling, `propose` asks the policy (`gpu.speculative.policy`) whether a
step decoding this many sequences gains from speculating; if so, the proposer guesses for
every sequence that may speculate, and each guess is cut to what the sequence can take:

- the request's own opt-out (`SamplingParams.speculate`), and a sequence still computing
  its prompt (or recomputing after preemption) guesses nothing;
- at most k, and one token less than its room (max_new_tokens, the context limit): the step
  adds the kept guesses and one token of the model's own;
- with LongRoPE, never past the original length (the sequence's rotation changes there);
- a constrained request's guess ends at its first token the grammar refuses.

The guesses go on `Sequence.draft_token_ids` for the scheduler (`Scheduler._draft`), and are
cleared once the step is done (`clear`). `measured` tells the policy how the step went.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu.grammar.matcher import GrammarMatcher
from gpu.sequence import Sequence
from gpu.speculative.config import SpeculativeConfig
from gpu.speculative.policy import StepAside
from gpu.speculative.proposer import ProposalRequest, Proposer


@dataclass(frozen=True)
class SpeculationLimits:
    max_model_len: int
    long_rope_original: int | None = None  # LongRoPE's original length, if the model has it


class Speculator:
    def __init__(
        self,
        proposer: Proposer,
        config: SpeculativeConfig,
        limits: SpeculationLimits,
        policy: StepAside | None = None,
    ) -> None:
        self.proposer = proposer
        self.config = config
        self.limits = limits
        self.policy = policy or StepAside()
        self._drafted: list[Sequence] = []
        self._num_decoding = 0
        self._drafted_before = False  # the previous step verified guesses

    @property
    def name(self) -> str:
        return self.proposer.name

    def room(self, seq: Sequence) -> int:
        """How many guesses `seq` may take this step (0: none)."""
        p = seq.params
        if not p.speculate or seq.num_uncomputed_tokens != 1 or seq.scores_prompt:
            return 0
        out = len(seq.output_token_ids)
        room = min(p.max_new_tokens - out, self.limits.max_model_len - seq.num_tokens) - 1
        original = self.limits.long_rope_original
        if original is not None and seq.num_tokens <= original:
            room = min(room, original - seq.num_tokens)
        return max(0, min(room, self.config.k))

    def propose(self, running: Iterable[Sequence], matchers: Mapping[str, GrammarMatcher]) -> None:
        """Set the guesses of `running`'s sequences for the next step (or none, when the
        policy steps aside)."""
        decoding = [s for s in running if s.num_uncomputed_tokens == 1]
        self._num_decoding = len(decoding)
        if not decoding or not self.policy.speculate(len(decoding)):
            return
        asks = [(s, n) for s in decoding if (n := self.room(s)) > 0]
        if not asks:
            return
        requests = [
            ProposalRequest(
                seq.request_id,
                seq.prompt_token_ids + seq.output_token_ids,
                seq.num_prompt_tokens,
                n,
            )
            for seq, n in asks
        ]
        for (seq, n), guess in zip(asks, self.proposer.propose(requests), strict=True):
            guess = guess[:n]
            matcher = matchers.get(seq.request_id)
            if matcher is not None and guess:
                guess = guess[: matcher.valid_prefix(guess)]
            if guess:
                seq.draft_token_ids = guess
                self._drafted.append(seq)

    def clear(self) -> None:
        """The step is done: its guesses are spent (kept ones are now tokens)."""
        for seq in self._drafted:
            seq.draft_token_ids = []
        self._drafted.clear()

    def measured(self, decode_only: bool, drafted: bool, tokens: int, seconds: float) -> None:
        """How the step went: the policy learns from decode-only steps (`drafted`: some
        verify chunk ran; `tokens`: tokens out). The first speculative step after plain ones
        is not measured: a draft model catches up then on every token it missed."""
        warming = drafted and not self._drafted_before
        self._drafted_before = drafted
        if decode_only and self._num_decoding and not warming:
            self.policy.measured(self._num_decoding, drafted, tokens, seconds)

    def release(self, seq_id: str) -> None:
        self.proposer.release(seq_id)
