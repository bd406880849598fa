"""The results page's section on embeddings (benchmarks/embeddings.py): our server against
sentence-transformers in one process, on the same texts, one file per CPU in
results/embeddings/."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import EmbeddingRun
from benchmarks.results_page import Section, per_cpu
from benchmarks.tables import markdown_table

FOLDER = "embeddings"
TARGETS = {"short": 2.0, "long": 1.0}  # what we aim for, against sentence-transformers


def table(run: EmbeddingRun) -> list[str]:
    rows = []
    for w in run.workloads:
        rows.append((f"{w.texts} {w.name} texts (~{w.tokens_per_text:.0f} tokens)",
                     [f"{w.ours_per_second:.2f}", f"{w.st_per_second:.2f} (batch {w.st_batch})",
                      f"{w.ours_per_second / w.st_per_second:.2f}x",
                      f"{TARGETS.get(w.name, 1.0):.0f}x", f"{w.lowest_cosine:.6f}"]))
    heads = [f"ours, {run.clients} clients", "sentence-transformers, best batch", "ratio",
             "target", "lowest cosine"]
    return [f"{run.model}, fp32; texts per second", "",
            *markdown_table("workload", heads, rows)]


def embeddings_section(files: list[str]) -> Section:
    return Section(
        "Embeddings against sentence-transformers",
        "The same texts embedded by sentence-transformers in one process at each of a few batch "
        "sizes (its best shown) and by our server (`--model embeddinggemma-300m`) under 16 "
        "concurrent clients sending one text a request, the load generator on the same cores. "
        "Every vector we sent back was checked against sentence-transformers'. Both sides "
        "compute the same matmuls in fp32 ([api.md](api.md#embeddings-rerank-and-score) says "
        "where the time goes).",
        ["python3 benchmarks/embeddings.py   # results/embeddings/CPU.json"],
        files, per_cpu(files, EmbeddingRun.load, table))


def embedding_sections(folder: Path) -> list[Section]:
    files = sorted(f"{FOLDER}/{p.name}" for p in (folder / FOLDER).glob("*.json"))
    return [embeddings_section(files)] if files else []
