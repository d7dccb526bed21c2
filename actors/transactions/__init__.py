"""Exactly-once results (`--exactly-once`): Kafka transactions per input partition.

`answered` (which offsets above a commit point were answered, kept in the commit's metadata),
`lane` (one partition's transactional producer and its transactions), `lanes` (the emitter's
set of them), `outcomes` (the emitter's side: its outcomes to the lanes), `client` (the
ingest's side: take over, commit, hand off).
"""
