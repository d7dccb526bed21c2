"""One `/v1/embeddings` request as the parts the gateway sends: at most `PART_INPUTS` inputs an
`EmbedRequest`, each answered in base64, and their results joined back into one.

    parts = split(request)                  # [EmbedRequest, ...], ids "<id>", or "<id>.<k>"
    result = joined(request, results)       # one EmbedResult, as the client asked it

Why: a worker writes each result as one Kafka record (1 MiB by default), and refuses at its
door a request whose vectors would not fit (`result_too_large`). OpenAI takes up to 2,048
inputs a request and clients send many (LangChain 1,000, the `openai` SDK whatever it is
given), so the gateway sends them in parts the record holds, in parallel (each part is
batched by the workers like any request), and always in base64 (4 bytes a value, against
about 21 as JSON numbers). The vectors a client asked as floats are decoded here: the same
float32 values, so the same numbers the worker would have written.
"""

from __future__ import annotations

import base64

import msgspec
import numpy as np

from messages.embedding import Embedding, EmbedRequest, EmbedResult, EmbedUsage
from messages.result import Timings
from messages.validation import embed_inputs

# Inputs a part: 32 vectors of 3,072 values (a wide model's) make 0.5 MB in base64.
PART_INPUTS = 32


def split(request: EmbedRequest) -> list[EmbedRequest]:
    """`request` as the parts the gateway sends, in input order: itself (asked in base64)
    when it has at most `PART_INPUTS` inputs, else one part per `PART_INPUTS` inputs, its id
    followed by ".<k>". Raises what `embed_inputs` raises for an input it cannot read."""
    inputs = embed_inputs(request.input)
    if len(inputs) <= PART_INPUTS:
        return [msgspec.structs.replace(request, encoding_format="base64")]
    return [
        msgspec.structs.replace(
            request,
            id=f"{request.id}.{k}",
            input=inputs[start : start + PART_INPUTS],
            encoding_format="base64",
        )
        for k, start in enumerate(range(0, len(inputs), PART_INPUTS))
    ]


def joined(request: EmbedRequest, results: list[EmbedResult]) -> EmbedResult:
    """The parts' `results` (in `split`'s order) as one answer to `request`: the first error
    if a part failed; else every vector at its place in the request's input, in the format the
    request asked, the usage summed."""
    for result in results:
        if result.error is not None:
            return msgspec.structs.replace(result, id=request.id, data=[])
    first = results[0]
    data: list[Embedding] = []
    for k, result in enumerate(results):
        offset = k * PART_INPUTS
        data.extend(
            Embedding(index=offset + e.index, embedding=_as_asked(e.embedding, request))
            for e in result.data
        )
    prompt_tokens = sum(r.usage.prompt_tokens for r in results)
    return EmbedResult(
        id=request.id,
        data=data,
        dimensions=first.dimensions,
        truncated=sum(r.truncated for r in results),
        usage=EmbedUsage(
            prompt_tokens=prompt_tokens, total_tokens=sum(r.usage.total_tokens for r in results)
        ),
        model=first.model,
        timings=Timings(
            queued_ms=max(r.timings.queued_ms for r in results),
            total_ms=max(r.timings.total_ms for r in results),
        ),
        worker=first.worker,
        source=first.source,
        metadata=request.metadata,
    )


def _as_asked(vector: list[float] | str, request: EmbedRequest) -> list[float] | str:
    """A part's vector (base64) in the request's own `encoding_format`."""
    if request.encoding_format == "base64" or not isinstance(vector, str):
        return vector
    values: list[float] = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
    return values
