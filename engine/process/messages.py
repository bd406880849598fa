"""What crosses between the API process and the engine core process (engine/process/loop.py),
as typed msgpack (msgspec): plain fields only, never pickled engine objects.

Three ZMQ sockets, all bound by the API process on private ipc:// paths:

- requests (API PUSH -> core PULL): `AddRequest`, `Abort`, `EndSample` (a stop string),
  `AbortAll`, `Shutdown`, and for the dashboard `Watch` and `BlockQuery`;
- outputs (core PUSH -> API PULL): `Ready` once, a `Report` after every step (its outputs:
  token ids, logprobs, counts and timing, no text; and the core's counts), `Failed` if the
  engine dies, `Stopped` after a `Shutdown`; for
  the dashboard, a `Snapshot` whenever the core took one (only while watched, at most ~10
  a second) and a `BlockAnswer` to each `BlockQuery` (between two steps: only the engine's
  own thread reads its pool);
- metrics (API DEALER <-> core ROUTER): a query id in, the id and the rendered
  Prometheus text out, answered by a thread of the core so a long step does not delay it.

The dashboard's dataclasses (engine/snapshot.py) travel as msgspec JSON, decoded into their
own types: their block hashes have 128 bits, and msgpack's integers stop at 64.
"""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

from engine.config import EngineConfig
from engine.core import EngineStats
from engine.request import RequestOutput, SamplingParams
from engine.structured.grammar import GrammarKind, GrammarSpec
from model.embedding import EmbeddingInfo

# --- API -> core ------------------------------------------------------------------------------


class GrammarMsg(msgspec.Struct, frozen=True):
    """A structured output's spec; the core compiles it again (cached by its key)."""

    kind: GrammarKind
    value: Any = None

    def spec(self) -> GrammarSpec:
        return GrammarSpec(self.kind, self.value)


class AddRequest(msgspec.Struct, tag=True):
    seq: int  # numbered by the client, so a Report can say how far the core has taken in
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # with grammar None: it travels as `grammar`
    grammar: GrammarMsg | None
    age: float  # seconds since arrival when sent (the processes' clocks need not agree)
    priority: int = 0
    timeout: float | None = None
    behind: int = 0  # Request.arrivals_behind: others still being checked when this was sent


class Abort(msgspec.Struct, tag=True):
    request_id: str


class EndSample(msgspec.Struct, tag=True):
    """The API process found a stop string in this sample's text (request_id: the sample's
    own id) and ended it for its client: end it here too (finish reason stop), freeing its
    blocks. The core's last output for it is not delivered; nothing if it ended already."""

    request_id: str


class AbortAll(msgspec.Struct, tag=True):
    error: str


class Shutdown(msgspec.Struct, tag=True):
    pass


class Watch(msgspec.Struct, tag=True):
    """Someone watches the dashboard: take snapshots for the next few seconds."""


class BlockQuery(msgspec.Struct, tag=True):
    query: int
    block_id: int


ToCore = AddRequest | Abort | EndSample | AbortAll | Shutdown | Watch | BlockQuery

# --- core -> API ------------------------------------------------------------------------------


class Rates(msgspec.Struct):
    """The core's measured drain rate (engine/admission.py); None until measured."""

    requests_per_second: float | None = None
    tokens_per_second: float | None = None


class CoreState(msgspec.Struct):
    """What the client's admission and /health need from the core, after a step."""

    stats: EngineStats
    line_tokens: int  # prompt tokens the waiting line still has to compute
    taken: int  # the highest AddRequest.seq taken in by a step
    rates: Rates


class Ready(msgspec.Struct, tag=True):
    """Once the model is loaded: what the API reports of the engine (/v1/models, the startup
    line) and its counts before any request."""

    pid: int
    max_tokens_per_request: int
    model_type: str  # the model's config.json's
    max_position_embeddings: int  # the same config's
    description: str
    state: CoreState
    dashboard: bool  # the core has a pool to show (not the baseline's)
    embedding: EmbeddingInfo | None = None  # an embedding model's sizes and prompts


class Report(msgspec.Struct, tag=True):
    # (the request's id as added, its output: text "", tokens, and its timing so far)
    outputs: list[tuple[str, RequestOutput]]
    state: CoreState


class Failed(msgspec.Struct, tag=True):
    error: str


class Stopped(msgspec.Struct, tag=True):
    state: CoreState


class Snapshot(msgspec.Struct, tag=True):
    snapshot: bytes  # an EngineSnapshot, in JSON (see above)


class BlockAnswer(msgspec.Struct, tag=True):
    query: int
    block: bytes  # a CachedBlock or null, in JSON (see above)


FromCore = Ready | Report | Failed | Stopped | Snapshot | BlockAnswer


def encode_config(config: EngineConfig) -> str:
    return msgspec.json.encode(config).decode()


def decode_config(text: str) -> EngineConfig:
    return msgspec.json.decode(text, type=EngineConfig)


def open_socket(context: zmq.Context, kind: int, address: str, *, bind: bool,
                linger_ms: int) -> zmq.Socket:
    """A socket of either side: no high-water mark, since neither side may block or drop a
    message (each drains the other every step); the API side binds, the core connects."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    (sock.bind if bind else sock.connect)(address)
    return sock

