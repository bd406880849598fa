"""KV cache groups: which layers share a block table.

A model whose layers all attend to the whole context has one group holding every layer: a
block id is a slot in every layer's K/V. A model with sliding-window layers (Gemma 3) splits
its layers into groups of equal size, each group of one kind (full attention, or one window),
and every group takes its blocks from the same pool: the pool keeps `group_size` K/V tensors,
and a block handed to group g is that block in the tensors of g's layers. Each sequence then
holds one block table per group, and a sliding group can give back the blocks its window has
left behind while the full-attention groups keep theirs (kv_cache_manager.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroups:
    layers: tuple[tuple[int, ...], ...]  # per group, its layers, in order
    windows: tuple[int | None, ...]  # per group: its layers' window, None for full attention

    @classmethod
    def single(cls, num_layers: int) -> KVCacheGroups:
        """Every layer in one group, with no window: one block table per sequence."""
        return cls((tuple(range(num_layers)),), (None,))

    @classmethod
    def from_windows(cls, windows: Sequence[int | None]) -> KVCacheGroups:
        """Groups for these per-layer windows (None: full attention). Layers of one kind are
        cut into groups of the size that divides every kind's count (the greatest common
        divisor), full attention first, then each window, each in layer order. Without any
        window, that is one group of all layers."""
        kinds: dict[int | None, list[int]] = {}
        for layer, window in enumerate(windows):
            kinds.setdefault(window, []).append(layer)
        if not kinds:
            raise ValueError("a model without layers has no KV cache")
        size = math.gcd(*(len(layers) for layers in kinds.values()))
        order = sorted(kinds, key=lambda w: -1 if w is None else w)
        layers, group_windows = [], []
        for window in order:
            of_kind = kinds[window]
            for start in range(0, len(of_kind), size):
                layers.append(tuple(of_kind[start:start + size]))
                group_windows.append(window)
        return cls(tuple(layers), tuple(group_windows))

    @property
    def num_groups(self) -> int:
        return len(self.layers)

    @property
    def group_size(self) -> int:
        """Layers per group: the pool's K/V tensors, each shared by one layer of each group."""
        return len(self.layers[0])

    @property
    def num_layers(self) -> int:
        return sum(len(layers) for layers in self.layers)

    def layer_group(self) -> list[int]:
        """Per layer, the index of its group."""
        group = [0] * self.num_layers
        for g, layers in enumerate(self.layers):
            for layer in layers:
                group[layer] = g
        return group

    def layer_slot(self) -> list[int]:
        """Per layer, which of the pool's group_size K/V tensors it uses (its place in its
        group)."""
        slot = [0] * self.num_layers
        for layers in self.layers:
            for i, layer in enumerate(layers):
                slot[layer] = i
        return slot

    def describe(self) -> str:
        if self.num_groups == 1:
            return "one KV cache group of all layers"
        sliding = sum(w is not None for w in self.windows)
        layers = f"{self.group_size} layer{'s' if self.group_size > 1 else ''}"
        return (f"{self.num_groups} KV cache groups of {layers} "
                f"({self.num_groups - sliding} full attention, {sliding} sliding window)")
