"""The GPU actor's parts (`actors.gpu_actor.GpuActor` runs the step loop over them).

- `admission`: a batch's requests into the active engine (copies joined to a running one,
  duplicates refused, a request tokenized again for a model flipped to);
- `answers`: what goes to the emitter, each request's result (built from its completion or
  an error) and a streamed request's chunks.
"""
