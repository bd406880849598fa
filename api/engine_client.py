"""What the API needs from an engine: engine/batch_engine.py's BatchEngine and
the engine wrapped around baseline_server.py's core both fit, and a test may pass a fake."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from api.dashboard.routes import DashboardSource
from engine.request import Request

if TYPE_CHECKING:
    import asyncio

    from transformers import PreTrainedTokenizerBase

    from engine.config import EngineConfig
    from engine.core import EngineStats
    from model.embedding import EmbeddingInfo


class MetricsRenderer(Protocol):
    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        ...


class EngineClient(DashboardSource, Protocol):
    """An engine running on its own thread, fed requests from the event loop's thread; the
    dashboard's view of it too (DashboardSource).

    Outputs come back through each request's `on_output` callback, called on the engine's
    thread, or on the event loop's (`outputs_on`)."""

    tokenizer: PreTrainedTokenizerBase
    metrics: MetricsRenderer

    @property
    def max_tokens_per_request(self) -> int:
        """Prompt + completion tokens one request may hold at most."""
        ...

    @property
    def model_type(self) -> str:
        """The architecture served: config.json's model_type ("llama", "qwen2", ...)."""
        ...

    @property
    def max_position_embeddings(self) -> int:
        """The model's own context length, from its config.json."""
        ...

    @property
    def embedding_info(self) -> EmbeddingInfo | None:
        """An embedding model's sizes and task prompts; None for a model that generates."""
        ...

    @property
    def max_num_seqs(self) -> int:
        """Seats: also the most samples (n, best_of) one prompt may ask for."""
        ...

    @property
    def unavailable_reason(self) -> str | None:
        """Why new requests are refused (shutting down, engine dead); None when serving."""
        ...

    @property
    def scheduling_policy(self) -> str:
        """"fcfs" or "priority" (only then is a request's priority honoured)."""
        ...

    def add_request(self, request: Request) -> None:
        """Queue a request; raises engine.admission.QueueFullError if the line is full,
        EngineUnavailableError if the engine takes no new requests."""
        ...

    def abort(self, request_id: str) -> None:
        """Cancel a request; an unknown or finished id is ignored."""
        ...

    def describe(self) -> str:
        """One line for the startup message: device, KV cache, attention."""
        ...

    def outputs_on(self, loop: asyncio.AbstractEventLoop) -> AbstractContextManager[None]:
        """While the context is open (the app's lifespan), `on_output` is called on `loop`'s
        thread where the engine can do that: an engine core in its own process has its
        outputs read there, with no thread in between. The in-process engine keeps calling
        it on its own thread, where its steps run."""
        ...


class ServedEngine(EngineClient, Protocol):
    """What server.py and api/lifecycle.py also use: start and stop, the drain, the failure
    exit. BatchEngine is one; engine/process/client.py's EngineProcessClient, for an engine core
    in its own process, is the other."""

    config: EngineConfig

    @property
    def num_in_flight(self) -> int:
        """Requests (samples counted apiece) accepted and not yet finished."""
        ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def stop_accepting(self, reason: str) -> None:
        """Refuse every new request from now on (EngineUnavailableError with `reason`)."""
        ...

    def abort_all(self, error: str) -> None:
        """End every request in flight with `error`."""
        ...

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Call `callback` if the engine dies."""
        ...

    def stats(self) -> EngineStats: ...
