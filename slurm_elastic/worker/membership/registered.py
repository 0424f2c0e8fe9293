"""A generation's backend as a torch `ProcessGroup` registered under a name of its own, which torch's helpers
look groups up by (for `torchworld`'s default group; `sharded.mesh` registers its mesh's group alike). The
library forms its groups itself (never with `init_process_group`: several ranks may share a process in
tests, and a group is abandoned, not destroyed, when a peer dies), so it registers them as torch does its
own. Only through `torch.distributed.distributed_c10d`: torch's private modules are the sharded path's."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import threading
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_names = itertools.count()
_lock = threading.Lock()


@dataclass
class RegisteredGroup:
    group: Any  # the torch ProcessGroup wrapping the backend
    name: str

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, KeyError):  # already gone
            c10d._unregister_process_group(cast(Any, self.name))


def register(backend: Any, rank: int, world: int, device_type: str, label: str) -> RegisteredGroup:
    """Wrap `backend` (a gloo or NCCL backend; None for a world of one, which gets a gloo one of its own)."""
    if backend is None:
        backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60))
    with _lock:
        name = f"se-{label}-{next(_names)}"
    pg = dist.ProcessGroup(dist.HashStore(), rank, world)
    kind = dist.ProcessGroup.BackendType.NCCL if device_type == "cuda" else dist.ProcessGroup.BackendType.GLOO
    pg._set_default_backend(kind)
    pg._register_backend(torch.device(device_type), kind, backend)
    pg._set_group_name(cast(Any, name))
    c10d._register_process_group(cast(Any, name), pg)
    return RegisteredGroup(pg, name)


__all__ = ["RegisteredGroup", "register"]
