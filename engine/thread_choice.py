"""How many tokens a step needs before it uses every thread, and how far ahead the matmul
kernel prefetches for a step of a few rows: measured on this machine, once.

A decode step of a few sequences runs faster on one OpenMP thread on some CPUs (the
threads' start and join cost more than they share) and slower on others. The engine core
process, when --single-thread-below is not given, times decode steps here at batch sizes 1,
2, 4, 8 and 16, on one thread and on all of them in turns, and picks the first batch size
where all threads win (it stops there: larger steps are not timed, which on a CPU where all
threads win at once leaves a first start a fifth of the measuring). The choice is kept in a
JSON file under the cache root, keyed by what it depends on (the CPU's model, the thread
count, the model, its dtype and weights, the attention and matmul paths, whether decode
steps run as one C++ call), so a later start reads it in no time.

Then, where the dense matmul kernel runs, the kernels' start-up autotuner
(model/kernels/autotune.py) is handed decode steps to time and picks the matmul's prefetch
distance for a step of a few rows; the engine caches its answer with the threads'.

A measurement describes the machine only if nothing else ran on it meanwhile: another
process on one core makes the all-threads steps wait for the thread sharing it (a busy first
start once cached "1 thread below 32 tokens" where the idle machine wants all threads at
every size). So the CPU time of other processes during the measurement is read from /proc
(engine/cpu_load.py); above FOREIGN_LIMIT cores the choice is not cached, the start says so
and uses the configured default (all threads, fewer while the others hold cores), and the
next start measures again. The cache is keyed by the CPU's flags as well as its model name:
two different CPUs here both call themselves "Intel(R) Xeon(R) Processor @ 2.80GHz".

In-process (--no-engine-process) the step shares the GIL with the HTTP server: a
measurement taken at start, with no HTTP load, would favour threads that lose once requests
arrive, so that mode keeps its fixed default (engine/config.py) and never measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.core import PagedEngineCore
from engine.cpu_load import ForeignLoad
from engine.request import FinishReason, Request, SamplingParams
from model.kernels import autotune

log = logging.getLogger("nano_vllm.threads")

BATCH_SIZES = (1, 2, 4, 8, 16)
TIMED_STEPS = 4  # decode steps timed per batch size, thread count and round (after a warm-up)
# One thread and all threads are timed in turns, this many times each: a slow moment of a
# shared machine (another process, a frequency dip) then lands on both, not on one of them.
ROUNDS = 3
PROMPT = [1, 2, 3, 4]  # short enough, with the steps' tokens, to fill no block
CACHE_ENV = "NANO_THREADS_CACHE"  # a file path replacing the default cache file
FORCE_ENV = "NANO_MEASURE_THREADS"  # "1": measure again, as --single-thread-below measure
# Other processes' CPU time during a measurement, in cores on average, above which it is not
# cached (an idle machine measured 0.01-0.03 here; one spinning process, 0.7-1.0).
FOREIGN_LIMIT = 0.2


@dataclass
class Timing:
    """The median decode step of `batch` sequences, in ms, on one thread and on all."""

    batch: int
    one_thread_ms: float
    all_threads_ms: float


def threshold_from(timings: Sequence[Timing]) -> int:
    """The first batch size where all threads are faster (0 if they are at batch 1, so no
    step runs on one thread); if they never are, twice the largest batch measured."""
    for t in sorted(timings, key=lambda t: t.batch):
        if t.all_threads_ms < t.one_thread_ms:
            return 0 if t.batch == 1 else t.batch
    return 2 * max(t.batch for t in timings)


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cache_file() -> Path:
    """$NANO_THREADS_CACHE, else thread-choices.json under the cache root (model/prepare.py)."""
    from model.prepare import cache_dir

    return Path(os.environ.get(CACHE_ENV) or cache_dir() / "thread-choices.json")


def cache_key(core: PagedEngineCore, cpu: str | None = None) -> dict[str, object]:
    """What the choice depends on."""
    config, runner = core.config, core.runner
    from model.kernels.cpu import EMULATED_MARCH, cpu_flags, emulated_cpu
    from model.prepare import resolve_model_dir

    emulated = emulated_cpu()
    cpu = (cpu or cpu_model_name()) + (f" as {EMULATED_MARCH[emulated]}" if emulated else "")
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    return {"cpu": cpu, "cpu_flags": flags, "threads": runner.threads.max_threads,
            "model": str(resolve_model_dir(config.model)), "dtype": config.dtype,
            "weights": config.weights, "attention": runner.attention_backend,
            "matmul": runner.matmul_path, "fused_ops": config.fused_ops,
            "decode_stack": runner.decode_stack is not None}


def _key_text(key: dict[str, object]) -> str:
    return json.dumps(key, sort_keys=True)


def _read_all(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("threads: ignoring the unreadable cache %s (%s)", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class Choice:
    """What was chosen for one key, and the timings it was chosen from: the threshold, and
    the one-block prefetch distance (None where the dense kernel does not run) with the
    median step (ms) at each distance tried (model/kernels/autotune.py)."""

    single_thread_below: int
    timings: list[Timing]
    prefetch_one_block: int | None = None
    prefetch_ms: dict[int, float] | None = None


def read_cached(path: Path, key: dict[str, object]) -> Choice | None:
    """The cached choice for `key`, or None (also for an entry from before the prefetch
    distance was measured)."""
    entry = _read_all(path).get(_key_text(key))
    if (not isinstance(entry, dict) or not isinstance(entry.get("single_thread_below"), int)
            or "prefetch_one_block" not in entry):
        return None
    prefetch_ms = entry.get("prefetch_ms")
    if not (entry["prefetch_one_block"] is None or isinstance(entry["prefetch_one_block"], int)
            ) or not (prefetch_ms is None or isinstance(prefetch_ms, dict)):
        log.warning("threads: ignoring a malformed entry in %s", path)
        return None
    return Choice(entry["single_thread_below"], [Timing(**t) for t in entry.get("timings", [])],
                  entry["prefetch_one_block"],
                  {int(b): ms for b, ms in prefetch_ms.items()} if prefetch_ms else None)


def write_cached(path: Path, key: dict[str, object], choice: Choice) -> None:
    """Add (or replace) `key`'s entry, written whole to a temporary file then renamed, so a
    reader never sees half a file."""
    data = _read_all(path)
    data[_key_text(key)] = {"key": key, "single_thread_below": choice.single_thread_below,
                            "timings": [vars(t) for t in choice.timings],
                            "prefetch_one_block": choice.prefetch_one_block,
                            "prefetch_ms": choice.prefetch_ms}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _timed_steps(core: PagedEngineCore, batch: int) -> list[float]:
    """Seat `batch` short greedy requests, prefill them, then time decode steps of exactly
    `batch` tokens, in ms; the requests are finished after."""
    params = SamplingParams(max_tokens=2 + 2 * TIMED_STEPS, temperature=0, ignore_eos=True)
    requests = [Request(f"thread-measure-{batch}-{i}", list(PROMPT), params, lambda _: None)
                for i in range(batch)]
    try:
        for r in requests:
            core.add(r)
        for _ in range(len(PROMPT) * batch):  # prefill (in chunks, if the step budget asks)
            if all(len(r.token_ids) > len(PROMPT) for r in requests):
                break
            core.step()
        times = []
        for _ in range(1 + TIMED_STEPS):
            start = time.perf_counter()
            result = core.step()
            times.append((time.perf_counter() - start) * 1000)
            assert result.num_scheduled_tokens == batch and not result.failed, result
        return times[1:]  # the first: a warm-up
    finally:
        for r in requests:
            core.finish(r, FinishReason.ABORT)


@contextmanager
def timing_steps(core: PagedEngineCore) -> Iterator[None]:
    """Speculation off while steps are timed (drafts would make a decode step more than one
    token); afterwards the core is checked clean: no request, no block held or cached."""
    scheduler, policy = core.scheduler, core.runner.threads
    speculative, scheduler.speculative = scheduler.speculative, None
    watch, policy.watch = policy.watch, None  # the thread counts timed are the ones asked for
    try:
        yield
    finally:
        scheduler.speculative = speculative
        policy.watch = watch
    check_clean(core)


def measure(core: PagedEngineCore, batch_sizes: Sequence[int] | None = None) -> list[Timing]:
    """Median decode step times at each batch size (default BATCH_SIZES; those that fit the
    seats and the free blocks, one each), on one thread and on all in turns (ROUNDS of
    TIMED_STEPS each), with no speculation, up to the first batch size where all threads win
    (threshold_from's answer is then settled); the core is left as it was (asserted): no
    request, no block held."""
    policy, scheduler = core.runner.threads, core.scheduler
    before = policy.single_below
    fits = min(scheduler.max_num_seqs, core.allocator.num_free)
    timings = []
    with timing_steps(core):
        try:
            for batch in (b for b in batch_sizes or BATCH_SIZES if b <= fits):
                one: list[float] = []
                every: list[float] = []
                for _ in range(ROUNDS):
                    for single_below, times in ((batch + 1, one), (0, every)):
                        policy.single_below = single_below
                        times.extend(_timed_steps(core, batch))
                timings.append(Timing(batch, round(statistics.median(one), 2),
                                      round(statistics.median(every), 2)))
                if timings[-1].all_threads_ms < timings[-1].one_thread_ms:
                    break
        finally:
            policy.single_below = before
    return timings


def uses_dense_kernel(core: PagedEngineCore) -> bool:
    """Do the core's matmuls run on the dense kernel (whose prefetch distance is tuned)?"""
    return "packed-kernel" in core.runner.matmul_path


def tune_prefetch(core: PagedEngineCore) -> autotune.Prefetch | None:
    """The autotuner's prefetch distance, from decode steps of this core (no speculation)."""
    with timing_steps(core):
        return autotune.tune_prefetch(lambda rows: _timed_steps(core, rows))


def check_clean(core: PagedEngineCore) -> None:
    """Nothing left of the measurement: no request, no block used or cached."""
    stats = core.stats()
    assert stats["running"] == stats["waiting"] == 0, stats
    assert stats["blocks_used"] == stats["blocks_cached_free"] == 0, stats
    assert not core.allocator._by_hash, "the measurement cached a prefix"
    core.allocator.check_invariants()


def describe_threshold(threshold: int) -> str:
    return "all threads for every step" if threshold == 0 else f"1 below {threshold} tokens"


def describe(choice: Choice, threads: int) -> str:
    measured = "; ".join(f"batch {t.batch}: 1 thread {t.one_thread_ms:.1f} ms, {threads} "
                         f"threads {t.all_threads_ms:.1f} ms" for t in choice.timings)
    text = f"{describe_threshold(choice.single_thread_below)} (measured: {measured})"
    if choice.prefetch_ms:
        tried = ", ".join(f"{b // 1024} KB {ms:.2f} ms" for b, ms in choice.prefetch_ms.items())
        text += (f"; matmul prefetch {choice.prefetch_one_block // 1024} KB ahead for a few "
                 f"rows ({autotune.ROWS}-sequence step: {tried})")
    return text


def choose_threads(core: object, again: bool = False,
                   own_pids: Sequence[int] = ()) -> int | None:
    """Set the core's --single-thread-below from the cache or a measurement (`again`, or
    $NANO_MEASURE_THREADS=1: measure even if cached) and return it; None where there is
    nothing to choose (not nano-vLLM's paged core, not on the CPU, or one thread).
    `own_pids`: processes whose CPU time is not another's load (the API process)."""
    if not isinstance(core, PagedEngineCore) or core.runner.device.type != "cpu":
        return None
    policy = core.runner.threads
    if policy.max_threads < 2:
        log.info("threads: one thread for every step (one CPU, or --threads 1)")
        policy.single_below = 0
        return None
    path, key, threads = cache_file(), cache_key(core), policy.max_threads
    again = again or os.environ.get(FORCE_ENV) == "1"
    kernel = uses_dense_kernel(core)
    choice = None if again else read_cached(path, key)
    if choice is not None:
        log.info("threads: %s, read from %s", describe(choice, threads), path)
    else:
        log.info("threads: measuring decode steps on 1 and %d threads ...", threads)
        load = ForeignLoad(own_pids)
        timings = measure(core)
        choice = Choice(threshold_from(timings), timings)
        foreign = load.cores_since_last()
        if foreign is not None and foreign > FOREIGN_LIMIT:
            log.warning("threads: other processes used %.2f cores while this start measured "
                        "(%s): not cached, measured again at the next start; this start "
                        "uses %s", foreign, describe(choice, threads),
                        describe_threshold(core.config.single_thread_below))
            choice = Choice(core.config.single_thread_below, timings)
        else:
            policy.single_below = choice.single_thread_below
            tuned = tune_prefetch(core) if kernel else None
            if tuned is not None:
                choice.prefetch_one_block, choice.prefetch_ms = tuned.distance, tuned.step_ms
            write_cached(path, key, choice)
            log.info("threads: %s, cached in %s", describe(choice, threads), path)
    policy.single_below = core.config.single_thread_below = choice.single_thread_below
    if kernel and choice.prefetch_one_block is not None:
        autotune.set_prefetch(choice.prefetch_one_block)
    return choice.single_thread_below
