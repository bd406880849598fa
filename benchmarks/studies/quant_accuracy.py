"""How close the quantized weights come to the fp32 model: logits, greedy tokens, perplexity.

For each prompt the fp32 model writes a greedy continuation; each quantized model then reads
prompt + continuation once (teacher forcing) and is scored on
- the largest and the mean |logit difference| to fp32 over all positions;
- greedy agreement: at how many continuation positions its top token is fp32's, and how many
  tokens it would write identically before its first different one (the prefixes agree up to
  there, so that is exactly where its own greedy text would part from fp32's);
- perplexity on benchmarks/data/eval_text.txt, a short English text shipped with the project.

Usage: `python3 -m benchmarks.studies.quant_accuracy [--weights q4_1 int8] [--model DIR]`
(q4_1 exists for the default model only).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from model.llama import LlamaModel, causal_attention
from model.loader import load_model
from model.prepare import resolve_model_dir

EVAL_TEXT = Path(__file__).resolve().parents[1] / "data" / "eval_text.txt"
PROMPTS = [
    "The cat sat on the",
    "Paris is the capital of",
    "In 1969, Neil Armstrong became the first person to walk on the moon. Later in his life, he",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Write a short poem about the sea.",
    "The three primary colours are",
    "To make a cup of tea, first",
    "Water boils at a temperature of",
]


def logits_of(model: LlamaModel, ids: list[int]) -> Tensor:
    """[len(ids), vocab] logits of one whole sequence."""
    x = torch.tensor([ids])
    return model(x, torch.arange(len(ids))[None], causal_attention)[0]


def greedy(model: LlamaModel, ids: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation, recomputing the whole sequence per token: slow but plainly right."""
    out = list(ids)
    for _ in range(new_tokens):
        out.append(int(logits_of(model, out)[-1].argmax()))
    return out[len(ids):]


def perplexity(model: LlamaModel, ids: list[int]) -> float:
    logits = logits_of(model, ids)
    return math.exp(F.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item())


def loaders() -> dict[str, Callable[[Path], LlamaModel]]:
    from model.loader import load_int8_model, load_q4_1_model

    return {"q4_1": load_q4_1_model, "int8": load_int8_model}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", default=["q4_1", "int8"], choices=["q4_1", "int8"])
    parser.add_argument("--model", default=None, help="a Hugging Face folder (default: SmolLM2)")
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    from transformers import AutoTokenizer

    model_dir = resolve_model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fp32 = load_model(model_dir)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    continuations = [greedy(fp32, ids, args.new_tokens) for ids in prompts]
    sequences = [ids + cont for ids, cont in zip(prompts, continuations)]
    reference = [logits_of(fp32, seq) for seq in sequences]
    text_ids = tokenizer(EVAL_TEXT.read_text()).input_ids
    print(f"{model_dir.name}: {len(PROMPTS)} prompts, {args.new_tokens} greedy tokens each; "
          f"perplexity text {len(text_ids)} tokens")
    print(f"{'weights':<8} {'max |dlogit|':>12} {'mean |dlogit|':>13} {'top-1 agree':>11} "
          f"{'same before 1st diff':>20} {'perplexity':>10}")
    print(f"{'fp32':<8} {'-':>12} {'-':>13} {'-':>11} {'-':>20} "
          f"{perplexity(fp32, text_ids):>10.3f}")
    for name in args.weights:
        model = loaders()[name](model_dir)
        max_diff, mean_diffs, agree, total, same_prefix = 0.0, [], 0, 0, []
        for ids, seq, ref in zip(prompts, sequences, reference):
            logits = logits_of(model, seq)
            diff = (logits - ref).abs()
            max_diff = max(max_diff, diff.max().item())
            mean_diffs.append(diff.mean().item())
            # Position p predicts token p + 1: the continuation's tokens are predicted from
            # len(ids) - 1 on.
            ours = logits[len(ids) - 1:-1].argmax(-1)
            theirs = torch.tensor(seq[len(ids):])
            matches = (ours == theirs).tolist()
            agree += sum(matches)
            total += len(matches)
            same_prefix.append(matches.index(False) if False in matches else len(matches))
        print(f"{name:<8} {max_diff:>12.2e} {sum(mean_diffs) / len(mean_diffs):>13.2e} "
              f"{agree / total:>10.1%} {sum(same_prefix) / len(same_prefix):>11.1f} "
              f"of {args.new_tokens:<5} {perplexity(model, text_ids):>10.3f}")


if __name__ == "__main__":
    main()
