"""Gemma 3 270M (Q4_K_M GGUF) against transformers loading the same file: greedy tokens and
every step's logits, after a 600-token prompt (longer than the 512-token window).

About 45 s (two models loaded from the GGUF: transformers' and ours on the file's codes;
the dequantized path is held to transformers on tiny files of every architecture in
tests/model/test_gguf.py), and it needs the 241 MiB file: it runs where
`gemma-3-270m` is already in the cache (`python3 benchmarks/gemma3_gguf_check.py` fetches
it and runs the same comparison with more steps), and skips elsewhere rather than download
(under CI, which fetches it, a missing file fails).
"""

from __future__ import annotations

from benchmarks.gemma3_gguf_check import TOLERANCE, compare
from model.gguf.source import release_path
from tests.conftest import missing


def test_gemma3_270m_from_gguf_matches_transformers():
    """Ours on the file's own codes (the default)."""
    path = release_path("gemma-3-270m")
    if not path.is_file():
        missing(f"{path} (python3 -m model.gguf.source gemma-3-270m fetches it)")
    tokens, results = compare(path, prompt_tokens=600, new_tokens=3, chunk=256,
                              weights=("gguf",))
    print(f"greedy tokens: {tokens}")
    for weights, steps in results.items():
        for i, step in enumerate(steps):
            print(f"--weights {weights}, step {i}: max |diff| = {step.max_diff:.2e} "
                  f"(tolerance {TOLERANCE:.0e}), top-1 ours {step.top1_ours} hf "
                  f"{step.top1_hf}")
        assert len(steps) == 3
        assert all(s.top1_ours == s.top1_hf for s in steps)
        assert max(s.max_diff for s in steps) <= TOLERANCE
