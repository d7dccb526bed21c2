"""API keys: read from a file, checked against `Authorization: Bearer`, required off loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.gateway.errors import GatewayStartError
from ops.gateway.keys import KeyCheck, check_exposure, is_loopback, read_keys


def test_keys_are_the_file_s_lines_without_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# the ops team\nsk-one\n\n  sk-two  \n")
    assert read_keys(path) == (b"sk-one", b"sk-two")


def test_a_file_without_keys_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# nothing\n")
    with pytest.raises(GatewayStartError, match="holds no key"):
        read_keys(path)


def test_only_a_bearer_of_a_listed_key_passes() -> None:
    check = KeyCheck((b"sk-one", b"sk-two"))
    assert check.allows("Bearer sk-two")
    assert check.allows("bearer sk-one")
    assert not check.allows("Bearer sk-three")
    assert not check.allows("Bearer sk-on")
    assert not check.allows("Basic sk-one")
    assert not check.allows("Bearer ")
    assert not check.allows(None)


def test_no_keys_lets_every_call_through() -> None:
    assert KeyCheck().allows(None)
    assert not KeyCheck().required


def test_the_keys_never_show_in_its_repr() -> None:
    assert "sk-secret" not in repr(KeyCheck((b"sk-secret",)))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_keys(host: str) -> None:
    assert is_loopback(host)
    check_exposure(host, KeyCheck())


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example"])
def test_beyond_loopback_without_keys_refuses_to_start(host: str) -> None:
    with pytest.raises(GatewayStartError, match="--api-key-file"):
        check_exposure(host, KeyCheck())
    check_exposure(host, KeyCheck((b"k",)))
