"""The kernels' start-up autotuner: the knobs that are measured rather than set.

Today one: how far ahead the dense matmul kernel (model/kernels/csrc/dense_linear.cpp)
prefetches for rows that fit in one row block. Decode steps of ROWS sequences are timed with
each of DISTANCES in turns (one sequence's row reads its panels side by side without software
prefetch, so a step of one would not see the distance); the default (the first) is kept
unless another is faster by more than MARGIN (two starts on one idle machine measured 4 KB 5%
faster, then the two within 0.1%: a near tie is noise, and keeps the default).

The caller hands in what to time: a callable that runs decode steps of a given number of
rows and returns their times in ms. So this module knows nothing of engines, and the engine
(engine/thread_choice.py, which caches the answer with its thread choice) only asks for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from model.kernels.build import load_cpu_kernels

DISTANCES = (4096, 16384)  # bytes; the first is the kernel's own default
ROWS = 4  # more than one (which does not prefetch), within one row block
ROUNDS = 10
MARGIN = 0.03


@dataclass
class Prefetch:
    """The distance chosen, and the median step (ms) at each distance tried."""

    distance: int
    step_ms: dict[int, float]


def knobs() -> ModuleType | None:
    """The kernels module's knobs (its `tuning`), or None where it could not be built. The
    caller asks only where its matmuls run on the dense kernel."""
    module = load_cpu_kernels()
    return None if module is None else module.tuning


def prefetch_from(step_ms: dict[int, float]) -> int:
    """The default distance (DISTANCES[0]) unless another's step was faster by more than
    MARGIN; then the fastest."""
    default = DISTANCES[0]
    fastest = min(step_ms, key=step_ms.__getitem__)
    return fastest if step_ms[fastest] < step_ms[default] * (1 - MARGIN) else default


def tune_prefetch(steps: Callable[[int], list[float]]) -> Prefetch | None:
    """Time `steps(ROWS)` at each distance in turns, ROUNDS times; the kernel is left at
    its default (set_prefetch sets the choice). None where the dense kernel does not run."""
    tuning = knobs()
    if tuning is None:
        return None
    times: dict[int, list[float]] = {d: [] for d in DISTANCES}
    try:
        for _ in range(ROUNDS):
            for distance, taken in times.items():
                tuning.set_prefetch_one_block(distance)
                taken.extend(steps(ROWS))
    finally:
        tuning.set_prefetch_one_block(DISTANCES[0])
    step_ms = {d: round(statistics.median(t), 2) for d, t in times.items()}
    return Prefetch(prefetch_from(step_ms), step_ms)


def set_prefetch(distance: int) -> None:
    """Set the one-row-block prefetch distance (a cached choice, at a later start)."""
    tuning = knobs()
    if tuning is not None:
        tuning.set_prefetch_one_block(distance)
