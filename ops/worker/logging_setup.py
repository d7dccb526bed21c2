"""structlog for every long-running command: JSON lines when not a terminal, pretty when one.

Context (request id, topic/partition/offset, ...) is bound through contextvars, so every log
line inside a request's handling carries it without being passed around.

One handler on the root logger writes every line: tokenmill's structlog events and the
standard-library records of aiokafka (or any other library, Python's warnings included) alike,
rendered by the same processors, so each line on stderr is one JSON object when not a tty:

    {"event": "Unable connect to node with id 1: ...", "logger": "aiokafka.conn",
     "level": "error", "timestamp": "...", "repeated": 41}

A single handler also means a single lock: lines written from two threads never interleave.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.stdlib import ProcessorFormatter


class _StderrHandler(logging.StreamHandler[TextIO]):
    """The handler `configure_logging` installs (and replaces when called again)."""


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    as_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    threshold = logging.getLevelNamesMapping()[level.upper()]
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,  # here: where the exception is being handled
            ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(
        ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(allow=("repeated",))],
            processors=[
                ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    handler.addFilter(RepeatLimit())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # aiokafka logs through the standard library; keep its chatter (and others') at warnings.
    root.setLevel(logging.WARNING)
    # structlog's events, already filtered by the bound logger: every one of them is named
    # `tokenmill.*`, so the root's warning level does not hold them back.
    logging.getLogger("tokenmill").setLevel(threshold)
    logging.captureWarnings(True)  # `warnings.warn` lines become records too


class RepeatLimit(logging.Filter):
    """Lets the same message (logger and template) through at most once per `every_s`.

    While a broker is away, aiokafka 0.14's producer retries its metadata without a backoff
    and logs two errors each time: ~4,000 lines a second. One line per `every_s` says as much;
    the next one let through carries how many were held back, as `repeated`. structlog's own
    events pass untouched: each is an event, not a template repeated.
    """

    MAX_KEYS = 1024  # templates remembered; past it, those quiet for `every_s` are forgotten

    def __init__(self, every_s: float = 5.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # -> (let through at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, dict):  # an event dict from `wrap_for_formatter`
            return True
        key = (record.name, str(record.msg))
        last, held = self._last.get(key, (-self.every_s, 0))
        if record.created - last < self.every_s:
            self._last[key] = (last, held + 1)
            return False
        if len(self._last) >= self.MAX_KEYS:
            self._forget(before=record.created - self.every_s)
        self._last[key] = (record.created, 0)
        if held:
            record.__dict__["repeated"] = held  # for `ExtraAdder`
        return True

    def _forget(self, before: float) -> None:
        for key, (last, _) in list(self._last.items()):
            if last < before:
                del self._last[key]
