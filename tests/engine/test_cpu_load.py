"""engine/cpu_load.py: other processes' CPU time read from /proc, and a step's threads held
to the cores they leave free: from readings made up, from a real spinning process, and in
a real engine step."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

from engine import cpu_load
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.cpu_load import ContentionWatch, ForeignLoad
from engine.request import Request, SamplingParams

CPUS = len(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(CPUS < 2, reason="one CPU: there is no thread to give back")


def spinning(count: int) -> list[subprocess.Popen]:
    """`count` processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        p.kill()
        p.wait()


class Machine:
    """Made-up /proc readings: `busy` seconds of the CPUs, `own` of our processes, `now`."""

    def __init__(self, monkeypatch) -> None:
        self.busy = self.own = self.now = 0.0
        monkeypatch.setattr(cpu_load, "busy_seconds", lambda cpus: self.busy)
        monkeypatch.setattr(cpu_load, "process_seconds", lambda pid: self.own)
        monkeypatch.setattr(cpu_load.time, "monotonic", lambda: self.now)

    def run(self, seconds: float, ours: float, others: float) -> None:
        """`seconds` pass with `ours` and `others` cores busy."""
        self.now += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds


def test_threads_follow_the_cores_the_others_leave(monkeypatch):
    machine = Machine(monkeypatch)
    watch = ContentionWatch(max_threads=2)
    watch.load.cpus = frozenset({0, 1})
    seen = []
    for ours, others in [(2.0, 0.0), (1.4, 0.6), (1.0, 1.0), (1.0, 1.0), (2.0, 0.3),
                         (1.55, 0.45), (2.0, 0.0)]:
        machine.run(0.3, ours, others)
        seen.append(watch.threads())
    print(f"threads allowed, reading by reading: {seen}")
    # 0.6 of a core taken: more than half, so one thread; under half: still both.
    assert seen == [2, 1, 1, 1, 2, 2, 2]
    machine.run(0.1, 1.0, 1.0)  # within the interval: no new reading
    assert watch.threads() == 2


def test_no_proc_means_no_watch(monkeypatch):
    monkeypatch.setattr(cpu_load, "busy_seconds", lambda cpus: None)
    watch = ContentionWatch(max_threads=2)
    assert not watch.enabled and watch.threads() == 2
    assert ForeignLoad().cores_since_last() is None


@needs_two
def test_a_spinning_process_takes_a_thread_and_gives_it_back():
    watch = ContentionWatch(max_threads=CPUS, interval=0.0)
    time.sleep(0.3)
    idle = watch.load.cores_since_last()
    watch.threads()
    spinners = spinning(CPUS - 1)
    try:
        time.sleep(0.5)
        watch.threads()  # the reading that spans the spinners' start
        time.sleep(0.5)
        busy = watch.threads()
    finally:
        stop(spinners)
    time.sleep(0.5)
    watch.threads()
    time.sleep(0.5)
    back = watch.threads()
    print(f"{CPUS} CPUs: idle {idle:.2f} foreign cores; with {CPUS - 1} spinning: {busy} "
          f"thread(s); after: {back}")
    assert busy == 1 and back == CPUS


@needs_two
def test_engine_steps_on_one_thread_beside_a_busy_process(model, tokenizer, caplog):
    """The same answer, on one thread while a process spins, on all of them after."""
    caplog.set_level(logging.WARNING, "nano_vllm.threads")
    engine = BatchEngine(EngineConfig(num_blocks=64, single_thread_below=0), model, tokenizer)
    policy = engine.core.runner.threads
    policy.watch.interval = 0.0
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    def answer(name: str) -> tuple[list[int], set[int]]:
        tokens: list[int] = []
        threads: set[int] = set()
        engine.add_request(Request(name, [1, 2, 3, 4], params,
                                   lambda out: tokens.extend(out.token_ids)))
        while engine.has_work():
            engine.step()
            threads.add(torch.get_num_threads())
            time.sleep(0.05)
        return tokens, threads

    spinners = spinning(CPUS - 1)
    try:
        time.sleep(0.3)
        busy_tokens, busy_threads = answer("busy")
    finally:
        stop(spinners)
    time.sleep(0.3)
    idle_tokens, idle_threads = answer("idle")
    print(f"beside a spinning process: threads {busy_threads}; after: {idle_threads}")
    assert busy_tokens == idle_tokens
    assert 1 in busy_threads and CPUS in idle_threads
    assert "while others hold cores" in caplog.text
