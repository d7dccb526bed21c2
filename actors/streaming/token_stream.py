"""TokenStream: one streamed request's state, from sampled tokens to `GenerateChunk`s.

Fed every token the engine samples for the request (`add`), it says when a chunk is due
(`due`) and makes it (`take`); when the request ends, `finish` makes the last chunk from the
result itself, so the chunks' text adds up to the result's text exactly (and their logprobs,
when the request asked for them, to the result's). Text that could still be the start of a
stop string is held back: the engine cuts the result's text where a stop string begins, so a
chunk must never have shown it. A request with `n` > 1 has one per choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from actors.result_shapes import wire_logprobs
from actors.streaming.detokenizer import Decode, IncrementalText
from gpu.logprobs import CompletionLogprobs, TokenLogprob
from messages.chunk import GenerateChunk
from messages.result import TokenLogprobs


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` could begin a stop string (0: none)."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


def shown_text(text: str, stops: Sequence[str], start: int = 0) -> str:
    """The part of `text` a chunk may show: before any stop string (searched from `start`),
    and without an end that could still become one."""
    if stops:
        reach = max((len(s) for s in stops), default=0)
        hits = [i for s in stops if (i := text.find(s, max(0, start - reach))) >= 0]
        if hits:
            text = text[: min(hits)]
    return text[: len(text) - held_back(text, stops)]


class TokenStream:
    """The chunks of one run of one choice (`index`) of one streamed request.

    The first chunk is due as soon as there is text to show (time to first token is what a
    streaming client waits on); later ones after `interval_tokens` new tokens or
    `interval_s` since the previous chunk, and never sooner than `min_interval_s` after it.

    `token_text`: for a request that asked for logprobs, one token id's text (decoded alone,
    special tokens included, as the result's logprobs show it); each chunk then carries its
    tokens' logprobs (`add_logprobs` gives them as the engine scored them).
    """

    def __init__(
        self,
        request_id: str,
        run: str,
        decode: Decode,
        *,
        stop: Sequence[str] = (),
        interval_tokens: int,
        interval_s: float,
        min_interval_s: float = 0.0,
        started: float = 0.0,
        index: int = 0,
        token_text: Callable[[int], str] | None = None,
    ) -> None:
        self.request_id = request_id
        self.run = run
        self.index = index
        self.token_text = token_text
        self._logprobs: list[TokenLogprob] = []  # of `tokens`, in order, when asked
        self.stop = tuple(s for s in stop if s)
        self.interval_tokens = interval_tokens
        self.interval_s = interval_s
        self.min_interval_s = min_interval_s
        self._text = IncrementalText(decode)
        self.seq = 0  # the next chunk's
        self.sent_tokens = 0
        self.sent_text = ""
        self.last_sent = started  # monotonic seconds
        self.diverged = False  # see `finish`

    @property
    def tokens(self) -> list[int]:
        return self._text.tokens

    def add(self, token: int) -> None:
        self._text.append(token)

    def add_logprobs(self, entries: Sequence[TokenLogprob]) -> None:
        """The logprobs of the tokens `add` was given, in the same order."""
        self._logprobs.extend(entries)

    def due(self, now: float) -> bool:
        pending = len(self.tokens) - self.sent_tokens
        if pending == 0 or now - self.last_sent < self.min_interval_s:
            return False
        if self.seq == 0:
            return True
        return pending >= self.interval_tokens or now - self.last_sent >= self.interval_s

    def take(self, now: float) -> GenerateChunk | None:
        """The chunk of what can be shown now; None when no new text can be (its tokens then
        go with a later chunk)."""
        shown = shown_text(self._text.text(), self.stop, len(self.sent_text))
        if len(shown) <= len(self.sent_text) or not shown.startswith(self.sent_text):
            return None
        return self._chunk(self.tokens[self.sent_tokens :], shown, now)

    def finish(self, text: str, token_ids: Sequence[int], now: float) -> GenerateChunk | None:
        """The last chunk: what the result has beyond the chunks sent (None: nothing).

        `text`/`token_ids`: the result's. Should they not extend what was sent (an engine
        that rewrote its output), the chunk carries only the remaining tokens and `diverged`
        is set: the result is then the only full account.
        """
        self.diverged = not text.startswith(self.sent_text)
        shown = self.sent_text if self.diverged else text
        rest = list(token_ids[self.sent_tokens :])
        if not rest and len(shown) == len(self.sent_text):
            return None
        return self._chunk(rest, shown, now)

    def _chunk(self, token_ids: list[int], shown: str, now: float) -> GenerateChunk:
        chunk = GenerateChunk(
            id=self.request_id,
            run=self.run,
            seq=self.seq,
            token_ids=token_ids,
            text=shown[len(self.sent_text) :],
            index=self.index,
            logprobs=self._logprobs_of(token_ids),
        )
        self.seq += 1
        self.sent_tokens += len(token_ids)
        self.sent_text = shown
        self.last_sent = now
        return chunk

    def _logprobs_of(self, token_ids: list[int]) -> TokenLogprobs | None:
        """The logprobs of `token_ids`, the tokens after the `sent_tokens` already sent."""
        if self.token_text is None:
            return None
        entries = self._logprobs[self.sent_tokens : self.sent_tokens + len(token_ids)]
        scored = token_ids[: len(entries)]  # all of them, unless the engine rewrote its output
        return wire_logprobs(CompletionLogprobs.of(scored, entries, self.token_text))
