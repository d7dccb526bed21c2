"""The gateway's routes, one module-level `APIRouter` per resource, wired by `ops.gateway.app`:

    completions   POST /v1/completions
    chat          POST /v1/chat/completions
    responses     POST /v1/responses (OpenAI's Responses API, run as a chat completion)
    embeddings    POST /v1/embeddings (its flow: `embedding`)
    models        GET  /v1/models, GET /v1/models/{id}
    tokenize      POST /tokenize, POST /detokenize
    files         /v1/files (the Batch API's inputs and outputs)
    batches       /v1/batches
    utility       GET /health, /healthz, /readyz, /version, /metrics (no key)

Each route is a few lines over the gateway's parts (`deps.Parts`), found through dependencies;
a router that asks for a key says so once (`deps.KEYED`). Completions and chat share one flow
(`generating.generate`); a client that leaves is met in one place (`disconnect`).
"""
