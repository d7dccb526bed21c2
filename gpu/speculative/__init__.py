"""Speculative decoding: guess several next tokens cheaply, check them all in one forward.

- `config`: what a worker runs (`--speculative ngram[:k=..,n=..]`, `--speculative-model`);
- `proposer`: what every guesser offers the engine (`Proposer`);
- `prompt_lookup`: guesses copied from the request's own prompt and output (n-gram match);
- `draft_model`: guesses of a smaller (or quantized) model with the same tokenizer;
- `verify`: which guessed tokens the target model's own samples accept;
- `policy`: when speculation steps aside (the batch is large enough that it costs more);
- `speculator`: the engine's side: propose for the running sequences within their limits.
"""
