"""`tokenmill worker`: its settings (flags, env, TOML), logging and telemetry setup."""
