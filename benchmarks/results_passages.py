"""The results passages outside docs/results.md (see benchmarks/results_blocks.py): README.md's
Results table and the figures other pages of docs/ quote, every one from results/."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from benchmarks.results import InterleavedRun, RooflineRun, ServedOverheadRun, StartupRun
from benchmarks.results_gguf import turns as gguf_turns
from benchmarks.results_page import anchor, level, level_by_order, ratio, run
from benchmarks.results_sections import INTERLEAVED, LLAMA_KIND, ORDERS, turns_table
from benchmarks.tables import markdown_table

# The sections of docs/results.md that README.md's table links to.
BASELINE_TITLE = "The default server against the baseline, last measured"
ONE_USER_TITLE = "One user against llama.cpp, interleaved"
PROCESS_TITLE = "Against llama.cpp, with the engine in its own process"
BOTH_ORDERS_TITLE = "One user against llama.cpp, each server started first in turn"
THIRTY_TITLE = "30 users against llama.cpp, interleaved"
GEMMA_TITLE = "Gemma 3 270M against llama.cpp on the same GGUF"
VLLM_TITLE = "Against vLLM's CPU build on the same weights"
VLLM_INTEL_TITLE = "Against vLLM's CPU build on an Intel Xeon"


def results_link(text: str, title: str) -> str:
    return f"[{text}](docs/results.md#{anchor(title)})"


def cpu(folder: Path, name: str) -> str:
    return json.loads((folder / name).read_text())["machine"]["cpu"]


def day(folder: Path, *names: str) -> str:
    """The day (or days) the runs in these files started."""
    days = sorted({json.loads((folder / n).read_text())["started_at"][:10] for n in names})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def span(values: list[float], digits: int = 2, unit: str = "") -> str:
    """'a-b' (or 'a' where both round alike), each to `digits` decimals."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def interleaved(folder: Path, name: str) -> InterleavedRun:
    return InterleavedRun.load(folder / name / "interleaved.json")


def per_turn(r: InterleavedRun, ours: str, theirs: str) -> list[float]:
    """`ours` throughput over `theirs`, turn by turn."""
    return [a / b for a, b in zip(r.throughput_tok_s[ours], r.throughput_tok_s[theirs],
                                  strict=True)]


def same_cpu(folder: Path, *names: str) -> str:
    """The CPU these files name, which must be one and the same."""
    cpus = {cpu(folder, name) for name in names}
    assert len(cpus) == 1, (names, cpus)
    return cpus.pop()


def one_run(folder: Path, ours: str, theirs: str) -> tuple[float, float]:
    """One bench.py run each: the peer's 1-user ITL p50 over ours, our 30-user throughput
    over the peer's."""
    a, b = level(folder, ours, 1), level(folder, theirs, 1)
    return b.itl_p50_ms / a.itl_p50_ms, ratio(folder, ours, theirs, 30)


def one_user_in_turns(folder: Path, *names: str) -> float:
    """Servers up at once, in turns: llama.cpp's ITL p50 over ours, median of the turns."""
    return statistics.median(x for n in names
                             for x in interleaved(folder, n).ratios("llama-cpp", "nano-vllm"))


def thirty_in_turns(folder: Path, name: str, ours: str = "nano-vllm") -> float:
    """Servers up at once, in turns: our throughput over llama.cpp's, median of the turns."""
    return statistics.median(per_turn(interleaved(folder, name), ours, "llama-cpp"))


