"""sign_command / verify_command / decode_signed / NonceCache: what a worker applies or refuses."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messages.control import Command, Drain, Rollback, SignedCommand, Status, SwapModel
from messages.signing import (
    MAX_NONCE_CHARS,
    CommandRefusedError,
    NonceCache,
    canonical_bytes,
    decode_signed,
    sign_command,
    verify_command,
)

SECRET = "fleet-secret"
NOW = 1_767_225_600.25
COMMANDS: list[Command] = [SwapModel(model="smollm2-135m"), Rollback(), Drain(), Status()]
signed_json = msgspec.json.Encoder()


def verify(
    signed: SignedCommand,
    *,
    now: float = NOW,
    secret: str | None = SECRET,
    nonces: NonceCache | None = None,
    max_age_s: float = 60.0,
) -> Command:
    nonces = NonceCache() if nonces is None else nonces
    return verify_command(signed, secret, now=now, nonces=nonces, max_age_s=max_age_s)


def refused(signed: SignedCommand, **kw: Any) -> CommandRefusedError:
    with pytest.raises(CommandRefusedError) as info:
        verify(signed, **kw)
    assert info.value.detail
    assert str(info.value) == f"{info.value.reason}: {info.value.detail}"
    return info.value


# --- accepted ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_round_trips_through_the_wire(command: Command) -> None:
    signed = sign_command(command, SECRET, now=NOW)
    wire = signed_json.encode(signed)
    assert verify(decode_signed(wire)) == command


def test_signature_covers_the_documented_bytes() -> None:
    signed = sign_command(Rollback(), SECRET, now=NOW, nonce="n-1")
    assert signed.body == b'{"type":"rollback"}'
    assert canonical_bytes(NOW, "n-1", signed.body) == (
        b'tokenmill-command/v1\n1767225600.25\nn-1\n{"type":"rollback"}'
    )
    assert len(signed.signature) == 64 and int(signed.signature, 16) >= 0


def test_an_integer_time_signs_as_its_float() -> None:
    signed = sign_command(Status(), SECRET, now=1_767_225_600)
    assert signed.timestamp == 1_767_225_600.0
    decoded = decode_signed(signed_json.encode(signed))
    assert verify(decoded, now=1_767_225_600.0) == Status()


def test_a_default_nonce_is_fresh_each_time() -> None:
    nonces = {sign_command(Status(), SECRET, now=NOW).nonce for _ in range(50)}
    assert len(nonces) == 50 and all(len(n) == 32 for n in nonces)


def test_clock_skew_within_max_age_either_way_is_accepted() -> None:
    assert verify(sign_command(Status(), SECRET, now=NOW - 59), now=NOW) == Status()
    assert verify(sign_command(Status(), SECRET, now=NOW + 59), now=NOW) == Status()


# --- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [None, ""])
def test_a_worker_without_a_secret_refuses_everything(secret: str | None) -> None:
    error = refused(sign_command(Status(), SECRET, now=NOW, nonce="n1"), secret=secret)
    assert (error.reason, error.nonce) == ("no_secret", "n1")  # the sender learns why


def test_unsigned() -> None:
    signed = sign_command(Status(), SECRET, now=NOW, nonce="abc")
    error = refused(msgspec.structs.replace(signed, signature=""))
    assert (error.reason, error.nonce) == ("unsigned", "abc")


def test_wrong_secret() -> None:
    assert refused(sign_command(Status(), "other", now=NOW)).reason == "bad_signature"


@pytest.mark.parametrize("signature", ["zz" * 32, "AB" * 32, "ab" * 31, "é" * 64, "ab" * 33])
def test_a_signature_that_is_not_hex_sha256_is_bad(signature: str) -> None:
    signed = sign_command(Status(), SECRET, now=NOW)
    error = refused(msgspec.structs.replace(signed, signature=signature))
    assert error.reason == "bad_signature"


def test_a_flipped_body_byte_fails() -> None:
    signed = sign_command(SwapModel(model="good"), SECRET, now=NOW)
    body = signed.body.replace(b"good", b"evil")
    assert refused(msgspec.structs.replace(signed, body=body)).reason == "bad_signature"


def test_a_flipped_nonce_or_timestamp_fails() -> None:
    signed = sign_command(Status(), SECRET, now=NOW, nonce="nonce-a")
    assert refused(msgspec.structs.replace(signed, nonce="nonce-b")).reason == "bad_signature"
    later = msgspec.structs.replace(signed, timestamp=NOW + 1)
    assert refused(later).reason == "bad_signature"


def test_a_flipped_byte_anywhere_in_the_wire_form_is_refused() -> None:
    wire = bytearray(signed_json.encode(sign_command(SwapModel(model="m"), SECRET, now=NOW)))
    for i in range(len(wire)):
        flipped = bytearray(wire)
        flipped[i] ^= 0x01
        try:
            command = verify(decode_signed(bytes(flipped)))
        except CommandRefusedError:
            continue
        # Only a change JSON itself ignores may pass (none here), never a different command.
        assert command == SwapModel(model="m"), f"byte {i}"


def test_stale_and_future() -> None:
    old = refused(sign_command(Status(), SECRET, now=NOW - 61), now=NOW)
    assert old.reason == "stale" and "61 s old" in old.detail
    future = refused(sign_command(Status(), SECRET, now=NOW + 61), now=NOW)
    assert future.reason == "stale" and "in the future" in future.detail
    custom = refused(sign_command(Status(), SECRET, now=NOW - 6), now=NOW, max_age_s=5.0)
    assert custom.reason == "stale"


def test_a_non_finite_timestamp_is_malformed() -> None:
    signed = sign_command(Status(), SECRET, now=NOW)
    for bad in (float("nan"), float("inf")):
        assert refused(msgspec.structs.replace(signed, timestamp=bad)).reason == "malformed"


def test_replay_within_the_window_is_refused() -> None:
    nonces = NonceCache()
    signed = sign_command(Status(), SECRET, now=NOW)
    assert verify(signed, nonces=nonces) == Status()
    error = refused(signed, now=NOW + 30, nonces=nonces)
    assert (error.reason, error.nonce) == ("replayed", signed.nonce)
    # Re-signed under the same nonce (only a secret holder can): still a replay meanwhile.
    again = sign_command(Status(), SECRET, now=NOW + 30, nonce=signed.nonce)
    assert refused(again, now=NOW + 30, nonces=nonces).reason == "replayed"


def test_replay_after_the_window_is_stale_and_the_nonce_is_forgotten() -> None:
    nonces = NonceCache()
    signed = sign_command(Status(), SECRET, now=NOW)
    verify(signed, nonces=nonces)
    assert refused(signed, now=NOW + 61, nonces=nonces).reason == "stale"
    # Once its first command can no longer pass the age check, the nonce may be reused.
    fresh = sign_command(Status(), SECRET, now=NOW + 61, nonce=signed.nonce)
    assert verify(fresh, now=NOW + 61, nonces=nonces) == Status()
    assert len(nonces) == 1


def test_a_refused_command_does_not_burn_its_nonce() -> None:
    nonces = NonceCache()
    good = sign_command(Status(), SECRET, now=NOW, nonce="same")
    forged = msgspec.structs.replace(good, signature="0" * 64)
    assert refused(forged, nonces=nonces).reason == "bad_signature"
    assert refused(good, now=NOW + 120, nonces=nonces).reason == "stale"
    assert len(nonces) == 0
    assert verify(good, nonces=nonces) == Status()


@pytest.mark.parametrize("nonce", ["", "x" * (MAX_NONCE_CHARS + 1), "a\nb", "a b", "é"])
def test_a_bad_nonce_is_malformed(nonce: str) -> None:
    signed = sign_command(Status(), SECRET, now=NOW)
    error = refused(msgspec.structs.replace(signed, nonce=nonce))
    assert (error.reason, error.nonce) == ("malformed", None)
    with pytest.raises(ValueError, match="nonce"):
        sign_command(Status(), SECRET, now=NOW, nonce=nonce)


def test_the_longest_nonce_is_accepted() -> None:
    assert verify(sign_command(Status(), SECRET, now=NOW, nonce="n" * MAX_NONCE_CHARS))


def test_a_signed_body_that_is_no_command_is_malformed() -> None:
    template = sign_command(Status(), SECRET, now=NOW, nonce="n1")
    for body in (b'{"type":"reboot"}', b"not json", b'{"type":"swap_model"}'):
        message = canonical_bytes(NOW, "n1", body)
        signature = hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()
        signed = msgspec.structs.replace(template, body=body, signature=signature)
        assert refused(signed).reason == "malformed"


def test_an_unknown_signing_version_is_malformed() -> None:
    signed = sign_command(Status(), SECRET, now=NOW)
    assert refused(msgspec.structs.replace(signed, v=2)).reason == "malformed"


def test_sign_needs_a_secret_and_a_finite_time() -> None:
    with pytest.raises(ValueError, match="secret"):
        sign_command(Status(), "", now=NOW)
    with pytest.raises(ValueError, match="finite"):
        sign_command(Status(), SECRET, now=float("nan"))


# --- decode_signed ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b'{"type":"status"}', b'{"body": 1}', b"\xff\xfe", b"[" * 100_000],
)
def test_anything_but_a_signed_command_is_malformed(raw: bytes) -> None:
    with pytest.raises(CommandRefusedError) as info:
        decode_signed(raw)
    assert info.value.reason == "malformed" and info.value.nonce is None


def test_an_oversized_record_is_malformed_without_parsing() -> None:
    with pytest.raises(CommandRefusedError, match="malformed"):
        decode_signed(b" " * (1 << 20))


def test_unknown_envelope_fields_are_ignored() -> None:
    wire = msgspec.json.decode(signed_json.encode(sign_command(Drain(), SECRET, now=NOW)))
    wire["added_later"] = True
    assert verify(decode_signed(msgspec.json.encode(wire))) == Drain()


# --- NonceCache -------------------------------------------------------------------------------


def test_nonce_cache_forgets_by_command_time_not_by_arrival() -> None:
    cache = NonceCache()
    cache.add("late", 100.0)
    cache.add("early", 50.0)  # skewed sender: arrives second, older
    cache.forget_before(60.0)
    assert "early" not in cache and "late" in cache
    cache.forget_before(101.0)
    assert len(cache) == 0


def test_nonce_cache_is_bounded_and_drops_the_oldest() -> None:
    cache = NonceCache(max_entries=3)
    for i, t in enumerate([5.0, 1.0, 3.0, 4.0, 2.0]):
        cache.add(f"n{i}", t)
    assert len(cache) == 3
    assert {n for n in ("n0", "n1", "n2", "n3", "n4") if n in cache} == {"n0", "n2", "n3"}


def test_nonce_cache_default_bound_holds_under_a_flood() -> None:
    cache = NonceCache()
    for i in range(cache.max_entries + 500):
        cache.add(f"n{i}", float(i))
    assert len(cache) == cache.max_entries
    assert "n0" not in cache and f"n{cache.max_entries + 499}" in cache


def test_nonce_cache_re_adding_keeps_the_later_time() -> None:
    cache = NonceCache()
    cache.add("n", 1.0)
    cache.add("n", 10.0)
    cache.forget_before(5.0)
    assert "n" in cache
    with pytest.raises(ValueError):
        NonceCache(max_entries=0)


# --- property ---------------------------------------------------------------------------------

commands = st.one_of(
    st.builds(SwapModel, model=st.text(max_size=200)),
    st.just(Rollback()),
    st.just(Drain()),
    st.just(Status()),
)


@settings(max_examples=300, deadline=None)
@given(
    command=commands,
    secret=st.text(min_size=1, max_size=64),
    now=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    skew=st.floats(min_value=-59, max_value=59),
    nonce=st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True),
)
def test_verify_of_sign_is_the_command(
    command: Command, secret: str, now: float, skew: float, nonce: str
) -> None:
    wire = signed_json.encode(sign_command(command, secret, now=now, nonce=nonce))
    decoded = decode_signed(wire)
    assert verify_command(decoded, secret, now=now + skew, nonces=NonceCache()) == command
