"""`tokenmill bench`: the engine, pipeline, swap and batch benchmarks and what they share."""