def readme_rows(folder: Path) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """README.md's table: a row per peer, CPU and precision; and the files it reads."""
    rows: list[tuple[str, list[str]]] = []
    files: list[str] = []

    def add(peer: str, precision: str, one: float | None, thirty: str, source: str,
            *read: str) -> None:
        files.extend(read)
        rows.append((peer, [same_cpu(folder, *read), precision,
                            "-" if one is None else f"{one:.2f}x", thirty, source]))

    def one_run_row(peer: str, precision: str, ours: str, theirs: str, source: str) -> None:
        one, thirty = one_run(folder, ours, theirs)
        add(peer, precision, one, f"{thirty:.2f}x", source, f"{ours}.json", f"{theirs}.json")

    one_run_row("`baseline_server.py`", "fp32", "baseline-check/nano", "baseline-check/base",
                results_link("one run", BASELINE_TITLE))
    for p, k in LLAMA_KIND.items():
        ours, theirs = f"vs-llama-cpp/nano-vllm-process-{p}", f"vs-llama-cpp/llama-cpp-{k}"
        add("llama.cpp", p, one_user_in_turns(folder, f"one-user-interleaved/{p}"),
            f"{ratio(folder, ours, theirs, 30):.2f}x",
            f"{results_link('1 user in turns', ONE_USER_TITLE)}, "
            f"{results_link('30 users one run', PROCESS_TITLE)}",
            f"one-user-interleaved/{p}/interleaved.json", f"{ours}.json", f"{theirs}.json")
    for p, k in LLAMA_KIND.items():
        orders = [f"one-user-both-orders/{p}/{o}" for o in ORDERS]
        thirty = f"vs-llama-cpp-30-users/{k}"
        add("llama.cpp", p + " ¹" * (p == "q4_1"), one_user_in_turns(folder, *orders),
            f"{thirty_in_turns(folder, thirty):.2f}x" + " ²" * (p == "fp32"),
            f"{results_link('1 user in turns', BOTH_ORDERS_TITLE)}, "
            f"{results_link('30 users in turns', THIRTY_TITLE)}",
            *(f"{n}/interleaved.json" for n in (*orders, thirty)))
    zen3 = "[in turns ³](docs/performance.md#our-cpu-kernels)"
    for p, k in LLAMA_KIND.items():
        one, thirty = f"zen3-one-user/{p}", f"zen3-30-users/{k}"
        add("llama.cpp", p, one_user_in_turns(folder, one),
            f"{thirty_in_turns(folder, thirty):.2f}x", zen3, f"{one}/interleaved.json",
            f"{thirty}/interleaved.json")
    add("llama.cpp", "q4_1, `--activations int8`", None,
        f"{thirty_in_turns(folder, 'zen3-30-users/q4_1', 'nano-vllm-int8act'):.2f}x", zen3,
        "zen3-30-users/q4_1/interleaved.json")
    one_run_row("llama.cpp, same Gemma 3 270M GGUF", "the file's Q4_K_M codes (`--weights q4_1`)",
                "gemma/nano-vllm-gemma-codes", "gemma/llama-cpp-gemma-3-270m",
                results_link("one run", GEMMA_TITLE))
    gguf = "gguf-qwen2.5-coder-0.5b"
    turns = gguf_turns(folder / gguf)
    one = statistics.median(level(folder, f"{gguf}/llama-cpp-{t}", 1).itl_p50_ms
                            / level(folder, f"{gguf}/nano-vllm-{t}", 1).itl_p50_ms
                            for t in turns)
    thirty = statistics.median(ratio(folder, f"{gguf}/nano-vllm-{t}",
                                     f"{gguf}/llama-cpp-{t}", 30) for t in turns)
    add("llama.cpp, same Qwen2.5-Coder-0.5B Q4_K_M GGUF", "the file's codes (the default)", one,
        f"{thirty:.2f}x", "[in turns](docs/gguf.md#against-llamacpp-on-the-same-file)",
        *(f"{gguf}/{s}-{t}.json" for s in ("nano-vllm", "llama-cpp") for t in turns))
    for sub, title in (("vs-vllm", VLLM_TITLE), ("vs-vllm-intel", VLLM_INTEL_TITLE)):
        for p, k in (("fp32", "f32"), ("bf16", "bf16")):
            one_run_row("vLLM's CPU build", p, f"{sub}/nano-vllm-{p}", f"{sub}/vllm-cpu-{k}",
                        results_link("one run", title))
    return rows, files


