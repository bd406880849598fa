"""engine/thread_choice.py: the threshold from timings, its cache (keyed, so another CPU
misses), the flags that choose whether to measure, and a real measurement on the session's
model that leaves the engine as it found it, then is read back from the cache."""

from __future__ import annotations

import argparse
import logging

import pytest

from engine import thread_choice
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.spec_decode import SpeculativeConfig
from engine.thread_choice import (
    Timing,
    cache_key,
    choose_threads,
    read_cached,
    threshold_from,
    write_cached,
)


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
    write_cached(path, key, 8, timings((5, 6), (6, 7)))
    assert read_cached(path, key) == (8, timings((5, 6), (6, 7)))
    assert read_cached(path, cache_key(core, cpu="CPU B")) is None
    other = engine(model, tokenizer, dtype="bfloat16").core
    assert read_cached(path, cache_key(other, cpu="CPU A")) is None
    write_cached(path, cache_key(core, cpu="CPU B"), 0, timings((5, 4)))  # beside, not over
    assert read_cached(path, key)[0] == 8
    assert read_cached(path, cache_key(core, cpu="CPU B"))[0] == 0


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


def test_measures_leaving_the_engine_clean_then_reads_the_cache(tmp_path, monkeypatch,
                                                               model, tokenizer, caplog):
    monkeypatch.setenv(thread_choice.CACHE_ENV, str(tmp_path / "choices.json"))
    monkeypatch.setattr(thread_choice, "BATCH_SIZES", (1, 4))  # a few seconds
    monkeypatch.setattr(thread_choice, "TIMED_STEPS", 2)
    spec = SpeculativeConfig(prompt_lookup_min=1)  # off while measuring: back after
    first = engine(model, tokenizer, speculative=spec)
    before = first.metrics.render()
    caplog.set_level(logging.INFO, "nano_vllm.threads")
    chosen = choose_threads(first.core)
    assert chosen in (0, 4, 8)  # the batch sizes measured, or past them
    assert "batch 16" not in caplog.text
    assert first.core.runner.threads.single_below == first.config.single_thread_below == chosen
    assert f"cached in {tmp_path / 'choices.json'}" in caplog.text
    assert "batch 4: 1 thread" in caplog.text and "2 threads" in caplog.text
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
