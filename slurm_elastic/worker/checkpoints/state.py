"""The training state a replica holds, as one flat byte buffer plus JSON metadata.

Model, optimizer and scheduler state dicts, RNG states, the data cursor and the user's own registered
state (`ElasticJob(extra_state=...)`, see `userstate.py`) are encoded as JSON with
tensor placeholders; the tensors are packed back to back into one uint8 buffer, so a peer can send the
state in byte-range chunks and a receiver can rebuild it without unpickling anything.
"""

from __future__ import annotations

import base64
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from slurm_elastic.errors import ElasticError


class StateError(ElasticError):
    """A value in the training state cannot be transferred or restored."""


@dataclass
class Snapshot:
    meta: dict[str, Any]  # JSON-able; tensors replaced by {"__t__": index}
    tensors: list[torch.Tensor]


def _encode(obj: Any, tensors: list[torch.Tensor], path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {"__t__": len(tensors) - 1}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict):
        return {"__d__": [[_encode(k, tensors, path), _encode(v, tensors, f"{path}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tu__": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, np.ndarray):
        return {"__np__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise StateError(f"cannot transfer {type(obj).__name__} at {path}: state must hold tensors and plain values")


def _numeric_dtype(name: Any) -> np.dtype[Any]:
    """A numpy dtype named in state: numbers only (an object or a huge void dtype is no array of ours)."""
    try:
        dtype = np.dtype(str(name))
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biufc":
        raise StateError(f"numpy dtype {str(name)[:40]!r} in the state, expected a numeric one")
    return dtype


def _decode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__t__" in obj:
        index = obj["__t__"]
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(tensors):
            raise StateError(f"tensor index {str(index)[:40]} in the state, expected 0 to {len(tensors) - 1}")
        return tensors[index]
    if "__d__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__d__"]}
    if "__tu__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tu__"])
    if "__np__" in obj:
        return np.asarray(obj["__np__"], dtype=_numeric_dtype(obj["dtype"]))
    raise StateError(f"unknown state encoding with keys {sorted(obj)}")


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    progress: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Snapshot:
    tensors: list[torch.Tensor] = []
    whole = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": _rng_state(),
        "progress": progress,
        "extra": extra or {},
    }
    return Snapshot(_encode(whole, tensors, "state"), tensors)


def decode(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as plain objects: model, optimizer, scheduler, rng, progress, extra."""
    whole: dict[str, Any] = _decode(snap.meta, snap.tensors)
    return whole


def restore_all(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any | None, snap: Snapshot
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a snapshot into the live objects; returns its progress record and the user's extra state."""
    whole = decode(snap)
    model.load_state_dict(whole["model"])
    optimizer.load_state_dict(whole["optimizer"])
    if scheduler is not None and whole["scheduler"] is not None:
        scheduler.load_state_dict(whole["scheduler"])
    _set_rng_state(whole["rng"])
    progress: dict[str, Any] = whole["progress"]
    extra: dict[str, Any] = whole.get("extra") or {}  # snapshots written before extra state have none
    return progress, extra


def restore(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any | None, snap: Snapshot
) -> dict[str, Any]:
    """Load a snapshot into the live objects; returns its progress record."""
    return restore_all(model, optimizer, scheduler, snap)[0]


def check_encodable(value: Any, path: str) -> None:
    """Raise StateError (naming `path`) unless `value` can travel in a snapshot."""
    _encode(value, [], path)


@dataclass(frozen=True)
class Layout:
    """Where each tensor lies in the packed buffer."""

    entries: tuple[tuple[str, tuple[int, ...], int, int], ...]  # dtype, shape, offset, nbytes
    total: int

    def to_json(self) -> list[Any]:
        return [list(e) for e in self.entries] + [self.total]

    @classmethod
    def from_json(cls, data: list[Any]) -> Layout:
        *entries, total = data
        return cls(tuple((str(d), tuple(s), int(o), int(n)) for d, s, o, n in entries), int(total))


_DTYPES = {
    str(d): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    )
}


def layout_of(tensors: list[torch.Tensor]) -> Layout:
    entries, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        entries.append((str(t.dtype), tuple(t.shape), offset, nbytes))
        offset += nbytes
    return Layout(tuple(entries), offset)


def pack(tensors: list[torch.Tensor], layout: Layout, device: torch.device | None = None) -> torch.Tensor:
    buf = torch.empty(layout.total, dtype=torch.uint8, device=device)
    for t, (_, _, offset, nbytes) in zip(tensors, layout.entries, strict=True):
        if nbytes:
            buf[offset : offset + nbytes].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return buf


def unpack(buf: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    out = []
    for dtype, shape, offset, nbytes in layout.entries:
        if dtype not in _DTYPES:
            raise StateError(f"cannot restore a tensor of dtype {dtype}")
        raw = buf[offset : offset + nbytes].clone()
        out.append(raw.view(_DTYPES[dtype]).reshape(shape))
    return out


def fingerprint(model: torch.nn.Module) -> tuple[float, float]:
    """Sum and sum of squares of all parameters in float64: equal replicas give equal values."""
    total = torch.zeros((), dtype=torch.float64)
    squares = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            d = p.detach().to(torch.float64)
            total += d.sum().cpu()
            squares += (d * d).sum().cpu()
    s, q = float(total), float(squares)
    return (s if math.isfinite(s) else math.nan, q if math.isfinite(q) else math.nan)


def to_json(value: Any, path: str) -> dict[str, Any]:
    """`value` (plain values and tensors, as in a snapshot) as JSON alone, tensors as base64 bytes: for small
    state that travels in the store (a sharded job's replicated part)."""
    tensors: list[torch.Tensor] = []
    meta = _encode(value, tensors, path)
    raw = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors]
    listed = [
        [str(t.dtype).removeprefix("torch."), list(t.shape), base64.b64encode(r).decode()]
        for t, r in zip(tensors, raw, strict=True)
    ]
    return {"meta": meta, "tensors": listed}


def from_json(data: dict[str, Any]) -> Any:
    """The value `to_json` encoded."""
    tensors = []
    for dtype_name, shape, b64 in data["tensors"]:
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype):
            raise StateError(f"invalid dtype {dtype_name!r} in encoded state")
        raw = base64.b64decode(b64)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        tensors.append(flat.view(dtype).reshape(shape))
    return _decode(data["meta"], tensors)