def readme_results(folder: Path) -> str:
    """README.md's Results table, its footnotes and what a row's method means."""
    rows, files = readme_rows(folder)
    table = markdown_table("against", ["CPU (as it names itself)", "precision",
                                       "1 user: peer's ITL p50 ÷ ours",
                                       "30 users: our tok/s ÷ peer's", "from"], rows)
    later = [statistics.median(per_turn(interleaved(folder, f"{sub}/{x}"), "nano-vllm",
                                        "llama-cpp"))
             for sub, xs in (("vs-llama-cpp-30-users-orders", ORDERS),
                             ("vs-llama-cpp-30-users-clients", ("httpx", "aiohttp")))
             for x in xs]
    same = interleaved(folder, "interleaved-identical-30-users")
    same_medians = [statistics.median(t) for t in same.throughput_tok_s.values()]
    turns = list(zip(*same.throughput_tok_s.values(), strict=True))
    notes = [
        "¹ llama.cpp with `--no-repack` (its Q4_1 repacking crashed loading that file on this "
        "CPU).",
        f"² Later fp32 runs: {span(later, unit='x')} at 30 users (a run's median), by which "
        "server started first and which load generator ran.",
        "³ AVX2 only (Zen 3), measured before the AVX2 path read a row's panels side by side.",
        "In turns: both servers up at once, each given the load in turn, the median of the "
        "per-turn ratios; one run: one after the other, rougher (identical servers in turns: "
        f"medians {max(same_medians) / min(same_medians) - 1:.0%} apart, single turns up to "
        f"{max(1 - min(t) / max(t) for t in turns):.0%}). Runs {day(folder, *files)}.",
    ]
    return "\n".join([*table, "", *(wrap(f"* {note}") for note in notes)])


def engine_process_gains(folder: Path) -> list[float]:
    """30-user throughput in the engine's own process over in-process, two turns summed,
    one per precision."""
    def total(kind: str, p: str) -> float:
        return sum(level(folder, f"engine-process/{kind}-{p}-{t}", 30).throughput_tok_s or 0
                   for t in (1, 2))

    return [total("process", p) / total("thread", p) for p in INTERLEAVED]


def engine_process_side_by_side(folder: Path) -> str:
    """docs/engine-process.md's summary of the side-by-side runs."""
    return wrap(
        "Measured side by side, against the in-process engine and against llama.cpp's server, "
        "in [results.md](results.md#the-engine-core-in-its-own-process): 30 users "
        f"{span(engine_process_gains(folder), unit='x')} the in-process throughput (mean of two "
        f"turns, {day(folder, 'engine-process/process-fp32-1.json')}); one user's ITL p50 "
        "against llama.cpp's in the [section after it](results.md#against-llamacpp-with-the-"
        "engine-in-its-own-process).", 95, continued="")


def wrap(bullet: str, width: int = 96, continued: str = "  ") -> str:
    """A bullet (or paragraph) on lines of at most `width` characters (but for a longer code
    span), each after the first led by `continued`; a code span stays on one line."""
    words, lines, line = re.findall(r"(?:[^\s`]*`[^`]*`)+[^\s`]*|\S+", bullet), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = continued + word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def tools_under_load(folder: Path) -> str:
    """docs/api.md's tool calls under load."""
    summary = json.loads((folder / "tools/tools-summary.json").read_text())
    constrained, free = level_by_order(folder, "tools/tools-throughput", summary, "throughput")
    alone, known, new = level_by_order(folder, "tools/tools-enum-compile", summary,
                                       "enum-compile")
    assert constrained.throughput_tok_s and free.throughput_tok_s
    valid = summary["validity"]
    run_day = run(folder, "tools/tools-throughput").started_at[:10]
    return wrap(
        f"On the {summary['machine']['cpu']} ({run_day}, one run): every call's arguments "
        f"validated ({valid['valid']}/{valid['users']}), and the tool-calling users got "
        f"{constrained.throughput_tok_s / free.throughput_tok_s:.0%} of the free users' "
        "throughput. A new tool's grammar compiles on worker threads, in the API process and "
        "in the engine core process, so it does not hold up a step; what a new tool does cost "
        "the running streams is its prompt, since the tool's schema is rendered into it: "
        "beside a ~1,500-token prompt prefilled in 512-token chunks, the streams' ITL p99 went "
        f"from {alone.itl_p99_ms:.0f} ms to {known.itl_p99_ms:.0f} ms with the grammar already "
        f"compiled and to {new.itl_p99_ms:.0f} ms with it compiling.", width=95, continued="")


def amx_30_users(folder: Path) -> str:
    """docs/performance.md's bf16 with and without AMX against fp32, 30 users."""
    name = "amx-30-users/interleaved.json"
    r = InterleavedRun.load(folder / name)
    faster = statistics.median(per_turn(r, "bf16", "fp32"))
    without = statistics.median(per_turn(r, "bf16-no-amx", "fp32"))
    return "\n".join([
        f"{r.machine.cpu}, {r.started_at[:10]} (`results/amx-30-users/`):", "",
        *turns_table(name, folder), "",
        wrap(f"So on this CPU bf16 serves 30 users {faster:.2f}x as fast as fp32 (median of "
             f"the turns), where without AMX it served {without:.2f}x.", 94, continued="")])


