"""One sequence's place in its grammar, advanced by the tokens it has accepted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the library is imported where a grammar is compiled (`compiler.py`)
    import llguidance


class GrammarMatcher:
    """Wraps the library's matcher, keyed on the sequence's accepted output tokens.

    `advance(output_token_ids)` consumes only the tokens past those it has already seen, so
    it can be called after every step whatever happened to the sequence: a preempted one
    keeps its output tokens (only its KV is recomputed), so its matcher is neither advanced
    twice for a token nor ever rolled back.
    """

    def __init__(self, inner: llguidance.LLMatcher) -> None:
        self.inner = inner
        self.num_accepted = 0

    def advance(self, output_token_ids: Sequence[int]) -> None:
        """Accept the tokens of `output_token_ids` past `num_accepted`."""
        new = list(output_token_ids[self.num_accepted :])
        if not new:
            return
        self.num_accepted = len(output_token_ids)
        if not self.is_terminated:  # past the grammar's end only EOS may come, and is no token
            self.inner.consume_tokens(new)

    @property
    def is_terminated(self) -> bool:
        """The output is complete and nothing may follow it (or the matcher failed)."""
        return bool(self.inner.is_stopped())

    @property
    def failed(self) -> str | None:
        """Why the matcher broke (a token it refused, a library limit), or None."""
        if not self.inner.is_error():
            return None
        return self.inner.get_error() or "the grammar library failed"

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order after the accepted output, the grammar allows (a
        speculative guess is cut at its first refused token)."""
        if not tokens or self.is_terminated:
            return 0
        return int(self.inner.validate_tokens(list(tokens)))

    def mask_after(self, ahead: Sequence[int], pointer: int, row_bytes: int) -> None:
        """Write the bitmask of what may follow the accepted output then `ahead` (guesses
        `valid_prefix` allowed) into the row at `pointer`; the matcher is left as it was."""
        if ahead:
            self.inner.consume_tokens(list(ahead))
        try:
            self.inner.unsafe_compute_mask_ptr(pointer, row_bytes)
        finally:
            if ahead:
                self.inner.rollback(len(ahead))

    def allowed(self, token_id: int) -> bool:
        """Whether `token_id` may come next (one probe; the sampler uses `fill_bitmasks`)."""
        return self.inner.validate_tokens([token_id]) == 1


def fill_bitmasks(
    executor: llguidance.LLExecutor,
    matchers: Sequence[tuple[GrammarMatcher, int]],
    pointer: int,
    row_bytes: int,
    num_rows: int,
) -> None:
    """Write each matcher's next-token bitmask into row `index` of the int32 [num_rows,
    row_bytes / 4] host buffer at `pointer` (bit t of a row set: token t allowed), in parallel
    on the executor's threads; a single row on this thread (waking a pool costs more)."""
    if len(matchers) == 1:
        ((matcher, row),) = matchers
        matcher.inner.unsafe_compute_mask_ptr(pointer + row * row_bytes, row_bytes)
        return
    executor.unsafe_compute_mask_ptr(
        [(m.inner, row) for m, row in matchers], pointer, row_bytes, num_rows
    )
