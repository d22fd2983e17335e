"""The safetensors file format, read and written without staging copies.

``safetensors.torch`` stages every tensor in a ``bytes`` object on save and
copies out of a mapping on load; these functions write straight from the
tensors' memory and read into one buffer the returned tensors view. The
files they read and write are interchangeable with that library's.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Mapping

import torch

from featurestream.common.errors import FeatureStreamError
from featurestream.common.refs import SampleRef
from featurestream.stores.ledger import check_spec

__all__ = ["DTYPES", "CorruptSampleError", "byte_view", "decode", "encode_header", "read_all", "write_all"]

# safetensors' dtype names.
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_HEADER_LIMIT = 100 * 1024 * 1024  # the safetensors reader's own bound on header size


class CorruptSampleError(FeatureStreamError, RuntimeError):
    """A sample file exists but cannot be decoded (truncated, garbled, or not what its ref describes)."""


def write_all(fd: int, views: list[memoryview]) -> None:
    """Write every byte of ``views`` in order, gathered into as few syscalls as the kernel allows."""
    views = [view for view in views if view.nbytes]
    while views:
        written = os.writev(fd, views)
        while views and written >= views[0].nbytes:
            written -= views.pop(0).nbytes
        if written:
            views[0] = views[0][written:]


def read_all(fd: int, view: memoryview) -> int:
    """Fill ``view`` from the start of file ``fd``; return how many bytes were read (short only at end of file)."""
    total = 0
    while total < view.nbytes:
        got = os.preadv(fd, [view[total:]], total)
        if not got:
            break
        total += got
    return total


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a dense CPU tensor, without copying them."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def encode_header(tensors: Mapping[str, torch.Tensor]) -> tuple[bytes, tuple[str, ...]]:
    """The safetensors prefix (length + JSON header) and the order the payloads follow in.

    Wider dtypes go first so every tensor starts at a multiple of its item
    size and ``get`` can view it in the read buffer instead of copying it.
    """
    return _encoded_header(tuple((name, t.dtype, tuple(t.shape)) for name, t in tensors.items()))


@functools.lru_cache(maxsize=64)  # every sample of one shape gets the same header
def _encoded_header(specs: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]) -> tuple[bytes, tuple[str, ...]]:
    order = sorted(specs, key=lambda spec: -spec[1].itemsize)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in order:
        dtype_name = _DTYPE_NAMES.get(dtype)
        if dtype_name is None:
            raise TypeError(f"feature {name!r} has dtype {dtype}, which safetensors files cannot hold")
        numel = 1
        for dim in shape:
            numel *= dim
        end = offset + numel * dtype.itemsize
        header[name] = {"dtype": dtype_name, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded, tuple(name for name, _, _ in order)


def decode(buffer: torch.Tensor, raw: memoryview, ref: SampleRef, path: str) -> dict[str, torch.Tensor]:
    """``ref``'s features as tensors on ``buffer``'s memory, the whole file ``path`` (uint8; ``raw``: its bytes)."""
    size = buffer.numel()
    if size < 8:
        raise CorruptSampleError(f"sample {ref.sample_id!r}: {path} is truncated ({size} bytes, no header)")
    (header_len,) = struct.unpack_from("<Q", raw)
    if header_len > min(size - 8, _HEADER_LIMIT):
        raise CorruptSampleError(
            f"sample {ref.sample_id!r}: {path} announces a {header_len}-byte header but holds {size} bytes"
        )
    header = raw[8 : 8 + header_len].tobytes()
    try:
        entries = _cached_entries(header) if header_len <= _CACHED_HEADER else _entries(header)
    except ValueError as exc:
        raise CorruptSampleError(f"sample {ref.sample_id!r}: {path} has an unreadable header ({exc})") from None
    payload = _Payload(buffer, 8 + header_len, size - 8 - header_len)
    out = {}
    for name in ref.feature_names():
        out[name] = payload.tensor(entries.get(name), f"sample {ref.sample_id!r} feature {name!r} in {path}")
        check_spec(ref, name, out[name])
    return out


_Entry = tuple[torch.dtype, list[int], int, int, int]  # dtype, shape, begin, end, the bytes the shape needs
_CACHED_HEADER = 1 << 16


def _entries(header: bytes) -> dict[str, _Entry | str]:
    """A header's entries by name, each parsed or the reason it is malformed; ``ValueError`` for no JSON object."""
    parsed = json.loads(header)
    if not isinstance(parsed, dict):
        raise ValueError("the header is not a JSON object")
    return {name: _entry(value) for name, value in parsed.items()}


# Every sample of one shape carries the same header: parsed once.
_cached_entries = functools.lru_cache(maxsize=64)(_entries)


def _entry(entry: object) -> _Entry | str:
    if not isinstance(entry, dict):
        return "missing from the file's header"
    dtype = DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if (
        dtype is None
        or not isinstance(shape, list)
        or not all(isinstance(d, int) and d >= 0 for d in shape)
        or not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
    ):
        return f"malformed header entry {entry!r}"
    numel = 1
    for dim in shape:
        numel *= dim
    return dtype, shape, offsets[0], offsets[1], numel * dtype.itemsize


class _Payload:
    """The bytes after a file's header, in ``buffer`` from byte ``start`` on, ``size`` of them."""

    def __init__(self, buffer: torch.Tensor, start: int, size: int) -> None:
        self.buffer = buffer
        self.start = start
        self.size = size
        self.storage = buffer.untyped_storage()
        self.base = buffer.storage_offset() + start  # where the payload begins in the storage

    def tensor(self, entry: _Entry | str | None, where: str) -> torch.Tensor:
        """The tensor ``entry`` describes, on the payload's memory (copied only when misaligned)."""
        if entry is None:
            raise CorruptSampleError(f"{where}: missing from the file's header")
        if isinstance(entry, str):
            raise CorruptSampleError(f"{where}: {entry}")
        dtype, shape, begin, end, nbytes = entry
        if not 0 <= begin <= end <= self.size or end - begin != nbytes:
            raise CorruptSampleError(
                f"{where}: bytes {begin}..{end} do not hold {shape}/{dtype} "
                f"within {self.size} payload bytes (truncated?)"
            )
        offset = self.base + begin
        if offset % dtype.itemsize:  # only files from other writers can be misaligned
            chunk = self.buffer[self.start + begin : self.start + end].clone()
            return chunk.view(dtype).reshape(shape)
        return torch.empty(0, dtype=dtype).set_(self.storage, offset // dtype.itemsize, shape)
