"""The compiled argmax over logits rows (model/kernels/csrc/argmax_cpu.cpp) gives NumPy's answer:
the first of equal maxima, a NaN as the largest, the two zeros equal, in fp32 and bf16, on
rows that are views; and the sampler's greedy rows take it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sampler import argmax_rows
from model.kernels.build import load_cpu_kernels

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C++ toolchain to build the kernels")
DTYPES = [torch.float32, torch.bfloat16]


def numpy_argmax(logits: torch.Tensor) -> list[int]:
    return logits.float().numpy().argmax(axis=-1).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "vocab"), [(30, 49152), (3, 7), (5, 65), (1, 1), (2, 129)])
def test_random_rows_match_numpy(dtype, rows, vocab):
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 8)
    logits = logits.to(dtype)
    ours = kernels.argmax_rows(logits)
    assert ours.dtype == torch.int64 and ours.shape == (rows,)
    assert ours.tolist() == numpy_argmax(logits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_nan_zeros_and_masks(dtype):
    inf, nan = float("inf"), float("nan")
    vocab = 1200                                # the kernel scans spans of 512
    rows = torch.full((7, vocab), -5.0)
    rows[0, [5, 600, 1100]] = 3.0               # equal maxima in several spans: the first
    rows[1, [700, 1150]] = 3.0
    rows[2, :] = -inf                           # everything masked: index 0, as NumPy
    rows[3, :] = -inf
    rows[3, 1199] = -1e30                        # one finite value among masked ones
    rows[4, [7, 9]] = nan                       # a NaN beats any number, the first NaN wins
    rows[4, 3] = inf
    rows[5, 40] = -0.0                          # -0 and +0 are equal: the first of them
    rows[5, 41] = 0.0
    rows[6, :] = -torch.arange(1, vocab + 1, dtype=torch.float32)  # all negative: the least
    logits = rows.to(dtype)
    ours = kernels.argmax_rows(logits).tolist()
    print(dtype, ours)
    assert ours == numpy_argmax(logits) == [5, 700, 0, 1199, 7, 40, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_are_views(dtype):
    wide = torch.randn(6, 500, generator=torch.Generator().manual_seed(1)).to(dtype)
    view = wide[::2, 10:410]  # rows 1000 values apart, each contiguous
    assert kernels.argmax_rows(view).tolist() == numpy_argmax(view)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        kernels.argmax_rows(wide.t())
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernels.argmax_rows(wide.to(torch.float16))


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16])
def test_the_samplers_greedy_rows(dtype):
    logits = torch.randn(30, 1000, generator=torch.Generator().manual_seed(2)).to(dtype)
    assert argmax_rows(logits) == numpy_argmax(logits)
    assert argmax_rows(logits.t().contiguous().t()) == numpy_argmax(logits)  # columns: NumPy
    assert np.array_equal(argmax_rows(logits[:0]), [])
