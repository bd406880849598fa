"""Qwen2.5-Coder-0.5B-Instruct's own Q4_K_M file (mostly Q5_0, with Q8_0, Q4_K and Q6_K), run
by default on its codes, against transformers loading the same file (which dequantizes it to
fp32): the same greedy tokens and every step's logits within TOLERANCE, through the paged
cache, a chunked prefill and decode steps (benchmarks/gemma3_gguf_check.py's comparison).

It needs the file in the cache (`python3 -m model.gguf.source qwen2.5-coder-0.5b-instruct`,
which .ci/run runs); elsewhere it skips, and under CI it fails. About a minute."""

from __future__ import annotations

from benchmarks.gemma3_gguf_check import TOLERANCE, compare
from model.gguf.source import release_path
from tests.conftest import missing

NAME = "qwen2.5-coder-0.5b-instruct"


def test_the_file_on_its_codes_matches_transformers():
    path = release_path(NAME)
    if not path.is_file():
        missing(f"{path} (python3 -m model.gguf.source {NAME} fetches it)")
    tokens, results = compare(path, prompt_tokens=300, new_tokens=3, chunk=128,
                              weights=("gguf",))
    steps = results["gguf"]
    print(f"greedy tokens: {tokens}")
    for i, step in enumerate(steps):
        print(f"step {i}: max |diff| = {step.max_diff:.2e} (tolerance {TOLERANCE:.0e}), "
              f"top-1 ours {step.top1_ours} hf {step.top1_hf}")
    assert len(steps) == 3
    assert all(s.top1_ours == s.top1_hf for s in steps)
    assert max(s.max_diff for s in steps) <= TOLERANCE
