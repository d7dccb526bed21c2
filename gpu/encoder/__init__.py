"""The encoder path: embedding models run bidirectionally over whole inputs, no KV kept."""
