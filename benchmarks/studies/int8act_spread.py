"""How much of `--activations int8`'s measured error is chance: the same scores, re-drawn.

Which near-ties the 8-bit rounding of the activations breaks depends on the last bits of
each input, so one measurement of the mode's error (tests/model/test_q4_1_int8act.py) is one
draw. This scores the mode against the exact q4_1 path on the test's sequences (all of
benchmarks/data/eval_text.txt and the prompts, 584 positions), first as it is, then with
every int8 matmul's input multiplied by (1 + 1e-6 * noise) for each seed: pooled mean KL,
top-1 agreement and perplexity on the eval text for each.

Usage: `python3 -m benchmarks.studies.int8act_spread [--seeds 6]`.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.studies.quant_accuracy import EVAL_TEXT, PROMPTS, logits_of
from model.loader import load_q4_1_model
from model.prepare import prepare_default_model
from model.weights.quantized import QuantizedLinear

TEST_PROMPTS = PROMPTS[:4]  # tests/conftest.py's, scored once more by the test


def scores(reference: list[Tensor], ours: list[Tensor], text: list[int]) -> tuple[float, ...]:
    """(pooled mean KL(reference || ours), top-1 agreement, perplexity on the eval text)."""
    kl = torch.cat([F.kl_div(o.log_softmax(-1), r.log_softmax(-1), log_target=True,
                             reduction="none").sum(-1) for r, o in zip(reference, ours)])
    top1 = torch.cat([(r.argmax(-1) == o.argmax(-1)).float() for r, o in zip(reference, ours)])
    ppl = math.exp(F.cross_entropy(ours[0][:-1], torch.tensor(text[1:])).item())
    return kl.mean().item(), top1.mean().item(), ppl


def perturb_inputs(model: torch.nn.Module, seed: int) -> None:
    """Every int8-activation matmul multiplies its input by (1 + 1e-6 * N(0, 1)) first."""
    g = torch.Generator().manual_seed(seed)
    for layer in model.modules():
        if isinstance(layer, QuantizedLinear) and layer.activations == "int8":
            exact = layer.forward

            def forward(x: Tensor, exact=exact) -> Tensor:
                return exact(x * (1 + 1e-6 * torch.randn(x.shape, generator=g)))

            layer.forward = forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model_dir = prepare_default_model()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sequences = [tokenizer(EVAL_TEXT.read_text()).input_ids] + [
        tokenizer(p).input_ids for p in TEST_PROMPTS + PROMPTS]
    exact = load_q4_1_model(model_dir)
    reference = [logits_of(exact, ids) for ids in sequences]
    _, _, exact_ppl = scores(reference, reference, sequences[0])
    print(f"{sum(map(len, sequences))} positions; q4_1 perplexity {exact_ppl:.3f}")
    for seed in [None, *range(args.seeds)]:
        model = load_q4_1_model(model_dir, activations="int8")
        if seed is not None:
            perturb_inputs(model, seed)
        kl, top1, ppl = scores(reference, [logits_of(model, ids) for ids in sequences],
                               sequences[0])
        label = "as is" if seed is None else f"seed {seed}"
        print(f"{label:8s} mean KL {kl:.5f}  top-1 {top1:.4f}  perplexity {ppl:.3f} "
              f"({100 * (ppl / exact_ppl - 1):+.1f}%)")


if __name__ == "__main__":
    main()
