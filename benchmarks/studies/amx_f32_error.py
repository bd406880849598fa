"""The fp32 product on AMX (three bf16 pieces per value, dense_linear_amx_f32.cpp) against
the FMA path: the error of each against a float64 product of the same inputs, relative to
sum |x w| per output, at the model's shapes and a few odd ones, 100 rows.

    python3 benchmarks/studies/amx_f32_error.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from model.dense_linear import PackedLinear, load_dense_linear

SHAPES = [(576, 960), (1536, 576), (576, 49152), (576, 1536), (41, 33), (7, 5), (31, 40)]


def errors(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    ref, scale = x.double() @ w.double(), x.double().abs() @ w.double().abs()
    err = (y.double() - ref).abs() / scale
    return err.max().item(), err.mean().item()


def main() -> None:
    torch.set_grad_enabled(False)
    kernels = load_dense_linear()
    if kernels is None or not kernels.dense_amx_usable():
        sys.exit("needs the CPU kernels and AMX")
    print("| K | N | FMA max | FMA mean | AMX max | AMX mean |\n|---|---|---|---|---|---|")
    for k, n in SHAPES:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(100, k, generator=gen)
        w = torch.randn(k, n, generator=gen) * k**-0.5
        layer = PackedLinear(w)
        kernels.set_dense_amx_f32(0, 64, False)
        fma = errors(layer(x), x, w)
        kernels.set_dense_amx_f32(1, 64, False)
        amx = errors(layer(x), x, w)
        kernels.set_dense_amx_f32(0, 64, False)
        print(f"| {k} | {n} | {fma[0]:.1e} | {fma[1]:.1e} | {amx[0]:.1e} | {amx[1]:.1e} |")


if __name__ == "__main__":
    main()
