"""The resident set's growth rate: the slope over the window, from the oldest sample kept."""

from __future__ import annotations

from actors.guards.rss_trend import RssTrend

MB = 1 << 20


def test_no_rate_before_two_samples() -> None:
    trend = RssTrend(window_s=60.0)
    assert trend.rss is None and trend.growth_bytes_per_s == 0.0
    trend.add(0.0, 500 * MB)
    assert trend.rss == 500 * MB and trend.growth_bytes_per_s == 0.0


def test_a_steady_leak_is_a_steady_rate_and_a_flat_set_none() -> None:
    trend = RssTrend(window_s=60.0)
    for t in range(10):
        trend.add(float(t), (500 + 2 * t) * MB)
    assert trend.growth_bytes_per_s == 2 * MB
    flat = RssTrend(window_s=60.0)
    for t in range(10):
        flat.add(float(t), 500 * MB)
    assert flat.growth_bytes_per_s == 0.0


def test_the_rate_covers_the_window_only() -> None:
    trend = RssTrend(window_s=10.0)
    trend.add(0.0, 100 * MB)
    trend.add(5.0, 1000 * MB)  # a jump long ago...
    for t in range(6, 40):
        trend.add(float(t), 1000 * MB)  # ...then flat for longer than the window
    assert trend.growth_bytes_per_s == 0.0
    trend.add(40.0, 1010 * MB)
    assert 0 < trend.growth_bytes_per_s <= 1 * MB
