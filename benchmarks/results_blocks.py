"""Passages of README.md and docs/*.md whose figures come from the files in results/.

Each passage sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->` (the two marks
indented alike; the passage takes their indent) and is written by
`python3 benchmarks/report.py` from BLOCKS[NAME]; `--check` fails when a passage differs
from what the files give, as it does for docs/results.md.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path

from benchmarks.results_gguf import gguf_served
from benchmarks.results_passages import (
    amx_30_users,
    bf16_without_amx_served,
    engine_process_side_by_side,
    fresh_start,
    gemma_served,
    int8act_intel_served,
    int8act_served,
    load_generator_share,
    one_user_vs_llama,
    readme_results,
    served_overhead,
    served_overhead_intel,
    shared_prompt_intel,
    tools_under_load,
    vllm_intel,
    zen3_30_users,
    zen3_one_user,
)

BLOCKS: dict[str, Callable[[Path], str]] = {
    "readme-results": readme_results,
    "tools-under-load": tools_under_load,
    "amx-30-users": amx_30_users,
    "load-generator-share": load_generator_share,
    "vllm-intel": vllm_intel,
    "gemma-served": gemma_served,
    "gguf-served": gguf_served,
    "int8act-served": int8act_served,
    "int8act-intel-served": int8act_intel_served,
    "bf16-without-amx-served": bf16_without_amx_served,
    "zen3-30-users": zen3_30_users,
    "zen3-one-user": zen3_one_user,
    "served-overhead": served_overhead,
    "served-overhead-intel": served_overhead_intel,
    "one-user-vs-llama": one_user_vs_llama,
    "shared-prompt-intel": shared_prompt_intel,
    "engine-process-side-by-side": engine_process_side_by_side,
    "fresh-start": fresh_start,
}

BLOCK = re.compile(r"^(?P<indent>[ ]*)(?P<open><!-- results:(?P<name>[\w-]+) -->\n)"
                   r"(?P<body>.*?)^(?P=indent)(?P<close><!-- /results:(?P=name) -->)",
                   re.S | re.M)


def pages(root: Path) -> list[Path]:
    """The pages that may hold passages: README.md and docs/*.md but the generated page."""
    return [root / "README.md",
            *sorted(p for p in (root / "docs").glob("*.md") if p.name != "results.md")]


def fill(text: str, folder: Path) -> str:
    """The text with every passage written anew from the files in `folder`."""
    def body(match: re.Match[str]) -> str:
        name, indent = match["name"], match["indent"]
        if name not in BLOCKS:
            raise KeyError(f"no passage named {name!r} (benchmarks/results_blocks.py)")
        lines = BLOCKS[name](folder).rstrip("\n").split("\n")
        text = "\n".join(f"{indent}{line}" if line else "" for line in lines)
        return f"{indent}{match['open']}{text}\n{indent}{match['close']}"
    filled, found = BLOCK.subn(body, text)
    if found != text.count("<!-- results:"):
        raise ValueError("a <!-- results:NAME --> mark without its <!-- /results:NAME -->")
    return filled


def write_or_check(root: Path, folder: Path, check: bool) -> list[str]:
    """Write each page's passages (or, `check`, compare them): a unified diff per page that
    differs. Pages are written only where something changed."""
    diffs = []
    for page in pages(root):
        current = page.read_text()
        wanted = fill(current, folder)
        if wanted == current:
            continue
        if check:
            diffs.append("".join(difflib.unified_diff(
                current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                str(page), "from the result files")))
        else:
            page.write_text(wanted)
            print(f"wrote the results passages of {page}")
    return diffs
