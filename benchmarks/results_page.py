"""docs/results.md, built from the JSON in results/: each section says how its runs were made,
names the CPU they ran on and the files they came from, and renders their tables.

benchmarks/report.py writes the page (and its charts) and checks it; this module only builds
the text. A figure in the prose is computed from the same files as the tables beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.results import (
    BenchRun,
    DashboardOverheadRun,
    LevelResult,
    Machine,
    ProfileRun,
    RooflineRun,
    SpecDecodeRun,
    StartupRun,
)
from benchmarks.tables import (
    markdown_table,
    profile_table,
    roofline_tables,
    side_by_side,
    top_ops_table,
)

SERVER = "python3 server.py --port 8123"
BENCH = "python3 benchmarks/bench.py --url http://127.0.0.1:8123"

# Charts drawn from the same files as the tables: (file name prefix, the runs' files).
CHARTS = [("", ["nano-vllm-vs-baseline.json", "baseline.json"]),
          ("prefix_", ["prefix-cache-on.json", "prefix-cache-off.json"]),
          ("prefill_", ["prefill-batched.json", "prefill-one-at-a-time.json"])]


@dataclass
class Section:
    title: str
    intro: str
    commands: list[str]
    files: list[str]  # under results/, the runs this section shows
    body: Callable[[Path], list[str]]
    after: str = ""
    charts: list[str] = field(default_factory=list)  # PNGs under docs/charts

    def render(self, folder: Path) -> list[str]:
        lines = [f"## {self.title}", "", self.intro, "", "```bash", *self.commands, "```", ""]
        cpus = sorted({machine.cpu for name in self.files
                       if name.endswith(".json") and (machine := machine_of(folder / name))})
        assert cpus, f"no run of '{self.title}' names its CPU"
        sources = ", ".join(f"`results/{name}`" for name in self.files)
        lines += [f"CPU: {' and '.join(cpus)}, 2 cores. {self.when(folder)} Saved in "
                  f"{sources}.", ""]
        lines += self.body(folder)
        if self.after:
            lines += ["", self.after]
        if self.charts:
            lines += [""] + [f"![{name}](charts/{name})" for name in self.charts]
        return [*lines, ""]


    def when(self, folder: Path) -> str:
        """The days its runs started (as the files record them), and whether the engine core
        then ran in the HTTP process while the commands above no longer say so."""
        starts = sorted(start for name in self.files if name.endswith(".json")
                        and (start := json.loads((folder / name).read_text()).get("started_at")))
        if not starts:
            return "The files record no date."
        days = sorted({start[:10] for start in starts})
        text = f"Run on {days[0]}" + (f" to {days[-1]}" if len(days) > 1 else "")
        said = any("engine-process" in command for command in self.commands)
        if starts[0] < ENGINE_PROCESS_DEFAULT and not said:
            text += (", when `server.py` ran the engine core in the HTTP process (what "
                     "`--no-engine-process` does now)")
        return text + "."


# When the engine core's own process became server.py's default (commit 89e8496): a run
# started before it served in-process.
ENGINE_PROCESS_DEFAULT = "2026-12-01T13:49:24"

# What `bash benchmarks/run_all.sh OUT` writes under OUT: a section whose files are all here
# is measured again by it.
RUN_ALL = {"startup/nano-vllm.json", "nano-vllm.json", "nano-vllm-bf16.json",
           "nano-vllm-q4_1.json", "llama-cpp-f32.json", "llama-cpp-bf16.json",
           "llama-cpp-q4_1.json", "nano-vllm-vs-baseline.json", "baseline.json",
           "nano-vllm-first-engine.json", "prefix-cache-on.json", "prefix-cache-off.json",
           "prefill-one-at-a-time.json", "prefill-batched.json", "profile_decode.json",
           "profile_decode_bf16.json", "preemption-64-blocks.json", "preemption_metrics.txt"}
RUN_ALL_FOLDERS = ("neighbour/",)  # one file per CPU


def made_by_run_all(name: str) -> bool:
    return name in RUN_ALL or name.startswith(RUN_ALL_FOLDERS)


def run_all_text(all_sections: list[Section]) -> str:
    """Which sections `benchmarks/run_all.sh` measures again, from their files."""
    whole = [s for s in all_sections if all(made_by_run_all(f) for f in s.files)]
    part = [s for s in all_sections if s not in whole and any(made_by_run_all(f)
                                                                for f in s.files)]
    links = "; ".join(f"[{s.title}](#{anchor(s.title)})" for s in whole)
    text = (f"`bash benchmarks/run_all.sh results` measures again the runs of {len(whole)} "
            f"of these {len(all_sections)} sections, one server at a time: {links}")
    for s in part:
        left = ", ".join(f"`results/{f}`" for f in s.files if not made_by_run_all(f))
        text += f"; and [{s.title}](#{anchor(s.title)}) but for {left}"
    return (text + ". Then `python3 benchmarks/report.py` writes this page again. Every other "
            "section's commands, shown in it, remake its runs.")


def machine_of(path: Path) -> Machine | None:
    raw = json.loads(path.read_text()).get("machine")
    return Machine(**raw) if raw else None


def per_cpu(files: list[str], load: Callable[[Path], Any],
            table: Callable[[Any], list[str]]) -> Callable[[Path], list[str]]:
    """A section's body of one run per CPU: each file loaded, its CPU named, its table."""
    def body(folder: Path) -> list[str]:
        lines: list[str] = []
        for name in files:
            run = load(folder / name)
            lines += [f"**{run.machine.cpu}**", "", *table(run), ""]
        return lines[:-1]

    return body


