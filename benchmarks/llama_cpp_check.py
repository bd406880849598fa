"""Checks that llama.cpp's llama-server serves the same model as nano-vLLM.

    weights F32.gguf Q4_1.gguf      every tensor of the converted F32 GGUF equals the original
                                    Q4_1 tensor dequantized (needs llama.cpp's gguf-py)
    tokens --llama URL --ours URL   greedy completions of a few prompts agree: the prompts are
                                    tokenized by llama-server and by our tokenizer (must agree),
                                    then the same token ids go to both servers

Run through `benchmarks/llama_cpp.sh check`, which sets PYTHONPATH and starts both servers.
"""

from __future__ import annotations

import argparse
import sys

import httpx
import numpy as np

# Plain text and code, as in tests/conftest.py, plus a chat-formatted prompt.
PROMPTS = [
    "The cat sat on the",
    "In 1969, Neil Armstrong became the first person to walk on the moon. Later in his life, he",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]


def check_weights(f32_path: str, q4_path: str) -> int:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    converted = {t.name: t for t in GGUFReader(f32_path).tensors}
    original = {t.name: t for t in GGUFReader(q4_path).tensors}
    if set(converted) != set(original):
        print(f"tensor names differ: {sorted(set(converted) ^ set(original))}")
        return 1
    worst = 0.0
    for name, t in original.items():
        ref = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        got = np.asarray(converted[name].data, dtype=np.float32).reshape(-1)
        if ref.shape != got.shape:
            print(f"{name}: {got.shape} elements, expected {ref.shape}")
            return 1
        worst = max(worst, float(np.max(np.abs(ref - got))))
    print(f"weights: {len(original)} tensors, max |F32 - dequantized Q4_1| = {worst:g}")
    return 0 if worst == 0.0 else 1


def complete(client: httpx.Client, url: str, ids: list[int], n: int) -> tuple[str, dict]:
    # No ignore_eos: llama.cpp implements it as a -inf logit bias on end-of-generation tokens,
    # nano-vLLM (like vLLM) samples them and carries on, so after an EOS the texts would differ.
    body = {"prompt": ids, "max_tokens": n, "temperature": 0}
    resp = client.post(url.rstrip("/") + "/v1/completions", json=body)
    resp.raise_for_status()
    out = resp.json()
    return out["choices"][0]["text"], out.get("usage") or {}


def check_tokens(llama_url: str, ours_url: str, model_dir: str, n: int) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    failures = 0
    with httpx.Client(timeout=120) as client:
        for prompt in PROMPTS:
            resp = client.post(llama_url.rstrip("/") + "/tokenize",
                               json={"content": prompt, "add_special": False,
                                     "parse_special": True})
            resp.raise_for_status()
            ids = resp.json()["tokens"]
            ours_ids = tokenizer(prompt).input_ids
            llama_text, llama_usage = complete(client, llama_url, ids, n)
            ours_text, ours_usage = complete(client, ours_url, ids, n)
            same_ids = ids == ours_ids
            same = llama_text == ours_text and same_ids
            failures += not same
            print(f"{'same' if same else 'DIFFERENT'}: {prompt!r} ({len(ids)} prompt tokens"
                  f"{'' if same_ids else ', tokenized differently'})")
            print(f"  llama.cpp ({llama_usage.get('completion_tokens')} tokens): {llama_text!r}")
            print(f"  nano-vLLM ({ours_usage.get('completion_tokens')} tokens): {ours_text!r}")
    print(f"tokens: {len(PROMPTS) - failures}/{len(PROMPTS)} prompts give the same greedy "
          f"completion (up to {n} tokens)")
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("weights")
    w.add_argument("f32")
    w.add_argument("q4_1")
    t = sub.add_parser("tokens")
    t.add_argument("--llama", required=True, help="llama-server base URL")
    t.add_argument("--ours", required=True, help="nano-vLLM server base URL")
    t.add_argument("--model-dir", required=True, help="our Hugging Face folder (tokenizer)")
    t.add_argument("--max-tokens", type=int, default=30)
    args = p.parse_args()
    if args.cmd == "weights":
        return check_weights(args.f32, args.q4_1)
    return check_tokens(args.llama, args.ours, args.model_dir, args.max_tokens)


if __name__ == "__main__":
    sys.exit(main())
