"""A generation's DeviceMesh for FSDP2, built on the library's own process group of that generation.

FSDP2 needs a `DeviceMesh` whose group it can look up by name. The library forms a fresh group per
generation (never torch's default group: several ranks may share a process in tests, and a generation's
group is abandoned, not destroyed, when a peer dies), so the mesh is built directly: the group's backend is
wrapped in a `ProcessGroup` registered under a unique name, and the mesh is told this rank explicitly.
`placeholder_mesh()` is the one-rank mesh a script shards its model on before the job has formed; the
library moves the model onto each generation's mesh.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import threading
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _register_process_group, _unregister_process_group
from torch.distributed.device_mesh import DeviceMesh

from slurm_elastic.errors import ConfigError

_names = itertools.count()
_lock = threading.Lock()


def _unique(label: str) -> str:
    with _lock:
        return f"se-{label}-{next(_names)}"


@dataclass
class GenerationMesh:
    """The mesh of one generation and the registered group behind it (released with `close`)."""

    mesh: DeviceMesh
    group: Any  # the registered torch ProcessGroup
    name: str

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def world(self) -> int:
        return int(self.group.size())

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, KeyError):  # already gone
            _unregister_process_group(cast(Any, self.name))


def _wrap(backend: Any, rank: int, world: int, device_type: str, name: str) -> Any:
    pg = dist.ProcessGroup(dist.HashStore(), rank, world)
    kind = dist.ProcessGroup.BackendType.NCCL if device_type == "cuda" else dist.ProcessGroup.BackendType.GLOO
    pg._set_default_backend(kind)
    pg._register_backend(torch.device(device_type), kind, backend)
    pg._set_group_name(cast(Any, name))
    _register_process_group(cast(Any, name), pg)
    return pg


def generation_mesh(backend: Any, rank: int, world: int, label: str, device_type: str = "cpu") -> GenerationMesh:
    """A 1-D mesh over `backend` (the generation's gloo or NCCL backend; None for a world of one)."""
    if backend is None:
        backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60))
    name = _unique(label)
    pg = _wrap(backend, rank, world, device_type, name)
    # A dim name of its own: DeviceMesh equality ignores the group and the rank, so DTensor's sharding caches
    # would otherwise hand an older generation's mesh (or, with ranks as threads, another rank's) to a tensor.
    mesh = DeviceMesh(
        device_type, torch.arange(world), mesh_dim_names=(name.replace("-", "_"),), _init_backend=False, _rank=rank
    )
    mesh._dim_group_names = [cast(Any, name)]
    mesh._pg_registry[cast(Any, name)] = pg  # torch's registry holds it weakly: the mesh keeps it alive
    return GenerationMesh(mesh, pg, name)


def placeholder_mesh(device_type: str = "cpu", *, shard_group: int | None = None) -> DeviceMesh:
    """The mesh to pass to `fully_shard` in an elastic script: one rank, until the job moves the model onto
    each generation's mesh (so the script needs no process group of its own).

    `shard_group=S` asks for HSDP, where a plain script would pass a 2-D (replicate, shard) mesh: each
    generation shards the model over groups of S ranks (or the next size that divides the world) and
    replicates it across them (`decide.shardlayout`)."""
    whole = isinstance(shard_group, int) and not isinstance(shard_group, bool)
    if shard_group is not None and not (whole and shard_group >= 1):
        raise ConfigError(f"invalid shard_group {shard_group!r}: expected a whole number of ranks >= 1")
    mesh = generation_mesh(None, 0, 1, "placeholder", device_type).mesh
    mesh._se_shard_group = shard_group  # type: ignore[attr-defined]  # read by wanted_shard_group
    return mesh


def wanted_shard_group(mesh: DeviceMesh) -> int | None:
    """The HSDP shard group a script asked for with `placeholder_mesh(shard_group=...)`, None for plain FSDP2."""
    return getattr(mesh, "_se_shard_group", None)


__all__ = ["GenerationMesh", "generation_mesh", "placeholder_mesh", "wanted_shard_group"]
