"""The ingest actor and its pure parts: length buckets, offsets, backpressure, the model front, the
door's checks, reply topics, the crash guard and its commits."""
