"""The file of a replicated job's checkpoint or snapshot, without pickle:

    MAGIC | header length (8 bytes, little-endian) | header (JSON) | zeros to a multiple of 64 | tensor bytes

The header is `{"format": 2, "step": N, "byteorder": "little", "meta": <the snapshot's JSON>, "tensors":
[[dtype, shape, offset, nbytes], ...]}`, offsets counted from the start of the tensor bytes. The reader checks
every field, and that every byte range lies inside the file, in order and without overlap, before it reads
one; a tensor is then read straight into memory of its own dtype and shape, so nothing in a file runs code
and what it allocates is bounded by the file's size.

Files of the first format (`torch.save` of a dict, written before this one) are read with
`torch.load(weights_only=True)`, and only by torch 2.6 or newer: before 2.6, weights_only could be bypassed
(CVE-2025-32434).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any, BinaryIO

import torch

from slurm_elastic.worker.checkpoints.ckptfiles import CheckpointError
from slurm_elastic.worker.checkpoints.state import Snapshot

MAGIC = b"slurm-elastic checkpoint\n"
FORMAT = 2
LEGACY_FORMAT = 1
MAX_HEADER = 256 * 1024 * 1024
MAX_DIMS = 64
_ALIGN = 64
_PREFIX = len(MAGIC) + 8
_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32", "int16", "int8",
    "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
)  # fmt: skip
DTYPES: dict[str, torch.dtype] = {
    name: found for name in _DTYPE_NAMES if isinstance(found := getattr(torch, name, None), torch.dtype)
}
_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}
SAFE_TORCH_LOAD = (2, 6)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _flat_bytes(t: torch.Tensor, where: str) -> tuple[str, torch.Tensor]:
    if t.layout != torch.strided or t.is_quantized or t.dtype not in _NAME_OF:
        raise CheckpointError(f"cannot write tensor {where} ({t.dtype}, {t.layout}): dense tensors of {sorted(DTYPES)}")
    flat = t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return _NAME_OF[t.dtype], flat.view(torch.uint8)


def write(fh: BinaryIO, step: int, meta: dict[str, Any], tensors: list[torch.Tensor]) -> None:
    flats, listed, ranges, offset = [], [], [], 0
    for i, t in enumerate(tensors):
        name, flat = _flat_bytes(t, f"#{i}")
        listed.append([name, list(t.shape), offset, flat.numel()])
        ranges.append((offset, flat.numel()))
        flats.append(flat)
        offset = _align(offset + flat.numel())
    header = json.dumps(
        {"format": FORMAT, "step": step, "byteorder": sys.byteorder, "meta": meta, "tensors": listed}
    ).encode()
    fh.write(MAGIC + len(header).to_bytes(8, "little") + header)
    fh.write(bytes(_align(_PREFIX + len(header)) - _PREFIX - len(header)))
    written = 0
    for flat, (at, nbytes) in zip(flats, ranges, strict=True):
        fh.write(bytes(at - written))
        if nbytes:
            fh.write(flat.numpy().data)
        written = at + nbytes


def _int(value: Any, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**62:
        raise ValueError(f"{what} is {str(value)[:40]}, expected an integer from {low} to 2**62")
    return value


def _check_tensors(listed: Any, data_bytes: int) -> list[tuple[torch.dtype, list[int], int, int]]:
    """Every tensor's dtype, shape and byte range, each checked: the ranges lie inside the data, in order."""
    if not isinstance(listed, list):
        raise ValueError(f"tensors is a {type(listed).__name__}, expected a list")
    out, end = [], 0
    for i, entry in enumerate(listed):
        if not (isinstance(entry, list) and len(entry) == 4):
            raise ValueError(f"tensor #{i} is {str(entry)[:80]}, expected [dtype, shape, offset, nbytes]")
        name, shape, offset, nbytes = entry
        if not isinstance(name, str) or name not in DTYPES:
            raise ValueError(f"tensor #{i} has dtype {str(name)[:40]!r}, expected one of {sorted(DTYPES)}")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise ValueError(f"tensor #{i} has shape {str(shape)[:80]}, expected a list of at most {MAX_DIMS} sizes")
        dims = [_int(s, f"tensor #{i}'s size") for s in shape]
        _int(offset, f"tensor #{i}'s offset", low=end)
        if _int(nbytes, f"tensor #{i}'s nbytes") != math.prod(dims) * DTYPES[name].itemsize:
            raise ValueError(f"tensor #{i} has {nbytes} bytes, but shape {dims} of {name} needs another number")
        if offset + nbytes > data_bytes:
            raise ValueError(f"tensor #{i}'s bytes {offset}..{offset + nbytes} lie past the end of the file")
        out.append((DTYPES[name], dims, offset, nbytes))
        end = offset + nbytes
    return out


