"""`actors.kafka.oauth_token`: OAUTHBEARER tokens from a file re-read when it changes, or from a
command run again before its token expires. Real files and real subprocesses; a fake clock."""

from __future__ import annotations

import base64
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from actors.kafka.oauth_token import (
    COMMAND_TOKEN_TTL_S,
    RENEW_BEFORE_EXPIRY_S,
    CommandToken,
    FileToken,
    TokenUnavailable,
    jwt_expiry,
)

STDERR_SECRET = "client-secret-Qw8-unlikely"


def _jwt(claims: object) -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = part(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{header}.{part(json.dumps(claims).encode())}.sig"


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _printing(tmp_path: Path, tokens: list[str]) -> tuple[str, Path]:
    """A command printing `tokens` one per run (the last one thereafter), and the file counting
    its runs."""
    runs = tmp_path / "runs"
    runs.write_text("0")
    script = tmp_path / "token.py"
    script.write_text(
        "import pathlib, sys\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "n = int(runs.read_text())\n"
        "runs.write_text(str(n + 1))\n"
        f"tokens = {tokens!r}\n"
        "print(tokens[min(n, len(tokens) - 1)])\n"
    )
    return shlex.join([sys.executable, str(script)]), runs


def _runs(runs: Path) -> int:
    return int(runs.read_text())


# --- jwt_expiry ---------------------------------------------------------------------------


def test_jwt_expiry_reads_exp() -> None:
    assert jwt_expiry(_jwt({"sub": "svc", "exp": 1_700_000_000})) == 1_700_000_000.0
    assert jwt_expiry(_jwt({"exp": 1_700_000_000.5})) == 1_700_000_000.5


@pytest.mark.parametrize(
    "token",
    [
        "opaque-token",
        "a.b",
        "a.b.c.d",
        "header.!!!not-base64!!!.sig",
        "header." + base64.urlsafe_b64encode(b"not json").decode() + ".sig",
        "header." + base64.urlsafe_b64encode(b"\xff\xfe").decode() + ".sig",
        _jwt({"sub": "svc"}),
        _jwt({"exp": "tomorrow"}),
        _jwt([1, 2, 3]),
    ],
)
def test_jwt_expiry_of_what_is_not_a_jwt_with_exp_is_none(token: str) -> None:
    assert jwt_expiry(token) is None


# --- FileToken ----------------------------------------------------------------------------


async def test_file_token_is_read_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("token-one\n")
    provider = FileToken(path)
    assert await provider.token() == "token-one"
    before = path.stat()

    # New content, but the same size and modification time: the file is not read again.
    path.write_text("token-two\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    assert await provider.token() == "token-one"


async def test_file_token_is_read_again_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("token-one")
    provider = FileToken(path)
    assert await provider.token() == "token-one"
    mtime_ns = path.stat().st_mtime_ns

    path.write_text("token-two")  # the same size: only the modification time tells
    os.utime(path, ns=(mtime_ns + 1_000_000_000, mtime_ns + 1_000_000_000))

    assert await provider.token() == "token-two"


async def test_a_missing_token_file_is_unavailable(tmp_path: Path) -> None:
    provider = FileToken(tmp_path / "missing")

    with pytest.raises(TokenUnavailable, match="missing"):
        await provider.token()


async def test_an_empty_token_file_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  \n")

    with pytest.raises(TokenUnavailable, match="is empty"):
        await FileToken(path).token()


# --- CommandToken -------------------------------------------------------------------------


async def test_command_token_prints_the_token() -> None:
    command = shlex.join([sys.executable, "-c", "print('  opaque-token  ')"])

    assert await CommandToken(command).token() == "opaque-token"


async def test_a_jwt_is_kept_until_a_minute_before_it_expires(tmp_path: Path) -> None:
    exp = 1_000_000.0
    first, second = _jwt({"exp": exp}), _jwt({"exp": exp + 3600})
    command, runs = _printing(tmp_path, [first, second])
    clock = FakeClock(exp - 3600)
    provider = CommandToken(command, clock=clock)

    assert await provider.token() == first
    clock.now = exp - RENEW_BEFORE_EXPIRY_S - 1
    assert await provider.token() == first
    assert _runs(runs) == 1

    clock.now = exp - RENEW_BEFORE_EXPIRY_S
    assert await provider.token() == second
    assert _runs(runs) == 2
    assert await provider.token() == second
    assert _runs(runs) == 2


async def test_a_token_without_expiry_is_kept_five_minutes(tmp_path: Path) -> None:
    command, runs = _printing(tmp_path, ["opaque-1", "opaque-2"])
    clock = FakeClock(5_000.0)
    provider = CommandToken(command, clock=clock)

    assert await provider.token() == "opaque-1"
    clock.now += COMMAND_TOKEN_TTL_S - 1
    assert await provider.token() == "opaque-1"
    assert _runs(runs) == 1

    clock.now += 1
    assert await provider.token() == "opaque-2"
    assert _runs(runs) == 2
    assert COMMAND_TOKEN_TTL_S == 300.0


async def test_a_failing_command_is_unavailable_without_its_stderr() -> None:
    command = shlex.join(
        [sys.executable, "-c", f"import sys; sys.stderr.write({STDERR_SECRET!r}); sys.exit(3)"]
    )

    with pytest.raises(TokenUnavailable) as raised:
        await CommandToken(command).token()

    message = str(raised.value)
    assert "exit 3" in message
    assert STDERR_SECRET not in message


async def test_a_command_printing_nothing_is_unavailable() -> None:
    command = shlex.join([sys.executable, "-c", f"import sys; sys.stderr.write({STDERR_SECRET!r})"])

    with pytest.raises(TokenUnavailable, match="no token on stdout") as raised:
        await CommandToken(command).token()

    assert STDERR_SECRET not in str(raised.value)


async def test_a_command_that_does_not_exist_is_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-command")

    with pytest.raises(TokenUnavailable, match="no-such-command"):
        await CommandToken(f"{missing} --secret {STDERR_SECRET}").token()


def test_an_empty_command_is_unavailable() -> None:
    with pytest.raises(TokenUnavailable, match="empty"):
        CommandToken("   ")


async def test_a_failed_renewal_raises_and_is_tried_again(tmp_path: Path) -> None:
    flag = tmp_path / "fail"
    script = tmp_path / "token.py"
    script.write_text(
        "import pathlib, sys\n"
        f"if pathlib.Path({str(flag)!r}).exists(): sys.exit(1)\n"
        "print('opaque')\n"
    )
    clock = FakeClock(0.0)
    provider = CommandToken(shlex.join([sys.executable, str(script)]), clock=clock)
    assert await provider.token() == "opaque"

    flag.write_text("")
    clock.now = COMMAND_TOKEN_TTL_S
    with pytest.raises(TokenUnavailable):
        await provider.token()

    flag.unlink()
    assert await provider.token() == "opaque"
