"""Both engines the server runs have every member of api/engine_client.py's ServedEngine.

Nothing checks the protocol at run time, and a member only one of them has fails only when
a route reads it (500). Read from the classes, loading no model: each property is a
property, each method a method, each annotated attribute set by the engine's __init__.
"""

from __future__ import annotations

import pytest

from api.engine_client import ServedEngine
from engine.batch_engine import BatchEngine
from engine.process.client import EngineProcessClient

PROTOCOLS = [c for c in ServedEngine.__mro__ if getattr(c, "_is_protocol", False)
             and c.__module__ == ServedEngine.__module__]


def members() -> tuple[dict[str, object], set[str]]:
    """The protocols' properties and methods by name, and their annotated attributes."""
    declared = {name: value for protocol in PROTOCOLS for name, value in vars(protocol).items()
                if not name.startswith("_")}
    attributes = {name for protocol in PROTOCOLS for name in protocol.__annotations__}
    return declared, attributes


def test_the_protocol_is_read():
    declared, attributes = members()
    assert {"model_type", "max_position_embeddings", "add_request", "stats"} <= set(declared)
    assert {"tokenizer", "metrics", "config"} <= attributes


@pytest.mark.parametrize("engine", [BatchEngine, EngineProcessClient])
def test_the_engine_has_every_member_of_the_protocol(engine: type):
    declared, attributes = members()
    for name, value in declared.items():
        assert hasattr(engine, name), f"{engine.__name__} lacks {name}"
        if isinstance(value, property):
            assert isinstance(getattr(engine, name), property), f"{name} is not a property"
        else:
            assert callable(getattr(engine, name)), f"{name} is not a method"
    # The attributes its __init__ (and its bases' __init__, engine/front.py's) sets, and more.
    stored = {name for cls in engine.__mro__ if "__init__" in vars(cls)
              and hasattr(cls.__init__, "__code__") for name in cls.__init__.__code__.co_names}
    assert attributes <= stored, f"{engine.__name__}.__init__ sets no {attributes - stored}"
