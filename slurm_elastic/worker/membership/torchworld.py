"""torch.distributed's default process group, kept as this process's current generation.

A script's helpers ask torch, not the job: `dist.get_rank()`, `dist.get_world_size()`, DCP's state-dict,
save and load functions, DTensor and logging libraries all look up the default group. The job forms a group
of its own for each generation (`runtime`); while a generation stands, its backend is also torch's default
group (wrapped and registered the way `init_process_group` registers one), and it is taken out before that
group is abandoned, so the default never points at a dead group. Between generations there is none.

Only where one rank lives in the process: ranks that are threads of one process (tests) share torch's
globals, and a script that formed a default group of its own keeps it.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from slurm_elastic.logs import get_logger
from slurm_elastic.worker.sharded.mesh import GenerationMesh, generation_mesh

log = get_logger("slurm_elastic.worker")


class DefaultGroup:
    """Installs a generation's group as torch's default one, and takes it out again."""

    def __init__(self) -> None:
        self._installed: GenerationMesh | None = None
        self._foreign_seen = False

    @property
    def installed(self) -> bool:
        return self._installed is not None

    def install(self, backend: Any, rank: int, world: int, device_type: str, store: Any) -> None:
        """Make `backend` (a generation's gloo or NCCL backend; None for a world of one) torch's default group.
        `store` backs `dist.new_group()` calls the script makes (None: a store of this process only)."""
        self.remove()
        if dist.is_initialized():  # the script's own init_process_group: not ours to replace
            if not self._foreign_seen:
                self._foreign_seen = True
                log.warning("default_group_kept", why="the script initialized torch.distributed itself")
            return
        held = generation_mesh(backend, rank, world, "world", device_type)
        pg, name = held.group, held.name
        kind = "nccl" if device_type == "cuda" else "gloo"
        world_ = c10d._world
        world_.pg_map[pg] = (kind, store if store is not None else dist.HashStore())
        world_.pg_names[pg] = cast(Any, name)
        world_.pg_group_ranks[pg] = {i: i for i in range(world)}
        world_.pg_backend_config[pg] = f"{device_type}:{kind}"
        world_.pg_to_tag[pg] = f"ptd:{name}"
        world_.tags_to_pg.setdefault(f"ptd:{name}", []).append(pg)
        world_.tags_to_pg.setdefault("", []).append(pg)
        c10d._update_default_pg(pg)
        self._installed = held

    def remove(self) -> None:
        """Take the installed group out of torch's globals (a script's `destroy_process_group()` may have)."""
        held, self._installed = self._installed, None
        if held is None:
            return
        pg, world_ = held.group, c10d._world
        if world_.default_pg is pg:
            c10d._update_default_pg(None)
        for table in (world_.pg_map, world_.pg_names, world_.pg_group_ranks, world_.pg_backend_config):
            table.pop(pg, None)
        tag = world_.pg_to_tag.pop(pg, None)
        for key in (tag, ""):
            with contextlib.suppress(KeyError, ValueError):
                world_.tags_to_pg[key or ""].remove(pg)
        held.close()


__all__ = ["DefaultGroup"]
