"""A GGUF file's codes in our kernels' forms (model/gguf/codes.py): the same weights as the
gguf package's dequantization, bit for bit, and the kernels on them against those weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.gguf.codes import KERNEL_TYPES, RAW_BYTES, WEIGHTS_PER_BLOCK, block_tensor, fuse
from model.weights.quantized import QuantizedLinear
from tests.model.test_q4_1 import check_against_reference, kernel_or_skip

torch.set_grad_enabled(False)


def random_raw(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random blocks (any bytes are valid codes and sub-scales) under fp16 scales of the
    real weights' size, or for F16 and BF16 random weights: uint8 [rows, bytes a row]."""
    rng = np.random.default_rng(seed)
    if kind in ("F16", "BF16"):
        values = rng.normal(0.0, 0.05, (rows, cols)).astype(np.float32)
        if kind == "F16":
            return values.astype(np.float16).view(np.uint8).reshape(rows, -1)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows, cols // WEIGHTS_PER_BLOCK[kind], RAW_BYTES[kind]),
                       dtype=np.uint8)

    def halves(low: float, high: float) -> np.ndarray:
        values = rng.uniform(low, high, raw.shape[:2]).astype(np.float16)
        return values.view(np.uint8).reshape(*raw.shape[:2], 2)

    if kind in ("Q4_K", "Q5_K"):  # d, dmin: with 6-bit sub-scales and mins, |w| < 0.6
        raw[..., 0:2], raw[..., 2:4] = halves(1e-4, 3e-4), halves(1e-4, 3e-4)
    elif kind == "Q6_K":  # d, after the codes and the int8 sub-scales
        raw[..., 208:210] = halves(2e-5, 7e-5)
    else:
        raw[..., 0:2] = halves(1e-3, 2e-2)
        if kind in ("Q4_1", "Q5_1"):
            raw[..., 2:4] = halves(-0.1, 0.0)
    return raw.reshape(rows, -1)


def gguf_reference(kind: str, raw: np.ndarray, rows: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    values = quants.dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32)
    return torch.from_numpy(values).reshape(rows, -1)


@pytest.mark.parametrize("kind", KERNEL_TYPES)
def test_kernel_forms_hold_the_gguf_weights_bit_for_bit(kind):
    raw = random_raw(kind, 48, 512, seed=1)
    weight = block_tensor(kind, torch.from_numpy(raw))
    assert torch.equal(weight.dequantize(), gguf_reference(kind, raw, 48))


@pytest.mark.parametrize("kind", [k for k in KERNEL_TYPES if k not in ("Q4_1", "Q8_0")])
@pytest.mark.parametrize("shape", [(640, 1024), (40, 512)])
def test_kernels_match_the_dequantized_weights(kind, shape, quantized_path):
    """40 rows: a padded last group of 16."""
    kernel_or_skip()
    weight = block_tensor(kind, torch.from_numpy(random_raw(kind, *shape, seed=shape[0])))
    check_against_reference(weight, f"{kind} {shape}")


def test_a_wrong_sub_scale_is_seen():
    """The forms' sub-scales matter: one Q4_K sub-scale changed (byte 4 of the first
    super-block holds sub-block 0's) moves the weights the kernel multiplies by."""
    kernel_or_skip()
    raw = random_raw("Q4_K", 16, 256, seed=2)
    changed = raw.copy()
    changed[:, 4] ^= 1
    x = torch.randn(1, 256)
    layers = [QuantizedLinear(block_tensor("Q4_K", torch.from_numpy(r))) for r in (raw, changed)]
    reference = x @ gguf_reference("Q4_K", raw, 16).T
    assert torch.allclose(layers[0](x), reference, atol=1e-5)
    assert not torch.allclose(layers[1](x), reference, atol=1e-3)


def test_fused_parts_share_a_form_or_stay_apart():
    parts = {kind: block_tensor(kind, torch.from_numpy(random_raw(kind, 32, 256, seed=3)))
             for kind in KERNEL_TYPES}
    same = fuse([parts["Q5_0"], parts["Q5_0"]])
    assert same is not None and same.kind == "Q5_0" and same.rows == 64
    assert torch.equal(same.dequantize(), torch.cat([parts["Q5_0"].dequantize()] * 2))
    assert fuse([parts["Q4_0"], parts["Q4_1"]]).kind == "Q4_1"  # Q4_0 takes Q4_1's form
    for kinds in (("Q5_0", "Q5_0", "Q8_0"), ("Q4_K", "Q6_K"), ("Q4_K", "F16")):
        assert fuse([parts[k] for k in kinds]) is None, kinds
