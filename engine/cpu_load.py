"""How much of this machine's CPUs other processes are using: read from /proc, not guessed.

OpenMP threads wait for each other at the end of every parallel region, so a step on all
threads runs at the pace of the slowest: when another process holds one of the cores, the
thread that shares its core gets a time slice now and then, and the whole step waits for it
(measured on 2 cores with a spinning process beside the engine core: a decode step of
SmolLM2 twice as slow on AMD EPYC Zen 5, 29 times on an Intel Xeon of family 6 model 106),
while a step on one thread keeps its own core and its speed.

Two users:
- the first-start measurement (engine/thread_choice.py) is never cached when another
  process was busy while it ran: it would describe that moment, not the machine;
- `ContentionWatch` lets a step use no more threads than there are cores the others leave
  free, and gives the threads back when the cores come back.

Foreign time is the busy time of this process's CPUs (/proc/stat: everything but idle and
iowait; steal, a hypervisor running another machine, counts as busy) less the time of our
own processes (/proc/PID/stat), over the same interval. Without /proc, nothing is foreign.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass

log = logging.getLogger("nano_vllm.threads")

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of CPU time at one moment: `busy` on the CPUs watched, `own` by our
    processes; `at`: time.monotonic()."""

    busy: float
    own: float
    at: float


def busy_seconds(cpus: Collection[int]) -> float | None:
    """Seconds the CPUs `cpus` have spent busy since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal (guest time is inside user's)
        fields = [int(v) for v in rest.split()[:8]]
        total += sum(fields) - fields[3] - fields[4]
    return total / TICKS


def process_seconds(pid: int) -> float:
    """User plus system seconds of process `pid`, all its threads (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return 0.0
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


class ForeignLoad:
    """Cores' worth of CPU time that other processes take from the CPUs this process may run
    on, between two readings. `own_pids`: our processes (this one by default; the engine core
    adds the API process that started it, whose work is part of serving)."""

    def __init__(self, own_pids: Collection[int] = ()) -> None:
        self.cpus = frozenset(os.sched_getaffinity(0))
        self.own_pids = tuple(dict.fromkeys([os.getpid(), *own_pids]))
        self.last = self.read()

    def add_own(self, pid: int) -> None:
        """Count process `pid`'s CPU time as ours from now on."""
        if pid not in self.own_pids:
            self.own_pids += (pid,)
            self.last = self.read()

    def read(self) -> CpuTimes | None:
        busy = busy_seconds(self.cpus)
        if busy is None:
            return None
        return CpuTimes(busy, sum(process_seconds(p) for p in self.own_pids), time.monotonic())

    def cores_since_last(self) -> float | None:
        """Average foreign cores since the last call (or since this object was made), or
        None where /proc cannot tell or no time has passed."""
        now, before = self.read(), self.last
        self.last = now
        if now is None or before is None or now.at <= before.at:
            return None
        foreign = (now.busy - before.busy) - (now.own - before.own)
        return max(0.0, foreign / (now.at - before.at))


class ContentionWatch:
    """How many threads a step may use now: all of them, or fewer while other processes keep
    cores busy (read every `interval` seconds at most: a read costs tens of microseconds)."""

    def __init__(self, max_threads: int, own_pids: Collection[int] = (),
                 interval: float = 0.25) -> None:
        self.max_threads = max_threads
        self.load = ForeignLoad(own_pids)
        self.interval = interval
        self.allowed = max_threads
        self.enabled = max_threads > 1 and self.load.last is not None

    def threads(self) -> int:
        """The threads a step may use: the cores the others leave free (a core counts as
        taken from more than half of it busy), at least one."""
        if not self.enabled:
            return self.max_threads
        if time.monotonic() - self.load.last.at < self.interval:
            return self.allowed
        foreign = self.load.cores_since_last()
        if foreign is None:
            return self.allowed
        free = len(self.load.cpus) - foreign
        allowed = max(1, min(self.max_threads, int(free + 0.5)))
        if allowed != self.allowed:
            log.warning("threads: %s (other processes used %.1f of %d cores)",
                        f"{allowed} of {self.max_threads} while others hold cores"
                        if allowed < self.max_threads else f"all {allowed} again",
                        foreign, len(self.load.cpus))
            self.allowed = allowed
        return allowed
