"""Token streaming: the pure per-request state behind `GenerateChunk`s (no I/O, no asyncio)."""