def run(folder: Path, name: str) -> BenchRun:
    return BenchRun.load(folder / f"{name}.json")


def level(folder: Path, name: str, users: int) -> LevelResult:
    return run(folder, name).by_users()[users]


def pair(a: str, b: str) -> Callable[[Path], list[str]]:
    def body(folder: Path) -> list[str]:
        return [f"Each cell: {a} / {b}.", "", *side_by_side(run(folder, a), run(folder, b))]
    return body


def pairs(*labels: tuple[str, str, str]) -> Callable[[Path], list[str]]:
    """Several side-by-side tables, each under a caption: (caption, a, b)."""
    def body(folder: Path) -> list[str]:
        lines: list[str] = []
        for caption, a, b in labels:
            lines += [f"{caption} (each cell: {a} / {b}):", "",
                      *side_by_side(run(folder, a), run(folder, b)), ""]
        return lines[:-1]
    return body


def ratio(folder: Path, a: str, b: str, users: int) -> float:
    x, y = level(folder, a, users), level(folder, b, users)
    assert x.throughput_tok_s and y.throughput_tok_s
    return x.throughput_tok_s / y.throughput_tok_s


def restructure(folder: Path) -> list[str]:
    rows = []
    for name in ("before", "after"):
        runs = [run(folder, f"restructure/{name}-{i}") for i in (1, 2)]
        one, thirty = ([r.by_users()[u] for r in runs] for u in (1, 30))
        rows.append((f"{name}, run 1 / 2", [" / ".join(f"{x.itl_p50_ms:.1f}" for x in one),
                                           " / ".join(f"{x.throughput_tok_s:.1f}" for x in thirty),
                                           " / ".join(f"{x.itl_p50_ms:.1f}" for x in thirty)]))
    return markdown_table("checkout", ["1 user: ITL p50 (ms)", "30 users: tok/s",
                                       "30 users: ITL p50 (ms)"], rows)


PREFIX_OPTIONS = [("prefix-fp32-default", "fp32, defaults"),
                  ("prefix-fp32-budget256", "fp32, `--max-num-batched-tokens 256`"),
                  ("prefix-bf16", "bf16"), ("prefix-bf16-budget256", "bf16, budget 256")]


def prefix_options(folder: Path) -> list[str]:
    rows = []
    for name, settings in PREFIX_OPTIONS:
        x = level(folder, f"prefix-options/{name}", 30)
        rows.append((settings, [f"{x.ttft_p50_ms:.0f}", f"{x.ttft_p99_ms:.0f}",
                                f"{x.throughput_tok_s:.1f}"]))
    return markdown_table("server", ["TTFT p50 (ms)", "TTFT p99 (ms)", "tok/s"], rows)


def text_file(name: str) -> Callable[[Path], list[str]]:
    def body(folder: Path) -> list[str]:
        return ["```", *(folder / name).read_text().splitlines(), "```"]
    return body


