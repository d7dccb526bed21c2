"""The one thread that does all of a worker's torch work: loading the model and every step.
(`bench pipeline` gives its direct engine one too, so both are stepped alike.)

CPU thread pools (OpenMP) belong to the thread that calls into torch. A model loaded on the
main thread and stepped on another leaves two pools competing for the same cores, and steps
run measurably slower (about 10-25% on a 2-core CPU). So the engine is built on this thread
and the GPU actor steps it here too.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def engine_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenmill-engine")


def build_on(thread: ThreadPoolExecutor, build: Callable[[], T]) -> T:
    """Run `build` (e.g. load the model and build the engine) on `thread`; wait for it."""
    return thread.submit(build).result()
