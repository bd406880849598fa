"""api/model_pool.py and api/model_budget.py over fake engines: which models are unloaded to
make room (least recently used idle ones, never one with requests in flight), one load for
every request waiting on it, a 503 with Retry-After past the bound, the memory arithmetic."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI

from api.errors import APIError
from api.model_budget import LoadPolicy, estimate_bytes, loaded_at_start, room_for
from api.model_pool import ModelPool
from api.model_slot import LOADED, UNLOADED, ModelSlot, ServedModel
from engine.config import EngineConfig

MIB = 1024**2


class FakeEngine:
    """What the pool uses of an engine: counts, stop and failure hooks."""

    def __init__(self) -> None:
        self.num_in_flight = 0
        self.is_alive = True
        self.unavailable_reason: str | None = None
        self.stopped = False

    def start(self) -> None: ...

    def shutdown(self) -> None:
        self.stopped = True

    def stop_accepting(self, reason: str) -> None:
        self.unavailable_reason = reason

    def abort_all(self, error: str) -> None: ...

    def on_failure(self, callback: Callable[[], None]) -> None: ...

    def stats(self) -> dict[str, int]:
        return {"blocks_used": 0}


def pool_of(names: list[str], policy: LoadPolicy, budget: int | None = None,
            load_seconds: float = 0.0, loaded: int = 1) -> tuple[ModelPool, list[str]]:
    """A pool of fake models (the first `loaded` loaded), and the log of the loads."""
    loads: list[str] = []

    def build(name: str, _path: str | None) -> ServedModel:
        loads.append(name)
        time.sleep(load_seconds)
        return ServedModel(name, FakeEngine(), FastAPI())  # type: ignore[arg-type]

    slots = [ModelSlot(name, None, 100 * MIB) for name in names]
    for slot in slots[:loaded]:
        slot.model, slot.state = build(slot.name, None), LOADED
    loads.clear()
    return ModelPool(slots, build, policy, budget), loads


def slot(name: str, state: str, last_used: float, busy: int = 0, estimate: int = 1) -> ModelSlot:
    return ModelSlot(name, None, estimate, state=state, last_used=last_used, active=busy)


def test_room_is_made_from_the_least_recently_used_idle_models():
    a, b, c = slot("a", LOADED, 1.0), slot("b", LOADED, 2.0), slot("c", LOADED, 3.0)
    new = slot("new", UNLOADED, 0.0)
    picked = room_for(new, [a, b, c, new], LoadPolicy(max_loaded=2), None)
    print([s.name for s in picked])
    assert [s.name for s in picked] == ["a", "b"]
    a.active = 1  # a model with requests in flight is never unloaded
    assert [s.name for s in room_for(new, [a, b, c, new], LoadPolicy(max_loaded=2), None)] == [
        "b", "c"]
    assert room_for(new, [a, b, new], LoadPolicy(max_loaded=1), None) is None
    # memory: 3 + 3 + 4 > 8, so the least recently used idle one goes
    a.active, a.estimate, b.estimate, new.estimate = 0, 3, 3, 4
    assert [s.name for s in room_for(new, [a, b, new], LoadPolicy(), 8)] == ["a"]
    assert room_for(new, [a, b, new], LoadPolicy(), 10) == []


def test_as_many_load_at_start_as_fit():
    assert loaded_at_start([5, 5, 5], LoadPolicy(), None) == 3
    assert loaded_at_start([5, 5, 5], LoadPolicy(max_loaded=2), None) == 2
    assert loaded_at_start([5, 5, 5], LoadPolicy(), 11) == 2
    assert loaded_at_start([20, 5], LoadPolicy(), 11) == 1  # the first always loads


def test_the_estimate_is_weights_plus_kv_cache_plus_process(tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "hidden_size": 576}))
    config = EngineConfig(num_blocks=64)
    block = 2 * 30 * 16 * 3 * 64 * 4  # K and V, layers, tokens, KV heads, head dim, fp32
    estimate = estimate_bytes(config, tmp_path, free=None)
    print(f"estimate {estimate}, of which KV {64 * block}")
    assert estimate == 1000 + 64 * block + 400 * MIB
    sized = EngineConfig(kv_cache_memory="256MiB")
    assert estimate_bytes(sized, tmp_path, free=None) == 1000 + 256 * MIB + 400 * MIB
    auto = EngineConfig()  # 40% of what is free once the weights are in, at most 2 GiB
    assert estimate_bytes(auto, tmp_path, free=1000 + 1000 * MIB) == (
        1000 + 400 * MIB + 400 * MIB)
    encoder = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**encoder,
                                                      "use_bidirectional_attention": True}))
    assert estimate_bytes(auto, tmp_path, free=None) == 1000 + 400 * MIB  # no KV cache


def test_concurrent_requests_share_one_load_and_lru_unloads_the_idle_one():
    async def scenario() -> None:
        pool, loads = pool_of(["a", "b"], LoadPolicy(max_loaded=1), load_seconds=0.3)
        await pool.open()
        first_a = pool.slots["a"].model
        got = await asyncio.gather(*(pool.acquire("b") for _ in range(5)))
        print("loads:", loads)
        assert loads == ["b"] and len({id(m) for m in got}) == 1
        assert pool.state("a") == UNLOADED and first_a.engine.stopped
        for model in got:
            pool.release(model)
        await pool.close()

    asyncio.run(scenario())


def test_past_the_bound_a_request_gets_503_with_retry_after():
    async def scenario() -> None:
        pool, _ = pool_of(["a", "b"], LoadPolicy(max_loaded=1, load_timeout=0.3))
        await pool.open()
        busy = await pool.acquire("a")  # a has a request in flight: it cannot be unloaded
        with pytest.raises(APIError) as refused:
            await pool.acquire("b")
        print(refused.value.message)
        assert refused.value.status == 503 and refused.value.retry_after >= 1
        assert "requests in flight" in refused.value.message
        with pytest.raises(APIError) as busy_unload:
            await pool.unload("a")
        assert busy_unload.value.status == 409
        pool.release(busy)
        waiting = asyncio.create_task(pool.acquire("b"))  # now a is idle: unloaded for b
        pool.release(await waiting)
        assert pool.state("b") == LOADED and pool.state("a") == UNLOADED
        assert await pool.unload("b") == UNLOADED
        await pool.close()

    asyncio.run(scenario())


def test_a_slow_load_is_503_past_the_bound_and_goes_on():
    async def scenario() -> None:
        pool, loads = pool_of(["a", "b"], LoadPolicy(load_timeout=0.2), load_seconds=0.6)
        await pool.open()
        with pytest.raises(APIError) as slow:
            await pool.acquire("b")
        print(slow.value.message)
        assert slow.value.status == 503 and "still loading" in slow.value.message
        await asyncio.sleep(0.6)
        assert pool.state("b") == LOADED and loads == ["b"]
        await pool.close()
        pool.shutdown()  # every engine process stopped
        assert all(s.model.engine.stopped for s in pool.slots.values())

    asyncio.run(scenario())
