"""`tokenmill gateway`: an OpenAI-compatible HTTP front onto the Kafka fleet (docs/gateway.md)."""
