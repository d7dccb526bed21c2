"""The repeat limit on standard-library log lines (aiokafka's, mostly)."""

from __future__ import annotations

import logging

from ops.worker.logging_setup import RepeatLimit


def record(msg: str, created: float, name: str = "aiokafka") -> logging.LogRecord:
    r = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, ("x",), None)
    r.created = created
    return r


def test_the_same_message_passes_once_per_window_and_then_says_how_many_were_held() -> None:
    limit = RepeatLimit(every_s=5.0)
    passed = [limit.filter(record("Unable connect to %s", t / 10)) for t in range(100)]
    assert passed.count(True) == 2  # at 0 s and at 5 s
    late = record("Unable connect to %s", 5.0)
    assert RepeatLimit(every_s=5.0).filter(late) and "more like this" not in late.getMessage()
    again = record("Unable connect to %s", 12.0)
    assert limit.filter(again)
    assert "[49 more like this in the last 5 s]" in again.getMessage()


def test_other_messages_and_loggers_are_counted_apart() -> None:
    limit = RepeatLimit()
    assert limit.filter(record("a %s", 0.0))
    assert limit.filter(record("b %s", 0.1))
    assert limit.filter(record("a %s", 0.2, name="other"))
    assert not limit.filter(record("a %s", 0.3))
