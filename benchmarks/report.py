"""docs/results.md and its charts, and the results passages of README.md and docs/*.md, from
the JSON files in results/.

    python3 benchmarks/report.py            # writes docs/results.md, docs/charts/*.png and
                                            # the passages
    python3 benchmarks/report.py --check    # exits 1 if the page or a passage differs from
                                            # the JSON

The page's sections (what each run was, its commands, its tables) are benchmarks/results_page.py;
the passages elsewhere (between <!-- results:NAME --> marks) are benchmarks/results_blocks.py.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.plot import draw_charts
from benchmarks.results import BenchRun
from benchmarks.results_blocks import write_or_check
from benchmarks.results_book import build_page
from benchmarks.results_page import CHARTS

ROOT = Path(__file__).resolve().parents[1]


def check(page: str, path: Path) -> int:
    """0 if the file holds exactly this page, else 1 with a diff on stderr."""
    current = path.read_text() if path.exists() else ""
    if current == page:
        print(f"{path} matches the result files")
        return 0
    sys.stderr.writelines(difflib.unified_diff(
        current.splitlines(keepends=True), page.splitlines(keepends=True),
        str(path), "from the result files"))
    print(f"{path} is out of date: run python3 benchmarks/report.py", file=sys.stderr)
    return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "results",
                        help="folder of result files (default: results/)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md")
    parser.add_argument("--check", action="store_true",
                        help="compare the page with --out instead of writing it")
    args = parser.parse_args()
    page = build_page(args.results)
    if args.check:
        failed = check(page, args.out)
        diffs = write_or_check(ROOT, args.results, check=True)
        sys.stderr.writelines(diffs)
        if diffs:
            print("results passages are out of date: run python3 benchmarks/report.py",
                  file=sys.stderr)
        else:
            print("the results passages of README.md and docs/ match the result files")
        sys.exit(1 if failed or diffs else 0)
    args.out.write_text(page)
    print(f"wrote {args.out}")
    write_or_check(ROOT, args.results, check=False)
    for prefix, files in CHARTS:
        runs = [BenchRun.load(args.results / name) for name in files]
        for path in draw_charts(runs, args.out.parent / "charts", prefix):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
