"""When speculation steps aside: measured, per batch size, from the steps themselves.

Verifying k guesses makes a sequence's row k + 1 rows: at batch 1 the weights are read once
for all of them (nearly free), but as the batch grows the step becomes compute-bound and the
extra rows cost what they would save. Where that happens depends on the model, the device,
the proposer and how well it guesses on this traffic, so the rule is measured, not set:

- Decode-only steps are grouped by how many sequences decode (powers of two: 1, 2, 3-4,
  5-8, ...).
- For each group, the goodput of steps with speculation and of steps without is kept as an
  exponential moving average of tokens out per second of step time (a verify chunk's tokens
  are its kept guesses plus one).
- A group speculates while its speculative goodput is at least its plain one; a group not yet
  measured both ways tries speculation first, then plain.
- Two steps of every `explore_every` of a group run the other way, so a change
  of traffic (guesses that stop matching, a batch that grows) is seen: the cost is at most 2
  steps in `explore_every` run the slower way. (Two, because the first speculative step after
  plain ones is not measured: a draft model then catches up on the tokens it missed, a cost
  that speculating all along does not pay; `Speculator.measured`.)

Steps with prefill work measure nothing (their time is the prefill's).
"""

from __future__ import annotations

from dataclasses import dataclass

EXPLORE_EVERY = 32
SMOOTHING = 0.2  # weight of the newest step in the moving averages


@dataclass
class _Group:
    speculative: float | None = None  # tokens per second, moving average
    plain: float | None = None
    steps: int = 0

    def update(self, speculated: bool, rate: float) -> None:
        old = self.speculative if speculated else self.plain
        new = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate
        if speculated:
            self.speculative = new
        else:
            self.plain = new


def group_of(num_decoding: int) -> int:
    """The group of a step that decodes `num_decoding` sequences: ceil(log2(n))."""
    return max(num_decoding - 1, 0).bit_length()


class StepAside:
    def __init__(self, explore_every: int = EXPLORE_EVERY) -> None:
        self.explore_every = explore_every
        self._groups: dict[int, _Group] = {}

    def speculate(self, num_decoding: int) -> bool:
        """Whether a step decoding `num_decoding` sequences should speculate."""
        group = self._groups.setdefault(group_of(num_decoding), _Group())
        group.steps += 1
        if group.speculative is None:
            return True
        if group.plain is None:
            return False
        better = group.speculative >= group.plain
        if group.steps % self.explore_every in (0, self.explore_every - 1):
            return not better
        return better

    def measured(self, num_decoding: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A decode-only step's outcome: `tokens` out in `seconds`."""
        if seconds <= 0 or num_decoding <= 0:
            return
        group = self._groups.setdefault(group_of(num_decoding), _Group())
        group.update(speculated, tokens / seconds)

    def goodput(self, num_decoding: int) -> tuple[float | None, float | None]:
        """(speculative, plain) tokens per second of the group, as measured so far."""
        group = self._groups.get(group_of(num_decoding), _Group())
        return group.speculative, group.plain
