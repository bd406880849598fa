"""All of SmolLM2-135M's matmuls for one decode step, and one timed pass over them.

Every layer has its own weight tensors (538 MB in fp32), so the weights stream from memory
as in the real model instead of sitting in cache. A "pass" is the 30 layers' qkv, o_proj,
gate_up and down matmuls plus the LM head, each on a fixed input of M rows.

Used by benchmarks/studies/linear_microbench.py (ms per pass by path) and
benchmarks/roofline.py (the same passes against this CPU's measured peaks).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from model.dense_linear import PackedLinear

HIDDEN, INTER, VOCAB, LAYERS = 576, 1536, 49152, 30
QKV = 576 + 2 * 192
SHAPES = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]  # (K, N)
# The GGUF's names for the same matmuls, in the same order (model/gguf/llama_codes.py).
LAYER_PARTS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def all_shapes() -> list[tuple[int, int]]:
    """(K, N) of every matmul of a pass, in the model's order."""
    return SHAPES * LAYERS + [(HIDDEN, VOCAB)]


def make_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    """Each matmul's weight as [K, N] contiguous (our Linear's weight_t)."""
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(k, n, generator=gen) * k**-0.5).to(dtype) for k, n in all_shapes()]


def build(path: str, weights: list[torch.Tensor], **kw) -> list[Callable]:
    """One callable per weight: "ours" (PackedLinear), "matmul" (`x @ weight_t`, what
    model/layers.py's Linear does) or "onednn" (weights reordered once)."""
    if path == "ours":
        return [PackedLinear(w, **kw) for w in weights]
    if path == "matmul":
        return [w.__rmatmul__ for w in weights]
    if path == "onednn":
        fns = []
        for w in weights:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous())
            fns.append(lambda x, p=packed: torch.ops.mkldnn._linear_pointwise(
                x, p, None, "none", [], ""))
        return fns
    raise ValueError(path)


def q4_1_matmuls() -> tuple[list[Callable], int]:
    """The default model's own GGUF codes (Q4_1 layers, Q8_0 LM head) on our quantized
    kernel, in all_shapes()' order, and the bytes of their packed codes."""
    from model.gguf.llama_codes import read_gguf
    from model.prepare import fetch_default_gguf
    from model.weights.quantized import QuantizedLinear

    gguf = read_gguf(fetch_default_gguf())
    names = [f"layers.{i}.{p}" for i in range(gguf.num_layers) for p in LAYER_PARTS]
    layers = [QuantizedLinear(gguf.quantized[n]) for n in [*names, "embed_tokens"]]
    got = [(layer.in_features, layer.out_features) for layer in layers]
    if got != all_shapes():
        raise ValueError("the GGUF's matmuls are not SmolLM2-135M's shapes")
    return layers, sum(layer.packed.numel() * layer.packed.element_size() for layer in layers)


def weight_bytes(weights: list[torch.Tensor]) -> int:
    return sum(w.numel() * w.element_size() for w in weights)


def pass_inputs(rows: int, dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """One fixed input [rows, K] per distinct K of a pass."""
    gen = torch.Generator().manual_seed(rows)
    return {k: torch.randn(rows, k, generator=gen).to(dtype) for k in {k for k, _ in SHAPES}}


def time_pass(fns: list[Callable], inputs: dict[int, torch.Tensor], repeats: int) -> float:
    """Best wall time of one pass over every matmul, in seconds."""
    ks = [k for k, _ in all_shapes()]
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        for fn, k in zip(fns, ks):
            fn(inputs[k])
        best = min(best, time.perf_counter() - start)
    return best
