"""engine/thread_choice.py: the threshold from timings, its cache (keyed, so another CPU
misses), the flags that choose whether to measure, a real measurement on the session's
model that leaves the engine as it found it, then is read back from the cache, and the
matmul kernel's prefetch distance: the faster one kept, and set again from the cache."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

import pytest

from engine import thread_choice
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.spec_decode import SpeculativeConfig
from engine.thread_choice import (
    Choice,
    Timing,
    cache_key,
    choose_threads,
    read_cached,
    threshold_from,
    write_cached,
)
from model.kernels import autotune


def timings(*pairs: tuple[float, float]) -> list[Timing]:
    return [Timing(b, one, all_) for b, (one, all_) in zip((1, 2, 4, 8, 16), pairs)]


def test_threshold_is_the_first_batch_where_all_threads_win():
    assert threshold_from(timings((5, 7), (6, 7), (8, 7.5), (12, 8), (20, 10))) == 4
    assert threshold_from(timings((5, 4), (6, 7), (8, 9))) == 0  # all threads win at 1
    assert threshold_from(timings((5, 6), (6, 7), (8, 8))) == 8  # never: past the largest
    assert threshold_from(timings((5, 7), (6, 5.9))) == 2  # a tie is no win; 5.9 < 6 is


def engine(model, tokenizer, **overrides) -> BatchEngine:
    config = EngineConfig(**{"num_blocks": 64, "max_num_seqs": 16, "threads": 2, **overrides})
    return BatchEngine(config, model, tokenizer)


def test_cache_round_trips_and_is_keyed(tmp_path, model, tokenizer):
    core = engine(model, tokenizer).core
    path, key = tmp_path / "choices.json", cache_key(core, cpu="CPU A")
    assert read_cached(path, key) is None  # no file yet
    chosen = Choice(8, timings((5, 6), (6, 7)), 4096, {4096: 9.5, 16384: 9.9})
    write_cached(path, key, chosen)
    assert read_cached(path, key) == chosen
    assert read_cached(path, cache_key(core, cpu="CPU B")) is None
    other = engine(model, tokenizer, dtype="bfloat16").core
    assert read_cached(path, cache_key(other, cpu="CPU A")) is None
    write_cached(path, cache_key(core, cpu="CPU B"), Choice(0, timings((5, 4))))  # beside
    assert read_cached(path, key).single_thread_below == 8
    assert read_cached(path, cache_key(core, cpu="CPU B")) == Choice(0, timings((5, 4)))


def test_an_entry_without_the_prefetch_distance_is_measured_again(tmp_path, model, tokenizer):
    import json

    core = engine(model, tokenizer).core
    path, key = tmp_path / "choices.json", cache_key(core, cpu="CPU A")
    write_cached(path, key, Choice(8, timings((5, 6))))
    data = json.loads(path.read_text())
    for entry in data.values():
        del entry["prefetch_one_block"], entry["prefetch_ms"]  # as written before them
    path.write_text(json.dumps(data))
    assert read_cached(path, key) is None
    for entry in data.values():
        entry["prefetch_one_block"], entry["prefetch_ms"] = "4096", [1]  # hand-edited
    path.write_text(json.dumps(data))
    assert read_cached(path, key) is None


def test_the_default_prefetch_distance_stays_unless_another_is_clearly_faster():
    assert autotune.prefetch_from({4096: 10.0, 16384: 9.9}) == 4096  # 1%: a near tie
    assert autotune.prefetch_from({4096: 10.0, 16384: 9.5}) == 16384
    assert autotune.prefetch_from({4096: 9.0, 16384: 10.0}) == 4096


class Knob:
    """The kernels module's prefetch setter, recording what it was set to."""

    def __init__(self) -> None:
        self.distance, self.history = 4096, []

    def set_prefetch_one_block(self, distance: int) -> None:
        self.distance = distance
        self.history.append(distance)


def test_the_faster_prefetch_distance_is_kept_and_set_again_from_the_cache(
        tmp_path, monkeypatch, model, tokenizer, caplog):
    monkeypatch.setenv(thread_choice.CACHE_ENV, str(tmp_path / "choices.json"))
    monkeypatch.setattr(thread_choice, "measure", lambda core: timings((5, 4)))
    knob = Knob()
    monkeypatch.setattr(autotune, "knobs", lambda: knob)
    monkeypatch.setattr(thread_choice, "uses_dense_kernel", lambda core: True)
    # 16 KB is the faster here (the default, 4 KB, is tried first).
    monkeypatch.setattr(thread_choice, "_timed_steps",
                        lambda core, batch: [9.0 if knob.distance == 16384 else 10.0])
    caplog.set_level(logging.INFO, "nano_vllm.threads")
    assert choose_threads(engine(model, tokenizer).core) == 0
    rounds = autotune.ROUNDS
    assert knob.history == [4096, 16384] * rounds + [4096, 16384]  # tried, reset, chosen
    assert "matmul prefetch 16 KB ahead" in caplog.text and "4 KB 10.00 ms" in caplog.text
    knob.history.clear()
    monkeypatch.setattr(thread_choice, "_timed_steps", None)  # a second start measures nothing
    assert choose_threads(engine(model, tokenizer).core) == 0
    assert knob.history == [16384]


def parse(*argv: str, engine_process: bool = True) -> EngineConfig:
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    args = parser.parse_args(list(argv))
    args.engine_process = engine_process
    return EngineConfig.from_args(args)


