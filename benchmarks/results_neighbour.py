"""The results page's section on a busy neighbour (benchmarks/neighbour.py): decode steps on
every thread and with the engine's default (the cores other processes leave free), on the idle
machine and beside spinning processes, one file per CPU in results/neighbour/."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import NeighbourRun
from benchmarks.results_page import Section, per_cpu
from benchmarks.tables import markdown_table

FOLDER = "neighbour"


def table(run: NeighbourRun) -> list[str]:
    rows = []
    for batch in sorted({r.batch for r in run.rows}):
        cells = [run.step_ms(n, batch, t) for n in ("idle", "busy")
                 for t in ("all threads", "yield cores")]
        rows.append((f"{batch} sequence{'s' if batch > 1 else ''}",
                     [f"{ms:.1f}" for ms in cells]
                     + [f"{cells[2] / cells[3]:.2f}x", f"{cells[1] / cells[0]:.2f}"]))
    head = (f"{run.model} {run.dtype}, {run.threads} threads, {run.spinning_processes} "
            f"spinning process(es); median decode step, ms")
    heads = ["idle, every thread", "idle, default", "busy, every thread", "busy, default",
             "busy: default's speed-up", "idle: default / every thread"]
    return [head, "", *markdown_table("decode step of", heads, rows)]


def busy_neighbour(files: list[str]) -> Section:
    return Section(
        "A busy neighbour",
        "One engine, no HTTP, its decode steps timed in turns on every thread "
        "(`--no-yield-cores`) and with the default, which gives a core back while another "
        "process holds it ([operations.md](operations.md#a-busy-machine)): on the idle "
        "machine, then beside one process spinning per core but one. The last column is the "
        "default's cost when nothing else runs (its /proc reading every 0.25 s).",
        ["python3 benchmarks/neighbour.py --batches 1 30   # results/neighbour/CPU.json"],
        files, per_cpu(files, NeighbourRun.load, table))


def neighbour_sections(folder: Path) -> list[Section]:
    files = sorted(f"{FOLDER}/{p.name}" for p in (folder / FOLDER).glob("*.json"))
    return [busy_neighbour(files)] if files else []
