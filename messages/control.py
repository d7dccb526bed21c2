"""Commands on the control topic. Every worker applies each command (own consumer group).

A command travels inside a `SignedCommand`: the encoded command as `body`, a timestamp and a
nonce, and an HMAC-SHA256 signature over them with the fleet's shared secret.
"""

from __future__ import annotations

import msgspec


class SwapModel(msgspec.Struct, kw_only=True, tag="swap_model", forbid_unknown_fields=False):
    """Load `model` (an alias or a path inside the models directory) and flip to it."""

    model: str


class Rollback(msgspec.Struct, kw_only=True, tag="rollback", forbid_unknown_fields=False):
    """Flip back to the previous model."""


class Drain(msgspec.Struct, kw_only=True, tag="drain", forbid_unknown_fields=False):
    """Stop fetching, finish in-flight work, then exit."""


class Status(msgspec.Struct, kw_only=True, tag="status", forbid_unknown_fields=False):
    """Ask every worker to publish a `StatusReply` event."""


Command = SwapModel | Rollback | Drain | Status


class SignedCommand(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    v: int = 1
    body: bytes  # the encoded `Command` (base64 in JSON)
    timestamp: float  # unix seconds at signing; stale ones are refused
    nonce: str  # unique per command; replays are refused
    signature: str  # hex HMAC-SHA256 over timestamp, nonce and body
