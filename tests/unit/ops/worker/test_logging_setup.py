"""Logging: one JSON object per stderr line, for structlog's events and standard-library
records (aiokafka's, mostly) alike; repeats of a record held back and counted."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from ops.worker.logging_setup import RepeatLimit, configure_logging


def record(msg: str, created: float, name: str = "aiokafka") -> logging.LogRecord:
    r = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, ("x",), None)
    r.created = created
    return r


def test_the_same_message_passes_once_per_window_and_then_says_how_many_were_held() -> None:
    limit = RepeatLimit(every_s=5.0)
    passed = [limit.filter(record("Unable connect to %s", t / 10)) for t in range(100)]
    assert passed.count(True) == 2  # at 0 s and at 5 s
    late = record("Unable connect to %s", 5.0)
    assert RepeatLimit(every_s=5.0).filter(late) and not hasattr(late, "repeated")
    again = record("Unable connect to %s", 12.0)
    assert limit.filter(again)
    assert again.repeated == 49  # type: ignore[attr-defined]
    assert again.getMessage() == "Unable connect to x"  # the message is left as it was


def test_other_messages_and_loggers_are_counted_apart() -> None:
    limit = RepeatLimit()
    assert limit.filter(record("a %s", 0.0))
    assert limit.filter(record("b %s", 0.1))
    assert limit.filter(record("a %s", 0.2, name="other"))
    assert not limit.filter(record("a %s", 0.3))


def test_templates_quiet_for_a_window_are_forgotten_past_the_bound() -> None:
    limit = RepeatLimit(every_s=5.0)
    for i in range(RepeatLimit.MAX_KEYS + 10):
        assert limit.filter(record(f"preformatted {i}", i / 1000))
    assert limit.filter(record("one more", 60.0))
    assert len(limit._last) == 1


@pytest.fixture
def configured() -> Iterator[None]:
    """`configure_logging` for one test: the root logger and structlog put back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    tokenmill_level = logging.getLogger("tokenmill").level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        logging.getLogger("tokenmill").setLevel(tokenmill_level)
        logging.captureWarnings(False)
        structlog.reset_defaults()


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_stdlib_records_are_json_lines_bounded_and_counted(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", json=True)
    conn = logging.getLogger("aiokafka.conn")
    for _ in range(1000):
        conn.error("Unable connect to node with id %s: %s", 1, "Connect call failed")
    conn.info("below the warning level: not written")
    first = lines(capsys.readouterr().err)  # every line parses as JSON
    assert len(first) == 1  # the other 999 came within the same 5 s
    assert first[0]["event"] == "Unable connect to node with id 1: Connect call failed"
    assert first[0]["logger"] == "aiokafka.conn" and first[0]["level"] == "error"
    assert "timestamp" in first[0] and "repeated" not in first[0]
    # The next one let through says how many were held back.
    late = logging.LogRecord(
        "aiokafka.conn", logging.ERROR, __file__, 1, "Unable connect to node with id %s: %s",
        (1, "Connect call failed"), None,
    )  # fmt: skip
    late.created += 5.0
    conn.handle(late)
    (again,) = lines(capsys.readouterr().err)
    assert again["repeated"] == 999


def test_structlog_events_exceptions_and_warnings_share_the_stream(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", json=True)
    log = structlog.get_logger("tokenmill.test")
    for i in range(3):
        log.info("batch_flushed", size=i)  # events are never held back
    log.debug("below the level: not written")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("child_crashed", child="gpu")
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("careful", UserWarning, stacklevel=1)
    written = lines(capsys.readouterr().err)
    assert [(e["event"], e["logger"]) for e in written[:3]] == [
        ("batch_flushed", "tokenmill.test")
    ] * 3
    assert [e["size"] for e in written[:3]] == [0, 1, 2]
    crashed, task = written[3], written[4]
    assert crashed["event"] == "child_crashed" and "ValueError: boom" in crashed["exception"]
    assert task["logger"] == "asyncio" and "ValueError: boom" in task["exception"]
    assert written[5]["logger"] == "py.warnings" and "careful" in written[5]["event"]
    assert len(written) == 6


def test_configuring_again_replaces_the_handler(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", json=True)
    configure_logging("warning", json=True)
    logging.getLogger("aiokafka").warning("once")
    structlog.get_logger("tokenmill.test").info("below warning now")
    assert [e["event"] for e in lines(capsys.readouterr().err)] == ["once"]
