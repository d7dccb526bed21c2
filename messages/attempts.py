"""A request's attempts: which one a record is, the failures before it, and when it may run.

A request that fails for a transient reason is produced again to a retry topic
(`<requests topic>.retry.<N>`) with these headers (see `messages.headers`):

    tokenmill-attempt           2                    this record is the request's 2nd attempt
    tokenmill-attempt-history   [{"attempt": 1, "worker": "host-41", "code": "engine_error",
                                  "message": "...", "time": "2026-12-04T10:15:02.125Z"}]
    tokenmill-not-before        1796382902125        epoch ms: its backoff ends then

A record without them is attempt 1 with no history. Headers that do not parse (another
producer's, a hand-edited record) count as absent: a garbled header never stops a request.
The same two attempt headers go on the request's dead letter after its last attempt (the
history then names every failed attempt, the last one included) and on its result.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import msgspec

from messages import headers as h

MAX_HISTORY = 32  # entries kept (the newest): a header stays a few KB whatever the attempts
MAX_MESSAGE_CHARS = 256  # of each entry's message


class FailedAttempt(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, frozen=True):
    """One failed attempt of a request: where and why it failed."""

    attempt: int
    worker: str = ""  # the worker id; "" when not known (a worker that died with it)
    code: str  # an `ErrorCode` value, or "worker_died" (the crash guard's deaths)
    message: str = ""
    time: str = ""  # RFC 3339, UTC, milliseconds


class Attempts(msgspec.Struct, frozen=True):
    """What a request record's headers say of its attempts."""

    number: int = 1  # this record's attempt (1: the original request)
    history: tuple[FailedAttempt, ...] = ()  # the failed attempts before it, oldest first
    not_before_ms: int | None = None  # epoch ms before which it is not run (its backoff)

    def failed(self, attempt: FailedAttempt) -> Attempts:
        """After this attempt failed: the next attempt, with `attempt` in its history."""
        history = (*self.history, attempt)[-MAX_HISTORY:]
        return Attempts(self.number + 1, history)

    def headers(self) -> list[tuple[str, bytes]]:
        """The attempt headers of a record carrying this attempt."""
        out = [(h.ATTEMPT, str(self.number).encode())]
        if self.history:
            out.append((h.ATTEMPT_HISTORY, _HISTORY_ENCODER.encode(list(self.history))))
        if self.not_before_ms is not None:
            out.append((h.NOT_BEFORE, str(self.not_before_ms).encode()))
        return out


_HISTORY_ENCODER = msgspec.json.Encoder()
_HISTORY_DECODER = msgspec.json.Decoder(list[FailedAttempt])
ATTEMPT_HEADERS = frozenset({h.ATTEMPT, h.ATTEMPT_HISTORY, h.NOT_BEFORE})


def read_attempts(headers: Iterable[tuple[str, bytes | None]] | None) -> Attempts:
    """The attempts a record's headers name (attempt 1, no history, when they name none)."""
    headers = list(headers or ())
    history: tuple[FailedAttempt, ...] = ()
    raw = h.header(headers, h.ATTEMPT_HISTORY)
    if raw:
        try:
            history = tuple(_HISTORY_DECODER.decode(raw))[-MAX_HISTORY:]
        except (msgspec.DecodeError, ValueError):
            history = ()
    number = _positive(h.header(headers, h.ATTEMPT)) or 1
    return Attempts(number, history, not_before_ms(headers))


def not_before_ms(headers: Iterable[tuple[str, bytes | None]] | None) -> int | None:
    """The `tokenmill-not-before` of a record's headers, or None (absent or garbled)."""
    return _positive(h.header(headers, h.NOT_BEFORE))


def failed_attempt(attempt: int, *, worker: str, code: str, message: str,
                   at_s: float | None = None) -> FailedAttempt:  # fmt: skip
    """An entry of the history, its message cut, stamped `at_s` (epoch seconds; now)."""
    return FailedAttempt(
        attempt=attempt,
        worker=worker,
        code=code,
        message=message[:MAX_MESSAGE_CHARS],
        time=rfc3339(time.time() if at_s is None else at_s),
    )


def without_attempt_headers(headers: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """`headers` less the attempt headers (a record's own, before new ones are written)."""
    return [(k, v) for k, v in headers if k.lower() not in ATTEMPT_HEADERS]


def rfc3339(at_s: float) -> str:
    millis = int(at_s * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000)) + (
        f".{millis % 1000:03d}Z"
    )


def _positive(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value > 0 else None
