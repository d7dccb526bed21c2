"""Where an OAUTHBEARER token comes from: a file that is re-read when it changes, or a command
that is run again when its token nears expiry.

Both are aiokafka token providers: aiokafka asks for a token on every new connection, and these
hand out the current one. A token that is a JWT has its `exp` claim read (not verified: the
broker does that) so a command's token is renewed a minute before it expires.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka.abc import AbstractTokenProvider

from actors.kafka.errors import TokenUnavailable

RENEW_BEFORE_EXPIRY_S = 60.0
COMMAND_TOKEN_TTL_S = 300.0  # for a token whose expiry cannot be read
COMMAND_TIMEOUT_S = 30.0


def jwt_expiry(token: str) -> float | None:
    """The `exp` claim (Unix seconds) of a JWT, unverified; None when the token is not a JWT
    or has none."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, UnicodeDecodeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


class FileToken(AbstractTokenProvider):  # type: ignore[misc]
    """The token in `path`, read again whenever the file's size or modification time changes
    (a sidecar that rotates it needs no restart of the worker)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._token = ""

    async def token(self) -> str:
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            raise TokenUnavailable(f"OAUTHBEARER token file {self.path}: {exc.strerror}") from exc
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            token = self.path.read_text().strip()
            if not token:
                raise TokenUnavailable(f"OAUTHBEARER token file {self.path} is empty")
            self._token, self._seen = token, seen
        return self._token


class CommandToken(AbstractTokenProvider):  # type: ignore[misc]
    """The token a command prints on stdout (e.g. a cloud CLI's `... get-token`), kept until a
    minute before its `exp`, or for five minutes when it has none."""

    def __init__(self, command: str, clock: Callable[[], float] = time.time) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise TokenUnavailable("the OAUTHBEARER token command is empty")
        self._clock = clock
        self._token = ""
        self._renew_at = 0.0

    async def token(self) -> str:
        if not self._token or self._clock() >= self._renew_at:
            try:
                token = await self._run()
            except TokenUnavailable:
                exp = jwt_expiry(self._token) if self._token else None
                if exp is not None and self._clock() < exp:
                    return self._token  # still valid: the next connection tries again
                raise
            self._token = token
            exp = jwt_expiry(self._token)
            self._renew_at = (
                exp - RENEW_BEFORE_EXPIRY_S if exp is not None
                else self._clock() + COMMAND_TOKEN_TTL_S
            )  # fmt: skip
        return self._token

    async def _run(self) -> str:
        name = self.argv[0]
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise TokenUnavailable(f"OAUTHBEARER token command {name}: {exc.strerror}") from exc
        try:
            out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_S)
        except TimeoutError as exc:
            process.kill()
            raise TokenUnavailable(
                f"OAUTHBEARER token command {name} gave no token within {COMMAND_TIMEOUT_S:.0f} s"
            ) from exc
        token = out.decode(errors="replace").strip()
        if process.returncode != 0 or not token:
            # Its stderr is not quoted: a failing token command may print what it was given.
            del err
            raise TokenUnavailable(
                f"OAUTHBEARER token command {name} failed (exit {process.returncode}"
                f"{', no token on stdout' if not token else ''})"
            )
        return token
