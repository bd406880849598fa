"""OpenAIServing.outputs notices a client that left within DISCONNECT_CHECK_SECONDS, whether
outputs keep coming or none do, and aborts the job's requests (api/serving.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from api import serving
from api.job import Job, Prompt
from api.serving import OpenAIServing
from engine.request import RequestOutput

CHECK = 0.1  # seconds, for these tests


class Client:
    """A request whose client leaves at `leaves_at` (monotonic time)."""

    def __init__(self, leaves_at: float) -> None:
        self.leaves_at = leaves_at

    async def is_disconnected(self) -> bool:
        return time.monotonic() >= self.leaves_at


async def read(output_every: float | None, tokens: int = 1000) -> tuple[int, float, list[str]]:
    """Outputs read, seconds from the client leaving to the end, requests aborted."""
    job = Job("cmpl-x", "m", [Prompt([1, 2])], n=1, num_samples=1, request_ids=["r-0"])
    aborted: list[str] = []
    owner = SimpleNamespace(engine=SimpleNamespace(abort=aborted.append))

    async def feed() -> None:
        for k in range(tokens):
            await asyncio.sleep(output_every)
            job.queue.put_nowait((0, RequestOutput("r-0", "x", [7], num_output_tokens=k + 1)))

    feeder = asyncio.create_task(feed()) if output_every is not None else None
    leaves_at = time.monotonic() + 2.5 * CHECK
    count = 0
    async for _ in OpenAIServing.outputs(owner, job, Client(leaves_at)):  # type: ignore[arg-type]
        count += 1
    if feeder is not None:
        feeder.cancel()
    return count, time.monotonic() - leaves_at, aborted


@pytest.mark.parametrize("output_every", [0.005, None], ids=["outputs-coming", "no-outputs"])
def test_a_client_that_left_is_noticed_within_the_check_interval(monkeypatch,
                                                                 output_every) -> None:
    monkeypatch.setattr(serving, "DISCONNECT_CHECK_SECONDS", CHECK)
    count, late, aborted = asyncio.run(read(output_every))
    assert 0 <= late < CHECK + 0.05
    assert aborted == ["r-0"]
    if output_every is not None:
        assert count > 0


def test_a_job_that_finishes_is_not_aborted(monkeypatch) -> None:
    monkeypatch.setattr(serving, "DISCONNECT_CHECK_SECONDS", CHECK)

    async def run() -> tuple[list[RequestOutput], list[str]]:
        job = Job("cmpl-x", "m", [Prompt([1, 2])], n=1, num_samples=1, request_ids=["r-0"])
        aborted: list[str] = []
        owner = SimpleNamespace(engine=SimpleNamespace(abort=aborted.append))
        job.queue.put_nowait((0, RequestOutput("r-0", "a", [7])))
        job.queue.put_nowait((0, RequestOutput("r-0", "b", [8], finished=True)))
        far = Client(time.monotonic() + 60)
        outputs = [o async for _, o in OpenAIServing.outputs(owner, job, far)]  # type: ignore[arg-type]
        return outputs, aborted

    outputs, aborted = asyncio.run(run())
    assert [o.text for o in outputs] == ["a", "b"] and aborted == []
