"""structlog for every long-running command: JSON lines when not a terminal, pretty when one.

Context (request id, topic/partition/offset, ...) is bound through contextvars, so every log
line inside a request's handling carries it without being passed around.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    as_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # aiokafka logs through the standard library; keep its chatter at warnings.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RepeatLimit) for f in handler.filters):
            handler.addFilter(RepeatLimit())


class RepeatLimit(logging.Filter):
    """Lets the same message (logger and template) through at most once per `every_s`.

    While a broker is away, aiokafka 0.14's producer retries its metadata without a backoff
    and logs two errors each time: ~4,000 lines a second. One line per `every_s` says as much;
    the next one let through tells how many were held back.
    """

    def __init__(self, every_s: float = 5.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # -> (let through at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        last, held = self._last.get(key, (-self.every_s, 0))
        if record.created - last < self.every_s:
            self._last[key] = (last, held + 1)
            return False
        self._last[key] = (record.created, 0)
        if held:
            record.msg = f"{record.msg} [{held} more like this in the last {self.every_s:.0f} s]"
        return True
