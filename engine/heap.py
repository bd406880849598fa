"""The objects a process makes while it starts, kept out of the garbage collector's walks.

By the time a server process serves, it has imported PyTorch, transformers, FastAPI and
pydantic and built its model or its app: hundreds of thousands of objects the cyclic
collector tracks, almost none of which will ever be garbage. Serving allocates a little for
every token, and from time to time that promotes enough survivors to start a full
collection, which walks them all with everything else in the process stopped: the event loop
that streams every answer, or the engine between two steps. `freeze_startup_heap` collects
once, then moves every object alive into the collector's permanent generation (`gc.freeze`),
which no collection walks; what is allocated afterwards is collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then exempt every object now alive from later collections; returns how
    many objects that froze (this process's total)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