def startups(subfolder: str, *labels: str) -> Callable[[Path], list[str]]:
    """One row per startup.py run in results/`subfolder`: its first and later start, in s."""
    def body(folder: Path) -> list[str]:
        runs = [StartupRun.load(folder / subfolder / f"{label}.json") for label in labels]
        return markdown_table("tree", ["first start (s)", "later start (s)"],
                              [(r.label, [f"{r.first_s:.1f}", f"{r.later_s:.1f}"]) for r in runs])
    return body


def preemption(folder: Path) -> list[str]:
    x = level(folder, "preemption-64-blocks", 30)
    return [f"All 30 requests: {x.total_tokens} tokens in all, {x.errors} errors; "
            f"{x.throughput_tok_s:.0f} tok/s, TTFT p50 {x.ttft_p50_ms:.0f} ms, ITL p50 "
            f"{x.itl_p50_ms:.1f} ms, ITL p99 {x.itl_p99_ms:.0f} ms (a preempted user waits "
            "while it is out, then recomputes what the prefix cache lost). `/metrics` "
            "afterwards (`results/preemption_metrics.txt`; the 31st request is bench.py's "
            "warm-up):", "", *text_file("preemption_metrics.txt")(folder)]


def profiles(folder: Path) -> list[str]:
    lines: list[str] = []
    for name in ("profile_decode", "profile_decode_bf16"):
        profile = ProfileRun.load(folder / f"{name}.json")
        lines += [f"{profile.dtype}, {profile.results[0].attention} attention "
                  f"(`{profile.command}`):", "", *profile_table(profile), ""]
    fp32 = ProfileRun.load(folder / "profile_decode.json")
    lines += ["The PyTorch ops with the most self time, fp32:", "", *top_ops_table(fp32)]
    return lines


def spec_decode(folder: Path) -> list[str]:
    spec = SpecDecodeRun.load(folder / "spec-decode.json")
    rows = []
    for w in spec.workloads:
        a, b = w.without, w.with_speculation
        assert a.throughput_tok_s and b.throughput_tok_s
        rate = f"{w.acceptance_rate:.0%}" if w.acceptance_rate is not None else "-"
        name = w.name if "user" in w.name else f"{w.name}, {w.users} user{'s' * (w.users > 1)}"
        rows.append((name,
                     [f"{a.throughput_tok_s:.1f}", f"{b.throughput_tok_s:.1f}",
                      f"{b.throughput_tok_s / a.throughput_tok_s:.2f}x",
                      f"{a.itl_p50_ms:.1f} / {b.itl_p50_ms:.1f}",
                      f"{w.draft_tokens} / {w.accepted_tokens}", rate,
                      "yes" if w.identical_text else "**no**"]))
    return [f"Speculation: `--speculative-config '{spec.speculative_config}'`.", "",
            *markdown_table("workload", ["without: tok/s", "with: tok/s", "speed-up",
                                         "ITL p50 per event (ms), without / with",
                                         "drafted / accepted", "acceptance",
                                         "identical text"], rows)]


def structured(folder: Path) -> list[str]:
    summary = json.loads((folder / "structured-summary.json").read_text())
    constrained, free = (level_by_order(folder, "structured-throughput", summary, "throughput"))
    alone, compiling = level_by_order(folder, "structured-enum-compile", summary,
                                      "enum-compile")
    assert constrained.throughput_tok_s and free.throughput_tok_s
    share = constrained.throughput_tok_s / free.throughput_tok_s
    valid = summary["validity"]
    return markdown_table("what", ["measured"], [
        ("30 concurrent JSON-schema answers that parse and validate",
         [f"{valid['valid']}/{valid['users']}"]),
        ("throughput, 30 constrained vs 30 free users of the same lengths",
         [f"{constrained.throughput_tok_s:.0f} vs {free.throughput_tok_s:.0f} tok/s "
          f"({share:.0%}); ITL p50 {constrained.itl_p50_ms:.1f} vs {free.itl_p50_ms:.1f} ms"]),
        ("10 free streams, ITL p50 / p99: alone vs while a new enum schema compiles",
         [f"{alone.itl_p50_ms:.1f} / {alone.itl_p99_ms:.1f} ms vs "
          f"{compiling.itl_p50_ms:.1f} / {compiling.itl_p99_ms:.1f} ms"]),
        ("the enum request (compiled on arrival), answered in",
         [f"{summary['enum_request_s']:.2f} s, HTTP {summary['enum_status']}"])])


