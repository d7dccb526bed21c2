"""`batch cancel`'s pure parts: the plan while cancelling, and the marker-file handshake with
the run that holds the output's lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from messages.error_codes import ErrorCode
from messages.openai_batch import BatchOutputLine
from messages.result import ErrorInfo, FinishReason
from ops.batch.cancel import cancel_marker, request_cancel, run_holds
from ops.batch.output import OutputWriter
from tests.unit.ops.batch.test_plan import in_flight, line, new_run, result


def choice(written: object) -> dict[str, object]:
    assert isinstance(written, BatchOutputLine) and written.response is not None
    body = written.response.body
    [first] = body.choices[:1]
    assert first.finish_reason == "length", "a choice cut short, in OpenAI's words"
    return {"finish_reason": first.tokenmill.finish_reason, "usage": body.usage.completion_tokens}


async def test_while_cancelling_nothing_is_sent_again_and_the_rest_is_written_cancelled() -> None:
    plan, _ = new_run(max_inflight=3)
    ids = [await in_flight(plan, n, line(f"q{n}")) for n in (1, 2, 3)]
    plan.cancelling = True
    draining = result(ids[0], error=ErrorInfo(code=ErrorCode.SHUTTING_DOWN, message="bye"))
    assert isinstance(plan.settle(draining), BatchOutputLine), "written, not sent again"
    stopped = plan.settle(result(ids[1], finish_reason=FinishReason.CANCELLED))
    assert choice(stopped) == {"finish_reason": "cancelled", "usage": 6}
    assert choice(plan.abandoned(ids[2])) == {"finish_reason": "cancelled", "usage": 0}
    assert not plan.pending and plan.window._value == 3, "every slot given back"
    assert plan.settle(result(ids[2])) is None, "a late answer is ignored"
    assert (plan.summary.cancelled, plan.summary.refused, plan.summary.ok) == (2, 1, 2)
    with pytest.raises(KeyError):
        plan.abandoned(ids[2])


def test_a_cancel_asks_only_a_run_that_holds_the_output(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    assert not run_holds(output) and request_cancel(output, 1.0) is False
    writer = OutputWriter(output)  # what `batch run` holds while it runs
    try:
        assert run_holds(output)
        with pytest.raises(TimeoutError):
            request_cancel(output, 0.3)
        assert cancel_marker(output).exists(), "left for the run to see"
        assert cancel_marker(output).name == "out.jsonl.cancel"
    finally:
        writer.close()
    assert not run_holds(output)
    assert request_cancel(output, 1.0) is False
