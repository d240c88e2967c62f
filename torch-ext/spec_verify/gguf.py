"""A minimal GGUF (v2/v3) reader: one tensor, read in place through mmap.

Only what ``LMHead.from_gguf`` needs, with the standard library and torch
(the kernel package imports nothing else): the header, the key-value pairs
(to find ``general.alignment``), the tensor infos, and the bytes of one
tensor as a torch view of a private (copy-on-write) memory map of the file.

Layout (ggml's ``docs/gguf.md``; little-endian): ``"GGUF"``, ``uint32``
version, ``uint64`` tensor count, ``uint64`` key-value count; the key-value
pairs (``string`` key, ``uint32`` type, value); per tensor a ``string`` name,
``uint32`` rank, ``uint64`` dims (``ne[0]`` fastest), ``uint32`` ggml type,
``uint64`` offset; then the data, from the info's end rounded up to the
alignment (``general.alignment``, default 32), each tensor at its offset.
"""

from __future__ import annotations

import mmap
import struct
from typing import NamedTuple

import torch

__all__ = ["GGML_TYPES", "GGUFTensor", "read_tensor_infos", "open_tensor"]

# ggml type ids -> names (ggml.h, enum ggml_type); the ones LMHead reads are
# F32, F16, BF16 and Q8_0, the others are named in its error.
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}

# Fixed-size value types of the key-value section: type id -> struct format.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFTensor(NamedTuple):
    """One tensor's info: name, dims as ggml gives them (``ne[0]`` fastest), type, absolute offset."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, f"type {self.ggml_type}")


class _Cursor:
    # Reads little-endian values from a buffer; a short file is a named ValueError.
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (header ends past byte {len(self.buf)})")
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (a string runs past the end)")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if etype in _SCALARS:  # skipped in one step: vocabularies are large
                size = struct.calcsize("<" + _SCALARS[etype]) * count
                if self.pos + size > len(self.buf):
                    raise ValueError(f"{self.path}: truncated GGUF file (an array runs past the end)")
                self.pos += size
                return None
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"{self.path}: unknown GGUF value type {vtype}")


def _map(path: str):
    with open(path, "rb") as f:
        # ACCESS_COPY: a private mapping, writable as torch.frombuffer wants, never written back.
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def read_tensor_infos(path: str) -> tuple[dict, dict[str, GGUFTensor], mmap.mmap]:
    """``(scalar metadata, tensor infos by name, the file's mapping)``.

    Raises
    ------
    ValueError
        not a GGUF file, an unsupported version, or a truncated header.
    """
    buf = _map(path)
    cur = _Cursor(buf, path)
    if len(buf) < 4 or bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (no 'GGUF' magic)")
    cur.pos = 4
    version = cur.take("I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}; versions 2 and 3 are read")
    n_tensors, n_kv = cur.take("Q"), cur.take("Q")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        rank = cur.take("I")
        dims = tuple(cur.take("Q") for _ in range(rank))
        infos.append((name, dims, cur.take("I"), cur.take("Q")))
    alignment = int(meta.get("general.alignment", 32) or 32)
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = {name: GGUFTensor(name, dims, t, data_start + off) for name, dims, t, off in infos}
    return meta, tensors, buf


def open_tensor(buf: mmap.mmap, info: GGUFTensor, nbytes: int) -> torch.Tensor:
    """The tensor's ``nbytes`` bytes as a uint8 view of the mapping (no copy)."""
    if info.offset + nbytes > len(buf):
        raise ValueError(f"tensor {info.name!r} runs past the end of the file ({info.offset + nbytes} > {len(buf)})")
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=info.offset)
