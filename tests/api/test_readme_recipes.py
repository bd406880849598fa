"""The README's tools recipe, run as written against a server (only its address changed)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def recipe(name: str) -> str:
    """The Python block after the README's `<!-- recipe: NAME -->` mark."""
    text = README.read_text()
    mark = text.index(f"<!-- recipe: {name} -->")
    return re.search(r"```python\n(.*?)```", text[mark:], re.S).group(1)


def test_the_tools_recipe_calls_a_tool_and_reads_the_answer(server):
    code = recipe("tools").replace("http://127.0.0.1:8080", server.url)
    assert code != recipe("tools")  # the address was there to change
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    print(lines)
    name, _, arguments = lines[0].partition(" ")
    assert name == "get_weather"
    assert arguments.startswith("{'city': ")  # the arguments parsed as the schema says
    assert len(lines) >= 2 and lines[1].strip()  # the answer after the tool's result