def level_by_order(folder: Path, name: str, summary: dict, key: str) -> list[LevelResult]:
    """structured.py stores its two loads as levels of one run, in the order it names."""
    levels = run(folder, name).levels
    assert len(levels) == len(summary["levels_order"][key])
    return levels


def dashboard(folder: Path) -> list[str]:
    overhead = DashboardOverheadRun.load(folder / "dashboard/overhead.json")
    rows = []
    for page_open in (False, True):
        trials = [t for t in overhead.trials if t.page_open == page_open]
        mean = overhead.open_mean_tok_s if page_open else overhead.closed_mean_tok_s
        rows.append(("open" if page_open else "closed",
                     [", ".join(f"{t.level.throughput_tok_s:.1f}" for t in trials),
                      f"{mean:.1f}"]))
    return [*markdown_table("page", ["throughput of each load (tok/s)", "mean"], rows), "",
            f"With the page open the mean differs by {overhead.difference_pct:+.1f}%, while "
            f"loads of the same kind differ among themselves by up to {overhead.noise_pct:.1f}%:"
            " this run cannot resolve an overhead smaller than that spread."]


def soak(folder: Path) -> list[str]:
    report = json.loads((folder / "soak/soak-600s.json").read_text())
    counts, rss = report["client_counts"], report["rss_mib"]
    blocks = report["blocks_idle"]
    checks = [name for name, ok in report["checks"].items() if ok]
    return [*markdown_table("what", ["count"], [
        ("seconds of traffic, clients", [f"{report['duration_s']:.0f} s, {report['clients']}"]),
        ("requests started (bursts of 30)", [f"{counts['requests_started']:,} "
                                             f"({counts['bursts']})"]),
        ("completed with all their tokens", [f"{counts['completed']:,} "
                                             f"({report['tokens']:,} tokens)"]),
        ("streams dropped mid-way", [f"{counts['dropped']}"]),
        ("refused with 429 + Retry-After", [f"{counts['refused_429']}"]),
        ("bad requests, each a 4xx envelope", [f"{counts['bad_4xx']}"]),
        ("preemptions", [f"{report['preemptions']}"]),
        ("KV blocks when idle: used, free + cached-free = total",
         [f"{blocks['used']}; {blocks['free']} + {blocks['cached_free']} = {blocks['total']}"]),
        ("server RSS at start / after warm-up / at the end (MiB)",
         [f"{rss['start']:.0f} / {rss['warm']:.0f} / {rss['end']:.0f}"]),
        ("exit code after SIGTERM", [f"{report['exit_code']}"]),
        ("broken promises", [f"{len(report['violations'])}"])]),
        "", f"Checks that held ({len(checks)} of {len(report['checks'])}): "
        + "; ".join(checks) + "."]


PRECISIONS = ["fp32", "bf16", "q4_1"]
FLAGS = {"fp32": "", "bf16": " --dtype bfloat16", "q4_1": " --weights q4_1"}


def both_turns(folder: Path, name: str, users: int) -> list[LevelResult]:
    return [level(folder, f"engine-process/{name}-{turn}", users) for turn in (1, 2)]


def engine_process(folder: Path) -> list[str]:
    def cells(name: str, users: int, metric: str) -> str:
        return " / ".join(f"{getattr(x, metric):.1f}" for x in both_turns(folder, name, users))

    first = [(p, [cells(f"thread-{p}", 1, "itl_p50_ms"), cells(f"process-{p}", 1, "itl_p50_ms"),
                  cells(f"thread-{p}", 30, "throughput_tok_s"),
                  cells(f"process-{p}", 30, "throughput_tok_s")]) for p in PRECISIONS]
    second = [(p, [cells(f"process2t-{p}", 1, "itl_p50_ms"), cells(f"process2t-{p}", 1,
                                                                    "itl_p99_ms")])
              for p in PRECISIONS]
    second.append(("fp32, one thread below 16 tokens (same run)",
                   [cells("process-fp32-b", 1, "itl_p50_ms"),
                    cells("process-fp32-b", 1, "itl_p99_ms")]))
    return ["First run (each cell: turn 1 / turn 2; small steps on one thread in both):", "",
            *markdown_table("precision", ["1 user ITL p50 (ms), thread",
                                          "1 user ITL p50 (ms), process",
                                          "30 users tok/s, thread", "30 users tok/s, process"],
                            first), "",
            "Second run, the engine process with every step on both threads "
            "(`--single-thread-below 0`, the engine core process's default when this was "
            "measured; it now measures its threshold at the first start on a machine and "
            "caches it):", "",
            *markdown_table("precision", ["1 user ITL p50 (ms)", "1 user ITL p99 (ms)"],
                            second)]


