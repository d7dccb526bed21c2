"""How much memory models, KV pools and swaps take: the memory plan, footprints, byte sizes, device
memory."""