def load_generator_share(folder: Path) -> str:
    """docs/engine-process.md's one user against llama.cpp through either client."""
    def medians(sub: str) -> str:
        return ", ".join(
            f"{p} {statistics.median(interleaved(folder, f'{sub}/{p}').ratios('nano-vllm', 'llama-cpp')):.3f}"  # noqa: E501
            for p in INTERLEAVED)

    aio, httpx = "one-user-interleaved-aiohttp", "one-user-interleaved"
    return wrap(
        "The lighter client does not change who streams faster: it takes about as much off both "
        "servers. One user against llama.cpp, both up at once, ten turns, our ITL p50 over "
        "theirs within a turn, median of the turns, through aiohttp "
        f"({interleaved(folder, f'{aio}/fp32').started_at[:16].replace('T', ' ')}): "
        f"{medians(aio)}; through httpx, a run later that day "
        f"({interleaved(folder, f'{httpx}/fp32').started_at[:16].replace('T', ' ')}): "
        f"{medians(httpx)} ([results.md](results.md#one-user-against-llamacpp-interleaved) "
        "and the section after it). The spread between runs is as large as the differences.",
        95, continued="")


def vllm_intel(folder: Path) -> str:
    """docs/peers.md's vLLM's CPU build on the Intel Xeon: ratios and what bf16 gains."""
    sub = "vs-vllm-intel"
    thirty = {p: (level(folder, f"{sub}/nano-vllm-{p}", 30),
                  level(folder, f"{sub}/vllm-cpu-{k}", 30))
              for p, k in (("fp32", "f32"), ("bf16", "bf16"))}
    ratios = " and ".join(f"{ours.throughput_tok_s / theirs.throughput_tok_s:.2f}x in {p}"
                          for p, (ours, theirs) in thirty.items()
                          if ours.throughput_tok_s and theirs.throughput_tok_s)
    (ours32, theirs32), (ours16, theirs16) = thirty["fp32"], thirty["bf16"]
    more = theirs32.itl_p50_ms / theirs16.itl_p50_ms > ours32.itl_p50_ms / ours16.itl_p50_ms
    later = run(folder, f"{sub}/nano-vllm-bf16").started_at[:16].replace("T", " ")
    return wrap(
        f"there 30 users {ratios} vLLM's throughput (the bf16 pair from a later run on a later "
        f"tree, {later}). vLLM gains {'more' if more else 'less'} from "
        f"bf16 than we do there, its 30-user ITL p50 falling from {theirs32.itl_p50_ms:.1f} ms "
        f"in fp32 to {theirs16.itl_p50_ms:.1f} in bf16 "
        f"({theirs32.itl_p50_ms / theirs16.itl_p50_ms:.1f}x), ours from "
        f"{ours32.itl_p50_ms:.1f} to {ours16.itl_p50_ms:.1f} "
        f"({ours32.itl_p50_ms / ours16.itl_p50_ms:.1f}x).", 95, continued="")


def gemma_served(folder: Path) -> str:
    """docs/models.md's Gemma 3 270M beside llama.cpp on the same file."""
    theirs = "gemma/llama-cpp-gemma-3-270m"
    ours = {"codes": "gemma/nano-vllm-gemma-codes", "q8head": "gemma/nano-vllm-gemma-q8head",
            "fp32": "gemma/nano-vllm-gemma"}
    one = {k: level(folder, n, 1) for k, n in ours.items()}
    them1, them30 = level(folder, theirs, 1), level(folder, theirs, 30)
    thirty = {k: level(folder, n, 30).throughput_tok_s or 0 for k, n in ours.items()}
    assert them30.throughput_tok_s
    return wrap(
        f"Served beside llama.cpp on the same file ({cpu(folder, theirs + '.json')}, one run, "
        f"{day(folder, theirs + '.json')}, idle machine, "
        "[results.md](results.md#gemma-3-270m-against-llamacpp-on-the-same-gguf)): at one user "
        f"the ITL p50 is {one['codes'].itl_p50_ms:.1f} ms with `--weights q4_1` (the file's own "
        f"codes, below) against llama.cpp's {them1.itl_p50_ms:.1f} ms "
        f"({one['codes'].throughput_tok_s:.1f} vs {them1.throughput_tok_s:.1f} tok/s), "
        f"{one['q8head'].itl_p50_ms:.1f} ms with `--lm-head q8_0` and "
        f"{one['fp32'].itl_p50_ms:.1f} ms with the fp32 model; at 30 users "
        f"{thirty['codes']:.0f} tok/s on the codes, {thirty['fp32']:.0f} in fp32 and "
        f"{thirty['q8head']:.0f} with `--lm-head q8_0`, against {them30.throughput_tok_s:.0f} ("
        + ", ".join(f"{thirty[k] / them30.throughput_tok_s:.2f}x"
                    for k in ("codes", "fp32", "q8head"))
        + "). 30-user throughput moves between runs on this machine, so these are one run's "
        "ratios, not exact ones.", 95, continued="")


