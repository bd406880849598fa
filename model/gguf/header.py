"""A GGUF file's tensor directory, read from its header alone, so that a truncated or
damaged file is refused with the tensor and byte counts that are wrong, before anything is
mapped or allocated (gguf's own reader fails deep inside numpy on such a file).

The layout (ggml's docs/gguf.md): magic "GGUF", version, tensor count, metadata count; the
metadata key/value pairs; per tensor its name, dimensions, type and offset; then, aligned to
general.alignment (32 by default), the tensor data, each tensor at its offset.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# Metadata value types (gguf.GGUFValueType) of fixed width, by their id.
FIXED_WIDTH = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
               11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class HeaderError(ValueError):
    """The header ends early or holds something that is not GGUF."""


@dataclass(frozen=True)
class TensorExtent:
    name: str
    type_id: int
    dims: tuple[int, ...]
    start: int  # absolute byte offset of the tensor's data in the file


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.data):
            raise HeaderError(f"the header ends early, at byte {len(self.data)}")
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += size
        return values

    def string(self) -> str:
        (length,) = self.take("Q")
        if self.at + length > len(self.data):
            raise HeaderError(f"the header ends early, at byte {len(self.data)}")
        text = bytes(self.data[self.at:self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def value(self, kind: int) -> object:
        if kind in FIXED_WIDTH:
            return self.take(FIXED_WIDTH[kind])[0]
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind, count = self.take("IQ")
            if item_kind in FIXED_WIDTH:  # skipped whole: token scores, types
                self.take(f"{count}{FIXED_WIDTH[item_kind]}")
                return None
            for _ in range(count):
                self.value(item_kind)
            return None
        raise HeaderError(f"metadata value of unknown type {kind} at byte {self.at}")


def read_tensor_extents(path: Path) -> tuple[list[TensorExtent], int]:
    """Every tensor's name, type id, dimensions and where its data starts; and the file size."""
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 24:
            raise HeaderError(f"only {size} bytes: not even a GGUF header")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _read(_Cursor(data)), size
        finally:
            data.close()


def _read(cursor: _Cursor) -> list[TensorExtent]:
    magic, version = cursor.take("4sI")
    if magic != b"GGUF":
        raise HeaderError(f"starts with {magic!r}, not GGUF's magic")
    if version < 2:
        raise HeaderError(f"GGUF version {version} is too old (2 or later is read)")
    tensor_count, kv_count = cursor.take("QQ")
    alignment = 32
    for _ in range(kv_count):
        key = cursor.string()
        (kind,) = cursor.take("I")
        value = cursor.value(kind)
        if key == "general.alignment" and isinstance(value, int):
            alignment = value
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        (n_dims,) = cursor.take("I")
        dims = cursor.take(f"{n_dims}Q")
        type_id, offset = cursor.take("IQ")
        infos.append((name, type_id, tuple(dims), offset))
    data_start = -(-cursor.at // alignment) * alignment
    return [TensorExtent(name, type_id, dims, data_start + offset)
            for name, type_id, dims, offset in infos]
