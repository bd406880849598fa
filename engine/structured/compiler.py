"""Compiling grammars off the engine thread: a worker pool, a time limit, a cache by spec.

The API handler awaits `compile()` before it queues a request, so the engine thread only
ever copies a compiled grammar. A compile past the time limit is answered with
GrammarTimeout at once; its thread cannot be stopped and finishes on its own (its result
then lands in the cache), but llguidance bounds that work with its parser limits (grammar
size, lexer fuel, lexer states), and builds with the GIL released, so the engine thread
keeps running meanwhile. The pool has few workers: a flood of slow schemas makes later
compiles wait, and time out, rather than take every core.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llguidance

from engine.structured.grammar import (
    CompiledGrammar,
    GrammarError,
    GrammarSpec,
    llguidance_tokenizer,
)

DEFAULT_COMPILE_TIMEOUT_S = 5.0
DEFAULT_CACHE_SIZE = 256


class GrammarTimeout(GrammarError):
    """The grammar did not compile within the time limit."""


class GrammarCompiler:
    def __init__(self, hf_tokenizer: Any, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                 cache_size: int = DEFAULT_CACHE_SIZE, workers: int = 2,
                 limits: llguidance.LLParserLimits | None = None) -> None:
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.limits = limits
        self._hf_tokenizer = hf_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use
        self._lock = threading.Lock()  # guards the cache and the tokenizer
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar")

    def cached(self, spec: GrammarSpec) -> CompiledGrammar | None:
        """The compiled grammar of `spec` if it is in the cache (no compiling)."""
        with self._lock:
            found = self._cache.get(spec.key)
            if found is not None:
                self._cache.move_to_end(spec.key)
            return found

    def compile_later(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Compile on the pool, with no time limit (the caller checked it compiles)."""
        return self._pool.submit(self.compile_now, spec)

    def compile_now(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile on this thread (or take from the cache); GrammarError if it cannot be."""
        with self._lock:
            found = self._cache.get(spec.key)
            if found is not None:
                self._cache.move_to_end(spec.key)
                return found
            if self._tokenizer is None:
                self._tokenizer = llguidance_tokenizer(self._hf_tokenizer)
            tokenizer = self._tokenizer
        compiled = CompiledGrammar(spec, tokenizer, self.limits)
        with self._lock:
            self._cache[spec.key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    async def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile on the pool, waiting at most timeout_s (GrammarTimeout past it)."""
        with self._lock:
            found = self._cache.get(spec.key)
        if found is not None:
            return found
        future = asyncio.get_running_loop().run_in_executor(self._pool, self.compile_now, spec)
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise GrammarTimeout(f"the grammar did not compile within {self.timeout_s:g} s "
                                 "(too large or too complex)") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
