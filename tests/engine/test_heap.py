"""engine/heap.py: after freeze_startup_heap, a full collection no longer walks what the
process made before it, and garbage made afterwards is still collected. Run in a fresh
interpreter: freezing this test process would exempt the whole suite's objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, json, time
from engine.heap import freeze_startup_heap

def full_collection_seconds():
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - start)
    return best

startup = [{"i": i, "tags": [i]} for i in range(300_000)]  # what start-up leaves alive
before = full_collection_seconds()
frozen = freeze_startup_heap()
after = full_collection_seconds()

class Cycle:
    pass

a, b = Cycle(), Cycle()
a.other, b.other = b, a
del a, b
collected = gc.collect()
print(json.dumps({"before": before, "after": after, "frozen": frozen,
                  "in_generations": len(gc.get_objects()), "collected": collected}))
"""


def test_a_frozen_heap_is_not_walked_and_new_garbage_is_still_collected() -> None:
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    found = json.loads(run.stdout)
    assert found["frozen"] >= 600_000  # the dicts and their lists, at least
    assert found["in_generations"] < 10_000  # left for the collector to walk
    assert found["after"] < found["before"] / 5, found
    assert found["collected"] >= 2  # the cycle made after the freeze
