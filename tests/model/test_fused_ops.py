"""The compiled fused ops against the PyTorch ops they replace, in fp32 and bf16, for a
small input (one thread) and a large one (split over threads); and a row's result does not
depend on how many rows came with it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.kernels.build import load_fused_ops
from model.layers import RotaryEmbedding

ops = load_fused_ops()
pytestmark = pytest.mark.skipif(ops is None, reason="no C++ toolchain to build the fused ops")

CASES = [(torch.float32, 3, 1e-6), (torch.float32, 200, 1e-6),
         (torch.bfloat16, 3, 2**-7), (torch.bfloat16, 200, 2**-7)]


def rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.mark.parametrize(("dtype", "rows", "rtol"), CASES)
def test_add_rms_norm(dtype, rows, rtol):
    torch.manual_seed(0)
    residual, delta = torch.randn(rows, 576, dtype=dtype), torch.randn(rows, 576, dtype=dtype)
    weight = torch.rand(576, dtype=dtype) + 0.5
    expected_stream = (residual.float() + delta.float()).to(dtype)
    expected = F.rms_norm(expected_stream.float(), (576,), weight.float(), 1e-5)
    stream = residual.clone()
    out = ops.add_rms_norm(stream, delta, weight, 1e-5)
    print(f"{dtype} x {rows}: stream {rel(stream, expected_stream):.1e}, "
          f"norm {rel(out, expected):.1e}")
    assert rel(stream, expected_stream) <= rtol and rel(out, expected) <= rtol
    plain = ops.add_rms_norm(residual, residual[:0], weight, 1e-5)  # no add: norm only
    assert rel(plain, F.rms_norm(residual.float(), (576,), weight.float(), 1e-5)) <= rtol


@pytest.mark.parametrize(("dtype", "rows", "rtol"), CASES)
def test_rope_in_place_inside_the_qkv_output(dtype, rows, rtol):
    torch.manual_seed(1)
    rope = RotaryEmbedding(64, 100_000.0, 4096).to(dtype)
    positions = torch.randint(0, 4096, (rows,))
    cos, sin = rope.table(positions)
    qkv = torch.randn(rows, 15 * 64, dtype=dtype)
    qk = qkv[:, :12 * 64]  # a strided view, as in the model
    expected = RotaryEmbedding.apply(qk.float().unflatten(-1, (12, 64)), cos.float(), sin.float())
    untouched = qkv[:, 12 * 64:].clone()
    ops.rope_inplace(qk, 12, cos.reshape(rows, 64), sin.reshape(rows, 64))
    print(f"{dtype} x {rows}: rope rel diff {rel(qk.unflatten(-1, (12, 64)), expected):.1e}")
    assert rel(qk.unflatten(-1, (12, 64)), expected) <= rtol
    assert torch.equal(qkv[:, 12 * 64:], untouched)  # V is not touched


@pytest.mark.parametrize(("dtype", "rows", "rtol"), CASES)
def test_silu_mul(dtype, rows, rtol):
    torch.manual_seed(2)
    gate_up = torch.randn(rows, 2 * 1536, dtype=dtype) * 4
    gate, up = gate_up.float().chunk(2, dim=-1)
    out = ops.silu_mul(gate_up)
    print(f"{dtype} x {rows}: silu_mul rel diff {rel(out, F.silu(gate) * up):.1e}")
    assert out.shape == (rows, 1536) and rel(out, F.silu(gate) * up) <= rtol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_split_over_threads_equal_each_row_alone(dtype):
    """30 rows (a decode step of 30 users) are split over threads; one row never is. Each
    row's bits are the same either way."""
    torch.manual_seed(3)
    rows = 30
    residual, delta = torch.randn(rows, 576, dtype=dtype), torch.randn(rows, 576, dtype=dtype)
    weight = torch.rand(576, dtype=dtype) + 0.5
    gate_up = torch.randn(rows, 2 * 1536, dtype=dtype) * 4
    rope = RotaryEmbedding(64, 100_000.0, 4096).to(dtype)
    cos, sin = (t.reshape(rows, 64) for t in rope.table(torch.randint(0, 4096, (rows,))))
    qkv = torch.randn(rows, 15 * 64, dtype=dtype)
    stream, together = residual.clone(), qkv.clone()
    normed = ops.add_rms_norm(stream, delta, weight, 1e-5)
    activated = ops.silu_mul(gate_up)
    ops.rope_inplace(together[:, :12 * 64], 12, cos, sin)
    for r in range(rows):
        alone_stream, alone_qkv = residual[r:r + 1].clone(), qkv[r:r + 1].clone()
        assert torch.equal(ops.add_rms_norm(alone_stream, delta[r:r + 1], weight, 1e-5),
                           normed[r:r + 1])
        assert torch.equal(alone_stream, stream[r:r + 1])
        assert torch.equal(ops.silu_mul(gate_up[r:r + 1]), activated[r:r + 1])
        ops.rope_inplace(alone_qkv[:, :12 * 64], 12, cos[r:r + 1], sin[r:r + 1])
        assert torch.equal(alone_qkv, together[r:r + 1])
