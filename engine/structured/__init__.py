"""Structured outputs: a request's answer constrained to a JSON schema, a regex or a fixed
list of choices, by masking the tokens the grammar forbids at each step.

grammar.py turns a GrammarSpec into a compiled grammar and holds one request's matcher;
compiler.py compiles off the engine thread, under a time limit, cached by spec. The grammar
engine itself is llguidance's (see the README for why it and not xgrammar)."""