def int8act_served(folder: Path) -> str:
    """docs/quantized.md's int8 activations served to 30 users on AMD."""
    turns = [ratio(folder, f"int8act/int8act-{t}", f"int8act/q4_1-{t}", 30) for t in (1, 2)]
    return wrap(
        f"Served to 30 users the mode gives {turns[0]:.2f}x and {turns[1]:.2f}x the exact "
        f"path's throughput in two turns ({cpu(folder, 'int8act/q4_1-1.json')}, "
        f"{day(folder, 'int8act/q4_1-1.json')}, "
        "[results.md](results.md#int8-activations-for-the-4-bit-weights)).", 95, continued="")


def int8act_intel_served(folder: Path) -> str:
    """docs/quantized.md's int8 activations served to 30 users on the Intel Xeon."""
    intel = interleaved(folder, "int8act-intel")
    per = per_turn(intel, "int8act", "q4_1")
    over = sum(intel.throughput_tok_s["int8act"]) / sum(intel.throughput_tok_s["q4_1"])
    return wrap(
        "Served to 30 users, both servers up at once and given the load in turns, the page "
        f"cache dropped first ({intel.started_at[:10]}): {span(per, unit='x')} the exact "
        f"path's throughput per turn, {over:.2f}x over the {len(per)} turns, ITL p50 "
        f"{statistics.median(intel.itl_p50_ms['int8act']):.1f} against "
        f"{statistics.median(intel.itl_p50_ms['q4_1']):.1f} ms (median of the turns; "
        "[results.md](results.md#int8-activations-at-30-users-on-an-intel-xeon)).",
        95, continued="")


def bf16_without_amx_served(folder: Path) -> str:
    """docs/performance.md's bf16 with AMX off, by FMAs and by `vdpbf16ps`, against fp32."""
    r = interleaved(folder, "bf16-without-amx")
    tput = r.throughput_tok_s

    def itl(label: str) -> str:
        return f"{statistics.median(r.ratios(label, 'fp32')):.3f}x"

    return wrap(
        "Served, 30 users x 100 tokens, fp32 and three bf16 servers up at once, in turns, the "
        f"page cache dropped first ({r.started_at[:10]}, "
        "[results.md](results.md#bf16-without-amx-fmas-where-vdpbf16ps-is-slow)): bf16 with AMX "
        f"off {span(tput['bf16'], 0)} tok/s against fp32's {span(tput['fp32'], 0)} (ITL "
        f"{itl('bf16')} fp32's per turn, median), where `vdpbf16ps` alone gave "
        f"{span(tput['bf16-dot'], 0)} ({itl('bf16-dot')}); with AMX, "
        f"{span(tput['bf16-amx'], 0)}.", 94, continued="")


