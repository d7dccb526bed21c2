"""`tokenmill cancel`: cancel records on the cancel topic (see `messages.cancel`)."""
