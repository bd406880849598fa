"""The compiled kernels compute without holding the GIL (model/kernels/csrc/bindings.cpp releases it
around each one): while one thread is inside a long matmul, another thread's Python runs. In
the server's in-process mode that other thread is the HTTP server's."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from model.dense_linear import PackedLinear, kernel_fn


@pytest.mark.skipif(kernel_fn(torch.float32) is None, reason="no dense matmul kernel here")
def test_python_runs_while_a_matmul_computes() -> None:
    torch.manual_seed(0)
    layer = PackedLinear(torch.randn(1536, 1536))
    x = torch.randn(4096, 1536)  # ~19 GFLOP: a few hundred ms on one thread
    span: dict[str, float] = {}

    def matmul() -> None:
        span["start"] = time.perf_counter()
        layer.kernel(x, layer.packed, layer.out_features, 1)  # one thread: a core for Python
        span["end"] = time.perf_counter()

    worker = threading.Thread(target=matmul)
    ticks: list[float] = []
    worker.start()
    while worker.is_alive():  # each tick needs the GIL to run
        ticks.append(time.perf_counter())
        time.sleep(0.002)
    worker.join()
    start, end = span["start"], span["end"]
    inside = [t for t in ticks if start < t < end]
    print(f"matmul {1e3 * (end - start):.0f} ms; {len(inside)} ticks of this thread meanwhile")
    assert end - start > 0.05, "the matmul was too short to tell"
    assert len(inside) >= 10
