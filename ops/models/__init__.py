"""Models and engines on the command line: the registry of downloadable models, the engine options,
`tokenmill models/plan/generate`."""
