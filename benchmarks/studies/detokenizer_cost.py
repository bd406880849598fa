"""What incremental detokenization costs per token, by path: the tokenizers library's
DecodeStream (what engine/detokenizer.py uses with a Rust-backed tokenizer) and the
two-window decode through the tokenizer's own `decode` (its path for any other tokenizer).

    python3 benchmarks/studies/detokenizer_cost.py

400 tokens of English text after a short prompt, added one at a time as a stream's outputs
arrive; best of 5 runs each, the two paths in turns, on the default model's tokenizer.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

from transformers import AutoTokenizer

from benchmarks.results import cpu_model
from engine.detokenizer import IncrementalDetokenizer
from model.prepare import prepare_default_model

TEXT = " Once upon a time, in a quiet village by the sea, there lived an old fisherman who " * 20


class PythonOnly:
    """The tokenizer without its Rust backend in sight: the detokenizer's Python path."""

    def __init__(self, tokenizer) -> None:
        self.decode = tokenizer.decode


def per_token_us(tokenizer, prompt: list[int], output: list[int]) -> float:
    detok = IncrementalDetokenizer(tokenizer, prompt, [])
    ids = list(prompt)
    start = time.perf_counter()
    for token in output:
        ids.append(token)
        detok.add(ids)
        detok.take(final=False)
    return (time.perf_counter() - start) / len(output) * 1e6


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(prepare_default_model())
    prompt = tokenizer("Write a story:").input_ids
    output = tokenizer(TEXT, add_special_tokens=False).input_ids
    best = {"DecodeStream": float("inf"), "two-window decode": float("inf")}
    for _ in range(5):
        best["DecodeStream"] = min(best["DecodeStream"], per_token_us(tokenizer, prompt, output))
        best["two-window decode"] = min(best["two-window decode"],
                                        per_token_us(PythonOnly(tokenizer), prompt, output))
    print(f"{cpu_model()}; {len(output)} tokens, best of 5")
    for path, us in best.items():
        print(f"{path}: {us:.1f} us a token")


if __name__ == "__main__":
    main()