def zen3_30_users(folder: Path) -> str:
    """docs/performance.md's 30 users against llama.cpp on Zen 3, and the roofline's why."""
    runs = {p: interleaved(folder, f"zen3-30-users/{k}") for p, k in LLAMA_KIND.items()}

    def turns(r: InterleavedRun, label: str) -> str:
        return ", ".join(f"{t:.1f}" for t in r.throughput_tok_s[label])

    rows = [(p, [turns(r, "nano-vllm"), turns(r, "llama-cpp")]) for p, r in runs.items()]
    rows.append(("q4_1, `--activations int8`", [turns(runs["q4_1"], "nano-vllm-int8act"),
                                                "(the q4_1 row's)"]))
    ours = {p: per_turn(r, "nano-vllm", "llama-cpp") for p, r in runs.items()}
    four_bit = ours["q4_1"] + per_turn(runs["q4_1"], "nano-vllm-int8act", "llama-cpp")
    roof = RooflineRun.load(folder / "roofline/amd-epyc-family-25-model-1.json")
    fp32, bf16 = roof.peak("float32"), roof.peak("bfloat16")
    at30 = {c.path: c for c in roof.cells if c.rows == 30}
    return "\n".join([
        *markdown_table("precision", ["nano-vLLM tok/s per turn", "llama.cpp tok/s per turn"],
                        rows), "",
        wrap(f"So on this CPU ({runs['fp32'].started_at[:10]}) we serve 30 users "
             f"{span(ours['fp32'], unit='x')} llama.cpp's throughput per turn in fp32 and "
             f"{span(ours['bf16'], unit='x')} in bf16, and {span(four_bit, unit='x')} with the "
             "4-bit weights. The roofline below says why (`results/roofline/`): at 30 rows the "
             f"step's matmuls are compute bound, and our fp32 kernel reaches "
             f"{at30['ours-fp32'].of_compute:.0%} of the fastest {fp32.gemm_size}^3 GEMM "
             f"measured there (torch's, {fp32.best_gflops:.0f} GFLOP/s; ours "
             f"{fp32.gflops_by_path['ours']:.0f} at that size), bf16 (widened to fp32, the same "
             f"FMAs) {at30['ours-bf16'].of_compute:.0%} of our own "
             f"({bf16.best_gflops:.0f} GFLOP/s).", 94, continued="")])


def zen3_one_user(folder: Path) -> str:
    """docs/performance.md's one user against llama.cpp on Zen 3."""
    parts = []
    for p in INTERLEAVED:
        r = interleaved(folder, f"zen3-one-user/{p}")
        parts.append(f"{statistics.median(r.ratios('llama-cpp', 'nano-vllm')):.3f} in {p} "
                     f"(ours {statistics.median(r.itl_p50_ms['nano-vllm']):.1f} ms, theirs "
                     f"{statistics.median(r.itl_p50_ms['llama-cpp']):.1f})")
    day_ = interleaved(folder, "zen3-one-user/fp32").started_at[:10]
    return wrap(f"llama.cpp's ITL p50 over ours within a turn, median ({day_}): "
                + ", ".join(parts) + ":", 94, continued="")


def overhead_table(r: ServedOverheadRun) -> list[str]:
    """served_overhead.py's rows, one per configuration, its turns side by side."""
    labels = list(dict.fromkeys(row.label for row in r.rows))
    rows = []
    for label in labels:
        mine = sorted((row for row in r.rows if row.label == label), key=lambda row: row.turn)
        rows.append((label, [" / ".join(f"{row.engine_alone_ms:.2f}" for row in mine),
                             " / ".join(f"{row.served_ms:.2f}" for row in mine),
                             " / ".join(f"{row.overhead_ms:+.2f}" for row in mine)]))
    turns = " / ".join(str(t) for t in sorted({row.turn for row in r.rows}))
    return markdown_table("precision", [f"engine alone (ms), turn {turns}",
                                        f"served (ms), turn {turns}",
                                        "served minus alone (ms)"], rows)


def served_overhead(folder: Path) -> str:
    """docs/performance.md's engine alone against the server, AMD."""
    r = ServedOverheadRun.load(folder / "served-overhead/overhead.json")
    shortest = min(row.overhead_ms for row in r.rows)
    return "\n".join([
        f"{r.machine.cpu}, {day(folder, 'served-overhead/fp32-1.json')}:", "",
        *overhead_table(r), "",
        wrap((f"A served step {-shortest:.1f} ms shorter than the engine alone's is the "
              "machine's speed moving between the two measurements, not serving: "
              if shortest < 0 else "The machine's speed moves between the two measurements: ")
             + "this method runs them one after the other, and on this machine a minute apart "
             "is enough for that. `benchmarks/interleaved.py` is the drift-proof comparison, "
             "but it compares servers only.", 95, continued="")])


