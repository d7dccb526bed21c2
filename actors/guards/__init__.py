"""Guards that end a worker on purpose before it does harm: the progress watchdog (an engine
step that never returns) and the memory guard (a resident set past `--max-rss`)."""
