"""Structured output: grammars that constrain which token may come next.

A `gpu.sequence.Constraint` names its kind: a JSON Schema, a regular expression, a choice of
strings or a Lark/GBNF grammar. The grammar library (llguidance) is wrapped behind three small
pieces, so the engine knows only our names: `compiler.GrammarCompiler` (constraint + the
model's vocabulary → a grammar, cached per distinct constraint), `matcher.GrammarMatcher` (one
sequence's place in its grammar: fill its mask, accept tokens, terminated?) and
`mask.TokenMasks` (one step's masks for the constrained rows, as one tensor on the device).
"""
