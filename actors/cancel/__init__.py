"""Cancellation: the cancel topic's reader (`CancelActor`) and the pure helpers the ingest and
the GPU actor use to take a cancelled request out of what they hold."""
