"""The user's own state inside the replica's: what `ElasticJob(extra_state={...})` registers.

The dict the user passes is the one the job keeps (`job.extra_state` is the same object), so the script
reads and writes its entries as usual. Each entry travels in peer transfers and disaster-recovery
checkpoints with the model, and is restored in place:

- an object with `state_dict()` / `load_state_dict()` (an EMA model, a GradScaler, a custom counter
  class): captured with `state_dict()`, restored with `load_state_dict()` into the same object;
- a tensor: restored with `copy_` into the same tensor when the shape and dtype agree, else replaced;
- a plain value (number, string, bool, None) or a list / tuple / dict of them and of tensors: replaced in
  the dict (read it back from the dict, not from a local variable).

Nothing is pickled: values travel as JSON plus tensors (`state.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from slurm_elastic.worker.checkpoints.state import StateError, check_encodable

VALID = (
    "plain values (numbers, strings, bools, None), tensors, lists/tuples/dicts of them, "
    "or objects with state_dict() and load_state_dict()"
)


def _stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def validate(extra: Any) -> dict[str, Any]:
    """The user's extra state dict, checked now so that a bad entry fails at construction, not mid-run."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise StateError(f"extra_state must be a dict of named entries, got {type(extra).__name__}")
    for key in extra:
        if not isinstance(key, str):
            raise StateError(f"extra_state key {key!r} is a {type(key).__name__}: keys must be strings")
    capture(extra)
    return extra


def capture(extra: dict[str, Any]) -> dict[str, Any]:
    """What goes into a snapshot: each entry's value, or its state_dict()."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        captured = value.state_dict() if _stateful(value) else value
        try:
            check_encodable(captured, f"extra_state[{key!r}]")
        except StateError as exc:
            raise StateError(f"{exc}; extra_state entries must be {VALID}") from None
        out[key] = captured
    return out


def restore(extra: dict[str, Any], saved: dict[str, Any]) -> None:
    """Load `saved` into the live entries, in place where the entry is an object or a tensor. Entries the
    snapshot lacks (added to the script since it was written) keep their current value."""
    for key, value in saved.items():
        current = extra.get(key)
        if current is not None and _stateful(current):
            current.load_state_dict(value)
        elif (
            isinstance(current, torch.Tensor)
            and isinstance(value, torch.Tensor)
            and current.shape == value.shape
            and current.dtype == value.dtype
        ):
            with torch.no_grad():
                current.copy_(value)
        else:
            extra[key] = value