def test_flags_choose_whether_to_measure():
    assert parse().measure_threads == "cached"
    given = parse("--single-thread-below", "4")
    assert (given.measure_threads, given.single_thread_below) == ("no", 4)
    assert parse("--single-thread-below", "measure").measure_threads == "again"
    in_process = parse(engine_process=False)
    assert (in_process.measure_threads, in_process.single_thread_below) == ("no", 16)
    with pytest.raises(ValueError, match="needs the engine core process"):
        parse("--single-thread-below", "measure", engine_process=False)
    with pytest.raises(SystemExit):
        parse("--single-thread-below", "some")


@pytest.fixture
def default_prefetch():
    """The kernel's prefetch distance back at its default after a test that chose one."""
    yield
    from model.dense_linear import load_dense_linear

    kernels = load_dense_linear()
    if kernels is not None:
        kernels.tuning.set_prefetch_one_block(autotune.DISTANCES[0])


def test_measuring_stops_at_the_first_batch_where_all_threads_win(monkeypatch, model,
                                                                  tokenizer):
    measured: list[int] = []

    def steps(core, batch: int) -> list[float]:  # all threads win from 4 sequences on
        measured.append(batch)
        if core.runner.threads.single_below > batch:
            return [10.0]  # one thread
        return [8.0 if batch >= 4 else 12.0]

    monkeypatch.setattr(thread_choice, "_timed_steps", steps)
    found = thread_choice.measure(engine(model, tokenizer).core)
    assert [t.batch for t in found] == [1, 2, 4] and max(measured) == 4
    assert threshold_from(found) == 4


def test_measures_leaving_the_engine_clean_then_reads_the_cache(tmp_path, monkeypatch,
                                                               model, tokenizer, caplog,
                                                               default_prefetch):
    monkeypatch.setenv(thread_choice.CACHE_ENV, str(tmp_path / "choices.json"))
    monkeypatch.setattr(thread_choice, "BATCH_SIZES", (1, 4))  # a few seconds
    monkeypatch.setattr(thread_choice, "TIMED_STEPS", 2)
    monkeypatch.setattr(autotune, "ROUNDS", 1)
    # What another process costs the measurement has a test of its own (below); here a busy
    # moment of the machine must not turn this one into that case.
    monkeypatch.setattr(thread_choice, "FOREIGN_LIMIT", float("inf"))
    spec = SpeculativeConfig(prompt_lookup_min=1)  # off while measuring: back after
    first = engine(model, tokenizer, speculative=spec)
    before = first.metrics.render()
    caplog.set_level(logging.INFO, "nano_vllm.threads")
    chosen = choose_threads(first.core)
    assert chosen in (0, 4, 8)  # the batch sizes measured, or past them
    assert "batch 16" not in caplog.text
    assert first.core.runner.threads.single_below == first.config.single_thread_below == chosen
    assert f"cached in {tmp_path / 'choices.json'}" in caplog.text
    assert "batch 1: 1 thread" in caplog.text and "2 threads" in caplog.text
    assert ("batch 4: 1 thread" in caplog.text) == (chosen != 0)  # measured up to a win
    if thread_choice.uses_dense_kernel(first.core):  # the dense kernel runs here
        assert "matmul prefetch" in caplog.text
    stats = first.core.stats()
    assert stats["blocks_used"] == stats["blocks_cached_free"] == stats["running"] == 0
    assert first.metrics.render() == before  # no step, request or token counted
    assert first.core.scheduler.speculative is spec
    small = engine(model, tokenizer, num_blocks=3).core  # 2 usable blocks: batch 1 only
    assert [t.batch for t in thread_choice.measure(small)] == [1]

    def no_measuring(core, batch_sizes=None):
        raise AssertionError("measured again, with a cached choice")

    monkeypatch.setattr(thread_choice, "measure", no_measuring)
    caplog.clear()
    second = engine(model, tokenizer)
    assert choose_threads(second.core) == chosen
    assert "read from" in caplog.text
    assert second.core.runner.threads.single_below == chosen
    with pytest.raises(AssertionError, match="measured again"):
        choose_threads(engine(model, tokenizer).core, again=True)


def spinning(count: int) -> list[subprocess.Popen]:
    """`count` processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def test_a_measurement_beside_a_busy_process_is_not_cached(tmp_path, monkeypatch, model,
                                                          tokenizer, caplog):
    """A spinning process on the other core while the first start measures: what it found
    is not cached, the configured default is used, and the next start measures again."""
    path = tmp_path / "choices.json"
    monkeypatch.setenv(thread_choice.CACHE_ENV, str(path))
    monkeypatch.setattr(thread_choice, "BATCH_SIZES", (1, 4))
    monkeypatch.setattr(thread_choice, "TIMED_STEPS", 2)
    caplog.set_level(logging.INFO, "nano_vllm.threads")
    core = engine(model, tokenizer, single_thread_below=0).core
    spinners = spinning(max(1, len(os.sched_getaffinity(0)) - 1))
    try:
        time.sleep(0.2)
        assert choose_threads(core) == 0
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    print(caplog.text)
    assert "not cached, measured again at the next start" in caplog.text
    assert "this start uses all threads for every step" in caplog.text
    assert not path.exists() or read_cached(path, cache_key(core)) is None
    assert core.runner.threads.single_below == 0


def test_the_cache_is_keyed_by_the_cpu_flags(monkeypatch, model, tokenizer):
    """Two CPUs with one model name and different flags get different entries."""
    from model.kernels import cpu

    core = engine(model, tokenizer).core
    first = cache_key(core, cpu="Intel(R) Xeon(R) Processor @ 2.80GHz")
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    second = cache_key(core, cpu="Intel(R) Xeon(R) Processor @ 2.80GHz")
    print(f"flags' digests: {first['cpu_flags']} and {second['cpu_flags']}")
    assert first["cpu"] == second["cpu"] and first["cpu_flags"] != second["cpu_flags"]
