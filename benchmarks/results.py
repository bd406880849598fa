"""The JSON files the benchmarks write and read, as dataclasses.

bench.py writes a `BenchRun` to {results_dir}/{label}.json, profile_decode.py a `ProfileRun`;
plot.py and report.py read them. The field names are the JSON keys, so a file with a key
missing or unknown fails to load instead of giving a table with holes.
"""

from __future__ import annotations

import json
import os
import platform as host
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self


def result_path(folder: Path, label: str) -> Path:
    """Where a run's JSON lives: the label names the file."""
    return folder / f"{label}.json"


class JsonFile:
    """Saving and loading for the dataclasses below; from_json rebuilds their nested fields."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Self:
        raise NotImplementedError

    @classmethod
    def load(cls, path: Path) -> Self:
        return cls.from_json(path.read_text())

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())


@dataclass
class LevelResult:
    """One concurrency level of bench.py: `users` started together. None: nothing measured."""

    users: int
    throughput_tok_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    total_tokens: int
    wall_s: float
    errors: int
    first_error: str | None


def cpu_model() -> str:
    """The CPU's name and x86 family/model from /proc/cpuinfo, e.g. 'AMD EPYC (family 26,
    model 2)': figures differ by up to 2x between CPU kinds, so every result names its CPU."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip():
                break  # the first processor is enough
    except OSError:
        return host.processor() or host.machine()
    name = fields.get("model name", host.machine())
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


@dataclass
class Machine:
    platform: str
    python: str
    processor: str
    cpu_count: int | None
    cpu: str  # cpu_model(): what every table of a run names

    @classmethod
    def this_one(cls) -> Machine:
        return cls(host.platform(), host.python_version(), host.processor() or host.machine(),
                   os.cpu_count(), cpu_model())


@dataclass
class BenchRun(JsonFile):
    """One bench.py run against one server: its settings and one result per level."""

    label: str
    url: str
    max_tokens: int
    system_repeats: int
    machine: Machine
    started_at: str
    command: str
    levels: list[LevelResult]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BenchRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]),
                      "levels": [LevelResult(**level) for level in raw["levels"]]})

    def by_users(self) -> dict[int, LevelResult]:
        return {level.users: level for level in self.levels}


@dataclass
class InterleavedRun(JsonFile):
    """benchmarks/interleaved.py: servers up at once, the same load to each in turn; per
    label (in the order the servers were given) its command and one figure per turn."""

    machine: Machine
    started_at: str
    bench_flags: list[str]
    commands: dict[str, str]
    itl_p50_ms: dict[str, list[float]]
    throughput_tok_s: dict[str, list[float]]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> InterleavedRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"])})

    def ratios(self, label: str, to: str) -> list[float]:
        """label's ITL p50 over `to`'s, turn by turn."""
        return [a / b for a, b in zip(self.itl_p50_ms[label], self.itl_p50_ms[to], strict=True)]


@dataclass
class SpecDecodeWorkload:
    """One workload of spec_decode.py, on the same server without and with speculation."""

    name: str
    users: int
    without: LevelResult
    with_speculation: LevelResult
    identical_text: bool  # every request's streamed text the same (greedy)
    draft_tokens: int  # counted by the speculating server's /metrics during the workload
    accepted_tokens: int

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None


@dataclass
class SpecDecodeRun(JsonFile):
    """spec_decode.py's A/B run: the server's flags each way and the workloads' results."""

    started_at: str
    machine: Machine
    command: str
    server_flags: str
    speculative_config: str
    workloads: list[SpecDecodeWorkload]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpecDecodeRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]), "workloads": [
            SpecDecodeWorkload(**{**w, "without": LevelResult(**w["without"]),
                                  "with_speculation": LevelResult(**w["with_speculation"])})
            for w in raw["workloads"]]})


@dataclass
class OpTime:
    """One PyTorch op's own time (the ops it calls not counted), per decode step."""

    name: str
    calls: float
    self_ms: float


