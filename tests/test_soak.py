"""Half a minute of the soak (benchmarks/soak.py) against a real server process: mixed and hostile
traffic, then no broken promise, no leaked block, /metrics agreeing with the client, bounded
memory growth and a clean SIGTERM exit. The README's figures come from a 10-minute run."""

from __future__ import annotations

import asyncio
import time

from benchmarks.soak import rss_grew_less_than, run, sample_when_warm


def test_soak_half_a_minute(tmp_path):
    report = run(duration=30, warmup=10, log_path=tmp_path / "server.log")
    print({k: report[k] for k in ("duration_s", "client_counts", "metrics_by_reason",
                                  "preemptions", "blocks_idle", "rss_mib", "exit_code")})
    print("violations:", report["violations"])
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert not failed, failed
    assert report["preemptions"] > 0  # the long prompts did overflow the pool


def test_no_warm_up_sample_fails_the_memory_check():
    assert rss_grew_less_than({"start": 300, "warm": 400, "end": 450}, 100)
    assert not rss_grew_less_than({"start": 300, "warm": 400, "end": 520}, 100)
    assert not rss_grew_less_than({"start": 300, "end": 300}, 100)  # nothing was measured


def test_the_warm_up_sample_is_taken_only_while_the_load_runs():
    def samples(load_s: float, warmup: float) -> list[float]:
        taken: list[float] = []
        asyncio.run(sample_when_warm(asyncio.sleep(load_s), warmup,
                                     lambda: taken.append(time.monotonic())))
        return taken

    assert len(samples(0.3, 0.05)) == 1
    assert samples(0.05, 0.3) == []  # the load ended within the warm-up
