"""`GenerateChunk`: a partial result of a streamed request (`"stream": true`), on its reply topic.

A streamed request's chunks go to the same topic as its result, keyed by its id (so they share
its partition and keep their order), with the schema header `GenerateChunk/1`; the final
`GenerateResult` follows them as for any request. A consumer that wants only results skips
every record whose `tokenmill-schema` is not `GenerateResult/1`.

Rebuilding the text: concatenate the `text` of the chunks of one `run` and one choice (`index`:
a request with `n` > 1 streams each of its choices, each counting its own `seq`) in `seq` order,
dropping a `seq` seen before (delivery is at-least-once, so a chunk may come twice). The
concatenation of a choice's chunks is that choice's final text (the result's `text`, or with
`n` > 1 its `choices[index].text`), and likewise their `token_ids` and `logprobs`; the result
is the authority, so a consumer may also just print chunks as they come and replace what it
showed by the result's text. A request run again (its worker died before the result was
delivered) streams again from `seq` 0 under a new `run`.
"""

from __future__ import annotations

import msgspec

from messages.request import SCHEMA_VERSION
from messages.result import TokenLogprobs


class GenerateChunk(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Tokens and text a streamed request produced since its previous chunk.

    - `id`: the request's.
    - `run`: names one execution of the request (a request run again gets a new one).
    - `seq`: 0, 1, 2, ... within a run.
    - `token_ids`: the tokens sampled since the previous chunk (the last chunk ends with the
      stop token, if one ended it, as the result's `token_ids` do).
    - `text`: the text they completed: never a partial UTF-8 character, and never text that
      could still turn out to be the start of a stop string (held back for a later chunk,
      and dropped if the stop string completes, as the result drops it). A chunk's text may
      be empty while its tokens are not (a character still incomplete, text held back).
    - `index`: the choice these tokens belong to (0 unless the request asked for `n` > 1).
    - `logprobs`: when the request asked for them, those of `token_ids` (entry `i` about
      `token_ids[i]`, as the result's `TokenLogprobs`); None otherwise.
    """

    v: int = SCHEMA_VERSION
    id: str
    run: str = ""
    seq: int = 0
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""
    index: int = 0
    logprobs: TokenLogprobs | None = None