@dataclass
class ProfileCell:
    """profile_decode.py at one (users, context); times in ms per decode step."""

    users: int
    context: int
    attention: str  # the decode attention backend ModelRunner chose
    parts_ms: dict[str, float]  # each part's own time: parts nested in it are not counted again
    sum_of_parts_ms: float  # the profiled step
    step_ms: float  # the same step unprofiled, where tokens_per_s comes from
    tokens_per_s: float
    top_ops: list[OpTime]  # the ops with the most self time, most first


@dataclass
class ProfileRun(JsonFile):
    device: str
    dtype: str
    machine: Machine
    command: str
    results: list[ProfileCell]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ProfileRun:
        cells = [ProfileCell(**{**cell, "top_ops": [OpTime(**op) for op in cell["top_ops"]]})
                 for cell in raw["results"]]
        return cls(**{**raw, "machine": Machine(**raw["machine"]), "results": cells})


@dataclass
class OverheadTrial:
    """One load of dashboard_overhead.py, with the dashboard's event stream open or not."""

    order: int
    page_open: bool
    frames: int  # snapshot frames the subscriber received during the load
    level: LevelResult


@dataclass
class DashboardOverheadRun(JsonFile):
    """dashboard_overhead.py: the same load alternately without and with a page watching."""

    url: str
    users: int
    max_tokens: int
    machine: Machine
    started_at: str
    command: str
    trials: list[OverheadTrial]
    closed_mean_tok_s: float
    open_mean_tok_s: float
    difference_pct: float  # (open - closed) / closed
    noise_pct: float  # the widest spread between two trials of the same kind, / their mean

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DashboardOverheadRun:
        trials = [OverheadTrial(**{**t, "level": LevelResult(**t["level"])})
                  for t in raw["trials"]]
        return cls(**{**raw, "machine": Machine(**raw["machine"]), "trials": trials})


@dataclass
class OverheadRow:
    """One turn of served_overhead.py for one configuration: one user's ITL p50 through the
    engine alone and through the server, in ms."""

    label: str
    turn: int
    flags: str  # server.py's flags ("" for its defaults)
    engine_alone_ms: float
    served_ms: float
    overhead_ms: float  # served - engine alone


@dataclass
class ServedOverheadRun(JsonFile):
    """served_overhead.py: the engine alone and the server, in turns, one user."""

    machine: Machine
    command: str
    rows: list[OverheadRow]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ServedOverheadRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]),
                      "rows": [OverheadRow(**row) for row in raw["rows"]]})


@dataclass
class ComputePeak:
    """The best GFLOP/s of one dtype on a large square GEMM, by path, what the CPU's flags
    and clock promise where they can be read, and the GEMM's multiply instruction's own
    rate measured on registers only."""

    dtype: str  # "float32" or "bfloat16"
    gemm_size: int  # M = N = K
    gflops_by_path: dict[str, float]
    best_gflops: float  # the achievable peak: the best path
    theoretical_gflops: float | None  # per FMA unit of each thread; None: not read
    theoretical_note: str  # how the figure was read, or why it was not
    # fp32: every thread running independent FMA chains on registers; None: not measured
    # (bf16, no kernel, or a run from before the field)
    instruction_gflops: float | None = None

    def instruction_text(self) -> str:
        """The instruction peak in words (the printed run, the results page)."""
        if self.instruction_gflops is None:
            return "instruction peak not measured"
        return (f"instruction peak {self.instruction_gflops:.0f} GFLOP/s (every thread running "
                "FMAs on registers)")


