"""xgrammar against llguidance on this CPU, for choosing the structured-output library:
compile time of a benchmark-like schema and of a 1,000-value enum, and the cost of one
decode step's grammar work at batch 30 (fill 30 masks, apply them to random logits, pick
the argmax, advance the 30 matchers), median of 40 steps.

xgrammar is not a dependency of nano-vLLM: `pip install xgrammar==0.2.8` before running.
    python3 benchmarks/studies/grammar_libraries.py xgrammar
    python3 benchmarks/studies/grammar_libraries.py llguidance
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import numpy as np
import torch
from transformers import AutoTokenizer

from model.prepare import prepare_default_model

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"type": "string", "enum": ["admin", "user", "guest"]},
    "address": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city", "zip"]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
             "maxItems": 3}},
    "required": ["name", "age", "role", "address", "tags"], "additionalProperties": False}
ENUM = {"type": "object", "properties": {"word": {
    "type": "string", "enum": [f"value_{i:04d}_item" for i in range(1000)]}},
    "required": ["word"]}
BATCH, STEPS = 30, 40


def steps(fill, apply, advance, vocab: int) -> list[float]:
    times = []
    for _ in range(STEPS):
        logits = torch.randn(BATCH, vocab)
        start = time.perf_counter()
        fill()
        apply(logits)
        advance(logits.argmax(-1).tolist())
        times.append(time.perf_counter() - start)
    return times


def xgrammar_run(tok, vocab: int) -> None:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    for name, schema in (("benchmark schema", SCHEMA), ("1,000-value enum", ENUM)):
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        start = time.perf_counter()
        compiler.compile_json_schema(json.dumps(schema))
        print(f"xgrammar compile {name}: {1000 * (time.perf_counter() - start):.1f} ms")
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA))
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(BATCH)]
    mask = xgr.allocate_token_bitmask(BATCH, vocab)

    def fill() -> None:
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)

    def advance(tokens: list[int]) -> None:
        for m, t in zip(matchers, tokens, strict=True):
            if not m.is_terminated():
                m.accept_token(t)

    times = steps(fill, lambda logits: xgr.apply_token_bitmask_inplace(logits, mask), advance,
                  vocab)
    print(f"xgrammar step at batch {BATCH}: median {1000 * np.median(times):.2f} ms")


def llguidance_run(tok, vocab: int) -> None:
    import llguidance
    import llguidance.hf

    lt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    for name, schema in (("benchmark schema", SCHEMA), ("1,000-value enum", ENUM)):
        start = time.perf_counter()
        llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(schema))
        print(f"llguidance compile {name}: {1000 * (time.perf_counter() - start):.1f} ms")
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    matchers = [llguidance.LLMatcher(lt, grammar) for _ in range(BATCH)]
    packed: list[np.ndarray] = []

    def fill() -> None:
        packed[:] = [np.frombuffer(m.compute_bitmask(), dtype=np.uint8) for m in matchers]

    def apply(logits: torch.Tensor) -> None:  # as engine/logits_processors.py does it
        allowed = np.unpackbits(np.stack(packed), axis=1, bitorder="little").astype(bool)
        logits.masked_fill_(~torch.from_numpy(allowed[:, :vocab]), float("-inf"))

    def advance(tokens: list[int]) -> None:
        for m, t in zip(matchers, tokens, strict=True):
            if not m.is_stopped():
                m.consume_token(t)

    times = steps(fill, apply, advance, vocab)
    print(f"llguidance step at batch {BATCH}: median {1000 * np.median(times):.2f} ms")


def main() -> int:
    tok = AutoTokenizer.from_pretrained(prepare_default_model())
    {"xgrammar": xgrammar_run, "llguidance": llguidance_run}[sys.argv[1]](tok, len(tok))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
