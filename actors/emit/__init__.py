"""The emitter's parts (`actors.emitter.EmitterActor` is their wiring).

- `records`: an outcome's records on their way, their sizes, and how one is handed to the
  producer;
- `planning`: an outcome's records, its result within the producer's limit or answered
  instead with an error result, or its request for a retry topic;
- `retries`: whether a failed request is answered, retried or dead-lettered;
- `retry_topics`: the retry topics checked at the first start;
- `chunks`: streamed requests' chunks, kept until their request's outcome is delivered;
- `destinations`: a record for a topic its producer does not know waits apart, bounded;
- `delivery`: waiting for the broker's acknowledgements, and what each failed send becomes;
- `dead_letters`: the DLQ check at the first start, and trimming a refused dead letter.
"""
