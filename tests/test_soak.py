"""A minute of the soak (benchmarks/soak.py) against a real server process: mixed and hostile
traffic, then no broken promise, no leaked block, /metrics agreeing with the client, bounded
memory growth and a clean SIGTERM exit. The README's figures come from a 10-minute run."""

from __future__ import annotations

from benchmarks.soak import run


def test_soak_one_minute(tmp_path):
    report = run(duration=45, warmup=15, log_path=tmp_path / "server.log")
    print({k: report[k] for k in ("duration_s", "client_counts", "metrics_by_reason",
                                  "preemptions", "blocks_idle", "rss_mib", "exit_code")})
    print("violations:", report["violations"])
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert not failed, failed
    assert report["preemptions"] > 0  # the long prompts did overflow the pool
