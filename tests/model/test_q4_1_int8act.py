"""`--weights q4_1 --activations int8`: the Q4_1 codes times int8 activations (the VNNI
kernel, or its AVX2 copy; on CPUs with VNNI both are checked, `quantized_path`).

The kernel's integer math is checked exactly; the mode's error is then measured like bf16's
(tests/model/test_bf16.py): distributions, pooled over every position of
benchmarks/data/eval_text.txt (451 tokens) and the test prompts (584 positions in all).

Measured (AMD EPYC Zen 5) against the exact q4_1 path (which is the fp32 model up to fp32
rounding, so the figures against fp32 are the same), the Q8_0 LM head on int8 activations
too: mean KL 0.0030 nats per position, the same top token at 96.4% of positions, perplexity on
the eval text 22.37 against 22.29 (+0.4%). Which ties the 8-bit rounding breaks is chance:
perturbing every int8 matmul's input by 1e-6 (relative) gave, over 6 runs, KL 0.0029-0.0032,
top-1 96.2-97.1%, perplexity -0.3% to +0.8% (`python3 -m benchmarks.studies.int8act_spread`).
Hence the bounds: KL < 0.005 and top-1 >= 95%, perplexity < 1.015 x q4_1's. Rounding the
layers' activations toward zero instead of to nearest (a plausible bug) gives KL 0.0105 and
top-1 93.3%, and fails both; a kernel without the min term fails by orders of magnitude (both
checked below).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.studies.quant_accuracy import EVAL_TEXT
from benchmarks.studies.quant_accuracy import PROMPTS as MORE_PROMPTS
from engine.config import EngineConfig
from model.kernels.build import load_cpu_kernels
from model.kernels.cpu import cpu_has_vnni
from model.llama import LlamaModel, causal_attention
from model.loader import load_q4_1_model
from model.weights import quantized
from model.weights.blocks import BlockTensor
from model.weights.quantized import QuantizedKernelUnavailable, QuantizedLinear
from tests.conftest import PROMPTS
from tests.model.conftest import quantized_paths
from tests.model.test_q4_1 import random_blocks

torch.set_grad_enabled(False)
KL_TOLERANCE = 0.005  # nats per position, pooled mean
TOP1_AGREEMENT = 0.95
PERPLEXITY_RATIO = 1.015
ROWS = [1, 3, 8, 30, 33, 64]


def kernel_or_skip() -> None:
    try:
        quantized.int8_activation_kernels()
    except QuantizedKernelUnavailable as exc:
        pytest.skip(str(exc))


def reference_codes(x: Tensor, rounding=torch.round) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (codes [M, K / 32, 32], scales [M, K / 32]), as the kernel computes them:
    dx = max|x| / 127, xq = round(x * (1 / dx)), all in fp32 (zeros below 1e-30)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    peak = blocks.abs().amax(-1)
    dx = torch.where(peak >= 1e-30, peak / 127, 0)
    inverse = torch.where(dx > 0, 1 / dx, 0)
    return rounding(blocks * inverse[..., None]).clamp(-127, 127), dx


def reference_linear(codes: Tensor, dx: Tensor, weight: BlockTensor) -> Tensor:
    """sum_blocks dx (d dot(q, xq) + m sum(xq)) in float64 (m = 0 for Q8_0): the integers
    are exact."""
    dot = torch.einsum("nbk,mbk->mnb", weight.codes().double(), codes.double())
    d = weight.scales().double()
    m = weight.minimums().double() if weight.kind == "Q4_1" else torch.zeros_like(d)
    return (dx.double()[:, None] * (d * dot + m * codes.double().sum(-1)[:, None])).sum(-1)


def test_activation_codes_match_the_reference_bit_for_bit(quantized_path):
    kernel_or_skip()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 256, generator=g) * torch.logspace(-3, 2, 9)[:, None]
    x[0, :32] = 0.0  # an all-zero block: scale 0, codes 0
    x[1, :32] = 1e-33  # below fp32's comfort: zeros too
    x[2, :32] = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5] + [0.0] * 26)  # ties: to even
    codes, scale, scaled_sum = load_cpu_kernels().quantize_rows_int8(x)
    ref_codes, ref_dx = reference_codes(x)
    print("tie codes:", codes[2, :6].tolist(), "scales of row 3:", scale[3, :4].tolist())
    assert torch.equal(codes.reshape(ref_codes.shape).float(), ref_codes)
    assert torch.equal(scale, ref_dx)
    assert torch.equal(scaled_sum, ref_dx * ref_codes.sum(-1))
    assert codes[2, :6].tolist() == [127, 0, 2, 2, 0, -2]


def exact_case(rows: int, cols: int, batch: int, seed: int,
               kind: str = "Q4_1") -> tuple[BlockTensor, Tensor]:
    """Scales of powers of two and x of small integers times them: every product and every
    partial sum is exact in fp32 (all below 2^24 units), so any summation order agrees.
    Q8_0's codes span all of -128..127 (random_blocks draws every byte)."""
    g = torch.Generator().manual_seed(seed)
    weight = random_blocks(kind, rows, cols, seed)
    halves = torch.empty(rows, cols // 32, 2, dtype=torch.float16)
    halves[..., 0] = (torch.randint(0, 2, (rows, cols // 32), generator=g) * 2 - 1) * 2.0**-6
    halves[..., 1] = torch.randint(-15, 16, (rows, cols // 32), generator=g) * 2.0**-6
    width = 4 if kind == "Q4_1" else 2  # Q8_0: d only
    weight.blocks[..., :width] = halves.view(torch.uint8).reshape(rows, cols // 32, 4)[
        ..., :width]
    ints = torch.randint(-127, 128, (batch, cols // 32, 32), generator=g).float()
    ints[..., 0] = 127.0  # each block's peak: dx = 2^-c exactly
    scale = 2.0 ** -torch.randint(0, 5, (batch, 1, 1), generator=g).float()
    return weight, (ints * scale).reshape(batch, cols)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(1000, 1536), (40, 64), (576, 576)])
def test_kernel_equals_the_integer_math_exactly_where_fp32_is_exact(shape, kind,
                                                                    quantized_path):
    """1000 and 40 rows are not multiples of 16 or 32: the padded group and a lone group."""
    kernel_or_skip()
    for batch in ROWS:
        weight, x = exact_case(*shape, batch, seed=batch, kind=kind)
        codes, dx = reference_codes(x)
        ours = QuantizedLinear(weight, "int8")(x).double()
        truth = reference_linear(codes, dx, weight)
        print(f"{shape} x {batch:2d} rows: max |diff| {(ours - truth).abs().max().item()}")
        assert torch.equal(ours, truth)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(960, 576), (1000, 1536)])
def test_kernel_matches_the_integer_math_on_random_inputs(shape, kind, quantized_path):
    """Real-size random scales: only fp32's rounding of the scaled sums may differ."""
    kernel_or_skip()
    weight = random_blocks(kind, *shape, seed=shape[0])
    layer, g = QuantizedLinear(weight, "int8"), torch.Generator().manual_seed(1)
    for batch in ROWS:
        x = torch.randn(batch, shape[1], generator=g)
        truth = reference_linear(*reference_codes(x), weight)
        error = ((layer(x).double() - truth).abs().max() / truth.abs().max()).item()
        print(f"{shape} x {batch:2d} rows: relative error {error:.1e}")
        assert error < 2e-6


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_avx2_copy_gives_the_vnni_copys_results_bit_for_bit(kind):
    """Same codes, same integer sums, same fp32 operations in the same order: the two copies
    must agree exactly, on real-size random scales too."""
    kernel_or_skip()
    if not cpu_has_vnni() or quantized_paths()[-1] == "native":
        pytest.skip("this CPU runs the AVX2 copy natively (no AVX-512 with VNNI beside it)")
    kernels = load_cpu_kernels()
    weight, g = random_blocks(kind, 1000, 1536, seed=7), torch.Generator().manual_seed(2)
    layer = QuantizedLinear(weight, "int8")
    for batch in ROWS:
        x = torch.randn(batch, 1536, generator=g) * 3
        vnni, vnni_codes = layer(x), kernels.quantize_rows_int8(x)
        kernels.tuning.set_quantized_avx2(True)
        try:
            avx2, avx2_codes = layer(x), kernels.quantize_rows_int8(x)
        finally:
            kernels.tuning.set_quantized_avx2(False)
        assert torch.equal(avx2, vnni)
        assert all(torch.equal(a, b) for a, b in zip(avx2_codes, vnni_codes, strict=True))


class FakeQuantizedLinear(torch.nn.Module):
    """A deliberately broken variant: x rounded toward zero to int8 per block (instead of to
    nearest), then the exact Q4_1 kernel, which is the same sum as the int8 kernel's."""

    def __init__(self, exact: QuantizedLinear) -> None:
        super().__init__()
        self.exact = exact

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        codes, dx = reference_codes(flat, rounding=torch.trunc)
        return self.exact((codes * dx[..., None]).reshape(x.shape))


@pytest.fixture(scope="module")
def models(model_dir) -> dict[str, LlamaModel]:
    kernel_or_skip()
    return {"q4_1": load_q4_1_model(model_dir),
            "int8act": load_q4_1_model(model_dir, activations="int8")}


@pytest.fixture(scope="module")
def sequences(tokenizer) -> list[list[int]]:
    return [tokenizer(EVAL_TEXT.read_text()).input_ids] + [
        tokenizer(p).input_ids for p in PROMPTS + MORE_PROMPTS]


def logits(model: LlamaModel, ids: list[int]) -> Tensor:
    return model(torch.tensor([ids]), torch.arange(len(ids))[None], causal_attention)[0]


def scores(reference: list[Tensor], model: LlamaModel, sequences) -> tuple[float, float, float]:
    """(pooled mean KL(reference || model), top-1 agreement, perplexity on the eval text)."""
    ours = [logits(model, ids) for ids in sequences]
    kl = torch.cat([F.kl_div(o.log_softmax(-1), r.log_softmax(-1), log_target=True,
                             reduction="none").sum(-1) for r, o in zip(reference, ours)])
    top1 = torch.cat([(r.argmax(-1) == o.argmax(-1)).float() for r, o in zip(reference, ours)])
    text = sequences[0]
    ppl = math.exp(F.cross_entropy(ours[0][:-1], torch.tensor(text[1:])).item())
    return kl.mean().item(), top1.mean().item(), ppl


def test_int8_activations_within_their_tolerance(models, model, sequences):
    q4_1 = [logits(models["q4_1"], ids) for ids in sequences]
    _, _, exact_ppl = scores(q4_1, models["q4_1"], sequences)
    for name, reference in (("q4_1", q4_1), ("fp32", [logits(model, ids) for ids in sequences])):
        kl, top1, ppl = scores(reference, models["int8act"], sequences)
        print(f"int8act vs {name} over {sum(map(len, sequences))} positions: mean KL {kl:.5f} "
              f"(tolerance {KL_TOLERANCE}), top-1 {top1:.4f}; perplexity {ppl:.3f} "
              f"(q4_1 {exact_ppl:.3f})")
        assert kl < KL_TOLERANCE
        assert top1 >= TOP1_AGREEMENT
        assert ppl < PERPLEXITY_RATIO * exact_ppl


def int8act_layers(model: LlamaModel) -> list[QuantizedLinear]:
    """The Q4_1 layers on the int8 kernel (the Q8_0 LM head has no min term)."""
    return [m for m in model.modules() if isinstance(m, QuantizedLinear)
            and m.activations == "int8" and m.kind == "Q4_1"]


def test_broken_variants_fail_the_tolerance(models, model_dir, sequences):
    q4_1 = [logits(models["q4_1"], ids) for ids in sequences]
    truncating = load_q4_1_model(model_dir)
    for layer in truncating.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj, attn.o_proj = (FakeQuantizedLinear(attn.qkv_proj),
                                      FakeQuantizedLinear(attn.o_proj))
        mlp.gate_up_proj, mlp.down_proj = (FakeQuantizedLinear(mlp.gate_up_proj),
                                           FakeQuantizedLinear(mlp.down_proj))
    kl, top1, ppl = scores(q4_1, truncating, sequences)
    print(f"rounding toward zero: mean KL {kl:.5f}, top-1 {top1:.4f}, perplexity {ppl:.3f}")
    assert kl > KL_TOLERANCE and top1 < TOP1_AGREEMENT

    layers = int8act_layers(models["int8act"])
    minimums = [layer.packed[..., 32:64].clone() for layer in layers]
    try:
        for layer in layers:  # the kernel then computes exactly what one without m would
            layer.packed[..., 32:64] = 0
        kl, top1, ppl = scores(q4_1, models["int8act"], sequences)
    finally:
        for layer, saved in zip(layers, minimums):
            layer.packed[..., 32:64] = saved
    print(f"min term dropped: mean KL {kl:.3f}, top-1 {top1:.4f}, perplexity {ppl:.3g}")
    assert kl > KL_TOLERANCE


def test_cpu_without_vnni_or_avx2_gets_a_clear_error(monkeypatch, model_dir, capsys):
    monkeypatch.setattr(quantized, "cpu_has_vnni", lambda: False)
    monkeypatch.setattr(quantized, "cpu_supports_avx2_quantized", lambda: False)
    monkeypatch.setattr(quantized, "quantized_kernels", lambda: {})
    with pytest.raises(QuantizedKernelUnavailable, match="AVX512-VNNI") as err:
        load_q4_1_model(model_dir, activations="int8")
    print("neither VNNI nor AVX2:", err.value)
    import server

    # In-process: the patched CPU check does not reach a core process.
    args = server.build_parser(None).parse_args(["--weights", "q4_1", "--activations", "int8",
                                                 "--no-engine-process"])
    assert server.run_server(None, args=args) == 1
    assert "AVX512-VNNI" in capsys.readouterr().err


def test_int8_activations_need_q4_1_weights():
    """Refused with dense weights: at the flags where they are asked for, at load where the
    default resolves to them (a folder)."""
    from model.loader import weight_format

    for weights in ("dense", "int8"):
        with pytest.raises(ValueError, match="--weights gguf"):
            EngineConfig(weights=weights, activations="int8").validate()
    with pytest.raises(ValueError, match="drop --activations"):
        weight_format("dense", activations="int8")
    with pytest.raises(ValueError, match="activations"):
        QuantizedLinear(random_blocks("Q8_0", 16, 32, 0), "int4")
    EngineConfig(weights="q4_1", activations="int8").validate()
