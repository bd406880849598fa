"""Shared fixtures: one prepared model folder, one loaded model per test session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
import torch

from model.llama import LlamaModel
from model.loader import load_model
from model.prepare import prepare_default_model
from tests.fp_watch import FloatWatch, rope_table_error

# Our forward pass against Hugging Face's on the same fp32 weights. Both are fp32 roundings
# of the same math, summed in different orders (our weights are fused and transposed), so
# they cannot agree exactly. How far apart may they honestly be? Measured against a float64
# evaluation of the same weights, Hugging Face's own fp32 logits (magnitude up to ~40) are off
# by up to 1.3e-4, and ours by about as much (test_logits_match_hf checks that, too). Two such
# errors can add up, hence 3e-4: still ~1000x below what a real bug (RoPE theta 10,000
# instead of 100,000) produces.
LOGITS_ATOL = 3e-4

PROMPTS = [
    "The cat sat on the",
    "Paris is the capital of",
    "In 1969, Neil Armstrong became the first person to walk on the moon. Later in his life, he",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]


@pytest.fixture(scope="session", autouse=True)
def thread_choices(tmp_path_factory) -> Path:
    """The engine core process's measured thread choices (engine/thread_choice.py) go to a
    file of this session's, read by every server it starts: the suite neither reads nor
    writes the machine's own cache."""
    path = tmp_path_factory.mktemp("threads") / "thread-choices.json"
    os.environ["NANO_THREADS_CACHE"] = str(path)
    return path


def missing(what: str) -> NoReturn:
    """Skip for want of `what` (an optional install or file), except under CI=true, which has
    everything the suite needs: there a test that would skip for it fails instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {what}, which CI provides, is missing")
    pytest.skip(f"{what} is missing")


def kernel_skip_is_a_failure(reason: str, has_compiler: bool, avx512: bool,
                             avx512_bf16: bool, avx2: bool = True,
                             quantized: bool = True) -> bool:
    """Under CI, a kernel test (tests/model/) may skip only for a reason this machine really
    has: no C++ compiler, neither AVX-512 nor AVX2 (no kernel of ours runs), neither AVX-512
    nor AVX2 with FMA and F16C (the quantized weights, and their int8 activations, which take
    AVX512-VNNI or else AVX2), no AVX-512 (for the kernels that need it, which say so; and the
    dense kernel's forced AVX2 path, which then runs natively), no AVX512_BF16 (the tests that
    need it); or an optional model file that was not fetched (Gemma 3's GGUF: an extra
    download, not CI's).
    Anything else, e.g. a kernel that failed to build on a machine that could build it, is a
    failure."""
    text = reason.lower()
    if not has_compiler or not (avx512 or avx2) or "not fetched" in text:
        return False
    if "the quantized weights" in text or "--activations int8" in text:
        return quantized  # they run on AVX-512 (with VNNI), or AVX2 with FMA and F16C
    if not avx512 and ("avx-512" in text or "natively" in text):
        return False
    return not ("avx512_bf16" in text and not avx512_bf16)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and os.environ.get("CI") == "true"
            and "tests/model/" in item.nodeid.replace("\\", "/")):
        return
    from model.kernels.cpu import cpu_supports, cpu_supports_avx2, cpu_supports_quantized

    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if kernel_skip_is_a_failure(reason, shutil.which("c++") is not None, cpu_supports(),
                                cpu_supports(bf16=True), cpu_supports_avx2(),
                                cpu_supports_quantized()):
        report.outcome = "failed"
        report.longrepr = (f"CI=true: this machine has a C++ compiler and AVX2 or AVX-512, so "
                           f"this kernel test must run, but it skipped: {reason}")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return prepare_default_model()


@pytest.fixture(scope="session")
def float_watch() -> FloatWatch:
    return FloatWatch()


@pytest.fixture(autouse=True)
def floats_unchanged(request: pytest.FixtureRequest, float_watch: FloatWatch) -> Iterator[None]:
    """After each test: PyTorch still rounds as at the session's start, and the RoPE tables
    are untouched (tests/fp_watch.py); otherwise this test is named as where it changed."""
    yield
    changed = float_watch.changes()
    assert not changed, (f"after {request.node.nodeid}, this process's floating-point "
                         f"results differ from the session's start: {', '.join(changed)}")


@pytest.fixture(scope="session")
def model(model_dir: Path, float_watch: FloatWatch) -> LlamaModel:
    torch.manual_seed(0)
    loaded = load_model(model_dir)
    if loaded.cfg.rope_scaling is None:
        error = rope_table_error(loaded.rotary.cos, loaded.rotary.sin, loaded.cfg.rope_theta)
        assert error < 1e-4, f"the session model's RoPE table is off by {error:.1e} at load"
    float_watch.keep("the session model's RoPE cos", lambda: loaded.rotary.cos)
    float_watch.keep("the session model's RoPE sin", lambda: loaded.rotary.sin)
    return loaded


@pytest.fixture(scope="session")
def hf_model(model_dir: Path, float_watch: FloatWatch):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    float_watch.keep("Hugging Face's RoPE inverse frequencies",
                     lambda: hf.model.rotary_emb.inv_freq)
    return hf


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
