"""API keys: read once from `--api-key-file`, checked in constant time, never logged.

A file holds one key a line; blank lines and lines starting with `#` are skipped. A client
sends `Authorization: Bearer KEY` (what the `openai` SDKs send for `api_key=`).
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

from ops.gateway.errors import GatewayStartError


def read_keys(path: Path) -> tuple[bytes, ...]:
    """The keys in `path`; `GatewayStartError` when it cannot be read or holds none."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise GatewayStartError(f"cannot read the API key file {path}: {exc.strerror}") from exc
    keys = tuple(
        line.strip().encode()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    if not keys:
        raise GatewayStartError(f"the API key file {path} holds no key")
    return keys


class KeyCheck:
    """Whether an `Authorization` header carries one of the keys. No keys: every call passes
    (a loopback-only gateway, `needs_keys`)."""

    def __init__(self, keys: tuple[bytes, ...] = ()) -> None:
        self._keys = keys

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def allows(self, authorization: str | None) -> bool:
        if not self._keys:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return False
        token = given.strip().encode()
        # Compare with every key, each in constant time: which key matched leaks nothing.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(token, key)
        return matched

    def __repr__(self) -> str:
        return f"KeyCheck({len(self._keys)} keys)"  # never the keys


def is_loopback(host: str) -> bool:
    """Whether listening on `host` reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve beyond this machine


def check_exposure(host: str, keys: KeyCheck) -> None:
    """Refuse to listen beyond loopback without keys."""
    if not keys.required and not is_loopback(host):
        raise GatewayStartError(
            f"--host {host} listens beyond this machine: give --api-key-file "
            "(or listen on 127.0.0.1)"
        )
