"""The decode-attention kernel of this checkout against the same file at another commit,
alternated in one process.

    python3 benchmarks/studies/decode_attention_ab.py --against HEAD~1

Both versions of model/kernels/csrc/paged_attention_cpu.cpp (this checkout's and `git show
REV:...`'s) are built on their own, each with a two-line binding, with the kernels' flags
(the whole kernels module cannot be loaded twice in one process). Each shape is the default
model's attention (9 query heads on 3 K/V heads, head dim 64, 30 layers): every sequence's
length drawn from [context / 2, context], its blocks scattered over the pool as a server's
are after a while, K/V random. Per shape and dtype, the two builds take turns for --rounds
rounds of one decode step's 30 calls; the medians are printed, with the K/V bytes each step
reads over its time. "hot" rows give every sequence the same blocks, so K/V sit in cache:
what the arithmetic costs without the memory.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from benchmarks.results import cpu_model
from kvcache.pool import BLOCK_SIZE
from model.kernels.build import CFLAGS

torch.set_grad_enabled(False)
ROOT = Path(__file__).resolve().parents[2]
SOURCE = "model/kernels/csrc/paged_attention_cpu.cpp"
HEADS, KV_HEADS, DIM, LAYERS = 9, 3, 64, 30
BINDING = """#include <torch/extension.h>
torch::Tensor paged_decode_attention(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                                     torch::Tensor, double, int64_t);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention);
}
"""


def build(name: str, source: str, workdir: Path) -> Callable:
    """The kernel built alone from `source` (its text), under a name keyed by the text."""
    from torch.utils.cpp_extension import load

    digest = hashlib.sha256((source + " ".join(CFLAGS)).encode()).hexdigest()[:10]
    folder = workdir / f"{name}_{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cpp").write_text(source)
    (folder / "binding.cpp").write_text(BINDING)
    module = load(name=f"decode_attention_{name}_{digest}", build_directory=str(folder),
                  sources=[str(folder / "kernel.cpp"), str(folder / "binding.cpp")],
                  extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                  extra_include_paths=[str(ROOT / "model/kernels/csrc")])  # its kernel_api.h
    return module.paged_decode_attention


def step_inputs(seqs: int, context: int, dtype: torch.dtype, hot: bool) -> tuple:
    gen = torch.Generator().manual_seed(seqs * 7919 + context)
    per_seq = -(-context // BLOCK_SIZE)
    blocks = (per_seq if hot else seqs * per_seq) + 1
    shape = (blocks, BLOCK_SIZE, KV_HEADS, DIM)
    k = [torch.randn(shape, generator=gen).to(dtype) for _ in range(LAYERS)]
    v = [torch.randn(shape, generator=gen).to(dtype) for _ in range(LAYERS)]
    if hot:
        tables = torch.arange(1, blocks, dtype=torch.int64).repeat(seqs, 1)
    else:
        tables = torch.randperm(blocks - 1, generator=gen).add(1).view(seqs, per_seq)
    lens = torch.randint(context // 2, context + 1, (seqs,), generator=gen, dtype=torch.int64)
    q = torch.randn(seqs, HEADS, DIM, generator=gen).to(dtype)
    return q, k, v, tables, lens


def compare(kernels: dict[str, Callable], seqs: int, context: int, dtype: torch.dtype,
            hot: bool, rounds: int) -> str:
    q, k, v, tables, lens = step_inputs(seqs, context, dtype, hot)
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            start = time.perf_counter()
            for layer in range(LAYERS):
                kernel(q, k[layer], v[layer], tables, lens, DIM ** -0.5, 0)
            times[name].append(time.perf_counter() - start)
    megabytes = int(lens.sum()) * LAYERS * 2 * KV_HEADS * DIM * k[0].element_size() / 1e6
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    cells = "  ".join(f"{name} {ms:6.2f} ms ({megabytes / ms:5.1f} GB/s)"
                      for name, ms in medians.items())
    first, second = medians.values()
    label = f"{'hot ' if hot else ''}{seqs} x {context}"
    return f"{label:>12} {str(dtype)[6:]:>8}: {cells}  ratio {first / second:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    theirs = subprocess.run(["git", "show", f"{args.against}:{SOURCE}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {args.against: build("theirs", theirs, Path(tmp)),
                   "this": build("this", (ROOT / SOURCE).read_text(), Path(tmp))}
        print(f"{cpu_model()}, {torch.get_num_threads()} threads; median of {args.rounds} "
              f"rounds of one decode step (30 layers); ratio = {args.against} / this")
        for dtype in (torch.float32, torch.bfloat16):
            for seqs, context in ((1, 150), (1, 2000), (30, 150), (30, 700)):
                print(compare(kernels, seqs, context, dtype, False, args.rounds), flush=True)
            print(compare(kernels, 30, 700, dtype, True, args.rounds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
