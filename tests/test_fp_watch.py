"""The suite's floating-point watch (tests/fp_watch.py) sees what it is there to see."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest
import torch

from model.layers import RotaryEmbedding
from tests.fp_watch import FloatWatch, rope_table_error


def test_a_quiet_test_changes_nothing():
    watch = FloatWatch()
    torch.randn(300, 300) @ torch.randn(300, 300)
    assert watch.changes() == []


def test_a_table_replaced_is_named_once():
    holder = {"table": torch.linspace(0, 1, 1000)}
    watch = FloatWatch()
    watch.keep("the table", lambda: holder["table"])
    holder["table"] = holder["table"].half().float()
    assert watch.changes() == ["the table (replaced by another tensor)"]
    assert watch.changes() == []


def test_a_table_changed_in_place_is_named_once():
    table = torch.linspace(0, 1, 1000)
    watch = FloatWatch()
    watch.keep("the table", lambda: table)
    table[500] += 1e-7
    assert watch.changes() == ["the table (changed in place: 1 rows of 1000 (rows 500), "
                               "max |change| 1.19e-07)"]
    assert watch.changes() == []


@pytest.mark.skipif(ctypes.util.find_library("m") is None or platform.machine() != "x86_64",
                    reason="x86-64's rounding-mode constants, set through the C library")
def test_another_rounding_mode_is_seen():
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    watch = FloatWatch()
    before = libm.fegetround()
    libm.fesetround(0xC00)  # x86's FE_TOWARDZERO
    try:
        changed = watch.changes()
    finally:
        libm.fesetround(before)
    assert "the C library's rounding mode" in changed
    assert "PyTorch's reciprocal" in changed
    watch.changes()


def test_the_rope_check_passes_an_fp32_table_and_fails_a_rounded_one():
    rotary = RotaryEmbedding(64, 100_000.0, 1024)
    error = rope_table_error(rotary.cos, rotary.sin, 100_000.0)
    print(f"fp32 table: {error:.1e} from float64")
    assert error < 2e-5
    halved = rope_table_error(rotary.cos.half().float(), rotary.sin.half().float(), 100_000.0)
    print(f"fp16-rounded table: {halved:.1e}")
    assert halved > 1e-4
    assert rope_table_error(rotary.cos, rotary.sin, 10_000.0) > 0.1
