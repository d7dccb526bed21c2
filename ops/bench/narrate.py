"""How a benchmark tells its user what it is doing while it runs.

`tokenmill bench` passes one that prints to stderr; tests pass a list's `append`.
"""

from __future__ import annotations

from collections.abc import Callable

# Called with one line of text, such as "kafka: 64 requests at once".
Narrate = Callable[[str], None]
