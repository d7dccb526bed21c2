"""The worker's span sink (actors/telemetry/span_sink.py) against a real child process that
reads its frames as the span export process does and writes each record's name to a file: frames,
flush on close, drops when full, a dead export process started again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from actors.telemetry.span_records import SpanRecord
from actors.telemetry.span_sink import SpanSink

READER = """
import sys, msgspec
out = open(sys.argv[1], "a")
while len(header := sys.stdin.buffer.read(4)) == 4:
    for record in msgspec.msgpack.decode(sys.stdin.buffer.read(int.from_bytes(header, "big"))):
        out.write(record[0] + "\\n")  # a record is an array; its name comes first
    out.flush()
"""  # msgspec only: starts fast, even on a loaded machine


def record(name: str) -> SpanRecord:
    return SpanRecord(name, 0, "ab" * 16, 1, 0, False, 1, 2, {"k": "v"})


def reader(path: Path) -> list[str]:
    return [sys.executable, "-c", READER, str(path)]


def names(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_what_is_recorded_reaches_the_export_process_by_close(tmp_path: Path) -> None:
    out = tmp_path / "names"
    sink = SpanSink(reader(out), batch=3, flush_every=0.05)
    sink.start()
    sink.record([record(f"span-{i}") for i in range(5)])
    sink.record([record("last")])
    sink.close(timeout=60)
    assert names(out) == [*(f"span-{i}" for i in range(5)), "last"]
    assert (sink.written, sink.dropped) == (6, 0)


def test_a_full_queue_drops_and_counts_instead_of_growing(tmp_path: Path) -> None:
    sink = SpanSink(reader(tmp_path / "names"), max_queued=4, flush_every=60)
    sink.start()
    sink.record([record("a")] * 3)
    sink.record([record("b")] * 3)  # 3 queued < 4: taken, now 6
    sink.record([record("c")])  # the queue is full: dropped
    sink.close(timeout=60)
    assert (sink.written, sink.refused) == (6, 1)
    assert names(tmp_path / "names") == ["a"] * 3 + ["b"] * 3


def test_a_dead_export_process_is_started_again(tmp_path: Path) -> None:
    out = tmp_path / "names"
    sink = SpanSink(reader(out), flush_every=0.02, restart_after=0.0)
    sink.start()
    sink.record([record("before")])
    _wait_for(lambda: names(out) == ["before"])
    first = sink._process
    assert first is not None
    first.kill()
    first.wait()
    sink.record([record("lost-or-kept")])  # written to the dead pipe or to its successor
    _wait_for(lambda: sink._process is not first and sink._process is not None)
    sink.record([record("after")])
    sink.close(timeout=60)
    assert names(out)[0] == "before" and names(out)[-1] == "after"
    assert sink.written + sink.dropped == 3


def test_an_export_process_that_cannot_start_loses_spans_without_an_error(tmp_path: Path) -> None:
    sink = SpanSink([str(tmp_path / "no-such-program")], flush_every=0.02)
    sink.start()
    sink.record([record("x")])
    sink.close(timeout=5)
    assert (sink.written, sink.dropped) == (0, 1)


def _wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_records_that_cannot_be_encoded_are_lost_alone(tmp_path: Path) -> None:
    out = tmp_path / "names"
    sink = SpanSink(reader(out), flush_every=0.02)
    sink.start()
    too_big = SpanRecord("too-big", 0, "ab" * 16, 1, 0, False, 1, 2, {"n": 2**70})
    sink.record([too_big])
    _wait_for(lambda: sink.lost == 1)
    sink.record([record("after")])
    sink.close(timeout=60)
    assert names(out) == ["after"]
