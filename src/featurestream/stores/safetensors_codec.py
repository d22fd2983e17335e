"""The safetensors file format, read and written without staging copies.

``safetensors.torch`` stages every tensor in a ``bytes`` object on save and
copies out of a mapping on load; these functions write straight from the
tensors' memory and read into one buffer the returned tensors view. The
files they read and write are interchangeable with that library's.
"""

from __future__ import annotations

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


def encode_header(tensors: Mapping[str, torch.Tensor]) -> tuple[bytes, list[str]]:
    """The safetensors prefix (length + JSON header) and the order the payloads follow in.

    Wider dtypes go first so every tensor starts at a multiple of its item
    size and ``get`` can view it in the read buffer instead of copying it.
    """
    order = sorted(tensors, key=lambda name: -tensors[name].element_size())
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in order:
        tensor = tensors[name]
        dtype = _DTYPE_NAMES.get(tensor.dtype)
        if dtype is None:
            raise TypeError(f"feature {name!r} has dtype {tensor.dtype}, which safetensors files cannot hold")
        end = offset + tensor.numel() * tensor.element_size()
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, end]}
        offset = end
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded, order


def decode(buffer: torch.Tensor, raw: memoryview, ref: SampleRef, path: str) -> dict[str, torch.Tensor]:
    """``ref``'s features as views of ``buffer``, the whole file ``path`` (uint8; ``raw``: its bytes)."""
    size = buffer.numel()
    if size < 8:
        raise CorruptSampleError(f"sample {ref.sample_id!r}: {path} is truncated ({size} bytes, no header)")
    (header_len,) = struct.unpack_from("<Q", raw)
    if header_len > min(size - 8, _HEADER_LIMIT):
        raise CorruptSampleError(
            f"sample {ref.sample_id!r}: {path} announces a {header_len}-byte header but holds {size} bytes"
        )
    data = buffer[8 + header_len :]
    try:
        header = json.loads(raw[8 : 8 + header_len].tobytes())
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except ValueError as exc:
        raise CorruptSampleError(f"sample {ref.sample_id!r}: {path} has an unreadable header ({exc})") from None
    out = {}
    for name in ref.feature_names():
        out[name] = _tensor_from(header.get(name), data, ref, name, path)
        check_spec(ref, name, out[name])
    return out


def _tensor_from(entry: object, data: torch.Tensor, ref: SampleRef, name: str, path: str) -> torch.Tensor:
    where = f"sample {ref.sample_id!r} feature {name!r} in {path}"
    if not isinstance(entry, dict):
        raise CorruptSampleError(f"{where}: missing from the file's header")
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
        raise CorruptSampleError(f"{where}: malformed header entry {entry!r}")
    begin, end = offsets
    numel = 1
    for dim in shape:
        numel *= dim
    if not 0 <= begin <= end <= data.numel() or end - begin != numel * dtype.itemsize:
        raise CorruptSampleError(
            f"{where}: bytes {begin}..{end} do not hold {shape}/{dtype} "
            f"within {data.numel()} payload bytes (truncated?)"
        )
    chunk = data[begin:end]
    if chunk.storage_offset() % dtype.itemsize:
        chunk = chunk.clone()  # only files from other writers can be misaligned
    return chunk.view(dtype).reshape(shape)
