"""The kernels' knobs go through one door (model/kernels/tuning.py): read from the
environment once, refused by name when a value cannot be taken, applied to the module's
`tuning` submodule as it loads; nothing else in the product reads the variables or turns
the knobs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from model.kernels.build import load_cpu_kernels
from model.kernels.tuning import KernelTuning, TuningError

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = ("NANO_VLLM_CPU", "NANO_VLLM_DENSE_KERNEL", "NANO_VLLM_AMX", "NANO_VLLM_BF16_FMA")


def test_the_defaults_and_each_variable():
    assert KernelTuning.from_env({}) == KernelTuning()
    assert KernelTuning().describe() == "the defaults"
    tuned = KernelTuning.from_env({"NANO_VLLM_CPU": "AVX512", "NANO_VLLM_DENSE_KERNEL": "0",
                                   "NANO_VLLM_AMX": "0", "NANO_VLLM_BF16_FMA": "2"})
    assert tuned == KernelTuning(cpu="avx512", dense_kernel=False, amx=False, bf16_fma=2)
    print(tuned.describe())
    assert all(name in tuned.describe() for name in VARIABLES)
    assert KernelTuning.from_env({"NANO_VLLM_CPU": "native"}).cpu is None
    assert KernelTuning.from_env({"NANO_VLLM_BF16_FMA": "-1"}).bf16_fma is None  # as chosen


@pytest.mark.parametrize("name, value", [("NANO_VLLM_CPU", "zen3"), ("NANO_VLLM_AMX", "off"),
                                         ("NANO_VLLM_DENSE_KERNEL", "no"),
                                         ("NANO_VLLM_BF16_FMA", "many")])
def test_a_value_a_variable_cannot_take_is_refused_by_name(name, value):
    with pytest.raises(TuningError, match=f"{name}='{value}'"):
        KernelTuning.from_env({name: value})


class Knobs:
    """A kernels module's `tuning`, recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, *args))


def test_applied_through_the_modules_tuning_submodule():
    module = type("Module", (), {"tuning": Knobs()})
    KernelTuning().apply(module)
    assert module.tuning.calls == []
    KernelTuning(cpu="avx2", amx=False, bf16_fma=1).apply(module)
    assert module.tuning.calls == [("set_dense_avx2", True), ("set_quantized_avx2", True),
                                   ("set_dense_amx", 0, 0), ("set_dense_bf16_fma", 1)]


def test_the_real_module_keeps_its_knobs_apart_from_its_ops():
    kernels = load_cpu_kernels()
    if kernels is None:
        pytest.skip("the kernels cannot be built here")
    knobs = [n for n in dir(kernels.tuning) if not n.startswith("_")]
    ops = [n for n in dir(kernels) if not n.startswith("_") and n != "tuning"]
    print(f"{len(ops)} ops, {len(knobs)} knobs")
    assert "set_prefetch_one_block" in knobs and "dense_linear" in ops
    assert not [n for n in ops if n.startswith("set_")]
    before = kernels.tuning.dense_bf16_fma_blocks()
    try:
        KernelTuning(bf16_fma=3).apply(kernels)
        assert kernels.tuning.dense_bf16_fma_blocks() == 3
    finally:
        kernels.tuning.set_dense_bf16_fma(-1)  # back to the choice for this CPU
    assert kernels.tuning.dense_bf16_fma_blocks() == before


def product_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / f for f in listed if f.split("/")[0] in ("api", "engine", "kvcache", "model")
            or f == "server.py"]


def test_nothing_else_in_the_product_reads_the_variables_or_turns_the_knobs():
    found = []
    for path in product_files():
        if path.is_relative_to(ROOT / "model" / "kernels"):
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {name}" for name in VARIABLES if name in text
                  and re.search(rf"environ[^\n]*{name}|{name}[^\n]*environ", text)]
        found += [f"{path.relative_to(ROOT)}: {m}" for m in
                  re.findall(r"\.tuning\.set_\w+", text)]
    assert not found, found