def _read_into(fh: BinaryIO, t: torch.Tensor) -> None:
    view = t.reshape(-1).view(torch.uint8).numpy().data
    done = 0
    while done < len(view):
        n = fh.readinto(view[done:])  # type: ignore[attr-defined]
        if not n:
            raise ValueError("the file ends inside a tensor")
        done += n


def _read(fh: BinaryIO, size: int) -> tuple[int, Snapshot]:
    length = int.from_bytes(fh.read(8), "little")
    if length > min(MAX_HEADER, size - _PREFIX):
        raise ValueError(f"its header claims {length} bytes; the file has {size}, the limit is {MAX_HEADER}")
    try:
        header = json.loads(fh.read(length))
    except RecursionError:
        raise ValueError("its header nests too deeply") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format') if isinstance(header, dict) else None!r}, expected {FORMAT}")
    if header.get("byteorder") != sys.byteorder:
        raise ValueError(f"byte order {header.get('byteorder')!r}; this machine's is {sys.byteorder!r}")
    step, meta = _int(header.get("step"), "step"), header.get("meta")
    if not isinstance(meta, dict):
        raise ValueError(f"meta is a {type(meta).__name__}, expected an object")
    start = _align(_PREFIX + length)
    tensors = []
    for dtype, dims, offset, _ in _check_tensors(header.get("tensors"), max(size - start, 0)):
        t = torch.empty(dims, dtype=dtype)
        fh.seek(start + offset)
        _read_into(fh, t)
        tensors.append(t)
    return step, Snapshot(meta, tensors)


def torch_load_is_safe(version: str) -> bool:
    """Whether `torch.load(weights_only=True)` of this torch version can be trusted with a hostile file."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) >= SAFE_TORCH_LOAD


def _read_legacy(fh: BinaryIO, path: Path) -> tuple[int, Snapshot]:
    if not torch_load_is_safe(str(torch.__version__)):
        raise CheckpointError(
            f"{path} is in the first checkpoint format (torch.save), which torch {torch.__version__} cannot read "
            "safely (weights_only can be bypassed before torch 2.6, CVE-2025-32434): read it with torch >= 2.6"
        )
    try:
        data = torch.load(fh, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load of a torn or foreign file raises almost anything
        raise CheckpointError(f"{path} is not a readable checkpoint: {str(exc)[:300]}") from None
    if not isinstance(data, dict) or data.get("format") != LEGACY_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"{path} is not a slurm-elastic checkpoint: format {found!r}, expected {LEGACY_FORMAT}")
    try:
        return int(data["step"]), Snapshot(json.loads(data["meta"]), list(data["tensors"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint: {str(exc)[:300]}") from None


def read(fh: BinaryIO, size: int, path: Path) -> tuple[int, Snapshot]:
    """The step and snapshot in an open checkpoint file of `size` bytes; CheckpointError naming `path`."""
    head = fh.read(len(MAGIC))
    if head != MAGIC:
        if head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip, or its older bare pickle
            fh.seek(0)
            return _read_legacy(fh, path)
        raise CheckpointError(f"{path} is not a readable checkpoint: it does not start with {MAGIC!r}")
    try:
        return _read(fh, size)
    except (ValueError, OverflowError, RuntimeError) as exc:  # RuntimeError: an allocation torch refuses
        raise CheckpointError(f"{path} is not a readable checkpoint: {str(exc)[:300]}") from None


__all__ = ["DTYPES", "FORMAT", "MAGIC", "read", "torch_load_is_safe", "write"]
