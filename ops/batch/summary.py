"""What one `tokenmill batch run` did: counts by outcome, tokens, time, memory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BatchSummary:
    """What one `batch run` did. `complete`: every input line has its output line."""

    input: str
    output: str
    total: int = 0  # non-blank input lines
    already: int = 0  # answered by an earlier run (skipped)
    sent: int = 0
    ok: int = 0  # status 200
    refused: int = 0  # the worker answered with an error (non-200 response)
    line_errors: int = 0  # lines that never became requests
    retried: int = 0  # requests sent again after a worker's shutting_down / engine_error
    cancelled: int = 0  # lines answered with finish_reason cancelled (`batch cancel`)
    cancel_requested: bool = False  # `tokenmill batch cancel` stopped the run
    errors_by_code: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embeddings: int = 0  # vectors answered (/v1/embeddings lines: one per input)
    in_flight: int = 0  # sent and unanswered when the run ended
    wall_s: float = 0.0
    stalled: bool = False
    peak_rss_mb: float | None = None  # this process's high-water mark (Linux)

    @property
    def answered(self) -> int:
        return self.ok + self.refused + self.line_errors

    @property
    def complete(self) -> bool:
        return self.already + self.answered >= self.total and not self.in_flight

    def as_json(self) -> dict[str, object]:
        wall = max(self.wall_s, 1e-9)
        return {
            "input": self.input,
            "output": self.output,
            "complete": self.complete,
            "total_lines": self.total,
            "already_answered": self.already,
            "answered": self.answered,
            "ok": self.ok,
            "refused": self.refused,
            "line_errors": self.line_errors,
            "retried": self.retried,
            "cancelled": self.cancelled,
            "cancel_requested": self.cancel_requested,
            "errors_by_code": dict(sorted(self.errors_by_code.items())),
            "in_flight_at_end": self.in_flight,
            "stalled": self.stalled,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "embeddings": self.embeddings,
            "wall_s": round(self.wall_s, 3),
            "requests_per_s": round(self.answered / wall, 2),
            "completion_tokens_per_s": round(self.completion_tokens / wall, 2),
            "peak_rss_mb": self.peak_rss_mb,
        }


def peak_rss_mb() -> float | None:
    """This process's peak resident memory (VmHWM), or None where /proc does not say.

    Not `getrusage`: Linux carries a forked parent's high-water mark across `exec` into it.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def count_lines(path: Path) -> int:
    """Non-blank lines of `path`, read in bounded memory."""
    with path.open("rb") as lines:
        return sum(1 for raw in lines if raw.strip())
