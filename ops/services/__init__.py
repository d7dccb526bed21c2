"""The local services tokenmill starts itself: Kafka from its Maven jars, Jaeger built with Go, the
topics; `tokenmill up/down/topics`."""
