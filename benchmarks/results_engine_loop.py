"""The results page's section on the engine loop's restructuring: the tree before it and
after it, and baseline_server.py, up at once and measured in turns
(benchmarks/interleaved.py), in results/engine-loop/."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.results import InterleavedRun
from benchmarks.results_page import Section
from benchmarks.tables import markdown_table

FOLDER = "engine-loop"
RUNS = {"1 user": "one-user", "30 users": "thirty-users",
        "30 users, after started first": "thirty-users-swapped"}
COMMANDS = [
    'python3 benchmarks/interleaved.py results/engine-loop/one-user '
    '"before=bash -c \'cd BEFORE && exec python3 server.py --port {port}\'" '
    '"after=python3 server.py --port {port}" '
    '"baseline=python3 baseline_server.py --port {port}" --turns 5 -- --users 1 --max-tokens 100',
    'python3 benchmarks/interleaved.py results/engine-loop/thirty-users (the same three) '
    '--turns 3 -- --users 30 --max-tokens 100',
    'python3 benchmarks/interleaved.py results/engine-loop/thirty-users-swapped "after=..." '
    '"before=..." --turns 4 -- --users 30 --max-tokens 100',
]


def per_turn(values: list[float], digits: int) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def rows(run: InterleavedRun) -> list[tuple[str, list[str]]]:
    """A row per server: ITL p50 and tok/s per turn, and after's (or baseline's) per-turn
    ratios to before: ITL, tok/s (median, range)."""
    out = []
    before_tps = run.throughput_tok_s["before"]
    for label in run.commands:
        itl, tps = run.itl_p50_ms[label], run.throughput_tok_s[label]
        if label == "before":
            ratio_itl = ratio_tps = "-"
        else:
            itl_r = run.ratios(label, "before")
            tps_r = [a / b for a, b in zip(tps, before_tps, strict=True)]
            ratio_itl = (f"{statistics.median(itl_r):.3f} "
                         f"({min(itl_r):.3f}-{max(itl_r):.3f})")
            ratio_tps = (f"{statistics.median(tps_r):.3f} "
                         f"({min(tps_r):.3f}-{max(tps_r):.3f})")
        out.append((label, [per_turn(itl, 1), per_turn(tps, 0), ratio_itl, ratio_tps]))
    return out


def body(folder: Path) -> list[str]:
    lines: list[str] = []
    for title, sub in RUNS.items():
        run = InterleavedRun.load(folder / FOLDER / sub / "interleaved.json")
        lines += [f"**{title}** ({run.machine.cpu}, {len(run.itl_p50_ms['before'])} turns)", "",
                  *markdown_table("server", ["ITL p50 per turn, ms", "tok/s per turn",
                                             "ITL over before's, per turn: median (range)",
                                             "tok/s over before's, per turn: median (range)"],
                                  rows(run)), ""]
    return lines[:-1]


def engine_loop_sections(folder: Path) -> list[Section]:
    if not (folder / FOLDER).is_dir():
        return []
    files = [f"{FOLDER}/{sub}/interleaved.json" for sub in RUNS.values()]
    return [Section(
        "One engine loop for both modes: before and after",
        "The engine's step frame moved into one loop that the core process steps directly and "
        "the in-process engine steps from its thread, and text and stop strings moved to one "
        "front for both modes (engine/engine_loop.py, engine/text_outputs.py). The tree "
        "before that change (commit 312a23b, checked out in BEFORE), the tree after it and "
        "baseline_server.py were up at once and given the same load in turns; a ratio within "
        "a turn is what the machine's drift cancels out of. Default flags: the engine core in "
        "its own process, fp32.",
        COMMANDS, files, body)]
