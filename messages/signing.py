"""Signing and checking control commands: HMAC-SHA256 with the fleet's shared secret.

The signature is the hex HMAC-SHA256, keyed with `secret.encode()` (UTF-8), of these bytes:

    b"tokenmill-command/v1\\n" + repr(timestamp) + b"\\n" + nonce + b"\\n" + body

`repr(timestamp)` is the float's shortest round-trip form, ASCII (`1733000000.125`; an integer
timestamp is first made a float, so `1733000000.0`); JSON carries floats exactly, so the
worker rebuilds the signed bytes from the decoded value. `nonce` is 1–128 characters of
`[A-Za-z0-9._:-]`, so it can hold no separator. `body` is the msgspec JSON encoding of the
tagged `Command` union, carried as is (base64 in the `SignedCommand` JSON).

A worker applies a command only when it has a secret, the signature matches, the timestamp is
within `max_age_s` of its clock (either side), and the nonce was not accepted before while
its command could still pass the age check. Pure functions: the caller passes the clock.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
import re
import secrets
from typing import Literal

import msgspec

from messages.control import Command, SignedCommand
from messages.errors import MessageError

SIGNING_VERSION = 1
MAX_NONCE_CHARS = 128
MAX_SIGNED_BYTES = 64 << 10  # a command is a few hundred bytes; anything this big is not one
_PREFIX = b"tokenmill-command/v1\n"
_NONCE = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_NONCE_CHARS}}}")
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")

RefusalReason = Literal["no_secret", "unsigned", "bad_signature", "stale", "replayed", "malformed"]

_command_encoder = msgspec.json.Encoder()
_command_decoder = msgspec.json.Decoder(Command)
_signed_decoder: msgspec.json.Decoder[SignedCommand] = msgspec.json.Decoder(SignedCommand)


class CommandRefusedError(MessageError):
    """A control command the worker will not apply; `reason` is one of `RefusalReason`.

    `nonce` is the command's nonce when it was well-formed (so a refusal can name it).
    """

    def __init__(self, reason: RefusalReason, detail: str, *, nonce: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.nonce = nonce


class NonceCache:
    """The nonces of accepted commands, each with its command's timestamp.

    Bounded: `forget_before` drops every nonce whose command is older than a cutoff (such a
    command is refused as stale anyway), and past `max_entries` the oldest is dropped.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        self.max_entries = max_entries
        self._seen: dict[str, float] = {}
        self._by_age: list[tuple[float, str]] = []  # heap; timestamps arrive out of order

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen

    def add(self, nonce: str, timestamp: float) -> None:
        self._seen[nonce] = timestamp
        heapq.heappush(self._by_age, (timestamp, nonce))
        while len(self._seen) > self.max_entries:
            self._pop_oldest()

    def forget_before(self, cutoff: float) -> None:
        """Forget every nonce whose command's timestamp is before `cutoff`."""
        while self._by_age and self._by_age[0][0] < cutoff:
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        timestamp, nonce = heapq.heappop(self._by_age)
        if self._seen.get(nonce) == timestamp:  # else a later add() replaced it
            del self._seen[nonce]


def canonical_bytes(timestamp: float, nonce: str, body: bytes) -> bytes:
    """The bytes a command's signature covers (see the module docstring)."""
    stamp = repr(float(timestamp)).encode("ascii")
    return b"".join((_PREFIX, stamp, b"\n", nonce.encode("ascii"), b"\n", body))


def valid_nonce(nonce: str) -> bool:
    return _NONCE.fullmatch(nonce) is not None


def sign_command(
    command: Command, secret: str, *, now: float, nonce: str | None = None
) -> SignedCommand:
    """`command` signed with `secret` at unix time `now`; a fresh random nonce by default."""
    if not secret:
        raise ValueError("cannot sign without a secret")
    if not math.isfinite(now):
        raise ValueError(f"timestamp must be finite, got {now!r}")
    nonce = secrets.token_hex(16) if nonce is None else nonce
    if not valid_nonce(nonce):
        raise ValueError(f"nonce must match {_NONCE.pattern}, got {nonce!r}")
    body = _command_encoder.encode(command)
    timestamp = float(now)
    return SignedCommand(
        v=SIGNING_VERSION,
        body=body,
        timestamp=timestamp,
        nonce=nonce,
        signature=_signature(secret, canonical_bytes(timestamp, nonce, body)),
    )


def decode_signed(raw: bytes) -> SignedCommand:
    """Read a control record's value; `CommandRefusedError("malformed")` if it is not one."""
    if len(raw) > MAX_SIGNED_BYTES:
        raise CommandRefusedError("malformed", f"{len(raw)} bytes; a command is far smaller")
    try:
        return _signed_decoder.decode(raw)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise CommandRefusedError("malformed", f"not a SignedCommand: {exc}") from None


def verify_command(
    signed: SignedCommand,
    secret: str | None,
    *,
    now: float,
    nonces: NonceCache,
    max_age_s: float = 60.0,
) -> Command:
    """The command inside `signed` if it may be applied now, recording its nonce.

    Checks, in order: a secret is configured, the envelope is well-formed, it is signed, the
    signature matches, the timestamp is within `max_age_s` of `now`, the nonce is new, the body
    is a `Command`. Raises `CommandRefusedError` naming the first that fails; the nonce is
    recorded only when all pass, so a refused command never blocks a later good one.

    A nonce is remembered until its command's timestamp is `max_age_s` in the past: a replay
    within that window is refused as "replayed", and after it the same signed bytes are
    refused as "stale". A nonce reused under a new timestamp and signature (only a holder of
    the secret can make one) is refused as "replayed" while the first use is remembered.
    """
    nonce = signed.nonce if valid_nonce(signed.nonce) else None
    if not secret:
        raise CommandRefusedError(
            "no_secret", "this worker has no control secret configured", nonce=nonce
        )
    if nonce is None:
        raise CommandRefusedError(
            "malformed", f"nonce must be 1-{MAX_NONCE_CHARS} characters of [A-Za-z0-9._:-]"
        )
    if signed.v != SIGNING_VERSION:
        raise CommandRefusedError("malformed", f"signing version {signed.v}", nonce=nonce)
    if not math.isfinite(signed.timestamp):
        raise CommandRefusedError("malformed", "timestamp is not a finite number", nonce=nonce)
    if not signed.signature:
        raise CommandRefusedError("unsigned", "the command carries no signature", nonce=nonce)
    expected = _signature(secret, canonical_bytes(signed.timestamp, nonce, signed.body))
    given = signed.signature if _HEX_SHA256.fullmatch(signed.signature) else ""
    if not hmac.compare_digest(expected, given):
        raise CommandRefusedError(
            "bad_signature", "the signature does not match this worker's secret", nonce=nonce
        )
    age = now - signed.timestamp
    if abs(age) > max_age_s:
        when = f"{age:.0f} s old" if age > 0 else f"{-age:.0f} s in the future"
        raise CommandRefusedError(
            "stale", f"signed {when}; the limit is {max_age_s:g} s either way", nonce=nonce
        )
    nonces.forget_before(now - max_age_s)
    if nonce in nonces:
        raise CommandRefusedError("replayed", "this nonce was already accepted", nonce=nonce)
    try:
        command = _command_decoder.decode(signed.body)
    except msgspec.DecodeError as exc:
        raise CommandRefusedError(
            "malformed", f"body is not a command: {exc}", nonce=nonce
        ) from None
    nonces.add(nonce, signed.timestamp)
    return command


def _signature(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
