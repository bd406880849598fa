"""The layout docs/architecture.md draws: who imports whom, by folder; no import circle in
the product's packages; the reading order's files and their sizes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("api", "engine", "kvcache", "model", "deploy", "benchmarks")
SCRIPTS = ("server.py", "baseline_server.py")
CIRCLE_FREE = PACKAGES  # no package's modules import each other in a circle
MAX_LINES = {"api": 400, "engine": 400}


def modules() -> dict[str, Path]:
    """Every module of the product's packages, by dotted name (a package by its own)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `path` imports, at any depth of its code (function-level too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            candidates = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        names.update(c for c in candidates if c in known)
    return names


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def folder_edges() -> set[tuple[str, str]]:
    """(importer, imported) by top-level folder or script, ours only."""
    known = modules()
    edges = set()
    sources = [(name.split(".")[0], path) for name, path in known.items()]
    sources += [(script, ROOT / script) for script in SCRIPTS]
    for source, path in sources:
        for name in imported(path, known):
            target = name.split(".")[0]
            if target != source:
                edges.add((source, target))
    return edges


def drawn_edges() -> set[tuple[str, str]]:
    """The "X -> a, b" lines of the doc's house drawing."""
    block = DOC.read_text().split("<!-- imports -->")[1]
    edges = set()
    for line in block.splitlines():
        match = re.match(r"\s*([\w.]+)/?\s+->\s+(.*)", line)
        if match and match.group(2).strip() != "nothing of ours":
            for target in match.group(2).split(","):
                edges.add((match.group(1), target.strip().rstrip("/")))
    return edges


def test_the_doc_draws_who_imports_whom() -> None:
    assert drawn_edges() == folder_edges()


def test_no_import_circle() -> None:
    known = modules()
    graph = {name: imported(path, known) for name, path in known.items()}
    found = [c for c in circles(graph) if c[0].split(".")[0] in CIRCLE_FREE]
    assert found == [], found


def test_no_long_file_in_api_or_engine() -> None:
    long = {str(path.relative_to(ROOT)): n for folder, limit in MAX_LINES.items()
            for path in (ROOT / folder).rglob("*.py")
            if (n := len(path.read_text().splitlines())) > limit}
    assert long == {}


def test_the_reading_order_names_real_files_of_about_their_size() -> None:
    """Each "`path` (N lines)" of the reading order: the file exists and N is within a
    fifth of its length (a guide for a reader's afternoon, not an exact count)."""
    listed = re.findall(r"`([\w/.]+\.py)` \((\d+) lines\)", DOC.read_text())
    assert len(listed) >= 8
    for path, lines in listed:
        actual = len((ROOT / path).read_text().splitlines())
        assert abs(actual - int(lines)) <= actual / 5, (path, lines, actual)