def served_overhead_intel(folder: Path) -> str:
    """docs/performance.md's engine alone (at the core's choices) against the server, Intel."""
    r = ServedOverheadRun.load(folder / "served-overhead-intel/overhead.json")
    return "\n".join([f"{r.machine.cpu}, {day(folder, 'served-overhead-intel/fp32-1.json')}:",
                      "", *overhead_table(r)])


def one_user_vs_llama(folder: Path) -> str:
    """docs/performance.md's one user against llama.cpp, with the engine in its own process."""
    pairs = {p: (level(folder, f"vs-llama-cpp/nano-vllm-process-{p}", 1),
                 level(folder, f"vs-llama-cpp/llama-cpp-{k}", 1))
             for p, k in LLAMA_KIND.items()}
    itl = ", ".join(f"{ours.itl_p50_ms:.1f} vs {theirs.itl_p50_ms:.1f} ms in {p}"
                    for p, (ours, theirs) in pairs.items())
    ahead = [(p, ours.itl_p50_ms - theirs.itl_p50_ms) for p, (ours, theirs) in pairs.items()
             if ours.itl_p50_ms > theirs.itl_p50_ms]
    lead = (" and ".join(f"{gap:.1f} ms in {p}" for p, gap in ahead) if ahead else "")
    ours_bf16 = [level(folder, f"one-user-bf16/nano-bf16-{t}", 1).itl_p50_ms for t in (1, 2)]
    theirs_bf16 = [level(folder, f"one-user-bf16/llama-cpp-bf16-{t}", 1).itl_p50_ms
                   for t in (1, 2)]
    return wrap(
        "Against llama.cpp's server in one run "
        "([results.md](results.md#against-llamacpp-with-the-engine-in-its-own-process), "
        f"{day(folder, 'vs-llama-cpp/llama-cpp-f32.json')}), one user's ITL p50 was {itl}. "
        + (f"So llama.cpp was ahead by {lead} in that run, and one-user steps on this machine "
           "move between runs by as much as that gap (the served-overhead turns above). "
           if lead else "")
        + "Earlier, the two servers in turns, one user only, three rounds each turn, gave "
        f"{' / '.join(f'{x:.2f}' for x in ours_bf16)} ms (ours) against "
        f"{' / '.join(f'{x:.2f}' for x in theirs_bf16)} ms (llama.cpp) in bf16 "
        f"({day(folder, 'one-user-bf16/nano-bf16-1.json')}, `results/one-user-bf16/`):",
        95, continued="")


def shared_prompt_intel(folder: Path) -> str:
    """docs/performance.md's shared ~690-token prompt served on the Intel Xeon."""
    ttft = {d: [level(folder, f"shared-prompt-intel/{d}-{i}", 30).ttft_p50_ms for i in (1, 2)]
            for d in ("fp32", "bf16")}
    misses = min(ttft["fp32"]) > 1000
    return wrap(
        f"On an {cpu(folder, 'shared-prompt-intel/fp32-1.json')} (as its VM reports it), the "
        "same load served in fp32 and in bf16, twice "
        f"({day(folder, 'shared-prompt-intel/fp32-1.json')}, "
        "[results.md](results.md#a-shared-690-token-prompt-on-an-intel-xeon-fp32-and-bf16)): "
        f"TTFT p50 {ttft['fp32'][0]:,.0f} and {ttft['fp32'][1]:,.0f} ms in fp32, "
        f"{ttft['bf16'][0]:,.0f} and {ttft['bf16'][1]:,.0f} ms in bf16 (AMX)."
        + (" fp32 misses the second there, and the engine alone shows why" if misses else
           " The engine alone shows where fp32's time goes"), 95, continued="")


def fresh_start(folder: Path) -> str:
    """docs/performance.md's first start from nothing, with and without the compile beside
    the model's preparation."""
    kept, overlap = (StartupRun.load(folder / f"startup-fresh-intel/{n}.json")
                     for n in ("before", "after"))
    return wrap(
        f"{kept.first_s:.1f} s to `/health` on the {kept.machine.cpu}, idle, and a later start "
        f"{kept.later_s:.1f} s (4c6cdc6, the start-up kept; {kept.started_at[:10]}). Compiling "
        "the kernels in a background process while the API process prepared the model "
        f"(44d6510) measured {overlap.first_s:.1f} s in the same run, run first", 92,
        continued="")
