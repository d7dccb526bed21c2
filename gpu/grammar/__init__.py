"""Structured output: JSON-Schema grammars that constrain which token may come next.

The grammar library (llguidance) is wrapped behind three small pieces, so the engine knows
only our names: `compiler.GrammarCompiler` (schema + the model's vocabulary → a grammar,
cached per distinct schema), `matcher.JsonMatcher` (one sequence's place in its grammar:
fill its mask, accept tokens, terminated?) and `mask.TokenMasks` (one step's masks for the
constrained rows, as one tensor on the device).
"""
