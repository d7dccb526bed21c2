"""`tokenmill trace`: a request's trace read back from Jaeger's query API, as a tree."""
