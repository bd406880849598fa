"""docs/gguf.md's passage: one GGUF file served by llama.cpp and by us in turns
(benchmarks/gguf_served.py), every figure from its files in results/."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.results import BenchRun, ServedFileRun
from benchmarks.tables import markdown_table

GGUF_FOLDER = "gguf-qwen2.5-coder-0.5b"
LABELS = {"llama-cpp": "llama.cpp `llama-server`", "nano-vllm": "nano-vLLM `server.py`"}


def turns(folder: Path) -> list[int]:
    found = sorted({int(p.stem.split("-")[-2]) for p in folder.glob("nano-vllm-*-served.json")})
    if not found:
        raise FileNotFoundError(f"no nano-vllm-T-served.json in {folder}")
    return found


def gguf_served(results: Path) -> str:
    """Per turn and server: ready, RSS against the file, 1-user ITL, 30-user tok/s, the long
    prompt's TTFT; then our ratios to llama.cpp turn by turn."""
    folder = results / GGUF_FOLDER
    rows, ratios, cpus, days = [], [], set(), set()
    for turn in turns(folder):
        runs = {label: (ServedFileRun.load(folder / f"{label}-{turn}-served.json"),
                        BenchRun.load(folder / f"{label}-{turn}.json").by_users())
                for label in LABELS}
        for label, (served, bench) in runs.items():
            cpus.add(served.machine.cpu)
            days.add(served.started_at[:10])
            rows.append((f"{LABELS[label]}, turn {turn}",
                         [f"{served.ready_s:.1f}", f"{served.rss_bytes / 1e9:.2f}",
                          f"{served.rss_bytes / served.file_bytes:.2f}x",
                          f"{bench[1].itl_p50_ms:.1f}", f"{bench[30].throughput_tok_s:.0f}",
                          f"{served.ttft_long_p50_ms:.0f}"]))
        (ls, lb), (ns, nb) = runs["llama-cpp"], runs["nano-vllm"]
        itl = lb[1].itl_p50_ms / nb[1].itl_p50_ms
        thirty = nb[30].throughput_tok_s / lb[30].throughput_tok_s
        ttft = ls.ttft_long_p50_ms / ns.ttft_long_p50_ms
        ratios.append(f"turn {turn}: one user's ITL {itl:.2f}x llama.cpp's speed, 30 users "
                      f"{thirty:.2f}x its throughput, the long prompt's TTFT {ttft:.2f}x its "
                      "speed")
    first = ServedFileRun.load(folder / f"nano-vllm-{turns(folder)[0]}-served.json")
    assert len(cpus) == 1, cpus
    weights, kv = (float(re.search(pattern, first.startup_line)[1]) * 1024**3
                   for pattern in (r"weights ([0-9.]+) GiB", r"in ([0-9.]+) GiB\)"))
    rest = first.rss_bytes - weights - kv
    heads = ["ready (s)", "RSS (GB)", "RSS ÷ file", "1 user ITL p50 (ms)", "30 users (tok/s)",
             f"TTFT, {first.long_prompt_tokens}-token prompt (ms)"]
    table = markdown_table("server", heads, rows)
    return "\n".join([f"`{first.file}` ({first.file_bytes / 1e6:.0f} MB), {cpus.pop()}, "
                      f"{', '.join(sorted(days))}, idle machine, the two servers in turns:", "",
                      *table, "", "Ours against llama.cpp, " + "; ".join(ratios) + ".", "",
                      f"Our RSS in turn {turns(folder)[0]} is the weights ({weights / 1e9:.2f} GB, "
                      f"{weights / first.file_bytes:.2f}x the file), the KV cache "
                      f"({kv / 1e9:.2f} GB, as the startup line states it) and "
                      f"{rest / 1e9:.2f} GB besides: the fixed cost of two Python processes "
                      "with PyTorch and the kernels loaded, the tokenizer in each, the "
                      "allocator's slack."])
