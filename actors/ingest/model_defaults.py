"""What a request leaves to the model (`GenerateRequest.model_defaults`), filled at the ingest.

The gateway holds no model, so a client's omitted `max_tokens`, `temperature`, `top_p` and
`top_k` travel as names; the worker that tokenizes the request fills them here, in the
request itself, before its lengths are checked. Filling is idempotent per model: a request
tokenized again for another model (a flip) takes that model's values.
"""

from __future__ import annotations

from gpu.loading.sampling_defaults import SamplingDefaults
from messages.request import GenerateRequest

# What an omitted field means when the model recommends nothing: OpenAI's defaults.
OPENAI_TEMPERATURE = 1.0
OPENAI_TOP_P = 1.0
OPENAI_TOP_K = 0  # off


def fill_sampling(request: GenerateRequest, model: SamplingDefaults) -> None:
    """Set the `temperature`, `top_p` and `top_k` that `request.model_defaults` names to the
    model's recommendation, else OpenAI's default."""
    asked = request.model_defaults
    if not asked:
        return
    if "temperature" in asked:
        temperature = model.temperature
        request.temperature = OPENAI_TEMPERATURE if temperature is None else temperature
    if "top_p" in asked:
        request.top_p = OPENAI_TOP_P if model.top_p is None else model.top_p
    if "top_k" in asked:
        # a recommended -1 means off, as 0 does here
        request.top_k = OPENAI_TOP_K if model.top_k is None else max(model.top_k, 0)


def fill_max_new_tokens(request: GenerateRequest, limit: int, room: int) -> None:
    """When `request.model_defaults` names `max_new_tokens`: run to EOS, or to the worker's
    `limit`, or to the end of the context (`room`: what the prompt leaves), whichever comes
    first. A prompt that leaves no room keeps the request's value, for `check_lengths` to
    refuse it saying why."""
    if "max_new_tokens" in request.model_defaults and room > 0:
        request.max_new_tokens = min(limit, room)
