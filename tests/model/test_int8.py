"""`--weights int8`: per-output-channel int8 codes, and the model's accuracy against fp32."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.studies.quant_accuracy import EVAL_TEXT
from model.llama import LlamaModel, causal_attention
from model.loader import load_int8_model, load_model
from model.weights.int8 import int8_per_channel, quantize_model_int8
from model.weights.quantized import QuantizedKernelUnavailable, quantized_kernels
from tests.conftest import PROMPTS

torch.set_grad_enabled(False)


@pytest.fixture(scope="module")
def int8_model(model_dir) -> LlamaModel:
    try:
        quantized_kernels()
    except QuantizedKernelUnavailable as exc:
        pytest.skip(str(exc))
    return load_int8_model(model_dir)


def test_codes_round_to_the_nearest_step_of_their_row():
    torch.manual_seed(0)
    w = torch.randn(40, 96) * torch.logspace(-3, 0, 40).unsqueeze(1)  # rows of very different size
    w[7] = 0.0  # an all-zero row must stay zero, not divide by zero
    blocks = int8_per_channel(w)
    d = blocks.scales()[:, :1]  # one scale per row, repeated in every block
    assert torch.equal(blocks.scales(), d.expand(-1, 3))
    err = (blocks.dequantize() - w).abs()
    print(f"worst error / row step: {(err / d.clamp_min(1e-30)).max().item():.3f}")
    assert (err <= d / 2 * (1 + 1e-6)).all()
    assert blocks.codes().abs().max().item() <= 127
    assert torch.equal(blocks.dequantize()[7], torch.zeros(96))


def test_int8_model_stays_close_to_fp32(int8_model, model, tokenizer):
    """Measured here: logits within ~2.4 of fp32 (q4_1: 1e-4), and on the shipped text a
    perplexity 0.2% above fp32's. The bounds leave room for other prompts, not for a bug
    (a wrong scale or a transposed weight costs logit errors of 10-40 and a perplexity
    in the hundreds)."""
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        positions = torch.arange(ids.shape[1])[None]
        ours = int8_model(ids, positions, causal_attention)[0, -1]
        fp32 = model(ids, positions, causal_attention)[0, -1]
        diff = (ours - fp32).abs().max().item()
        print(f"{prompt[:30]!r}: int8 logits max |diff| vs fp32 {diff:.2f}, next token "
              f"{tokenizer.decode(ours.argmax())!r} vs {tokenizer.decode(fp32.argmax())!r}")
        assert diff < 5.0
        assert ours.argmax() == fp32.argmax()
    ids = tokenizer(EVAL_TEXT.read_text()).input_ids
    x, positions, targets = torch.tensor([ids]), torch.arange(len(ids))[None], torch.tensor(ids)
    ppl = {name: math.exp(F.cross_entropy(m(x, positions, causal_attention)[0, :-1],
                                          targets[1:]).item())
           for name, m in (("int8", int8_model), ("fp32", model))}
    print(f"perplexity on {len(ids)} tokens: int8 {ppl['int8']:.3f}, fp32 {ppl['fp32']:.3f}")
    assert ppl["int8"] < 1.01 * ppl["fp32"]


def test_int8_needs_a_float32_cpu_model(model_dir):
    with pytest.raises(ValueError, match="float32"):
        quantize_model_int8(load_model(model_dir, dtype=torch.bfloat16))
