"""Admission: `--max-inflight` places, each released once."""

from __future__ import annotations

import pytest

from ops.gateway.errors import ApiError
from ops.gateway.service import Gateway
from ops.gateway.settings import GatewaySettings


def gateway(max_inflight: int) -> Gateway:
    return Gateway(GatewaySettings(max_inflight=max_inflight), None, "t")  # type: ignore[arg-type]


def test_past_max_inflight_is_429_until_a_place_is_released() -> None:
    g = gateway(1)
    place = g.admit()
    with pytest.raises(ApiError) as caught:
        g.admit()
    assert caught.value.status == 429
    place.release()
    g.admit()


def test_a_place_is_released_once_however_often_asked() -> None:
    g = gateway(2)
    first, _second = g.admit(), g.admit()
    first.release()
    first.release()
    assert g.in_flight == 1


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="max-inflight"):
        GatewaySettings(max_inflight=0)
    with pytest.raises(ValueError, match="instance-id"):
        GatewaySettings(instance_id="a/b")
    assert GatewaySettings().reply_topic("x1") == "tokenmill.gateway.x1.results"
