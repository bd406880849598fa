"""The results page's section on several models behind one address
(benchmarks/several_models.py): each model's users served alone and both models at once, 30
users on one model against 30 split across two, and a request whose model loads first; one
file per CPU in results/several_models/."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import LevelResult
from benchmarks.results_page import Section, per_cpu
from benchmarks.several_models import SeveralModelsRun
from benchmarks.tables import markdown_table

FOLDER = "several_models"


def cells(level: LevelResult) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rate = "-" if level.throughput_tok_s is None else f"{level.throughput_tok_s:.0f}"
    e2e = "-" if level.e2e_p50_ms is None else f"{level.e2e_p50_ms / 1000:.1f}"
    return [str(level.users), rate, ms(level.ttft_p50_ms), ms(level.itl_p50_ms), e2e,
            str(level.errors)]


def table(run: SeveralModelsRun) -> list[str]:
    a, b = (m.split("=", 1)[0] for m in run.models)
    rows = [(f"{a} alone", cells(run.halves_alone[a])),
            (f"{a} beside {b}", cells(run.split[a])),
            (f"{b} alone", cells(run.halves_alone[b])),
            (f"{b} beside {a}", cells(run.split[b])),
            (f"both at once ({a} and {b})", cells(run.split["both"])),
            (f"{run.users} users on {a} alone", cells(run.alone))]
    heads = ["users", "tok/s", "TTFT p50 ms", "ITL p50 ms", "request p50 s", "errors"]
    lines = [f"{', '.join(run.models)}; {run.tokens} tokens a user", "",
             *markdown_table("served", heads, rows)]
    if run.cold_ttft_ms is not None and run.warm_ttft_ms is not None:
        lines += ["", f"Time to first token of a request to {b} under `--max-loaded-models "
                      f"1`: {run.cold_ttft_ms / 1000:.1f} s when it loads {b} first (its "
                      f"engine process starts and loads the weights), {run.warm_ttft_ms:.0f} "
                      f"ms once loaded."]
    return lines


def several_models_section(files: list[str]) -> Section:
    return Section(
        "Several models behind one address",
        "Each model served alone to half the users, then both in one server (each in its own "
        "engine process) with the users split between them, then all the users on the first "
        "model alone. A model's tok/s beside the other is its tokens over the whole run's "
        "time (the two finish apart: its median request time says more). Two busy engines "
        "share the two cores: each runs its steps on the cores the other leaves free "
        "([operations.md](operations.md#a-busy-machine)).",
        ["python3 benchmarks/several_models.py   # results/several_models/CPU.json"],
        files, per_cpu(files, SeveralModelsRun.load, table))


def several_models_sections(folder: Path) -> list[Section]:
    files = sorted(f"{FOLDER}/{p.name}" for p in (folder / FOLDER).glob("*.json"))
    return [several_models_section(files)] if files else []
