"""The docs against the code: every relative link in README.md and docs/ resolves (file and
#anchor), and every `--flag` they write is a flag of the command it belongs to.

A flag on a command line (`python3 server.py --dtype bfloat16 ...`) must be in that command's
--help; a flag written alone (`--max-waiting`) must be in the --help of one of our commands.
Flags of other programs (pip, cmake, llama-server, lm-eval, ...) are named in FOREIGN_FLAGS.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Flags of programs that are not ours, as the docs use them.
FOREIGN_FLAGS = {
    "--no-deps", "--no-binary", "--quiet", "--disable-pip-version-check", "--target",
    "--build", "--detach", "--host", "--port", "--model", "--model_args", "--tasks",
    "--include_path", "--batch_size", "--output_path", "--log_samples", "--limit",
    "--apply_chat_template", "--ignore-installed", "--upgrade", "--user", "--break-system-packages",
    "--fail", "--silent", "--show-error", "--data", "--header", "--request", "--no-buffer",
    "--url", "--checks", "--phases", "--max-examples", "--workers", "--num-cpus",
    "--disable-usage-stats", "--address", "--head", "--dashboard-host", "--include-dashboard",
    "--serve-app-name", "--no-repack",
}

# Our commands, as the docs invoke them: the way to ask each for --help.
# (side_by_side.py takes servers as "LABEL=server.py FLAGS": the flags are server.py's.)
COMMAND = re.compile(r"python3\s+(?:-m\s+([\w.]+)|((?:[\w./-]+/)?[\w-]+\.py))"
                     r"|\"[\w.-]+=((?:[\w./-]+/)?[\w-]+\.py)")
# A shell separator ends a command's flags; so does a lone "--" (what follows is passed on to
# another program, e.g. side_by_side.py's flags for bench.py).
SHELL_BREAK = re.compile(r"\s(?:&&?|\|\|?|;|\)|--)(?:\s|$)|\s#|\"")
FLAG = re.compile(r"(?<![^\s`(\[=])(--[a-z][a-z0-9_-]*)")


def code_spans(text: str) -> list[str]:
    """The text of fenced code blocks (line by line) and of inline code spans."""
    spans: list[str] = []
    fenced = re.compile(r"^```.*?^```", re.S | re.M)
    for block in fenced.findall(text):
        spans += block.splitlines()[1:-1]
    rest = fenced.sub("", text)
    spans += [line for line in rest.splitlines() if line.startswith("    ")]  # indented code
    spans += re.findall(r"`([^`\n]+)`", rest)
    return spans


@cache
def help_flags(target: str) -> frozenset[str]:
    """The flags in `python3 TARGET --help` (TARGET: a script path or '-m module')."""
    args = target.split() if target.startswith("-m ") else [target]
    done = subprocess.run([sys.executable, *args, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"python3 {target} --help failed:\n{done.stderr[-2000:]}"
    return frozenset(FLAG.findall(done.stdout))


def command_flags(line: str) -> list[tuple[str, str]]:
    """(command target, flag) for each of our commands on a line and the flags that follow
    it, up to the next shell separator or command."""
    found = []
    matches = list(COMMAND.finditer(line))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        tail = line[match.end():end]
        cut = SHELL_BREAK.search(tail)
        tail = tail[:cut.start()] if cut else tail
        target = f"-m {match.group(1)}" if match.group(1) else match.group(2) or match.group(3)
        found += [(target, flag) for flag in FLAG.findall(tail)]
    return found


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to
    hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    result = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        slug = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
        slug = slug.replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def test_every_relative_link_resolves() -> None:
    checked, broken = 0, []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    print(f"{checked} relative links checked in {len(PAGES)} pages")
    assert checked > 20 and not broken, "\n".join(broken)


def test_every_flag_written_belongs_to_its_command() -> None:
    on_commands: list[tuple[str, str, str]] = []  # (page, command target, flag)
    alone: list[tuple[str, str]] = []
    for page in PAGES:
        for span in code_spans(page.read_text()):
            pairs = command_flags(span)
            if pairs:
                on_commands += [(page.name, target, flag) for target, flag in pairs]
            elif not re.search(r"\b(pip|cmake|llama-server|lm_eval|curl|git|ray|serve|"
                               r"schemathesis|bash)\b", span):
                alone += [(page.name, flag) for flag in FLAG.findall(span)]
    targets = sorted({target for _, target, _ in on_commands} | {"server.py"})
    with ThreadPoolExecutor(max_workers=2) as pool:  # each --help imports torch: ~3 s
        known = dict(zip(targets, pool.map(help_flags, targets)))
    ours = frozenset().union(*known.values())
    wrong = [f"{page}: {flag} is not a flag of python3 {target}"
             for page, target, flag in on_commands if flag not in known[target]]
    wrong += [f"{page}: {flag} is not a flag of any of our commands"
              for page, flag in alone if flag not in ours and flag not in FOREIGN_FLAGS]
    print(f"{len(on_commands)} flags on {len(targets)} commands, {len(alone)} flags alone")
    assert len(on_commands) > 30 and not wrong, "\n".join(sorted(set(wrong)))


def test_the_api_docs_field_tables_are_the_policy_table() -> None:
    """docs/api.md's per-field statuses are rendered from api/field_policy.py, the one table
    that decides; they must not drift from it."""
    from api.field_policy import render_markdown

    text = (ROOT / "docs" / "api.md").read_text()
    block = re.search(r"<!-- field-policy:start[^>]*-->\n(.*?)\n<!-- field-policy:end -->",
                      text, re.S)
    assert block, "docs/api.md has no field-policy block"
    assert block.group(1).strip() == render_markdown().strip(), \
        "docs/api.md's field tables are stale: paste the output of python3 -m api.field_policy"
