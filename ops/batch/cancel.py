"""`tokenmill batch cancel`: ask the run writing an output file to cancel what it has in flight.

Only the running `batch run` knows which requests it has in flight, and only it may append to
the output (it holds the file's lock), so cancelling is asked of it through a marker file
beside the output (`OUT.jsonl.cancel`). The run sees it within a poll (0.2 s), stops reading
input, sends a cancel record for each request in flight, writes each answer as it comes
(`tokenmill.finish_reason` cancelled, with the tokens made so far), writes the ones still unanswered
after `cancel_wait_s` as cancelled itself, and exits. Lines it never sent stay unanswered: a
rerun of the same `batch run` runs them. A run removes a marker left from before as it starts.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

_POLL_S = 0.2


def cancel_marker(output: Path) -> Path:
    return output.with_name(output.name + ".cancel")


def run_holds(output: Path) -> bool:
    """Whether a `batch run` holds the output file's lock now (is writing it)."""
    try:
        fd = os.open(output, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this probe took
    return False


def request_cancel(output: Path, wait_s: float) -> bool:
    """Ask the run writing `output` to cancel, and wait up to `wait_s` for it to finish.

    False when no run holds `output`; raises TimeoutError when the run is still going after
    `wait_s` (the marker stays: it cancels as soon as it looks)."""
    if not run_holds(output):
        return False
    marker = cancel_marker(output)
    marker.touch()
    deadline = time.monotonic() + wait_s
    while run_holds(output):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run writing {output} is still going after {wait_s:.0f} s")
        time.sleep(_POLL_S)
    marker.unlink(missing_ok=True)
    return True