def newest_roofline_per_cpu(folder: Path) -> dict[str, str]:
    """{CPU: the file under results/ of its newest roofline run}, for every CPU that has one."""
    newest: dict[str, RooflineRun] = {}
    names: dict[str, str] = {}
    for path in sorted((folder / "roofline").glob("*.json")):
        run = RooflineRun.load(path)
        cpu = run.machine.cpu
        if cpu not in newest or run.started_at > newest[cpu].started_at:
            newest[cpu], names[cpu] = run, f"roofline/{path.name}"
    return dict(sorted(names.items()))


def roofline_sections(folder: Path) -> list[Section]:
    """One section with a table per CPU, or none while results/roofline/ holds no run."""
    files = newest_roofline_per_cpu(folder)

    def body(folder: Path) -> list[str]:
        lines: list[str] = []
        for cpu, name in files.items():
            run = RooflineRun.load(folder / name)
            lines += [f"**{cpu}**, {run.threads} threads, best of {run.repeats} "
                      f"(`results/{name}`: `{run.command}`):", "", *roofline_tables(run), ""]
        return lines[:-1]

    if not files:
        return []
    return [Section(
        "Matmuls against this CPU's peaks (roofline)",
        "`benchmarks/roofline.py` measures the CPU's peaks on the engine's 2 threads (memory "
        "bandwidth: a streaming sum; compute: a large square GEMM through our kernel and "
        "torch, the best taken), then times each matmul path over one decode step's matmuls "
        "(30 layers' qkv, o_proj, gate_up, down + LM head, the default model's shapes) at "
        "each row count. GFLOP/s is 2·M·N·K over the pass's time, GB/s the weight and "
        "activation bytes over it; a pass whose FLOP per byte is below the ridge point "
        "(compute peak / bandwidth) is memory bound, above it compute bound, and *% of "
        "roofline* is GFLOP/s over the lower of the two roofs at that intensity. q4_1 is "
        "held against the fp32 compute peak (it dequantizes and multiplies in fp32).",
        ["python3 benchmarks/roofline.py"], list(files.values()), body)]


