"""The results passages outside docs/results.md (see benchmarks/results_blocks.py): README.md's
Results bullets and the figures other pages of docs/ quote, every one from results/."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from benchmarks.results import InterleavedRun, RooflineRun, ServedOverheadRun, StartupRun
from benchmarks.results_page import anchor, level, level_by_order, ratio, run
from benchmarks.results_sections import INTERLEAVED, ORDERS, turns_table
from benchmarks.tables import markdown_table

PRECISIONS = {"fp32": ("", "f32"), "bf16": ("-bf16", "bf16"), "q4_1": ("-q4_1", "q4_1")}
ORDERS_TITLE = "30 users against llama.cpp in fp32, each server started first in turn"
FRESH_TITLE = ("A first start from nothing on an Intel Xeon: compiling while the model is "
               "prepared")
NO_REPACK = ("llama.cpp with `--no-repack`, its faster Q4_1 path off (its weight repacking "
             "crashed loading that file on this CPU)")


def results_link(title: str) -> str:
    return f"[docs/results.md](docs/results.md#{anchor(title)})"


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


def vs_llama_process(folder: Path) -> str:
    names = {p: (f"vs-llama-cpp/nano-vllm-process-{p}", f"vs-llama-cpp/llama-cpp-{k}")
             for p, (_, k) in PRECISIONS.items()}
    ratios = ", ".join(f"{ratio(folder, a, b, 30):.2f}x ({p})" for p, (a, b) in names.items())
    itl = ", ".join(f"{level(folder, a, 1).itl_p50_ms:.1f} vs {level(folder, b, 1).itl_p50_ms:.1f}"
                    f" ms ({p})" for p, (a, b) in names.items())
    theirs_then = level(folder, "vs-llama-cpp/llama-cpp-f32", 30).throughput_tok_s
    theirs_before = level(folder, "llama-cpp-f32", 30).throughput_tok_s
    served = ServedOverheadRun.load(folder / "served-overhead/overhead.json")
    intel = ServedOverheadRun.load(folder / "served-overhead-intel/overhead.json")

    def gap(r: ServedOverheadRun) -> str:
        ms = [row.overhead_ms for row in r.rows]
        return f"{min(ms):+.2f} to {max(ms):+.2f} ms"

    return (f"* **Against llama.cpp, one run, the engine in its own process and decode steps in "
            f"one C++ call** ({cpu(folder, names['fp32'][0] + '.json')}, "
            f"{day(folder, names['fp32'][0] + '.json')}, `results/vs-llama-cpp/`): 30 users "
            f"{ratios} its throughput; one user's ITL p50 {itl}. The machine was "
            f"{'slower' if theirs_then < theirs_before else 'faster'} that day than in the "
            "earlier run below: llama.cpp's own fp32 30-user throughput "
            f"{theirs_then:.1f} against {theirs_before:.1f} tok/s. Served minus the engine "
            f"alone, for one user, two turns each: {gap(served)}, the machine drifting between "
            "the two measurements by more than that (`results/served-overhead/`, "
            "[docs/performance.md](docs/performance.md#a-decode-step-in-one-c-call)). On an "
            f"{intel.machine.cpu}, the engine alone at the server's own thread and prefetch "
            f"choices: {gap(intel)} in fp32, bf16 and q4_1 (`results/served-overhead-intel/`).")


def one_user_amd(folder: Path) -> str:
    def medians(sub: str) -> list[tuple[str, float, float, float]]:
        rows = []
        for p in INTERLEAVED:
            r = interleaved(folder, f"{sub}/{p}")
            rows.append((p, statistics.median(r.ratios("nano-vllm", "llama-cpp")),
                         statistics.median(r.itl_p50_ms["nano-vllm"]),
                         statistics.median(r.itl_p50_ms["llama-cpp"])))
        return rows

    first = f"one-user-interleaved/{INTERLEAVED[0]}/interleaved.json"
    lighter = f"one-user-interleaved-aiohttp/{INTERLEAVED[0]}/interleaved.json"
    main = ", ".join(f"{x:.3f} in {p} ({a:.1f} vs {b:.1f} ms)" for p, x, a, b in
                     medians("one-user-interleaved"))
    aio = ", ".join(f"{x:.3f}" for _, x, _, _ in medians("one-user-interleaved-aiohttp"))
    return (f"* **One user against llama.cpp, both servers up at once, ten turns each** "
            f"({cpu(folder, first)}, {day(folder, first)}, `results/one-user-interleaved/`, "
            "`benchmarks/interleaved.py`): our ITL p50 over llama.cpp's within a turn, median "
            f"of the turns, {main}. Through a lighter load generator (`--client aiohttp`, "
            f"`results/one-user-interleaved-aiohttp/`, {day(folder, lighter)}, an earlier run "
            f"that day): {aio} (fp32, bf16, q4_1). Runs differ by about as much as the two "
            "servers ([docs/engine-process.md](docs/engine-process.md#the-load-generators-"
            "share)).")


def intel(folder: Path) -> str:
    orders = {p: [statistics.median(interleaved(folder, f"one-user-both-orders/{p}/{o}")
                                    .ratios("nano-vllm", "llama-cpp")) for o in ORDERS]
              for p in INTERLEAVED}
    one_user = ", ".join(f"{span(v)} in {p}" for p, v in orders.items())
    thirty = {p: interleaved(folder, f"vs-llama-cpp-30-users/{k}")
              for p, (_, k) in PRECISIONS.items()}
    tput = {p: per_turn(r, "nano-vllm", "llama-cpp") for p, r in thirty.items()}
    their_itl = thirty["fp32"].ratios("llama-cpp", "nano-vllm")
    clients = {c: per_turn(interleaved(folder, f"vs-llama-cpp-30-users-clients/{c}"),
                           "nano-vllm", "llama-cpp") for c in ("httpx", "aiohttp")}
    starts = {o: per_turn(interleaved(folder, f"vs-llama-cpp-30-users-orders/{o}"),
                          "nano-vllm", "llama-cpp") for o in ORDERS}
    same = interleaved(folder, "interleaved-identical-30-users")
    same_medians = [statistics.median(t) for t in same.throughput_tok_s.values()]
    turns = list(zip(*same.throughput_tok_s.values(), strict=True))
    int8 = per_turn(interleaved(folder, "int8act-intel"), "int8act", "q4_1")
    amx = interleaved(folder, "bf16-without-amx")
    first = "one-user-both-orders/fp32/nano-first/interleaved.json"
    return (f"* **On an {cpu(folder, first)}** (as its VM reports it; AVX-512 with BF16, and "
            "AMX), both servers up at once, in turns, the page cache dropped first: one user's "
            f"ITL p50 over llama.cpp's {one_user}, the q4_1 ratio against {NO_REPACK}, with "
            f"either server started first ({day(folder, first)}, "
            "`results/one-user-both-orders/`); at 30 users, every turn with new prompts, our "
            f"throughput over llama.cpp's per turn {span(tput['fp32'], unit='x')} in fp32 "
            f"(their ITL p50 over ours {span(their_itl, unit='x')}), "
            f"{span(tput['bf16'], unit='x')} in bf16 and {span(tput['q4_1'], unit='x')} in "
            f"q4_1, against llama.cpp with `--no-repack` again "
            f"({day(folder, 'vs-llama-cpp-30-users/f32/interleaved.json')}, "
            "`results/vs-llama-cpp-30-users/`; in an earlier run the turns after the first "
            "repeated the first turn's prompts, which llama.cpp answers from its cache); in a "
            f"later hour, fp32 over five turns: {span(clients['httpx'], unit='x')} per turn "
            f"(median {statistics.median(clients['httpx']):.2f}) with bench.py's default "
            f"client, {span(clients['aiohttp'], unit='x')} (median "
            f"{statistics.median(clients['aiohttp']):.2f}) right before with its lighter "
            "aiohttp client, the load generator being a cost on the same 2 cores that grows "
            "with the tokens a server streams (`results/vs-llama-cpp-30-users-clients/`); two "
            "back-to-back runs differing only in which server started first gave "
            f"{statistics.median(starts['nano-first']):.2f}x (ours first) and "
            f"{statistics.median(starts['llama-first']):.2f}x, "
            f"{statistics.median(starts['nano-first'] + starts['llama-first']):.2f}x over both "
            "runs' ten turns, most of the difference llama.cpp's own throughput; three "
            "identical nano-vLLM servers in the same harness had throughput medians within "
            f"{max(same_medians) / min(same_medians) - 1:.0%} of each other, while in single "
            f"turns one ran up to {max(1 - min(t) / max(t) for t in turns):.0%} below the "
            "fastest (`results/vs-llama-cpp-30-users-orders/`, "
            "`results/interleaved-identical-30-users/`, commands in "
            f"{results_link(ORDERS_TITLE)}); `--activations int8` {span(int8, unit='x')} the "
            "exact q4_1 path's 30-user throughput per turn (`results/int8act-intel/`). With "
            "AMX off, as on a CPU without it, bf16 serves 30 users "
            f"{span(per_turn(amx, 'bf16', 'fp32'), unit='x')} as fast as fp32, where "
            f"`vdpbf16ps` alone made it {span(per_turn(amx, 'bf16-dot', 'fp32'), unit='x')}: "
            "that CPU's `vdpbf16ps` does half the FMAs' multiply-adds, so compute-bound rows run "
            "on FMAs over widened weights (`results/bf16-without-amx/`, "
            "[docs/performance.md](docs/performance.md#our-cpu-kernels)).")


def zen3(folder: Path) -> str:
    def ratios(name: str, ours: str = "nano-vllm") -> str:
        return span(per_turn(interleaved(folder, name), ours, "llama-cpp"), unit="x")

    itl = {p: interleaved(folder, f"zen3-one-user/{p}").ratios("nano-vllm", "llama-cpp")
           for p in INTERLEAVED}
    one = ", ".join(f"{statistics.median(x):.2f}x in {p}" for p, x in itl.items())
    first = "zen3-30-users/f32/interleaved.json"
    return (f"* **On an AVX2-only CPU** ({cpu(folder, first)}, Zen 3; both servers up at once, "
            f"in turns, {day(folder, first, 'zen3-one-user/fp32/interleaved.json')}, "
            "`results/zen3-30-users/`, `results/zen3-one-user/`): 30 users "
            f"{ratios('zen3-30-users/f32')} llama.cpp's throughput per turn in fp32 and "
            f"{ratios('zen3-30-users/bf16')} in bf16 (compute bound there), "
            f"{ratios('zen3-30-users/q4_1')} with q4_1 and "
            f"{ratios('zen3-30-users/q4_1', 'nano-vllm-int8act')} with `--activations int8`; "
            f"one user's ITL p50 over theirs, median of the turns, {one} "
            "([docs/performance.md](docs/performance.md#our-cpu-kernels)). That was before the "
            "AVX2 path read one row's panels side by side; it has not been measured on Zen 3 "
            "since.")


def in_process_llama(folder: Path) -> str:
    pairs = {p: (f"nano-vllm{s}", f"llama-cpp-{k}") for p, (s, k) in PRECISIONS.items()}
    thirty = ", ".join(f"{ratio(folder, a, b, 30):.2f}x in {p}" for p, (a, b) in pairs.items())
    one = ", ".join(f"{ratio(folder, a, b, 1):.2f}x" for a, b in pairs.values())
    return (f"* **Against llama.cpp on the same weights, an earlier run with the engine "
            f"in-process** ({cpu(folder, 'nano-vllm.json')}, {day(folder, 'nano-vllm.json')}): "
            f"30 users {thirty} (the model's own 4-bit weights) llama.cpp's throughput; one "
            f"user {one} (`results/nano-vllm.json`, `nano-vllm-bf16.json`, "
            "`nano-vllm-q4_1.json` against `results/llama-cpp-f32.json`, "
            "`llama-cpp-bf16.json`, `llama-cpp-q4_1.json`). The bullets above have later "
            "figures.")


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


def engine_process(folder: Path) -> str:
    gains = engine_process_gains(folder)
    first = "engine-process/process-fp32-1.json"
    return (f"* **The engine core in its own process** (the default; {cpu(folder, first)}, "
            f"{day(folder, first)}): in turns with the engine on a thread of the server "
            f"(`--no-engine-process`), {span(gains, unit='x')} the 30-user throughput (mean "
            "of two turns) in every precision (`results/engine-process/`).")


def vs_vllm(folder: Path) -> str:
    def part(sub: str) -> tuple[str, str]:
        thirty = " and ".join(
            f"{ratio(folder, f'{sub}/nano-vllm-{p}', f'{sub}/vllm-cpu-{k}', 30):.2f}x in {p}"
            for p, k in (("fp32", "f32"), ("bf16", "bf16")))
        one = " and ".join(
            f"{level(folder, f'{sub}/nano-vllm-{p}', 1).itl_p50_ms:.1f} vs "
            f"{level(folder, f'{sub}/vllm-cpu-{k}', 1).itl_p50_ms:.1f} ms ({p})"
            for p, k in (("fp32", "f32"), ("bf16", "bf16")))
        return thirty, one

    (amd30, amd1), (intel30, intel1) = part("vs-vllm"), part("vs-vllm-intel")
    return (f"* **Against vLLM's CPU build** (`vllm-cpu` 0.32.0, same weights, one run, "
            f"{cpu(folder, 'vs-vllm/nano-vllm-fp32.json')}, "
            f"{day(folder, 'vs-vllm/nano-vllm-fp32.json')}): 30 users {amd30} its "
            f"throughput; one user's ITL p50 {amd1} (`results/vs-vllm/`). On an "
            f"{cpu(folder, 'vs-vllm-intel/nano-vllm-fp32.json')} with AMX "
            f"({day(folder, *(f'vs-vllm-intel/nano-vllm-{p}.json' for p in ('fp32', 'bf16')))}"
            f"): 30 users {intel30} its throughput; one user's ITL p50 {intel1} "
            "(`results/vs-vllm-intel/`).")


def gemma(folder: Path) -> str:
    theirs = "gemma/llama-cpp-gemma-3-270m"
    return (f"* **Gemma 3 270M from its GGUF, against llama.cpp on the same file** (one run, "
            f"{cpu(folder, theirs + '.json')}, {day(folder, theirs + '.json')}): one user's "
            f"ITL p50 {level(folder, 'gemma/nano-vllm-gemma-codes', 1).itl_p50_ms:.1f} ms on "
            f"the file's own codes (`--weights q4_1`) vs {level(folder, theirs, 1).itl_p50_ms:.1f}"
            f" ms; 30 users {ratio(folder, 'gemma/nano-vllm-gemma-codes', theirs, 30):.2f}x its "
            f"throughput on the codes and {ratio(folder, 'gemma/nano-vllm-gemma', theirs, 30):.2f}"
            "x with the fp32 model (`results/gemma/`, "
            "[docs/models.md](docs/models.md#gemma-3-270m)).")


def baseline(folder: Path) -> str:
    nano, base = "baseline-check/nano", "baseline-check/base"

    def at(users: int) -> str:
        a, b = level(folder, nano, users), level(folder, base, users)
        assert a.throughput_tok_s and b.throughput_tok_s
        return (f"{a.throughput_tok_s / b.throughput_tok_s:.2f}x at {users} user"
                f"{'s' * (users > 1)} ({a.throughput_tok_s:.{1 if users == 1 else 0}f} vs "
                f"{b.throughput_tok_s:.{1 if users == 1 else 0}f} tok/s)")

    return (f"* **The default server against the baseline** ({cpu(folder, nano + '.json')} with "
            f"AMX, fp32, one run, {day(folder, nano + '.json')}, `python3 "
            "benchmarks/side_by_side.py results/baseline-check nano=server.py "
            "base=baseline_server.py -- --users 1 30 --max-tokens 100`): "
            f"{at(1)} and {at(30)} of `baseline_server.py`'s throughput "
            "(`results/baseline-check/`; each ratio is of one run on a machine whose speed "
            "drifts). An earlier tree with the engine in-process, on "
            f"{cpu(folder, 'baseline.json')}, gave "
            f"{ratio(folder, 'nano-vllm-vs-baseline', 'baseline', 30):.2f}x at 30 users "
            "(`results/nano-vllm-vs-baseline.json` against `results/baseline.json`).")


def startup(folder: Path) -> str:
    after, before = (StartupRun.load(folder / f"startup-intel/{n}.json")
                     for n in ("after", "before"))
    kept, overlap = (StartupRun.load(folder / f"startup-fresh-intel/{n}.json")
                     for n in ("before", "after"))
    latest = StartupRun.load(folder / "startup/nano-vllm.json")
    return (f"* **Start-up** ({after.machine.cpu}, the default model prepared, "
            f"{after.started_at[:10]}, `python3 benchmarks/startup.py results/startup-intel "
            "after=server.py before=/tmp/before/server.py`, `/tmp/before` a checkout of "
            "4bf7217): a first start, with the kernels to compile and the thread choice to "
            f"measure, answers `/health` after {after.first_s:.1f} s, where the tree before the "
            f"kernel files stopped including `<torch/extension.h>` took {before.first_s:.1f} s; "
            f"a later start {after.later_s:.1f} s (`results/startup-intel/`). From nothing, the "
            f"model fetched and prepared too (`--fresh-model`), {kept.first_s:.1f} s "
            f"({overlap.first_s:.1f} s with the kernels compiled beside the model's "
            f"preparation, which was dropped; `results/startup-fresh-intel/`, "
            f"{results_link(FRESH_TITLE)}). The latest run ({latest.started_at[:10]}, "
            f"`results/startup/`): {latest.first_s:.1f} s first, {latest.later_s:.1f} s later.")


def prefix(folder: Path) -> str:
    on, off = level(folder, "prefix-cache-on", 30), level(folder, "prefix-cache-off", 30)
    assert on.throughput_tok_s and off.throughput_tok_s
    return (f"* **A ~660-token system prompt shared by 30 users** "
            f"({cpu(folder, 'prefix-cache-on.json')}, {day(folder, 'prefix-cache-on.json')}): "
            f"{on.throughput_tok_s / off.throughput_tok_s:.2f}x the throughput with the prefix "
            f"cache on than with `--no-prefix-cache`, and TTFT p50 {on.ttft_p50_ms:,.0f} ms "
            f"against {off.ttft_p50_ms / 1000:.1f} s (`results/prefix-cache-on.json` against "
            "`results/prefix-cache-off.json`).")


def readme_results(folder: Path) -> str:
    """README.md's Results bullets."""
    bullets = [vs_llama_process, one_user_amd, intel, zen3, in_process_llama, engine_process,
               vs_vllm, gemma, baseline, startup, prefix]
    return "\n".join(wrap(b(folder)) for b in bullets)


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
    runs = {p: interleaved(folder, f"zen3-30-users/{k}") for p, (_, k) in PRECISIONS.items()}

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
             for p, (_, k) in PRECISIONS.items()}
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
