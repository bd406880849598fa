"""What the API talks to of an engine, the part both modes share: the engine's limits,
the record of every request in flight with its text (engine/text_outputs.py), refusing new
requests once told to, and telling whoever asked when the engine dies. The two fronts are
engine/batch_engine.py's BatchEngine (the engine loop on a thread of this process) and
engine/process/client.py's EngineProcessClient (the loop in a core process of its own)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.admission import EngineUnavailableError, check_samples
from engine.config import EngineConfig
from engine.request import Request
from engine.text_outputs import TextOutputs
from model.embedding import EmbeddingInfo

log = logging.getLogger("nano_vllm.engine")


@dataclass(frozen=True)
class ModelLimits:
    """What the API checks requests against, as the engine's model and pool set it."""

    max_tokens_per_request: int  # prompt + completion tokens one request may hold
    model_type: str  # config.json's model_type ("llama", "qwen2", ...)
    max_position_embeddings: int  # the model's own context length
    embedding: EmbeddingInfo | None = None  # an embedding model's (model/embedding.py)


class EngineFront:
    def __init__(self, config: EngineConfig, tokenizer, lock: threading.Lock | threading.RLock,
                 end_sample: Callable[[str], None]) -> None:
        """`lock` guards what other threads change (`_unavailable`, the front's own fields);
        `end_sample(sample_id)` tells the loop a stop string ended that sample."""
        self.config = config
        self.tokenizer = tokenizer
        self.texts = TextOutputs(tokenizer, end_sample)
        self._lock = lock
        self._unavailable: str | None = None  # why new requests are refused, if they are
        self._failure_callbacks: list[Callable[[], None]] = []
        self.limits: ModelLimits  # set by each front once its engine has said

    @property
    def max_tokens_per_request(self) -> int:
        return self.limits.max_tokens_per_request

    @property
    def model_type(self) -> str:
        return self.limits.model_type

    @property
    def max_position_embeddings(self) -> int:
        return self.limits.max_position_embeddings

    @property
    def embedding_info(self) -> EmbeddingInfo | None:
        """An embedding model's sizes and prompts; None for a model that generates."""
        return self.limits.embedding

    @property
    def max_num_seqs(self) -> int:
        """Seats: also the most samples (n, best_of) one prompt may ask for."""
        return self.config.max_num_seqs

    @property
    def scheduling_policy(self) -> str:
        return self.config.scheduling_policy

    @property
    def num_in_flight(self) -> int:
        """Requests (samples counted apiece) accepted and not yet finished."""
        return self.texts.num_samples

    def add_request(self, request: Request) -> None:
        """Admit the request (QueueFullError when the line is full, EngineUnavailableError
        once the front refuses new ones), track its samples' text, and hand it to the loop."""
        check_samples(self.config, request.params.n)
        with self._lock:
            if self._unavailable is not None:
                raise EngineUnavailableError(self._unavailable)
            self._check_line(request)
            self.texts.add(request)  # first: the loop's first outputs may be back at once
            try:
                self._hand_over(request)
            except EngineUnavailableError:  # the loop is gone (its process exited)
                self.texts.forget(request.request_id)
                raise
        self._handed_over()

    def _check_line(self, request: Request) -> None:
        """QueueFullError if the waiting line, as this front sees it, has no room (under the
        lock; engine/admission.py's check_line over the front's counts)."""
        raise NotImplementedError

    def _hand_over(self, request: Request) -> None:
        """Give the admitted request to the loop (under the lock)."""
        raise NotImplementedError

    def _handed_over(self) -> None:
        """After the lock is released: wake the loop, where it sleeps."""

    def stop_accepting(self, reason: str) -> None:
        """Refuse every new request from now on (EngineUnavailableError with `reason`)."""
        with self._lock:
            self._unavailable = self._unavailable or reason
        log.info("no longer accepting requests: %s", reason)

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Call `callback` if the engine dies (where the front receives its outputs)."""
        self._failure_callbacks.append(callback)

    def _failed(self) -> None:
        for callback in self._failure_callbacks:
            callback()
