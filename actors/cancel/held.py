"""Taking a cancelled request out of queued batches. Pure Python, no I/O.

The ingest holds requests in length buckets (`LengthBuckets.remove`), the GPU actor in the
batches it has not admitted yet (here). The same id may be held more than once (a record
redelivered, a client's retry): every copy is taken.
"""

from __future__ import annotations

from actors.mail import Admitted, Batch


def take_from_batches(batches: list[Batch], request_id: str) -> tuple[list[Batch], list[Admitted]]:
    """The batches without request `request_id` (emptied ones dropped, order kept), and the
    items taken out of them, in order."""
    taken = [item for batch in batches for item in batch.items if item.request.id == request_id]
    if not taken:
        return batches, []
    for batch in batches:
        batch.items = [item for item in batch.items if item.request.id != request_id]
    return [batch for batch in batches if batch.items], taken