@dataclass
class RooflineCell:
    """One path at one row count: a pass over all the model's matmuls against the peaks."""

    path: str
    dtype: str  # the compute peak it is held against: "float32" or "bfloat16"
    rows: int
    ms: float  # best pass
    gflop: float  # 2 * M * N * K over the pass
    weight_mb: float  # bytes of weights the pass reads (packed, as the path stores them)
    activation_mb: float  # inputs read and outputs written
    gflops: float
    gbs: float
    intensity: float  # FLOP per byte
    bound: str  # "memory" or "compute": the intensity against the ridge point
    of_bandwidth: float  # fractions of the measured peaks, 0..1 (or above: a cache hit)
    of_compute: float
    of_roofline: float  # of min(compute peak, intensity * bandwidth)


@dataclass
class RooflineRun(JsonFile):
    """benchmarks/roofline.py: this CPU's measured peaks and every path's passes against
    them."""

    label: str
    machine: Machine
    started_at: str
    command: str
    threads: int
    repeats: int
    read_gbs: float  # a streaming sum over stream_mb
    copy_gbs: float  # a copy: bytes read + written
    stream_mb: float
    compute: list[ComputePeak]
    cells: list[RooflineCell]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RooflineRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]),
                      "compute": [ComputePeak(**c) for c in raw["compute"]],
                      "cells": [RooflineCell(**c) for c in raw["cells"]]})

    def peak(self, dtype: str) -> ComputePeak:
        return next(c for c in self.compute if c.dtype == dtype)


@dataclass
class StartupRun(JsonFile):
    """startup.py: one server's first start (no compiled kernels, no cached thread choice)
    and a later one, each in seconds to the first healthy /health."""

    label: str
    machine: Machine
    started_at: str
    command: str
    first_s: float
    later_s: float

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StartupRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"])})


@dataclass
class NeighbourStep:
    """neighbour.py's median decode step of `batch` sequences, `neighbour` "idle" or "busy",
    `threads` "all threads" (--no-yield-cores) or "yield cores" (the default)."""

    neighbour: str
    batch: int
    threads: str
    step_ms: float


@dataclass
class NeighbourRun(JsonFile):
    """neighbour.py: decode steps on every thread and with the default, on the idle machine
    and beside `spinning_processes` processes that each keep a core busy."""

    machine: Machine
    command: str
    model: str
    dtype: str
    threads: int
    spinning_processes: int
    rounds: int
    rows: list[NeighbourStep]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> NeighbourRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]),
                      "rows": [NeighbourStep(**r) for r in raw["rows"]]})

    def step_ms(self, neighbour: str, batch: int, threads: str) -> float:
        return next(r.step_ms for r in self.rows
                    if (r.neighbour, r.batch, r.threads) == (neighbour, batch, threads))


@dataclass
class EmbeddingWorkload:
    """One workload of embeddings.py: texts per second, ours and sentence-transformers' best."""

    name: str
    texts: int
    tokens_per_text: float
    ours_per_second: float
    st_per_second: float
    st_batch: int  # the batch size of sentence-transformers' best
    lowest_cosine: float  # of our vectors against sentence-transformers'


@dataclass
class EmbeddingRun(JsonFile):
    """embeddings.py: our server (CLIENTS concurrent clients) against sentence-transformers
    in one process, on the same texts."""

    machine: Machine
    started_at: str
    command: str
    model: str
    clients: int
    server_args: str
    workloads: list[EmbeddingWorkload]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EmbeddingRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]),
                      "workloads": [EmbeddingWorkload(**w) for w in raw["workloads"]]})


@dataclass
class ServedFileRun(JsonFile):
    """gguf_served.py: one server on one GGUF file in one turn, everything but bench.py's
    figures."""

    label: str
    machine: Machine
    started_at: str
    command: str
    file: str
    file_bytes: int
    ready_s: float  # start to the first healthy /health
    rss_bytes: int  # the server's processes together, after the load
    ttft_long_ms: list[float]  # one per ~1,000-token prompt
    long_prompt_tokens: int
    startup_line: str  # what the server says it holds (weights, KV cache)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ServedFileRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"])})

    @property
    def ttft_long_p50_ms(self) -> float:
        return statistics.median(self.ttft_long_ms)