def fixed_sections(folder: Path) -> list[Section]:
    llama_ratio = {p: ratio(folder, f"nano-vllm{s}", f"llama-cpp-{p}", 30)
                   for p, s in (("f32", ""), ("bf16", "-bf16"), ("q4_1", "-q4_1"))}
    base_ratio = ratio(folder, "nano-vllm-vs-baseline", "baseline", 30)
    kernels_ratio = ratio(folder, "nano-vllm", "baseline-with-our-kernels", 30)
    fixed = [
        Section(
            "Against llama.cpp, on the same weights",
            "llama.cpp's `llama-server` serves the same model in the same three forms (built "
            "and run as [peers.md](peers.md#llamacpp-how-it-was-built-and-run) describes); "
            "both servers see the same load.",
            [f"{SERVER}                  & {BENCH} --label nano-vllm      --users 1 30 "
             "--max-tokens 100 --rounds 2",
             f"{SERVER} --dtype bfloat16 & {BENCH} --label nano-vllm-bf16 --users 1 30 "
             "--max-tokens 100 --rounds 2",
             f"{SERVER} --weights q4_1   & {BENCH} --label nano-vllm-q4_1 --users 1 30 "
             "--max-tokens 100 --rounds 2",
             'USERS="1 30" ROUNDS=2 bash benchmarks/llama_cpp.sh bench results'],
            ["nano-vllm.json", "llama-cpp-f32.json", "nano-vllm-bf16.json",
             "llama-cpp-bf16.json", "nano-vllm-q4_1.json", "llama-cpp-q4_1.json"],
            pairs(("fp32", "nano-vllm", "llama-cpp-f32"),
                  ("bf16", "nano-vllm-bf16", "llama-cpp-bf16"),
                  ("The model's own 4-bit weights", "nano-vllm-q4_1", "llama-cpp-q4_1")),
            after=f"At 30 users nano-vLLM serves {llama_ratio['f32']:.2f}x (fp32), "
            f"{llama_ratio['bf16']:.2f}x (bf16) and {llama_ratio['q4_1']:.2f}x (q4_1) "
            "llama.cpp's throughput: one batched GEMM pass over the weights serves every user. "
            "For one user llama.cpp is ahead: see [performance.md](performance.md) for where "
            "the milliseconds go."),
        Section(
            "Against the baseline",
            "The baseline (`baseline_server.py`) is the fixed yardstick: per-user KV caches "
            "padded and concatenated every step, PyTorch's model math. One server after the "
            "other, in one run.",
            [f"{SERVER}          & {BENCH} --label nano-vllm-vs-baseline --users 1 10 30 "
             "--max-tokens 100",
             f"python3 baseline_server.py --port 8123 & {BENCH} --label baseline "
             "--users 1 10 30 --max-tokens 100"],
            ["nano-vllm-vs-baseline.json", "baseline.json", "baseline-with-our-kernels.json"],
            pair("nano-vllm-vs-baseline", "baseline"),
            after=f"{base_ratio:.2f}x at 30 users. An earlier run whose baseline still loaded "
            f"our kernels (`results/baseline-with-our-kernels.json`) isolates the engine's own "
            f"share (paged cache, batched prefill, no per-step copies): {kernels_ratio:.2f}x at "
            "30 users.",
            charts=["throughput.png", "ttft.png", "itl.png"]),
        Section(
            "The engine core in its own process",
            "The same server with the engine on a thread of the HTTP process "
            "(`--no-engine-process`; the default when this was measured) and in a process of "
            "its own (`--engine-process`, the default now), in turns, 100 tokens per user. "
            "In its own process the engine no longer shares the GIL with the HTTP loop, so "
            "two OpenMP threads pay off even for one user's steps.",
            ["python3 benchmarks/side_by_side.py results/engine-process "
             + " ".join(f'"thread-{p}=server.py --no-engine-process{FLAGS[p]}" '
                        f'"process-{p}=server.py '
                        f'--engine-process{FLAGS[p]}"' for p in PRECISIONS)
             + " --turns 2 -- --users 1 30 --max-tokens 100",
             "python3 benchmarks/side_by_side.py results/engine-process "
             + " ".join(f'"process2t-{p}=server.py --engine-process --single-thread-below 0'
                        f'{FLAGS[p]}"' for p in PRECISIONS)
             + ' "process-fp32-b=server.py --engine-process --single-thread-below 16"'
             + " --turns 2 -- --users 1 --max-tokens 100"],
            [f"engine-process/{k}-{p}-{t}.json" for k in ("thread", "process", "process2t")
             for p in PRECISIONS for t in (1, 2)]
            + ["engine-process/process-fp32-b-1.json", "engine-process/process-fp32-b-2.json"],
            engine_process,
            after="For comparison, llama.cpp's server on the same weights (an earlier run on "
            "the same CPU kind, [above](#against-llamacpp-on-the-same-weights)): 1 user ITL p50 "
            + ", ".join(f"{level(folder, f'llama-cpp-{n}', 1).itl_p50_ms:.1f} ms ({p})"
                        for p, n in (("fp32", "f32"), ("bf16", "bf16"), ("q4_1", "q4_1")))
            + ". Those are figures from different runs; the next section has both servers in one "
            "run."),
        Section(
            "Against llama.cpp, with the engine in its own process",
            "nano-vLLM with `--engine-process` and llama.cpp's server on the same weights, one "
            "after the other in one run.",
            ["python3 benchmarks/side_by_side.py results/vs-llama-cpp "
             + " ".join(f'"nano-vllm-process-{p}=server.py --engine-process{FLAGS[p]}"'
                        for p in PRECISIONS)
             + " -- --users 1 30 --max-tokens 100 --rounds 2",
             'USERS="1 30" ROUNDS=2 bash benchmarks/llama_cpp.sh bench results/vs-llama-cpp'],
            [f"vs-llama-cpp/{n}.json" for p, k in (("fp32", "f32"), ("bf16", "bf16"),
                                                   ("q4_1", "q4_1"))
             for n in (f"nano-vllm-process-{p}", f"llama-cpp-{k}")],
            pairs(("fp32", "vs-llama-cpp/nano-vllm-process-fp32", "vs-llama-cpp/llama-cpp-f32"),
                  ("bf16", "vs-llama-cpp/nano-vllm-process-bf16",
                   "vs-llama-cpp/llama-cpp-bf16"),
                  ("q4_1", "vs-llama-cpp/nano-vllm-process-q4_1",
                   "vs-llama-cpp/llama-cpp-q4_1"))),
        Section(
            "The default server against the baseline, last measured",
            "The comparison repeated on a later tree (its defaults: the engine core in its own "
            "process, fp32, 100 tokens per user; the baseline's core in its own process too), "
            "one server after the other: the default path against the fixed yardstick.",
            ["python3 benchmarks/side_by_side.py results/baseline-check nano=server.py "
             "base=baseline_server.py -- --users 1 30 --max-tokens 100"],
            ["baseline-check/nano.json", "baseline-check/base.json"],
            pair("baseline-check/nano", "baseline-check/base")),
        Section(
            "Against the first engine",
            "The first engine (commit `bd9fa3b`, checked out beside this one) served in the "
            "same run as the llama.cpp comparison.",
            ["git worktree add --detach /tmp/first-engine bd9fa3b",
             "(cd /tmp/first-engine && python3 server.py --port 8123) & "
             f"{BENCH} --label nano-vllm-first-engine --users 1 30 --max-tokens 100 --rounds 2"],
            ["nano-vllm.json", "nano-vllm-first-engine.json"],
            pair("nano-vllm", "nano-vllm-first-engine")),
        Section(
            "Start-up",
            "A first start with no compiled kernels and no cached thread choice (the kernels "
            "compile, the engine core measures its threads), and a later one that reads both; "
            "the default model already prepared (`benchmarks/startup.py`, step 0 of "
            "`benchmarks/run_all.sh`).",
            ["python3 benchmarks/startup.py results/startup nano-vllm=server.py"],
            ["startup/nano-vllm.json"], startups("startup", "nano-vllm")),
        Section(
            "The step restructure: before and after",
            "One step became schedule, execute, update; both checkouts served the same load, "
            "alternating A B A B, in one run.",
            ["git worktree add --detach /tmp/before bd9fa3b && "
             "git worktree add --detach /tmp/after 94e210a",
             "python3 benchmarks/side_by_side.py results/restructure before=/tmp/before/server.py "
             "after=/tmp/after/server.py --turns 2 -- --users 1 30 --max-tokens 100"],
            [f"restructure/{n}-{i}.json" for n in ("before", "after") for i in (1, 2)],
            restructure),
        Section(
            "Prefix caching: a ~660-token system prompt shared by 30 users",
            "With the cache the shared prompt is computed once, by the first user: the others "
            "wait the step it takes for its last blocks to be cached rather than compute them "
            "alongside it, then each prefills its own ~20 tokens and (in this run, before a "
            "partly matching block was copied from a seated request) the shared prompt's "
            "last, partly filled block; without it each user prefills its whole ~690-token "
            "prompt.",
            [f"{SERVER}                   & {BENCH} --label prefix-cache-on  --users 30 "
             "--max-tokens 100 --system-repeats 50",
             f"{SERVER} --no-prefix-cache & {BENCH} --label prefix-cache-off --users 30 "
             "--max-tokens 100 --system-repeats 50"],
            ["prefix-cache-on.json", "prefix-cache-off.json"],
            pair("prefix-cache-on", "prefix-cache-off"), charts=["prefix_ttft.png"]),
        Section(
            "Shared prompt: the obvious knobs",
            "The same load against four servers, one after the other: a smaller per-step "
            "token budget and bf16, measured before newcomers waited for the shared prompt's "
            "last blocks (section above). None of these brought TTFT p50 to 1 s; what did was "
            "no longer computing the shared prompt's tail alongside the first user "
            "(docs/performance.md, Prefill attention).",
            ["python3 server.py --port 8127 [--dtype bfloat16] [--max-num-batched-tokens 256] "
             "& python3 benchmarks/bench.py --url http://127.0.0.1:8127 --label LABEL "
             "--results-dir results/prefix-options --users 30 --max-tokens 100 "
             "--system-repeats 50"],
            [f"prefix-options/{name}.json" for name, _ in PREFIX_OPTIONS], prefix_options),
        Section(
            "Batched, chunked prefill against one newcomer per step",
            "With fast matmuls a ~25-token prompt costs little more than a decode step, so "
            "batching newcomers mostly cuts the tail (TTFT p99).",
            [f"{SERVER}                           & {BENCH} --label prefill-batched       "
             "--users 10 30 --max-tokens 100 --rounds 2",
             f"{SERVER} --max-prefills-per-step 1 & {BENCH} --label prefill-one-at-a-time "
             "--users 10 30 --max-tokens 100 --rounds 2"],
            ["prefill-batched.json", "prefill-one-at-a-time.json"],
            pair("prefill-batched", "prefill-one-at-a-time"), charts=["prefill_ttft.png"]),
        Section(
            "Preemption under a small pool",
            "64 blocks hold 1,024 tokens, about a third of what 30 users of ~125 tokens need "
            "at once. That preemption leaves the answers unchanged is checked token for token "
            "by `tests/engine/test_engine.py`.",
            [f"{SERVER} --num-blocks 64 & {BENCH} --label preemption-64-blocks --users 30 "
             "--max-tokens 100",
             "curl -s http://127.0.0.1:8123/metrics | grep -E "
             "'^nano_vllm:(num_preemptions_total|request_success_total)'"],
            ["preemption-64-blocks.json", "preemption_metrics.txt"], preemption),
        Section(
            "Where a decode step's time goes",
            "`benchmarks/profile_decode.py` runs real decode steps through the model runner "
            "over a pool filled as if every user had `context` tokens, on 2 threads, first "
            "unprofiled (the **decode step** row), then under `torch.profiler` with each part "
            "in a named scope; parts add up to the profiled step (**sum of parts**, higher by "
            "the profiler's own cost). *Attention* includes writing the new K/V.",
            ["python3 benchmarks/profile_decode.py --users 1 30 --contexts 100 1000 "
             "--out results/profile_decode.json",
             "python3 benchmarks/profile_decode.py --dtype bfloat16 --users 1 30 --contexts "
             "100 1000 --out results/profile_decode_bf16.json"],
            ["profile_decode.json", "profile_decode_bf16.json"], profiles),
        Section(
            "Speculative decoding",
            "The same server without and then with n-gram speculation, greedy, streamed "
            "through the API. *copy*: chat tasks that repeat their input with small changes; "
            "*free*: open questions; 30 users: bench.py's load, where no step drafts (more "
            "seated requests than `disable_by_batch_size`). tok/s is completion tokens over "
            "the requests' summed time.",
            ["python3 benchmarks/spec_decode.py"], ["spec-decode.json"], spec_decode),
        Section(
            "Structured outputs under load",
            "30 users asking for answers constrained by one JSON schema (an object with a "
            "title, a rating 1-5, an enum, a nested object, an array of tags and a "
            "120-240-character summary) against 30 free users of the same lengths; then 10 "
            "free streams alone and while a request with a new 1,000-value enum compiles.",
            ["python3 server.py --port PORT & "
             "python3 benchmarks/structured.py --url http://127.0.0.1:PORT --label structured"],
            ["structured-throughput.json", "structured-enum-compile.json",
             "structured-summary.json"], structured),
        Section(
            "The dashboard's cost to the engine",
            "30 users starting together, 100 tokens each, fp32, one server, loads alternately "
            "without and with a subscriber reading every frame of `/dashboard/events`; the "
            "first, uncounted load fills the prefix cache.",
            ["python3 server.py --port 8123 &",
             "python3 benchmarks/studies/dashboard_overhead.py --url http://127.0.0.1:8123 "
             "--pairs 5 --results-dir results/dashboard --label overhead"],
            ["dashboard/overhead.json"], dashboard),
        Section(
            "Soak: ten minutes of mixed traffic",
            "`benchmarks/soak.py` starts `server.py` with a small pool and a short line (to "
            "force preemption and refusals) and runs mixed clients for the whole duration: "
            "streamed and plain completions and chats, long prompts, dropped streams, bad "
            "requests and bursts past the cap; then it checks every promise and sends SIGTERM.",
            ["python3 -m benchmarks.soak --duration 600 --out results/soak/soak-600s.json"],
            ["soak/soak-600s.json"], soak),
    ]
    return [*fixed, *roofline_sections(folder)]


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")
